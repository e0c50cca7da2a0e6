"""Serving in memory (ordnmf_dask.postfit.serving and the estimator's methods), no cluster.

Models are written here with chosen factors (the format of docs/model-format.md, through the
package's chunk writer), so that every answer is checked against a dense numpy oracle: scores
E[W] E[H]^T (ties to the lower item index), cosine similarities, and the fold-in iterated densely
with the other side and the thresholds fixed.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr
from conftest import dense_split, store_from_dense, synthetic_ordinal
from test_recommend import oracle_fold_in, oracle_top

from ordnmf_dask import ingest
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.estimator import BePoF, CaviEstimator, DcPF, OrdNMF
from ordnmf_dask.model.thresholds import theta_from_delta
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore import chunkstore, seen
from ordnmf_dask.modelstore.model import MODEL_FORMAT, open_model, store_fingerprint
from ordnmf_dask.postfit import serving
from ordnmf_dask.store.kinds import MODEL_KIND

V, K = 4, 3
N_USERS, N_ITEMS = 37, 29


def write_model(
    path, store, w, h, estimator: CaviEstimator, attrs=None, own_ids=False, own_seen=False
):
    """A model directory of ``estimator``'s class holding E[W] = w, E[H] = h (and E[log .] =
    log(.) - 0.1) for ``store``; with ``own_ids`` the store's id maps are copied into it, with
    ``own_seen`` the index of the users' training items is written by the package's writer."""
    rb, cb = store.row_bounds.tolist(), store.col_bounds.tolist()
    root = zarr.open_group(str(path), mode="w")
    if own_seen:
        for group in ("seen", "seen/indptr", "seen/indices"):
            root.create_group(group)
        for r in range(len(rb) - 1):
            seen.write(store.path, str(path), r, cb)
    for name, x, bounds in (("W", w, rb), ("H", h, cb)):
        root.create_group(name)
        for j in range(len(bounds) - 1):
            part = x[bounds[j] : bounds[j + 1]].copy()
            chunkstore.save_chunk(FactorChunk(part, np.exp(np.log(part) - 0.1)), str(path), name, j)
    if own_ids:
        for axis in ("users", "items"):
            shutil.copytree(f"{store.path}/{axis}", f"{path}/{axis}")
    attrs = {"delta": [0.0, 0.4, 0.3, 0.2, 0.5], **(attrs or {})}
    root.attrs.update(
        {
            "model": type(estimator).__name__,
            "family": "ordinal",
            "params": estimator.get_params(),
            "theta": theta_from_delta(np.asarray(attrs["delta"])).tolist(),
            "elbo": [0.0],
            "n_iter": 1,
            "converged": False,
            "store": {
                "path": store.path,
                "n_users": store.n_users,
                "n_items": store.n_items,
                "n_classes": store.n_classes,
                "nnz_train": store.nnz_train,
                "fingerprint": store_fingerprint(store.path),
            },
            "row_bounds": rb,
            "col_bounds": cb,
            **attrs,
            "kind": MODEL_KIND,
            "format_version": MODEL_FORMAT,
            "ids": own_ids,
            "seen": own_seen,
            "complete": True,
        }
    )
    return str(path)


class Case:
    """A (2, 3)-grid store with string user ids and integer item ids, and a model on it."""

    def __init__(self, tmp_path, w=None, h=None, own_ids=False, own_seen=False):
        rng = np.random.default_rng(4)
        train, test = dense_split(synthetic_ordinal(N_USERS, N_ITEMS, V, k=K, seed=3))
        train[6, :] = np.where(np.arange(N_ITEMS) < 27, 1, 0)  # 2 items left for user 6
        self.users = np.array([f"u{3 * j + 1}" for j in range(N_USERS)])
        self.items = 100 + 5 * np.arange(N_ITEMS)
        self.store = store_from_dense(
            tmp_path / "s.zarr", train, test, V, (2, 3), self.users, self.items
        )
        self.train = train
        self.W = rng.gamma(1.0, 1.0, (N_USERS, K)) if w is None else w
        self.H = rng.gamma(1.0, 1.0, (N_ITEMS, K)) if h is None else h
        self.path = write_model(
            tmp_path / "m.zarr",
            self.store,
            self.W,
            self.H,
            OrdNMF(K, n_members=1),
            own_ids=own_ids,
            own_seen=own_seen,
        )
        self.model = OrdNMF.load(self.path)

    def item(self, i):
        return int(self.items[i])

    def named(self, recs):
        return [(self.item(i), s) for i, s in recs]


def check_recs(got, want):
    """Same items in the same order; scores to float64 rounding."""
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-12)


@pytest.fixture
def case(tmp_path):
    return Case(tmp_path)


def test_recommend_matches_the_dense_oracle(case, monkeypatch):
    """Given users in two user-blocks (a repeat, a user with 2 items left), with and without
    the seen filter, with a candidate list and an exclusion list; for float32 screening, float64
    screening, and slabs of one user."""
    asked = ["u73", "u1", "u19", "u73", "u100"]
    rows = [int(np.flatnonzero(case.users == u)[0]) for u in asked]
    allowed = [case.item(i) for i in (0, 3, 4, 8, 9, 20, 28)]
    banned = [case.item(i) for i in (3, 5, 9)]
    seen = case.train > 0
    in_allowed = ~np.isin(case.items, allowed)
    in_banned = np.isin(case.items, banned)
    for variant in ("float32", "float64", "one row per slab"):
        if variant == "float64":
            monkeypatch.setattr(serving, "_SAFE32", (np.inf, np.inf))
        if variant == "one row per slab":
            monkeypatch.setattr(serving, "_BUDGET", 1)
        model = OrdNMF.load(case.path)
        res = model.recommend(asked, n=4)
        assert list(res) == ["u73", "u1", "u19", "u100"]
        want = oracle_top(case.W, case.H, seen, 4)
        for user, row in zip(asked, rows, strict=True):
            check_recs(res[user], case.named(want[row]))
        assert len(res["u19"]) == 2
        every = oracle_top(case.W, case.H, np.zeros_like(seen), 6)
        res = model.recommend(asked, n=6, filter_already_seen=False)
        for user, row in zip(asked, rows, strict=True):
            check_recs(res[user], case.named(every[row]))
        res = model.recommend(asked, n=3, items=allowed, exclude=banned)
        want = oracle_top(case.W, case.H, seen | in_allowed[None, :] | in_banned[None, :], 3)
        for user, row in zip(asked, rows, strict=True):
            check_recs(res[user], case.named(want[row]))
        with pytest.raises(TypeError, match=r"user_ids must be a list of ids.*\['u1'\]"):
            model.recommend("u1", 2)  # a bare string is no list of ids (not its characters)


def test_ties_go_to_the_lower_item_as_in_the_distributed_recommend(tmp_path):
    """Integer factors tie scores everywhere: the screened lists still follow the tie rule."""
    rng = np.random.default_rng(0)
    w = rng.integers(1, 3, (N_USERS, K)).astype(float)
    h = rng.integers(1, 4, (N_ITEMS, K)).astype(float)
    case = Case(tmp_path, w, h)
    res = case.model.recommend(list(case.users), n=5)
    want = oracle_top(w, h, case.train > 0, 5)
    for u, user in enumerate(case.users):
        assert res[user] == case.named(want[u])


@pytest.mark.parametrize("m", [3, 70])  # a few rows (numpy's screen), a batch (the kernel's)
def test_top_n_screening_keeps_every_exact_top_item(m):
    """Scores that differ in the 7th digit (closer than float32 can tell apart, with rounding
    errors that reorder them): the float32 screen keeps every item of the float64 top n."""
    assert (m * 4000 <= serving._SMALL_SLAB) == (m == 3)
    rng = np.random.default_rng(1)
    base = rng.gamma(1.0, 1.0, (1, 8))
    target = base * (1 + rng.uniform(-3e-7, 3e-7, (4000, 8)))
    query = rng.gamma(1.0, 1.0, (m, 8))
    for n in (1, 7, 60):
        scores, cols = serving.top_n(query, target, serving.screen_copy(target), n)
        exact = query @ target.T
        for r in range(m):
            order = np.lexsort((np.arange(4000), -exact[r]))[:n]
            np.testing.assert_array_equal(cols[r], order)
            np.testing.assert_allclose(scores[r], exact[r, order], rtol=1e-14)


def test_the_two_screens_keep_the_same_columns():
    """The numpy screen of a few rows and the compiled one of a batch: the same candidates, on
    near-ties, rows banned in part (-inf) and rows with fewer than n finite scores."""
    rng = np.random.default_rng(5)
    s = (1 + rng.integers(0, 40, (9, 300)) * 1e-7).astype(np.float32)
    s[2, 5:] = -np.inf  # 5 finite scores, fewer than n
    s[3] = -np.inf  # none
    s[4, rng.random(300) < 0.5] = -np.inf
    for n in (1, 10, 299):
        for shrink in (1.0, 1 - 1e-7, 0.5):
            small = serving._screen_small(s, n, shrink)
            compiled = serving._screen_compiled(s, n, shrink)
            for a, b in zip(small, compiled, strict=True):
                np.testing.assert_array_equal(a, b)


def test_similar_and_score(case):
    m = case.model
    unit_h = case.H / np.linalg.norm(case.H, axis=1, keepdims=True)
    unit_w = case.W / np.linalg.norm(case.W, axis=1, keepdims=True)
    res = m.similar_items([case.item(2), case.item(11)], n=4)
    for i in (2, 11):
        want = oracle_top(unit_h[[i]], unit_h, np.eye(N_ITEMS, dtype=bool)[[i]], 4)[0]
        check_recs(res[case.item(i)], case.named(want))
    res = m.similar_users(["u4", "u100"], n=3)
    for user in ("u4", "u100"):
        u = int(np.flatnonzero(case.users == user)[0])
        want = oracle_top(unit_w[[u]], unit_w, np.eye(N_USERS, dtype=bool)[[u]], 3)[0]
        check_recs(res[user], [(str(case.users[j]), s) for j, s in want])
    got = m.score(["u4", "u100", "u4"], [case.item(0), case.item(28), case.item(28)])
    want = [case.W[1] @ case.H[0], case.W[33] @ case.H[28], case.W[1] @ case.H[28]]
    np.testing.assert_allclose(got, want, rtol=1e-14)
    with pytest.raises(InputError, match="as many users as items"):
        m.score(["u4"], [])


def test_unknown_ids_and_bad_arguments(case):
    m = case.model
    with pytest.raises(InputError, match="unknown user id 'u2'"):
        m.recommend(["u1", "u2"])
    with pytest.raises(InputError, match="unknown item id 7"):
        m.recommend(["u1"], items=[100, 7])
    with pytest.raises(InputError, match="unknown item id 'x'"):
        m.similar_items(["x"])
    with pytest.raises(InputError, match="n must be an integer"):
        m.recommend(["u1"], n=0)
    with pytest.raises(InputError, match="nonnegative"):
        m.recommend_for(-np.ones((1, K)))


def test_the_store_is_read_only_when_asked_and_only_the_users_blocks(tmp_path, monkeypatch):
    """Without the seen filter, a model holding its id maps needs no store at all; with it, only
    the blocks of the requested users' user-blocks are read."""
    case = Case(tmp_path, own_ids=True)
    reads = []
    real = serving.read_block
    monkeypatch.setattr(
        serving,
        "read_block",
        lambda path, split, r, c, **kw: reads.append((r, c)) or real(path, split, r, c, **kw),
    )
    case.model.recommend(["u1", "u4"], n=2)  # both in user-block 0
    assert sorted(reads) == [(0, 0), (0, 1), (0, 2)]
    shutil.rmtree(case.store.path)
    fresh = OrdNMF.load(case.path)
    res = fresh.recommend(["u100"], n=3, filter_already_seen=False)
    every = oracle_top(case.W, case.H, np.zeros((N_USERS, N_ITEMS), bool), 3)
    check_recs(res["u100"], case.named(every[33]))
    with pytest.raises(StoreError, match="s.zarr"):
        fresh.recommend(["u100"], n=3)


def test_an_old_model_filters_seen_items_from_the_store_passed(tmp_path):
    """A model without its own index of the training items, its store moved: the error says
    what to pass, and the store passed to ``recommend`` provides them."""
    case = Case(tmp_path, own_ids=True)
    moved = tmp_path / "moved.zarr"
    shutil.move(case.store.path, moved)
    with pytest.raises(
        StoreError,
        match=r"m.zarr: the model holds no index of its users' "
        r"training items .* \(.*s.zarr: no store here.*\); pass store=STORE "
        r"\(the training store\), or filter_already_seen=False",
    ):
        OrdNMF.load(case.path).recommend(["u100"], n=3)
    res = OrdNMF.load(case.path).recommend(["u100", "u1"], n=4, store=moved)
    want = oracle_top(case.W, case.H, case.train > 0, 4)
    check_recs(res["u100"], case.named(want[33]))
    check_recs(res["u1"], case.named(want[0]))


def test_a_model_with_its_seen_index_filters_without_its_store(tmp_path, monkeypatch):
    """The model's own index of the training items: the store moved away, the seen filter gives
    the lists it gave with the store; only the requested users' user-blocks are read, and a
    damaged index is an error naming the file, never an empty filter."""
    case = Case(tmp_path, own_ids=True, own_seen=True)
    asked = list(case.users[[0, 1, 2, 6, 20, 33, 36]])
    with_store = serving.server(case.path, case.store.path).recommend(asked, n=5)
    shutil.move(case.store.path, tmp_path / "moved.zarr")
    reads = []
    real = seen.load_index
    monkeypatch.setattr(seen, "load_index", lambda model, r: reads.append(r) or real(model, r))
    model = OrdNMF.load(case.path)
    res = model.recommend(asked, n=5)
    want = oracle_top(case.W, case.H, case.train > 0, 5)
    for user in asked:
        u = int(np.flatnonzero(case.users == user)[0])
        check_recs(res[user], case.named(want[u]))
        assert res[user] == with_store[user]
    assert len(res["u19"]) == 2  # user 6: 27 of the 29 items in train
    assert sorted(reads) == [0, 1]
    reads.clear()  # the index is read once per served model, then kept with it
    assert model.recommend(["u1", "u4"], n=2) == OrdNMF.load(case.path).recommend(["u1", "u4"], 2)
    assert reads == []
    fresh = serving.Server(open_model(case.path))  # as a new process serves it
    fresh.recommend(["u1", "u4"], n=2)
    assert reads == [0]
    shutil.rmtree(f"{case.path}/seen/indices/1/c")
    with pytest.raises(StoreError, match=r"seen/indices/1/c/0: chunk file missing"):
        serving.Server(open_model(case.path)).recommend(["u100"], n=2)


def test_a_model_without_a_store_or_with_another_store(tmp_path):
    """A model recording no store serves from its own id maps, but cannot filter seen items; a
    store given that does not match the model is refused."""
    case = Case(tmp_path, own_ids=True)
    recorded = {"path": None, "n_users": N_USERS, "n_items": N_ITEMS, "n_classes": V}
    path = write_model(
        tmp_path / "alone.zarr",
        case.store,
        case.W,
        case.H,
        OrdNMF(K, n_members=1),
        {"store": recorded},
        own_ids=True,
    )
    model = OrdNMF.load(path)
    every = oracle_top(case.W, case.H, np.zeros((N_USERS, N_ITEMS), bool), 2)
    check_recs(model.recommend(["u1"], 2, filter_already_seen=False)["u1"], case.named(every[0]))
    with pytest.raises(StoreError, match="records no training store; pass store=STORE"):
        model.recommend(["u1"], 2)
    train, test = dense_split(synthetic_ordinal(N_USERS + 1, N_ITEMS, V, k=K, seed=3))
    other = store_from_dense(tmp_path / "other.zarr", train, test, V, (2, 3))
    with pytest.raises(InputError, match="does not match store"):
        serving.server(case.path, other.path).recommend([1], 2)


def test_a_replaced_model_is_served_afresh(case):
    first = serving.server(case.path)
    assert serving.server(case.path) is first
    write_model(case.path, case.store, case.W * 2, case.H, OrdNMF(K, n_members=1))
    second = serving.server(case.path)
    assert second is not first
    np.testing.assert_array_equal(second.W, case.W * 2)


@pytest.mark.parametrize("kind", ["ordnmf", "bepof", "dcpf"])
def test_fold_in_users_and_items_match_the_dense_oracle(tmp_path, kind):
    """New users against the fixed E[H], E[log H]; new items against the fixed E[W], E[log W],
    with each family's frozen likelihood (BePoF binarizes at its threshold as its fit did)."""
    est, attrs = {
        "ordnmf": (OrdNMF(K, alpha_W=0.3, alpha_H=0.7, n_members=1), {}),
        "bepof": (
            BePoF(K, threshold=3, alpha_W=0.3, alpha_H=0.7, n_members=1),
            {"delta": [0.0, 0.6]},
        ),
        "dcpf": (
            DcPF(K, alpha_W=0.3, alpha_H=0.7, n_members=1),
            {"family": "dcpf", "p": 0.4, "t": 1.5},
        ),
    }[kind]
    case = Case(tmp_path)
    path = write_model(tmp_path / f"{kind}.zarr", case.store, case.W, case.H, est, attrs)
    model = type(est).load(path)
    if kind == "dcpf":
        family, params, see = "dcpf", {"p": 0.4, "t": 1.5}, lambda y: y
    else:
        delta = np.asarray(attrs.get("delta", [0.0, 0.4, 0.3, 0.2, 0.5]))
        family, params = "ordinal", {"delta": delta}
        see = (lambda y: (y >= 3).astype(np.int64)) if kind == "bepof" else (lambda y: y)
    rng = np.random.default_rng(2)
    for axis, n_other, others in (("users", N_ITEMS, case.items), ("items", N_USERS, case.users)):
        y = np.zeros((3, n_other), dtype=np.int64)
        for j, m in enumerate((5, 9, 0)):
            y[j, rng.choice(n_other, m, replace=False)] = rng.integers(1, V + 1, m)
        ids = [[others[i].item() for i in np.flatnonzero(row)] for row in y]
        values = [row[row > 0].tolist() for row in y]
        if axis == "users":
            got = model.fold_in_users(ids, values, tol=1e-9)
            fixed, alpha = case.H, 0.3
        else:
            got = model.fold_in_items(ids, values, tol=1e-9)
            fixed, alpha = case.W, 0.7
        want = oracle_fold_in(see(y), fixed, np.log(fixed) - 0.1, alpha, family, params, tol=1e-9)
        np.testing.assert_allclose(got, want, rtol=1e-10)
    w = model.fold_in_users([[case.item(0), case.item(4)]], [[2, 4]])
    recs = model.recommend_for(w, n=3, exclude=[[case.item(0), case.item(4)]])
    seen = np.isin(np.arange(N_ITEMS), [0, 4])[None, :]
    assert list(recs) == [0]  # recommend's shape, keyed by the row of w
    check_recs(recs[0], case.named(oracle_top(w, case.H, seen, 3)[0]))
    with pytest.raises(InputError, match="new item 0: user 'u1' given twice"):
        model.fold_in_items([["u1", "u1"]], [[1, 2]])
    with pytest.raises(InputError, match="unknown user id 'u2'"):
        model.fold_in_items([["u2"]], [[1]])


def test_cli_recommend_for_given_users_starts_no_cluster(case, capsys):
    """This test is not marked ``cluster``: any Dask scheduler started in it would fail."""
    cmd = ["recommend", case.store.path, case.path, "--users", "u1,u4", "-n", "2"]
    assert main(cmd) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "user\trank\titem\tscore"
    want = oracle_top(case.W, case.H, case.train > 0, 2)
    got = [ln.split("\t") for ln in lines[1:]]
    assert [g[:3] for g in got] == [
        ["u1", "1", str(case.item(want[0][0][0]))],
        ["u1", "2", str(case.item(want[0][1][0]))],
        ["u4", "1", str(case.item(want[1][0][0]))],
        ["u4", "2", str(case.item(want[1][1][0]))],
    ]
    assert main([*cmd[:3], "--users", "u1,nope"]) == 2
    assert "unknown user id 'nope'" in capsys.readouterr().err


def test_fold_in_takes_values_on_the_scale_the_store_was_ingested_from(tmp_path):
    """A store of half-star ratings: fold-in takes half stars (4.5 -> class 9), as fit(X) does,
    and gives the dense oracle's E[w] of those classes; a value of no half star is refused,
    saying what to pass. The model records the rule, so the store may be gone."""
    rng = np.random.default_rng(4)
    users, items = np.repeat(np.arange(30), 8), rng.integers(0, 25, 240)
    keep = np.unique(users * 100 + items, return_index=True)[1]
    stars = rng.integers(1, 11, 240) / 2
    store = ingest(
        (users[keep], items[keep], stars[keep]),
        tmp_path / "s.zarr",
        ratings="halfstar",
        test_fraction=0.0,
        show_progress=False,
    )
    model = OrdNMF(3, max_iter=5, seed=0, n_members=1).fit(store, show_progress=False)
    model = OrdNMF.load(model.save(tmp_path / "m.zarr"))
    assert open_model(model.model_path_).attrs["store"]["value_kind"] == "ratings-halfstar"
    shutil.rmtree(store.path)
    ids = model._server().items.raw([0, 3, 7])
    got = model.fold_in_users([ids], [[4.5, 5.0, 0.5]], tol=1e-9)
    y = np.zeros((1, model._server().H.shape[0]), dtype=np.int64)
    y[0, [0, 3, 7]] = [9, 10, 1]
    eh, log_eh = np.asarray(model.H_), np.asarray(model.log_H_)
    want = oracle_fold_in(y, eh, log_eh, 0.3, "ordinal", {"delta": model.delta_}, tol=1e-9)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    with pytest.raises(
        InputError,
        match=r"fold-in values, row 1: rating 9 is off the halfstar scale 0\.5, 1\.0, \.\.\., "
        r"5\.0; pass values on the scale the store was ingested from: half-star ratings 0\.5, "
        r"1\.0, \.\.\., 5\.0 \(ratings='halfstar'\)",
    ):
        model.fold_in_users([ids[:2]], [[4.5, 9]])


def test_user_and_item_factors_are_numpy_arrays_of_the_posterior_means(case):
    assert isinstance(case.model.user_factors, np.ndarray)
    np.testing.assert_array_equal(case.model.user_factors, case.W)
    np.testing.assert_array_equal(case.model.item_factors, case.H)
    with pytest.raises(AttributeError, match="not fitted"):
        OrdNMF(K, n_members=1).user_factors  # noqa: B018


def test_the_kept_seen_index_stays_within_its_budget(tmp_path, monkeypatch):
    """With room for one user-block only, the most recent one is kept and the other read again
    when asked; the lists are the same."""
    case = Case(tmp_path, own_ids=True, own_seen=True)
    reads = []
    real = seen.load_index
    monkeypatch.setattr(seen, "load_index", lambda model, r: reads.append(r) or real(model, r))
    monkeypatch.setattr(serving, "_SEEN_BUDGET", 1)
    served = serving.Server(open_model(case.path))
    first = served.recommend(["u1", "u100"], n=4)  # user-blocks 0 and 1
    assert sorted(reads) == [0, 1] and list(served._seen_blocks) == [reads[-1]]
    again = served.recommend(["u1", "u100"], n=4)
    assert again == first and len(reads) == 4 and len(served._seen_blocks) == 1
    want = oracle_top(case.W, case.H, case.train > 0, 4)
    check_recs(first["u100"], case.named(want[33]))
