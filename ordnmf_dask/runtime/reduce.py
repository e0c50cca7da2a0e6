"""Deterministic tree reductions of futures, performed on the workers.

The pairing order depends only on the order of the inputs, never on which worker finished
first, so results are bit-identical across worker counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import numpy as np

if TYPE_CHECKING:  # a client is a distributed.Client or an in-process one (.inprocess)
    from distributed import Client, Future


PRIORITY = 1  # of combining tasks; Dask's default is 0
# levels of the tree one combining task folds (:func:`tree_reduce`): up to 8 inputs a task, so
# the sums over the user-blocks or item-blocks of grids up to 8 x 8 take one hop, not three
LEVELS = 3

T = TypeVar("T")


def fold(n: int, leaf: Callable[[int], T], combine: Callable[[T, T], T]) -> T:
    """``leaf(0) .. leaf(n - 1)`` combined along the one fixed tree of the package: a run of
    leaves is cut after the largest power of two below its length, halves left first (the
    pairing of neighbours level by level, the odd one out carried up). The tree depends on
    ``n`` only; it is walked depth first, so a node is combined as soon as its halves exist
    and at most one partial per level is held."""
    if n < 1:
        raise ValueError("a reduction of nothing")
    return _node(0, n, leaf, combine)


def _node(lo: int, hi: int, leaf: Callable[[int], T], combine: Callable[[T, T], T]) -> T:
    """The node of :func:`fold`'s tree over leaves [lo, hi). (A module-level function: a nested
    one calling itself is a reference cycle, which would keep the leaves, futures of a fit,
    until the garbage collector runs.)"""
    if hi - lo == 1:
        return leaf(lo)
    mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    return combine(_node(lo, mid, leaf, combine), _node(mid, hi, leaf, combine))


Shape: TypeAlias = "int | tuple[Shape, Shape]"
"""The top levels of a node of :func:`fold`'s tree, evaluated in one task: an input's index
among the task's values, or a pair of shapes combined."""


def fold_grouped(
    n: int,
    leaf: Callable[[int], T],
    node: Callable[[Shape, list[T]], T],
    levels: int,
) -> T:
    """:func:`fold`'s tree over ``leaf(0) .. leaf(n - 1)``, ``levels`` of its levels per
    ``node(shape, values)``: one node (a task) folds up to ``2**levels`` values (leaves, or
    nodes below it) along the same pairing. The same tree as :func:`fold`, walked depth first
    likewise, with ``levels`` times fewer dependent steps."""
    if n < 1:
        raise ValueError("a reduction of nothing")
    if n == 1:
        return leaf(0)
    return _group(0, n, leaf, node, levels)


def _group(
    lo: int, hi: int, leaf: Callable[[int], T], node: Callable[[Shape, list[T]], T], levels: int
) -> T:
    """The node of :func:`fold_grouped` over leaves [lo, hi) (several leaves)."""
    values: list[T] = []
    shape = _expand(lo, hi, levels, leaf, node, levels, values)
    return node(shape, values)


def _expand(
    lo: int,
    hi: int,
    depth: int,
    leaf: Callable[[int], T],
    node: Callable[[Shape, list[T]], T],
    levels: int,
    values: list[T],
) -> Shape:
    """The shape of fold's node [lo, hi) down ``depth`` levels, its inputs appended to
    ``values``: leaves, and the nodes (of their own ``levels``) where the depth runs out."""
    if hi - lo == 1 or depth == 0:
        values.append(leaf(lo) if hi - lo == 1 else _group(lo, hi, leaf, node, levels))
        return len(values) - 1
    mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    left = _expand(lo, mid, depth - 1, leaf, node, levels, values)
    return left, _expand(mid, hi, depth - 1, leaf, node, levels, values)


def evaluate(combine: Callable[..., Any], shape: Shape, args: tuple[Any, ...], *values: Any) -> Any:
    """On a worker: the node ``shape`` of :func:`fold_grouped` over ``values``, combined with
    ``combine(a, b, *args)`` depth first (one partial per level held)."""
    if isinstance(shape, int):
        return values[shape]
    a = evaluate(combine, shape[0], args, *values)
    return combine(a, evaluate(combine, shape[1], args, *values), *args)


def tree_reduce(
    client: Client,
    futures: Sequence[Future],
    combine: Callable[..., Any],
    *args: Any,
    at: dict[str, Any] | None = None,
) -> Future:
    """Reduce with ``combine(a, b, *args)`` along the fixed tree (:func:`fold`) over ``futures``,
    ``LEVELS`` of its levels per task (:func:`fold_grouped`): a reduction of up to
    ``2**LEVELS`` inputs is one task, one hop, where a task per pair would be ``LEVELS``.

    The combining tasks run before any task of normal priority that is ready at the same time,
    so partial results are folded in as soon as a node's inputs exist instead of piling up on
    the workers while the rest of a pass runs (partials are (n, K) arrays: they set a pass's peak
    memory, and a combining task holds at most ``2**LEVELS`` of them and one per level).
    ``at``: ``submit`` keywords of every combining task (where the sum is wanted); placement
    only, the tree is the same.
    """

    def node(shape: Shape, values: list[Any]) -> Future:
        return client.submit(
            evaluate, combine, shape, args, *values, priority=PRIORITY, **(at or {})
        )

    return fold_grouped(len(futures), futures.__getitem__, node, LEVELS)


Field = str | int | tuple[str | int, ...] | list[Any] | None
"""Where a part sits in an object: an attribute name, an item index, or a path of them
(``("sh", j)`` is ``x.sh[j]``); a list of fields is the tuple of those parts
(``["sw", "small"]``); None is the object itself."""


def _part(x: object, field: Field) -> Any:
    if field is None or isinstance(x, np.ndarray):
        return x
    if isinstance(field, list):
        return tuple(_part(x, f) for f in field)
    for step in field if isinstance(field, tuple) else (field,):
        x = x[step] if isinstance(step, int) else getattr(x, step)
    return x


def _add(a: Any, b: Any) -> Any:
    """``a + b`` into a new array (a tuple of arrays is added item by item)."""
    if isinstance(a, tuple):
        return tuple(_add(x, y) for x, y in zip(a, b, strict=True))
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b))
    return np.add(a, b, out=out)


def _pick(a: object, field: Field = None) -> Any:
    return _part(a, field)


Lazy: TypeAlias = "Future | tuple[Future, Field]"


def resolve(x: object) -> Any:
    """On a worker: the value of a :data:`Lazy` argument (``(obj, field)`` -> its field)."""
    return _part(x[0], x[1]) if isinstance(x, tuple) else x


def item(x: Lazy, j: int) -> Lazy:
    """Item j of the tuple that the :data:`Lazy` ``x`` stands for, still lazy (no task)."""
    if isinstance(x, tuple):
        obj, field = x
        if isinstance(field, list):  # a tuple of fields: item j is field j
            return (obj, field[j])
        path = () if field is None else field if isinstance(field, tuple) else (field,)
        return (obj, (*path, j))
    return (x, j)


def tree_sum(
    client: Client,
    futures: Sequence[Future],
    field: Field = None,
    lazy: bool = False,
    at: dict[str, Any] | None = None,
) -> Lazy:
    """Sum the ``field`` of each future (or the value itself) with a fixed binary tree: ``"sw"``
    is ``f.sw``, ``("sh", j)`` is ``f.sh[j]``; a field holding a tuple of arrays (``"sh"``) is
    summed item by item (one tree for all of them; :func:`item` refers to one).

    With ``lazy`` and a single input, no task is added: the result is ``(future, field)``, which
    task arguments accept (Dask resolves the future inside the tuple) and :func:`resolve`
    unwraps on the worker. One task hop less on the critical path of every small-grid pass.
    Never gather a lazy result: it would bring the whole object to the client. Otherwise the
    field is taken on the worker holding each input before anything moves, so e.g. the column
    sums of factor chunks move (K + 1,) vectors, not the chunks. ``at``: as in
    :func:`tree_reduce` (the adds only: a field is taken where its object lives).
    """
    if len(futures) == 1:
        if lazy:
            return futures[0] if field is None else (futures[0], field)
        return client.submit(_pick, futures[0], field, priority=PRIORITY)
    if field is not None:  # take the field where each object lives: only it travels
        futures = [client.submit(_pick, f, field, priority=PRIORITY) for f in futures]
    return tree_reduce(client, futures, _add, at=at)
