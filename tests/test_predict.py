"""Class probabilities, ratings and calibration of a saved model (ordnmf_dask/postfit/predict.py,
calibrate.py; docs/design.md, "Class probabilities"), against dense computations written here
from the saved factors (E[W], E[H], their posterior shapes) and thresholds."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from scipy import stats
from test_serving import write_model

from ordnmf_dask.errors import InputError
from ordnmf_dask.estimator import BePoF, DcPF, OrdNMF
from ordnmf_dask.model.thresholds import theta_from_delta
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.postfit.evaluate import evaluate

V, K = 4, 3
N_USERS, N_ITEMS = 37, 29
DELTA = [0.0, 0.4, 0.3, 0.2, 0.5]


def save_shapes(path, store, w, h, aw, ah) -> None:
    """Rewrite the model's factor chunks with posterior shapes ``aw``, ``ah``."""
    for name, x, a, bounds in (("W", w, aw, store.row_bounds), ("H", h, ah, store.col_bounds)):
        for j in range(len(bounds) - 1):
            rows = slice(int(bounds[j]), int(bounds[j + 1]))
            chunk = FactorChunk(x[rows].copy(), x[rows] * 0.9, shape=a[rows].copy())
            with np.errstate(divide="ignore"):  # the zero row's log and rate
                chunkstore.save_chunk(chunk, str(path), name, j)


class Model:
    """A store (2 x 3 grid, string user ids, integer item ids) and an OrdNMF model on it with
    chosen factors and posterior shapes; ``scale`` records the store's value scale."""

    def __init__(self, tmp_path, estimator=None, attrs=None, scale=None, name="m.zarr"):
        rng = np.random.default_rng(7)
        tmp_path = tmp_path / name.removesuffix(".zarr")
        tmp_path.mkdir()
        y = synthetic_ordinal(N_USERS, N_ITEMS, V, k=K, seed=3)
        self.train, self.test = dense_split(y)
        self.users = np.array([f"u{3 * j + 1}" for j in range(N_USERS)])
        self.items = 100 + 5 * np.arange(N_ITEMS)
        self.store = store_from_dense(
            tmp_path / "s.zarr", self.train, self.test, V, (2, 3), self.users, self.items
        )
        self.W = rng.gamma(1.0, 1.0, (N_USERS, K))
        self.H = rng.gamma(1.0, 1.0, (N_ITEMS, K))
        self.W[5] = 0.0  # a zero row: its rates are 0
        self.aW = rng.uniform(0.5, 30.0, (N_USERS, K))
        self.aH = rng.uniform(0.5, 30.0, (N_ITEMS, K))
        estimator = estimator or OrdNMF(K, n_members=1)
        attrs = dict(attrs or {})
        if scale is not None:
            attrs["store"] = {**self._store_record(), **scale}
        with np.errstate(divide="ignore"):  # log of the zero row's entries
            self.path = write_model(tmp_path / name, self.store, self.W, self.H, estimator, attrs)
            save_shapes(self.path, self.store, self.W, self.H, self.aW, self.aH)
        self.model = type(estimator).load(self.path)
        self.delta = np.asarray(attrs.get("delta", DELTA))
        self.theta = theta_from_delta(self.delta)

    def _store_record(self):
        from ordnmf_dask.modelstore.model import store_fingerprint

        s = self.store
        return {
            "path": s.path,
            "n_users": s.n_users,
            "n_items": s.n_items,
            "n_classes": s.n_classes,
            "nnz_train": s.nnz_train,
            "fingerprint": store_fingerprint(s.path),
        }

    def oracle(self, u, i, posterior, given=False):
        """P(y = v) of pairs of indices, one pair at a time from the formulas."""
        out = np.zeros((len(u), len(self.theta)))
        for j, (a, b) in enumerate(zip(u, i, strict=True)):
            mean = sum(self.W[a, k] * self.H[b, k] for k in range(K))
            ew2 = self.W[a] ** 2 * (1 + 1 / self.aW[a])
            eh2 = self.H[b] ** 2 * (1 + 1 / self.aH[b])
            var = sum(ew2[k] * eh2[k] - (self.W[a, k] * self.H[b, k]) ** 2 for k in range(K))
            if posterior == "mean" or mean == 0:
                cdf = np.exp(-mean * self.theta)
            else:
                cdf = (1 + self.theta * var / mean) ** (-(mean**2) / var)
            out[j] = np.diff(np.concatenate([[0.0], cdf]))
            if given:
                if mean == 0:
                    out[j] = np.concatenate([[0.0], -np.diff(self.theta) / self.theta[0]])
                else:
                    out[j] = np.concatenate([[0.0], out[j, 1:] / (1 - cdf[0])])
        return out


@pytest.fixture
def m(tmp_path):
    return Model(tmp_path)


def _pairs(m, n=60, seed=0):
    rng = np.random.default_rng(seed)
    u, i = rng.integers(0, N_USERS, n), rng.integers(0, N_ITEMS, n)
    u[:3] = 5  # the zero row
    return u, i, list(m.users[u]), [int(x) for x in m.items[i]]


@pytest.mark.parametrize("posterior", ["gamma", "mean"])
@pytest.mark.parametrize("given", [False, True])
def test_predict_proba_matches_the_dense_oracle(m, posterior, given):
    u, i, users, items = _pairs(m)
    p = m.model.predict_proba(users, items, given_interaction=given, posterior=posterior)
    assert p.shape == (len(u), V + 1)
    np.testing.assert_allclose(p, m.oracle(u, i, posterior, given), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    if given:
        assert np.all(p[:, 0] == 0)


def test_predict_proba_monotone_in_the_rate(m):
    """Scaling a user's E[w] (and so its posterior sd, shapes kept) up raises every
    P(y >= s | y > 0) and lowers P(y = 0) of its pairs, for both posteriors."""
    from ordnmf_dask.model import classlaw
    from ordnmf_dask.postfit.predict import predictor

    pred = predictor(m.model._server())
    items = np.arange(N_ITEMS)
    limit = classlaw.ordinal_limit(m.theta)
    for posterior in ("gamma", "mean"):
        last = None
        for scale in (0.25, 0.5, 1.0, 2.0, 4.0):
            w = m.W[:1] * scale
            var = w**2 / m.aW[:1]
            pairs = pred.pairs(w, var, np.zeros(N_ITEMS, np.int64), items, posterior)
            h = pred.law.pair_hazards(*pairs)
            now = np.stack(
                [classlaw.at_least(h, s, limit) for s in (2, 3, 4)] + [-np.exp(-h[:, 0])]
            )
            if last is not None:
                assert np.all(now >= last - 1e-15)
            last = now


def test_unknown_ids_and_unequal_lengths_are_refused(m):
    with pytest.raises(InputError, match="unknown user id 'nobody'"):
        m.model.predict_proba(["u1", "nobody"], [100, 105])
    with pytest.raises(InputError, match="unknown item id 7"):
        m.model.predict(["u1"], [7])
    with pytest.raises(InputError, match="as many users as items"):
        m.model.predict_proba(["u1", "u4"], [100])
    with pytest.raises(InputError, match="posterior"):
        m.model.predict_proba(["u1"], [100], posterior="exact")
    with pytest.raises(InputError, match="kind"):
        m.model.predict(["u1"], [100], kind="average")


def test_predict_on_the_store_scale(tmp_path):
    half = Model(tmp_path, scale={"value_kind": "ratings-halfstar", "thresholds": None})
    u, i, users, items = _pairs(half, 40, seed=1)
    law = half.oracle(u, i, "mean", given=True)
    expected = law @ (np.arange(V + 1) / 2)
    np.testing.assert_allclose(half.model.predict(users, items), expected, rtol=1e-10)
    mode = np.array([1 + int(np.argmax(row[1:])) for row in law])
    median = np.array([1 + int(np.argmax(np.cumsum(row[1:]) >= 0.5)) for row in law])
    np.testing.assert_array_equal(half.model.predict(users, items, kind="mode"), mode / 2)
    np.testing.assert_array_equal(half.model.predict(users, items, kind="median"), median / 2)
    np.testing.assert_array_equal(
        half.model.predict(users, items, kind="mode", scale="class"), mode
    )
    # classes that are no points of a scale (a synthetic store's) are predicted as classes only
    synthetic = Model(
        tmp_path, scale={"value_kind": "synthetic", "thresholds": None}, name="syn.zarr"
    )
    with pytest.raises(InputError, match="'synthetic' are not points of a rating scale: use scale"):
        synthetic.model.predict(users, items)
    np.testing.assert_array_equal(
        synthetic.model.predict(users, items, kind="mode", scale="class"), mode
    )


def test_predict_on_count_classes(tmp_path):
    edges = [0, 1, 2, 5]
    counts = Model(tmp_path, scale={"value_kind": "counts", "thresholds": edges})
    u, i, users, items = _pairs(counts, 30, seed=2)
    law = counts.oracle(u, i, "mean", given=True)
    median = np.array([1 + int(np.argmax(np.cumsum(row[1:]) >= 0.5)) for row in law])
    lo = np.array([0, 1, 2, 3, 6])[median]
    hi = np.array([0, 1, 2, 5, np.inf])[median]
    got = counts.model.predict(users, items, kind="median")
    np.testing.assert_array_equal(got, np.stack([lo, hi], axis=1))
    with pytest.raises(InputError, match="no expected value"):
        counts.model.predict(users, items)


def test_recommend_with_proba_at(m):
    recs = m.model.recommend(["u1", "u73"], n=5, proba_at=3)
    plain = m.model.recommend(["u1", "u73"], n=5)
    for user in ("u1", "u73"):
        assert [(a, b) for a, b, _ in recs[user]] == plain[user]
        items = [a for a, _, _ in recs[user]]
        p = m.model.predict_proba([user] * len(items), items, given_interaction=True)
        np.testing.assert_allclose([x for _, _, x in recs[user]], p[:, 3:].sum(axis=1), rtol=1e-10)
    with pytest.raises(InputError, match="proba_at must be a class in 1..4"):
        m.model.recommend(["u1"], n=5, proba_at=5)


def test_recommend_for_with_proba_at(m):
    w = m.W[[2, 9]]
    recs = m.model.recommend_for(w, n=4, proba_at=2)
    for j in (0, 1):
        items = [a for a, _, _ in recs[j]]
        idx = np.searchsorted(m.items, items)
        lam = m.H[idx] @ w[j]
        want = (1 - np.exp(-lam * m.theta[1])) / (
            1 - np.exp(-lam * m.theta[0])
        )  # P(y >= 2 | y > 0)
        assert np.all(np.diff(want) <= 1e-15)  # falls down the list as the score does
        np.testing.assert_allclose([x for _, _, x in recs[j]], want, rtol=1e-10)


def test_binarized_and_dcpf_models_say_what_they_lack(tmp_path):
    bepof = Model(
        tmp_path, BePoF(K, threshold=3, n_members=1), attrs={"delta": [0.0, 0.7]}, name="b.zarr"
    )
    p = bepof.model.predict_proba(["u1"], [100])
    assert p.shape == (1, 2)
    with pytest.raises(InputError, match="binarized"):
        bepof.model.predict(["u1"], [100])
    with pytest.raises(InputError, match="binarized"):
        bepof.model.recommend(["u1"], proba_at=1)
    dcpf = Model(
        tmp_path, DcPF(K, n_members=1), attrs={"family": "dcpf", "p": 0.3, "t": 1.0}, name="d.zarr"
    )
    with pytest.raises(InputError, match="no law of the classes"):
        dcpf.model.predict_proba(["u1"], [100])


def test_dcpf_on_counts_gives_the_count_mass_of_each_class(tmp_path):
    edges = [0, 1, 2, 5]
    dcpf = Model(
        tmp_path,
        DcPF(K, n_members=1),
        attrs={"family": "dcpf", "p": 0.3, "t": 1.5},
        scale={"value_kind": "counts", "thresholds": edges},
    )
    u, i, users, items = _pairs(dcpf, 20, seed=3)
    u, users, items = u[3:], users[3:], items[3:]  # not the zero row
    lam = np.einsum("ij,ij->i", dcpf.W[u], dcpf.H[i[3:]])
    dist = stats.nbinom(1.5 * lam[:, None] / -np.log1p(-0.3), 0.7)
    counts = np.arange(2000)
    pmf = dist.pmf(counts[None])
    cls = np.searchsorted(np.asarray(edges), counts, side="left")
    want = np.stack([pmf[:, cls == v].sum(axis=1) for v in range(V + 1)], axis=1)
    np.testing.assert_allclose(dcpf.model.predict_proba(users, items), want, rtol=1e-8)


def _oracle_calibration(m, posterior):
    """The held-out metrics of docs/design.md, "Class probabilities", over the dense test
    matrix, pair by pair."""
    u, i = np.nonzero(m.test)
    y = m.test[u, i]
    law = m.oracle(u, i, posterior, given=True)
    n = len(y)
    onehot = np.eye(V + 1)[y]
    expected = law @ np.arange(V + 1)
    out = {
        "log_loss": -np.mean(np.log(law[np.arange(n), y])),
        "brier": np.mean(((law - onehot) ** 2).sum(axis=1)),
        "rmse": np.sqrt(np.mean((expected - y) ** 2)),
        "mae": np.mean(np.abs(expected - y)),
        "ece": {},
    }
    for s in range(1, V + 1):
        q = law[:, s:].sum(axis=1)
        total = 0.0
        for b in range(10):
            inside = (np.minimum(np.floor(q * 10), 9) == b) & (q >= 0)
            if inside.any():
                total += abs(q[inside].sum() - (y[inside] >= s).sum())
        out["ece"][s] = total / n
    return out


@pytest.mark.parametrize("posterior", ["gamma", "mean"])
def test_evaluate_reports_calibration_against_the_dense_oracle(m, posterior):
    res = evaluate(m.store, m.path, k=5, posterior=posterior)
    cal = res["calibration"]
    want = _oracle_calibration(m, posterior)
    assert cal["n"] == int((m.test > 0).sum())
    for key in ("log_loss", "brier", "rmse", "mae"):
        assert cal[key] == pytest.approx(want[key], rel=1e-9), key
    for s in range(1, V + 1):
        assert cal["ece"][s] == pytest.approx(want["ece"][s], rel=1e-9, abs=1e-12)
    assert sum(b[0] for b in cal["reliability"][2]) == cal["n"]
    if posterior == "mean":  # the plug-in law's log-loss is the test log-likelihood
        assert cal["log_loss"] == pytest.approx(-res["test_loglik_mean"], rel=1e-10)


def test_cli_evaluate_prints_calibration_and_draws_reliability(m, tmp_path, capsys):
    from ordnmf_dask.app.cli import main

    png, out = tmp_path / "rel.png", tmp_path / "res.json"
    argv = ["evaluate", m.store.path, m.path, "--k", "5", "--json", str(out)]
    assert main([*argv, "--reliability", str(png), "--posterior", "gamma"]) == 0
    text = capsys.readouterr().out
    import json

    cal = json.loads(out.read_text())["calibration"]
    assert cal["posterior"] == "gamma"
    assert f"log-loss {cal['log_loss']:.4f}" in text
    assert cal["log_loss"] == pytest.approx(_oracle_calibration(m, "gamma")["log_loss"], rel=1e-9)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_with_proba_at_matches_predict_proba(m, tmp_path):
    import pyarrow.parquet as pq

    from ordnmf_dask.postfit.export import export

    out = export(m.path, tmp_path / "x", what=["recommendations"], n=4, proba_at=3)
    table = pq.read_table(f"{out}/recommendations").to_pandas()
    assert list(table.columns) == ["user", "rank", "item", "score", "proba"]
    assert len(table) == 4 * N_USERS
    p = m.model.predict_proba(
        table["user"].tolist(), table["item"].tolist(), given_interaction=True
    )
    np.testing.assert_allclose(table["proba"], p[:, 3:].sum(axis=1), rtol=1e-10)
    recs = m.model.recommend(["u1"], n=4, proba_at=3)["u1"]
    mine = table[table["user"] == "u1"].sort_values("rank")
    assert [i for i, _, _ in recs] == mine["item"].tolist()
    with pytest.raises(InputError, match="export them too"):
        export(m.path, tmp_path / "y", what=["factors"], proba_at=3)
    with pytest.raises(InputError, match="proba_at must be a class"):
        export(m.path, tmp_path / "z", what=["recommendations"], proba_at=0)


def test_cli_recommend_prints_proba_at(m, capsys):
    from ordnmf_dask.app.cli import main

    assert (
        main(["recommend", m.store.path, m.path, "--users", "u1,u4", "-n", "3", "--proba-at", "2"])
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "user\trank\titem\tscore\tP(y>=2|y>0)"
    recs = m.model.recommend(["u1", "u4"], n=3, proba_at=2)
    want = [
        f"{u}\t{r}\t{i}\t{s:.10g}\t{p:.10g}"
        for u in ("u1", "u4")
        for r, (i, s, p) in enumerate(recs[u], 1)
    ]
    assert lines[1:] == want


def test_active_components_and_thresholds_in_info(tmp_path, capsys):
    import json

    from ordnmf_dask.app.cli import main
    from ordnmf_dask.model.components import max_count_share
    from ordnmf_dask.params import DEFAULTS

    alpha = DEFAULTS["alpha_W"]
    shape = np.array([[alpha + 3.0, alpha, alpha + 1e-4], [alpha + 1.0, alpha + 1e-3, alpha + 5.0]])
    counts = shape - alpha
    want = [max(counts[u, k] / counts[u].sum() for u in range(2)) for k in range(3)]
    np.testing.assert_allclose(max_count_share(shape, alpha), want, rtol=1e-12)

    m = Model(tmp_path)
    m.aW[:, 1] = alpha + 1e-6 * m.aW[:, 1]  # component 1: no user puts a count on it
    save_shapes(m.path, m.store, m.W, m.H, m.aW, m.aH)
    model = OrdNMF.load(m.path)
    assert model.n_active_components_ == K - 1
    assert main(["info", m.path, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["n_active_components"] == K - 1 and s["active_components"] == [0, 2]
    for row in s["thresholds_as_classes"]:
        assert sum(row["probs"]) == pytest.approx(1.0)
        assert 1 - np.exp(-row["rate"] * m.theta[0]) == pytest.approx(row["reach"])
        assert row["expected_class"] == pytest.approx(np.dot(row["probs"], np.arange(1, V + 1)))
    assert main(["info", m.path]) == 0
    assert f"components {K - 1} active of {K}" in capsys.readouterr().out


def test_calibration_on_data_drawn_from_the_model(tmp_path):
    """Classes drawn from a known ordinal law: a model holding the generating factors (shapes so
    large that q is a point) is calibrated within sampling noise, its log-loss is the law's
    entropy, and a model with its rates halved is visibly miscalibrated."""
    from ordnmf_dask.model import classlaw

    rng = np.random.default_rng(11)
    n_users, n_items, k = 120, 90, 3
    w, h = rng.gamma(1.0, 0.6, (n_users, k)), rng.gamma(1.0, 0.6, (n_items, k))
    theta = theta_from_delta(np.asarray(DELTA))
    lam = w @ h.T
    law = classlaw.class_law(
        classlaw.plugin_hazards(lam.ravel(), theta), classlaw.ordinal_limit(theta)
    )
    y = (rng.random(lam.size)[:, None] > np.cumsum(law, axis=1)).sum(axis=1).reshape(lam.shape)
    y[0, :V] = np.arange(1, V + 1)
    train, test = dense_split(y, 0.5, seed=2)
    store = store_from_dense(tmp_path / "s.zarr", train, test, V, (2, 2))
    results = {}
    for name, scale in (("true", 1.0), ("halved", 0.5)):
        path = write_model(tmp_path / f"{name}.zarr", store, w * scale, h, OrdNMF(k, n_members=1))
        save_shapes(path, store, w * scale, h, np.full(w.shape, 1e9), np.full(h.shape, 1e9))
        results[name] = evaluate(store, path, k=5, posterior="gamma")["calibration"]
    n = results["true"]["n"]
    u, i = np.nonzero(test)
    given = classlaw.class_law(
        classlaw.plugin_hazards(lam[u, i], theta), classlaw.ordinal_limit(theta), True
    )
    entropy = -(given[:, 1:] * np.log(given[:, 1:])).sum(axis=1)
    surprise = -np.log(given[np.arange(n), test[u, i]])  # its mean estimates the entropy's
    noise = 3 * np.sqrt(np.var(surprise) / n)
    assert results["true"]["log_loss"] == pytest.approx(entropy.mean(), abs=noise)
    for s in range(2, V + 1):  # 10 bins of n pairs: sampling noise about 0.5 sqrt(10 / n)
        assert results["true"]["ece"][s] < 0.7 * np.sqrt(10 / n)
    assert max(results["halved"]["ece"].values()) > 2 * max(results["true"]["ece"].values())
    assert results["halved"]["log_loss"] > results["true"]["log_loss"]
