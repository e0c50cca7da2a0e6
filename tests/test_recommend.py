"""Recommendations (all users to part files, given users) and fold-in of new users.

Every result is compared with a dense numpy oracle written here from docs/design.md: scores
E[W] E[H]^T with the training nonzeros excluded (ties to the lower item index), and the W half of
CAVI iterated with H and the thresholds fixed.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from fsspec.implementations.local import LocalFileSystem
from scipy.special import digamma

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError
from ordnmf_dask.estimator import BePoF, DcPF
from ordnmf_dask.model.foldin_rows import Likelihood, fold_in_rows
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.postfit.foldin import fold_in, recommend_for
from ordnmf_dask.postfit.recommend import recommend

V, K = 4, 3


class Fitted:
    def __init__(self, store, model, train, users, items):
        self.store, self.model, self.train = store, model, train
        self.users, self.items = list(users), list(items)  # raw ids in index order
        m = open_model(model.model_path_)
        self.W = m.factor("W").compute()
        self.H = m.factor("H").compute()
        self.logH = m.factor("H", "log_mean").compute()
        self.attrs = m.attrs


@pytest.fixture(scope="module")
def grid23(tmp_path_factory):
    """(2, 3) grid, string user ids, integer item ids, a short fit (any state will do; fitted
    in-process: the model does not depend on the executor, tests/test_inprocess.py)."""
    d = tmp_path_factory.mktemp("g23")
    train, test = dense_split(synthetic_ordinal(37, 29, V, k=K, density=0.3, seed=3))
    train[5, :] = np.where(train[5] > 0, train[5], 1)  # a user with every item in train
    train[6, :] = 0
    train[6, :3] = 2  # a user with only 3 training items ...
    train[6, 3:] = np.where(np.arange(3, 29) < 27, 1, 0)  # ... and then 27 of 29
    test[5:7] = 0
    users = np.array([f"u{3 * j + 1}" for j in range(37)])
    items = 100 + 5 * np.arange(29)
    store = store_from_dense(d / "s.zarr", train, test, V, (2, 3), users, items)
    model = OrdNMF(K, max_iter=5, executor="inprocess", n_members=1).fit(store, out=d / "m.zarr")
    return Fitted(store, model, train, users, items.tolist())


@pytest.fixture(scope="module")
def grid11(tmp_path_factory):
    """(1, 1) grid, integer ids 0.., fitted for 80 iterations (for the fold-in property;
    in-process, as grid23)."""
    d = tmp_path_factory.mktemp("g11")
    train, test = dense_split(synthetic_ordinal(30, 25, V, k=K, density=0.5, seed=0))
    store = store_from_dense(d / "s.zarr", train, test, V, (1, 1))
    model = OrdNMF(K, max_iter=80, tol=1e-14, executor="inprocess", n_members=1).fit(
        store, out=d / "m.zarr"
    )
    return Fitted(store, model, train, range(30), range(25))


# ------------------------------------------------------------------------------------ oracles


def oracle_top(w, h, exclude, n):
    """Per row: [(item index, score)] best first; excluded (-inf) items dropped."""
    s = w @ h.T
    s[exclude] = -np.inf
    out = []
    for row in s:
        order = np.lexsort((np.arange(len(row)), -row))[:n]
        out.append([(int(i), float(row[i])) for i in order if np.isfinite(row[i])])
    return out


def oracle_fold_in(y, eh, log_eh, alpha, family, params, tol=1e-6, max_iter=500):
    """Dense fold-in, one user at a time; y (n_new, I) classes or counts (0 = none)."""
    gh, out = np.exp(log_eh), []
    for yu in y:
        nz = yu > 0
        if family == "ordinal":
            delta = params["delta"]
            theta = np.array([delta[v + 1 :].sum() for v in range(len(delta))])
            gap = np.array([0.0] + [theta[0] - theta[v - 1] for v in range(1, len(delta))])
            fixed = theta[0] * eh.sum(0) - gap[yu[nz]] @ eh[nz]
        else:
            fixed = params["t"] * eh.sum(0)

        def sw(gw, yu=yu, nz=nz):
            lam = gh[nz] @ gw
            if family == "ordinal":
                x = lam * params["delta"][yu[nz]]
                en = x / -np.expm1(-x)
            else:
                r = params["t"] * lam / -np.log1p(-params["p"])
                yy = yu[nz].astype(float)
                en = np.where(yy == 1, 1.0, r * (digamma(yy + r) - digamma(r)))
            return gw * ((en / lam) @ gh[nz])

        w = np.ones(eh.shape[1])
        s = sw(w)
        for _ in range(max_iter):
            a, b = alpha + s, alpha / w.mean() + fixed
            new = a / b
            change = np.abs(new - w).sum() / w.sum()
            w = new
            if change < tol:
                break
            s = sw(np.exp(digamma(a) - np.log(b)))
        out.append(w)
    return np.array(out)


def read_parts(out):
    """{str(user): [(rank, str(item), score), ...]} from the Parquet parts of ``out``."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "recommendations", "part-*.parquet"))):
        table = pq.read_table(path)
        assert table.column_names == ["user", "rank", "item", "score"]
        for rec in table.to_pylist():
            rows.setdefault(str(rec["user"]), []).append(
                (rec["rank"], str(rec["item"]), rec["score"])
            )
    return rows


# ---------------------------------------------------------------------------- recommendations


@pytest.mark.parametrize("which", ["grid11", "grid23"])
def test_all_users_match_dense_oracle(request, mclient, tmp_path, which):
    f = request.getfixturevalue(which)
    n = 6
    out = recommend(f.store, f.model, mclient, n=n, out=tmp_path / "rec")
    assert out == str(tmp_path / "rec")
    assert sorted(os.listdir(tmp_path)) == ["rec"]  # no temporary directory left
    n_r = f.store.grid[0]
    assert sorted(os.listdir(out)) == ["_SUCCESS", "recommendations"]
    assert sorted(os.listdir(os.path.join(out, "recommendations"))) == [
        f"part-{r:05d}.parquet" for r in range(n_r)
    ]
    got = read_parts(out)
    ref = oracle_top(f.W, f.H, f.train > 0, n)
    for u, recs in enumerate(ref):
        if not recs:  # every item in train: no line at all
            assert str(f.users[u]) not in got
            continue
        lines = got[str(f.users[u])]
        assert [r for r, _, _ in lines] == list(range(1, len(recs) + 1))
        assert [item for _, item, _ in lines] == [str(f.items[i]) for i, _ in recs]
        np.testing.assert_allclose([s for _, _, s in lines], [s for _, s in recs], rtol=1e-12)
    assert len(got) == sum(1 for r in ref if r)
    with pytest.raises(InputError, match="already exists"):
        recommend(f.store, f.model, mclient, n=n, out=out)
    recommend(f.store, f.model.model_path_, mclient, n=2, out=out, overwrite=True)
    assert max(len(v) for v in read_parts(out).values()) == 2
    assert sorted(os.listdir(tmp_path)) == ["rec"]
    with pytest.raises(InputError, match="not a Parquet export written by ordnmf_dask"):
        recommend(f.store, f.model, mclient, out=tmp_path, overwrite=True)


def test_an_output_it_may_not_replace_is_refused_before_any_cluster_starts(
    grid23, tmp_path, monkeypatch
):
    """No work before every conflict is known: --out naming the training store is refused
    before a LocalCluster is started (or a given cluster used)."""
    from ordnmf_dask.postfit import executor as module

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was asked for before the output was checked")

    monkeypatch.setattr(module, "choose_client", no_cluster)
    with pytest.raises(InputError, match=f"it is the training store {grid23.store.path}"):
        recommend(grid23.store, grid23.model, None, out=grid23.store.path, overwrite=True)


def test_edge_users_in_part_files(grid23, mclient, tmp_path):
    got = read_parts(recommend(grid23.store, grid23.model, mclient, n=6, out=tmp_path / "r"))
    assert "u16" not in got  # user 5 has every item in train
    assert len(got["u19"]) == 2  # user 6: 29 - 27 items left


def test_part_file_written_in_slabs(grid23, mclient, tmp_path, monkeypatch):
    import ordnmf_dask.postfit.export as exp
    import ordnmf_dask.postfit.recommend as rec
    import ordnmf_dask.postfit.topn as topn

    out = rec.recommend(grid23.store, grid23.model, mclient, n=3, out=tmp_path / "r")
    rb = grid23.store.row_bounds
    cb = grid23.store.col_bounds
    tops = [
        topn._candidates(grid23.model.model_path_, grid23.store.path, 1, c, int(cb[c]), 3)
        for c in range(3)
    ]
    top = topn.metrics.merge_topk(topn.metrics.merge_topk(tops[0], tops[1], 3), tops[2], 3)
    monkeypatch.setattr(exp, "SLAB", 4)  # in this process only
    path = tmp_path / "slabbed.parquet"
    schema = pq.read_schema(Path(out) / "recommendations" / "part-00001.parquet")
    exp.recommendation_part(
        top, grid23.store.path, int(rb[1]), schema, LocalFileSystem(), str(path)
    )
    assert pq.ParquetFile(path).num_row_groups == -(-(int(rb[2]) - int(rb[1])) // 4)
    assert pq.read_table(path).equals(
        pq.read_table(Path(out) / "recommendations" / "part-00001.parquet")
    )


def test_given_users_match_oracle(grid23, mclient):
    f = grid23
    asked = ["u73", "u1", "u19", "u73", "u100"]  # two blocks, a repeat, user 6 (2 items left)
    res = recommend(f.store, f.model, mclient, n=4, users=asked)
    assert list(res) == ["u73", "u1", "u19", "u100"]
    ref = oracle_top(f.W, f.H, f.train > 0, 4)
    for user, recs in res.items():
        expect = ref[f.users.index(user)]
        assert [item for item, _ in recs] == [f.items[i] for i, _ in expect]
        np.testing.assert_allclose([s for _, s in recs], [s for _, s in expect], rtol=1e-12)
    assert len(res["u19"]) == 2


def test_given_users_integer_ids_and_unknown(grid11, grid23, mclient):
    res = recommend(grid11.store, grid11.model, mclient, n=3, users=["7", 2])
    ref = oracle_top(grid11.W, grid11.H, grid11.train > 0, 3)
    assert [i for i, _ in res["7"]] == [i for i, _ in ref[7]]
    assert [i for i, _ in res[2]] == [i for i, _ in ref[2]]
    with pytest.raises(InputError, match="unknown user id 'x9'"):
        recommend(grid11.store, grid11.model, mclient, users=[1, "x9"])
    with pytest.raises(InputError, match="unknown user id 'u2'"):
        recommend(grid23.store, grid23.model, mclient, users=["u1", "u2"])
    with pytest.raises(InputError, match="does not match store"):
        recommend(grid11.store, grid23.model, mclient, users=[1])
    with pytest.raises(InputError, match="either users"):
        recommend(grid11.store, grid11.model, mclient)


# ------------------------------------------------------------------------------------ fold-in


def _new_users(f, seed):
    """Three new users: a few random (item, class) pairs each, one with no interaction."""
    rng = np.random.default_rng(seed)
    n_items = len(f.items)
    y = np.zeros((3, n_items), dtype=np.int64)
    for j, m in enumerate((5, 9, 0)):
        idx = rng.choice(n_items, m, replace=False)
        y[j, idx] = rng.integers(1, V + 1, m)
    items = [np.flatnonzero(row).tolist() for row in y]
    values = [row[row > 0].tolist() for row in y]
    return y, items, values


def test_fold_in_matches_dense_oracle(grid23, mclient):
    f = grid23
    y, items, values = _new_users(f, 0)
    raw = [[f.items[i] for i in a] for a in items]
    w = fold_in(f.model, raw, values, store=f.store, client=mclient)
    ref = oracle_fold_in(y, f.H, f.logH, 0.3, "ordinal", {"delta": np.asarray(f.attrs["delta"])})
    np.testing.assert_allclose(w, ref, rtol=1e-10)
    by_index = fold_in(f.model.model_path_, items, values, client=mclient)  # indices, no store
    np.testing.assert_array_equal(by_index, w)
    # recommendations for them: the dense oracle, excluding what they were folded in with
    recs = recommend_for(f.model, w, raw, 4, store=f.store, client=mclient)
    expect = oracle_top(w, f.H, y > 0, 4)
    assert list(recs) == list(range(len(w)))  # recommend's shape, keyed by the row of w
    for got, exp in zip(recs.values(), expect, strict=True):
        assert [i for i, _ in got] == [f.items[i] for i, _ in exp]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in exp], rtol=1e-12)
    idx = recommend_for(f.model, w, items, 4, client=mclient)
    assert [[i for i, _ in idx[j]] for j in range(len(w))] == [[i for i, _ in e] for e in expect]
    with pytest.raises(InputError, match="unknown item id 7"):
        fold_in(f.model, [[100, 7]], [[1, 2]], store=f.store, client=mclient)
    with pytest.raises(
        InputError,
        match=r"rating 5 is off the integer scale 1\.\.4; pass values on the scale the store "
        r"was ingested from: integer ratings 1\.\.4",
    ):
        fold_in(f.model, [[0, 1]], [[1, 5]], client=mclient)
    with pytest.raises(InputError, match="given twice"):
        fold_in(f.model, [[3, 3]], [[1, 2]], client=mclient)


def test_fold_in_dcpf_and_bepof(grid11, mclient, tmp_path):
    f = grid11
    y, items, values = _new_users(f, 1)
    dc = DcPF(K, max_iter=4, n_members=1).fit(f.store, mclient, out=tmp_path / "dc.zarr")
    m = open_model(dc.model_path_)
    eh, log_eh = m.factor("H").compute(), m.factor("H", "log_mean").compute()
    w = fold_in(dc, items, values, client=mclient, tol=1e-9)
    params = {"p": float(m.attrs["p"]), "t": float(m.attrs["t"])}
    np.testing.assert_allclose(
        w, oracle_fold_in(y, eh, log_eh, 0.3, "dcpf", params, tol=1e-9), rtol=1e-10
    )
    be = BePoF(K, threshold=3, max_iter=4, n_members=1).fit(
        f.store, mclient, out=tmp_path / "be.zarr"
    )
    m = open_model(be.model_path_)
    eh, log_eh = m.factor("H").compute(), m.factor("H", "log_mean").compute()
    w = fold_in(be, items, values, client=mclient)  # classes < 3 dropped, the rest -> 1
    ref = oracle_fold_in(
        (y >= 3).astype(np.int64),
        eh,
        log_eh,
        0.3,
        "ordinal",
        {"delta": np.asarray(m.attrs["delta"])},
    )
    np.testing.assert_allclose(w, ref, rtol=1e-10)


def test_fold_in_of_existing_users_recovers_their_factors(grid11, mclient):
    """Folding in a training user's row with the fitted H gives back (about) its fitted E[w].

    Not equal: the fitted E[w_u] is the W update given H of the previous iteration, whereas the
    fold-in is the fixed point given the final H; the gap is the fit's last step, small once
    the fit has settled (80 iterations here: about 1e-2 at most, 1e-3 for a typical user).
    q(w_u) may also have several fixed points for a user with few interactions, and the fold-in
    starts from E[w] = 1, not from the fit's trajectory: hence also the top-5 overlap.
    """
    f = grid11
    items = [np.flatnonzero(row).tolist() for row in f.train]
    values = [row[row > 0].tolist() for row in f.train]
    w = fold_in(f.model, items, values, client=mclient, tol=1e-10, max_iter=5000)
    rel = np.abs(w - f.W).sum(axis=1) / f.W.sum(axis=1)
    assert np.median(rel) < 5e-3 and rel.max() < 5e-2, (np.median(rel), rel.max())
    got = oracle_top(w, f.H, f.train > 0, 5)
    ref = oracle_top(f.W, f.H, f.train > 0, 5)
    overlap = [
        len({i for i, _ in a} & {i for i, _ in b}) / 5 for a, b in zip(got, ref, strict=True)
    ]
    assert np.mean(overlap) >= 0.95
    # started from the fitted E[w], the pure kernel stays there to the same accuracy
    u, i = np.nonzero(f.train)
    block = CsrBlock.from_coo(u, i, f.train[u, i].astype(np.uint8), f.train.shape)
    lik = Likelihood("ordinal", delta=np.asarray(f.attrs["delta"]))
    res = fold_in_rows(block, f.H, f.logH, f.H.sum(0), 0.3, lik, tol=1e-10, init=f.W)
    assert res.converged.all()
    assert (np.abs(res.mean - f.W).sum(axis=1) / f.W.sum(axis=1)).max() < 5e-2


# ---------------------------------------------------------------------------------------- CLI


def test_cli_recommend(grid23, mclient, tmp_path, capsys, monkeypatch):
    """--out on the cluster; --users in memory, and on the cluster when the factors would not
    fit in memory (the same lines)."""
    from ordnmf_dask.postfit import serving

    f = grid23
    out = tmp_path / "cli"
    assert main(["recommend", f.store.path, f.model.model_path_, "--out", str(out), "-n", "3"]) == 0
    assert len(read_parts(out)["u1"]) == 3
    assert main(["recommend", f.store.path, f.model.model_path_, "--out", str(out)]) == 2
    capsys.readouterr()
    cmd = ["recommend", f.store.path, f.model.model_path_]
    printed = []
    for memory in (True, False):
        if not memory:
            monkeypatch.setattr(serving, "fits_in_memory", lambda model: False)
            monkeypatch.setattr(serving, "server", None)  # any use of it fails
            cmd += ["--scheduler", mclient.scheduler.address]
        assert main([*cmd, "--users", "u1,u4", "-n", "2"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[0] == "user\trank\titem\tscore"
        assert [ln.split("\t")[:2] for ln in lines[1:]] == [
            ["u1", "1"],
            ["u1", "2"],
            ["u4", "1"],
            ["u4", "2"],
        ]
        ref = oracle_top(f.W, f.H, f.train > 0, 2)[0]
        assert [int(ln.split("\t")[2]) for ln in lines[1:3]] == [f.items[i] for i, _ in ref]
        printed.append(lines)
        assert main([*cmd, "--users", "u1,nope"]) == 2
        assert "unknown user id 'nope'" in capsys.readouterr().err
    assert printed[0] == printed[1]


def test_evaluate_on_a_user_sample_matches_the_oracle_on_those_users(tmp_path, mclient):
    """NDCG over a seeded sample of users is the oracle's NDCG over exactly those users; the
    test log-likelihood still covers every test nonzero."""
    import oracle

    from ordnmf_dask.postfit.evaluate import evaluate, sampled_users

    train, test = dense_split(synthetic_ordinal(41, 23, V, k=K, density=0.35, seed=5))
    store = store_from_dense(tmp_path / "s.zarr", train, test, V, (2, 2))
    model = OrdNMF(K, max_iter=4, n_members=1).fit(store, mclient, out=tmp_path / "m.zarr")
    m = open_model(model.model_path_)
    w, h = m.factor("W").compute(), m.factor("H").compute()
    full = evaluate(store, model, mclient, k=5)
    part = evaluate(store, model, mclient, k=5, user_fraction=0.5, seed=7)
    rb = store.row_bounds
    kept = np.concatenate(
        [rb[r] + sampled_users(r, int(rb[r + 1] - rb[r]), 0.5, 7) for r in range(2)]
    )
    assert 5 < len(kept) < 36
    for s in range(1, V + 1):
        want = oracle.ndcg_at_k(w, h, train, test, s, k=5)
        assert full["ndcg"][s] == pytest.approx(want, rel=1e-12, nan_ok=True)
        want = oracle.ndcg_at_k(w[kept], h, train[kept], test[kept], s, k=5)
        assert part["ndcg"][s] == pytest.approx(want, rel=1e-12, nan_ok=True)
    assert part["n_users"][1] < full["n_users"][1]
    assert part["test_loglik"] == full["test_loglik"] and part["user_fraction"] == 0.5
    with pytest.raises(InputError, match="user_fraction"):
        evaluate(store, model, mclient, user_fraction=0.0)
