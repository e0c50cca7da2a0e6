"""Tree sums on the workers (runtime/reduce.py): fields, tuples of arrays, lazy parts."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

from ordnmf_dask.runtime import reduce


@dataclass(frozen=True)
class Parts:
    sw: np.ndarray
    sh: tuple[np.ndarray, ...]
    small: np.ndarray


def make(seed: int) -> Parts:
    rng = np.random.default_rng(seed)
    return Parts(rng.random((4, 3)), (rng.random((2, 3)), rng.random((5, 3))), rng.random(6))


@pytest.mark.parametrize("n", [1, 2, 5])
def test_tree_sums_of_fields_tuples_and_items(client, n):
    objs = [make(s) for s in range(n)]
    futs = [client.submit(make, s) for s in range(n)]
    pairs = client.gather(reduce.tree_sum(client, futs, ["sw", "small"]))
    np.testing.assert_allclose(pairs[0], sum(o.sw for o in objs), rtol=1e-15)
    np.testing.assert_allclose(pairs[1], sum(o.small for o in objs), rtol=1e-15)
    total = reduce.tree_sum(client, futs, "sh", lazy=True)
    for j in range(2):  # an item of the lazily summed tuple, resolved on a worker
        got = client.submit(reduce.resolve, reduce.item(total, j)).result()
        np.testing.assert_allclose(got, sum(o.sh[j] for o in objs), rtol=1e-15)
    pair = reduce.tree_sum(client, futs, ["sw", "small"], lazy=True)  # n = 1: no task at all
    for j, name in enumerate(["sw", "small"]):
        got = client.submit(reduce.resolve, reduce.item(pair, j)).result()
        np.testing.assert_allclose(got, sum(getattr(o, name) for o in objs), rtol=1e-15)
    rows = reduce.tree_sum(client, futs, ["sw", "small"])
    small = client.gather(reduce.tree_sum(client, [rows], 1))
    np.testing.assert_allclose(small, sum(o.small for o in objs), rtol=1e-15)


@pytest.mark.parametrize("levels", [1, 3])
def test_tree_sum_order_is_fixed(client, levels, monkeypatch):
    """The pairing depends on the input order only, not on the levels a task folds:
    ((x0 + x1) + (x2 + x3)) + x4."""
    monkeypatch.setattr(reduce, "LEVELS", levels)
    xs = [np.array([v]) for v in (1e16, 1.0, -1e16, 1.0, 3.0)]
    futs = [client.submit(np.copy, x) for x in xs]
    got = client.gather(reduce.tree_sum(client, futs))
    assert got[0] == ((xs[0] + xs[1]) + (xs[2] + xs[3]) + xs[4])[0]
    assert got[0] != sum(x[0] for x in xs)  # left to right gives another value here


def test_tree_sum_adds_run_where_asked(client):
    """``at`` places every add of the tree (the sum ends on that worker); the sum is the same."""
    futs = [client.submit(make, s, pure=False) for s in range(5)]
    plain = client.gather(reduce.tree_sum(client, futs, ("sh", 1)))
    for worker in sorted(client.scheduler_info()["workers"]):
        total = reduce.tree_sum(
            client, futs, ("sh", 1), at={"workers": [worker], "allow_other_workers": False}
        )
        np.testing.assert_array_equal(total.result(), plain)
        assert set(client.who_has([total])[total.key]) == {worker}


def _paren(a: str, b: str) -> str:
    return f"({a} {b})"


@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 8, 13])
def test_one_tree_for_tree_reduce_and_map_reduce(n, levels, monkeypatch):
    """The engine's reductions (``tree_reduce``, whatever the levels folded per task) and the
    ingest's (``Runner.map_reduce``) walk the same tree, which pairs neighbours level by level:
    a combine that records its pairing gives one string for both, and for 7 leaves
    ((0 1) (2 3)) ((4 5) 6)."""
    from ordnmf_dask.runtime.inprocess import InProcessClient
    from ordnmf_dask.runtime.runner import Runner

    monkeypatch.setattr(reduce, "LEVELS", levels)
    with InProcessClient(2) as threads:
        leaves = [threads.submit(str, j) for j in range(n)]
        engine = reduce.tree_reduce(threads, leaves, _paren).result()
    ingest = Runner().map_reduce(str, list(range(n)), _paren)
    assert engine == ingest == reduce.fold(n, str, _paren)
    if n == 7:
        assert engine == "(((0 1) (2 3)) ((4 5) 6))"
    level = [str(j) for j in range(n)]  # neighbours paired level by level, odd one carried
    while len(level) > 1:
        level = [_paren(*level[j : j + 2]) for j in range(0, len(level) - 1, 2)] + (
            [level[-1]] if len(level) % 2 else []
        )
    assert engine == level[0]


@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("n", [2, 4, 7, 8, 9, 16, 64, 65])
def test_grouped_fold_takes_fewer_dependent_steps(n, levels):
    """``fold_grouped`` folds ``levels`` levels of the one tree per node: the same result as
    ``fold``, each node of at most 2**levels inputs, and ceil(depth / levels) nodes along the
    longest chain (the tree over n leaves has depth ceil(log2 n))."""
    sizes: list[int] = []

    def node(shape: reduce.Shape, values: list[tuple[str, int]], where) -> tuple[str, int]:
        sizes.append(len(values))
        text = reduce.evaluate(lambda a, b: (_paren(a[0], b[0]), 0), shape, (), *values)[0]
        return text, 1 + max(chain for _, chain in values)

    text, chain = reduce.fold_grouped(n, lambda j: (str(j), 0), node, levels)
    assert text == reduce.fold(n, str, _paren)
    assert max(sizes) <= 2**levels
    depth = (n - 1).bit_length()
    assert chain == -(-depth // levels)


@pytest.mark.parametrize("levels", [1, 3])
def test_grouped_fold_adds_one_workers_subtrees_there(levels):
    """With the leaves' homes, a subtree whose leaves all live on one worker (below a node whose
    leaves do not) is a node of its own on that worker: partials are added where they live
    before they move. The tree, and so the result, is fold's."""
    homes = ["a", "a", "a", "a", "b", "b", "c", "a"]
    seen: list[tuple[str, object]] = []

    def node(shape: reduce.Shape, values: list[str], where) -> str:
        text = reduce.evaluate(_paren, shape, (), *values)
        seen.append((text, where))
        return text

    text = reduce.fold_grouped(len(homes), str, node, levels, homes.__getitem__)
    assert text == reduce.fold(len(homes), str, _paren)
    assert ("((0 1) (2 3))", "a") in seen  # leaves 0-3 on worker a: summed there
    assert ("(4 5)", "b") in seen
    assert seen[-1] == (text, None)  # the root goes where the caller places it
    assert all(where is None for t, where in seen if "6" in t)  # nodes spanning b, c and a


@pytest.mark.parametrize("levels", [1, 3])
@pytest.mark.parametrize("homes", ["aaaabbca", "aabb", "aaaaaaaaa", "abab"])
def test_one_workers_subtrees_supplied_by_the_caller_give_the_same_tree(levels, homes):
    """``own_ranges`` names the nodes of one home (the whole tree first when its leaves share
    one); a caller that supplies them (``local``, as a worker's pass task does) gets fold's
    tree, its leaves inside them never read and none of their nodes made."""
    ranges = reduce.own_ranges(len(homes), homes.__getitem__, levels)
    for lo, hi in ranges:
        assert len(set(homes[lo:hi])) == 1
    assert ((0, len(homes)) in ranges) == (len(set(homes)) == 1)
    read: list[int] = []

    def leaf(j: int) -> str:
        read.append(j)
        return str(j)

    def local(lo: int, hi: int) -> str | None:
        assert (lo, hi) in ranges
        return "".join(_shift(reduce.fold(hi - lo, str, _paren), lo))

    def node(shape: reduce.Shape, values: list[str], where) -> str:
        assert where is None  # every node of one home was supplied
        return reduce.evaluate(_paren, shape, (), *values)

    text = reduce.fold_grouped(len(homes), leaf, node, levels, homes.__getitem__, local)
    assert text == reduce.fold(len(homes), str, _paren)
    inside = {j for lo, hi in ranges for j in range(lo, hi)}
    assert set(read) == set(range(len(homes))) - inside
    assert homes != "abab" or ranges == []  # no two neighbours share a worker
    assert homes != "aaaabbca" or ranges == [(0, 4), (4, 6)]


def _shift(text: str, by: int) -> list[str]:
    """``text`` (a tree over leaves 0..) with each leaf index raised by ``by``."""
    return [str(int(t) + by) if t.isdigit() else t for t in re.split(r"(\d+)", text) if t]


def test_tree_sum_with_homes_is_the_same_sum(client):
    """``homes`` moves where the adds run, not what they add: bitwise the sum without them."""
    workers = sorted(client.scheduler_info()["workers"])
    at = [{"workers": [workers[j * 2 // 7]], "allow_other_workers": True} for j in range(7)]
    futs = [client.submit(make, s, pure=False, **at[j]) for j, s in enumerate(range(7))]
    plain = client.gather(reduce.tree_sum(client, futs, "sw"))
    placed = client.gather(reduce.tree_sum(client, futs, "sw", homes=at))
    np.testing.assert_array_equal(placed, plain)
