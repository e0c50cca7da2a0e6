"""``fit`` on data in memory (scipy.sparse, pandas, dask, pyarrow, arrays): the model of
``ingest`` + ``fit(store)``, a temporary store that the fit owns, and errors that say what to
use. In-process fits of a small matrix."""

from __future__ import annotations

import gc

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import scipy.sparse as sp

from ordnmf_dask import PF, BePoF, DcPF, InputError, OrdNMF, ingest, open_store
from ordnmf_dask.modelstore.model import open_model

N_USERS, N_ITEMS, ITERS = 24, 17, 6


def ratings(seed: int = 0, scale: float = 1.0) -> sp.csr_matrix:
    """A users x items matrix of integer ratings 1..4 (times ``scale``), every row and column
    with an entry."""
    rng = np.random.default_rng(seed)
    shape = (N_USERS, N_ITEMS)
    dense = np.where(rng.random(shape) < 0.35, rng.integers(1, 5, shape), 0).astype(float)
    dense[np.arange(N_USERS), np.arange(N_USERS) % N_ITEMS] = 3
    dense[np.arange(N_ITEMS) % N_USERS, np.arange(N_ITEMS)] = 2
    return sp.csr_matrix(dense * scale)


def triples(x: sp.spmatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    coo = x.tocoo()
    return coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data


def write_csv(path, x: sp.spmatrix):
    u, i, v = triples(x)
    path.write_text("".join(f"{a},{b},{c:g}\n" for a, b, c in zip(u, i, v, strict=True)))
    return path


def state_of(est) -> dict[str, object]:
    """The fitted factors, the family's parameters and the ELBO trace."""
    m = open_model(est.model_path_)
    out: dict[str, object] = {
        f"{n}.{f}": np.asarray(m.factor(n, f).compute())
        for n in ("W", "H")
        for f in ("mean", "log_mean")
    }
    out["elbo"] = list(est.elbo_)
    out["params"] = est.theta_.tolist() if hasattr(est, "theta_") else est.p_
    return out


def assert_bitwise(a: dict[str, object], b: dict[str, object], what: str = "") -> None:
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], np.ndarray):
            assert np.array_equal(a[name], b[name]), f"{what} {name}"
        else:
            assert a[name] == b[name], f"{what} {name}"  # floats compared exactly


def fit(data, **kw) -> dict[str, object]:
    """The state of a short K = 2 fit of ``data`` (``kw``: fit's keywords)."""
    return state_of(OrdNMF(2, max_iter=ITERS, tol=1e-12, n_members=1).fit(data, **kw))


def data_dirs(work) -> list:
    return sorted(work.glob("ordnmf-data-*")) if work.exists() else []


@pytest.mark.parametrize(
    ("klass", "kw"),
    [(OrdNMF, {}), (BePoF, {"threshold": 3}), (PF, {"threshold": 2}), (DcPF, {"p": 0.3})],
)
def test_fit_on_a_sparse_matrix_is_bitwise_the_fit_on_the_same_rows_ingested_from_csv(
    tmp_path, klass, kw
):
    x = ratings()
    store = ingest(write_csv(tmp_path / "r.csv", x), tmp_path / "r.zarr", test_fraction=0.0)
    on_store = klass(2, max_iter=ITERS, tol=1e-12, **kw, n_members=1).fit(
        store, out=tmp_path / "a.zarr"
    )
    in_memory = klass(2, max_iter=ITERS, tol=1e-12, **kw, n_members=1).fit(
        x, out=tmp_path / "b.zarr"
    )
    assert_bitwise(state_of(in_memory), state_of(on_store))
    assert in_memory.W_.shape == (N_USERS, 2) and in_memory.H_.shape == (N_ITEMS, 2)


def test_every_kind_in_memory_gives_the_model_of_the_matrix(tmp_path):
    x = ratings(1)
    u, i, v = triples(x)
    frame = pd.DataFrame({"user": u, "item": i, "value": v})

    reference = fit(x)
    kinds = {
        "coo": x.tocoo(),
        "csc": x.tocsc(),
        "lil": x.tolil(),
        "csr_array": sp.csr_array(x),
        "arrays": (u, i, v),
        "pandas": frame,
        "pyarrow": pa.Table.from_pandas(frame),
        "dask": dd.from_pandas(frame, npartitions=3),
    }
    for name, data in kinds.items():
        assert_bitwise(fit(data), reference, name)
    renamed = frame.rename(columns={"user": "u", "item": "i", "value": "r"})[["r", "i", "u"]]
    assert_bitwise(fit(renamed, ingest_options={"columns": ["u", "i", "r"]}), reference)


def test_a_frame_is_read_by_column_name_never_by_position(tmp_path):
    """Columns reordered and named as MovieLens names them give the model of the canonical
    frame; names that tell nothing, or positions, are refused naming the frame's columns."""
    x = ratings(1)
    u, i, v = triples(x)
    frame = pd.DataFrame({"user": u, "item": i, "value": v})

    reference = fit(frame)
    movielens = frame.rename(columns={"user": "userId", "item": "movieId", "value": "rating"})
    reordered = movielens[["movieId", "rating", "userId"]]
    assert_bitwise(fit(reordered), reference, "pandas, reordered")
    assert_bitwise(fit(pa.Table.from_pandas(reordered)), reference, "pyarrow, reordered")
    assert_bitwise(fit(dd.from_pandas(reordered, npartitions=2)), reference, "dask, reordered")
    shop = frame.rename(columns={"user": "customer", "item": "product", "value": "stars"})
    work = tmp_path / "work"
    with pytest.raises(InputError, match=r"customer, product, stars.*columns=\(USER, ITEM"):
        OrdNMF(2, max_iter=1, work_dir=str(work), n_members=1).fit(shop)
    assert_bitwise(
        fit(shop, ingest_options={"columns": ("customer", "product", "stars")}), reference
    )
    twice = movielens.assign(user_id=u)
    with pytest.raises(InputError, match=r"2 could be the user \(userId, user_id\)"):
        OrdNMF(2, max_iter=1, work_dir=str(work), n_members=1).fit(twice)
    with pytest.raises(InputError, match=r"are positions; a table's columns are picked by name"):
        OrdNMF(2, max_iter=1, work_dir=str(work), n_members=1).fit(
            reordered, ingest_options={"columns": (2, 0, 1)}
        )
    assert data_dirs(work) == []


def test_all_of_x_trains_unless_a_test_split_is_asked_for(tmp_path):
    x = ratings(2)
    est = OrdNMF(2, max_iter=2, n_members=1).fit(x)
    assert open_model(est.model_path_).attrs["store"]["nnz_train"] == x.nnz
    est = OrdNMF(2, max_iter=2, n_members=1).fit(
        x, ingest_options={"test_fraction": 0.25, "seed": 3}, store_out=tmp_path / "kept.zarr"
    )
    store = open_store(tmp_path / "kept.zarr")
    # the split draws each pair at random (docs/store-format.md): about a quarter, within 4 sd
    assert abs(store.nnz_test - 0.25 * x.nnz) <= 4 * (x.nnz * 0.25 * 0.75) ** 0.5
    assert store.nnz_test > 0 and store.nnz_train + store.nnz_test == x.nnz
    assert open_model(est.model_path_).attrs["store"]["path"] == store.path


def test_ingest_options_set_the_classes(tmp_path):
    x = ratings(3, scale=0.5)  # half-star ratings 0.5 .. 2
    est = OrdNMF(2, max_iter=2, n_members=1).fit(x, ingest_options={"ratings": "halfstar"})
    assert est.theta_.shape == (11,)
    counts = ratings(3, scale=300)  # raw counts 300 .. 1200
    est = DcPF(2, max_iter=2, n_members=1).fit(counts, ingest_options={"counts": "paper"})
    assert open_model(est.model_path_).attrs["store"]["n_classes"] == 10


def test_store_out_keeps_the_store_and_gives_the_model_of_ingest_then_fit(tmp_path):
    x = ratings(4)
    kept = OrdNMF(2, max_iter=ITERS, tol=1e-12, n_members=1).fit(x, store_out=tmp_path / "s.zarr")
    store = ingest(x, tmp_path / "t.zarr", test_fraction=0.0)
    assert_bitwise(
        state_of(kept), state_of(OrdNMF(2, max_iter=ITERS, tol=1e-12, n_members=1).fit(store))
    )
    assert open_store(tmp_path / "s.zarr").nnz_train == x.nnz


def test_the_temporary_store_lives_as_long_as_the_estimator(tmp_path):
    work = tmp_path / "work"
    x = ratings(5)
    est = OrdNMF(2, max_iter=2, work_dir=str(work), n_members=1).fit(x)
    (first,) = data_dirs(work)
    store = open_model(est.model_path_).attrs["store"]["path"]
    assert store.startswith(str(first))
    seen = set(x[0].indices.tolist())
    top = est.recommend([0], n=N_ITEMS)[0]  # the seen-items filter reads the store
    assert {item for item, _ in top} == set(range(N_ITEMS)) - seen
    est.fit(ratings(6))  # refitted: the first store goes
    (second,) = data_dirs(work)
    assert second != first and not first.exists()
    del est
    gc.collect()
    assert data_dirs(work) == []


def test_a_failed_fit_leaves_no_store(tmp_path):
    work = tmp_path / "work"
    x = ratings(7)
    with pytest.raises(InputError, match="threshold must be an integer in 1..4"):
        BePoF(2, threshold=9, work_dir=str(work), n_members=1).fit(x)  # fails after the ingest
    with pytest.raises(InputError, match="not a positive integer"):
        OrdNMF(2, work_dir=str(work), n_members=1).fit(ratings(7, scale=0.5))  # fails in the ingest
    est = OrdNMF(2, max_iter=2, work_dir=str(work), n_members=1).fit(x, check=True)
    assert not hasattr(est, "model_path_")
    assert data_dirs(work) == []


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        ([[0, 1, 3], [1, 2, 4]], "pass the tuple"),
        (np.array([3.0, 4.0, 5.0]), "ambiguous"),
        (np.ones((4, 3)), r"scipy\.sparse\.csr_matrix\(X\)"),
        ({"user": [0]}, "ordnmf_dask.ingest"),
    ],
)
def test_a_wrong_kind_of_data_is_a_type_error_naming_what_fit_takes(data, hint):
    with pytest.raises(TypeError, match=hint) as exc:
        OrdNMF(2, n_members=1).fit(data)
    assert "scipy.sparse matrix" in str(exc.value) and "ordnmf_dask.ingest" in str(exc.value)


@pytest.mark.parametrize(
    ("scale", "message"),
    [
        (
            0.5,
            r"value \d\.5 is not a positive integer; for half-star ratings 0\.5 \.\. 5 pass "
            r"ingest_options=\{'ratings': 'halfstar'\}",
        ),
        (
            0.3,
            r"is not a positive integer; pass ingest_options\['ratings'\], "
            r"ingest_options\['counts'\] or ingest_options\['binarize'\]",
        ),
        (
            300,
            r"got 1200; if the values are counts \(plays, clicks\), "
            r"pass ingest_options=\{'counts': 'paper'\}",
        ),
    ],
)
def test_a_wrong_value_scale_says_which_ingest_option_to_pass(tmp_path, scale, message):
    with pytest.raises(InputError, match=message):
        OrdNMF(2, work_dir=str(tmp_path), n_members=1).fit(ratings(8, scale=scale))
    assert data_dirs(tmp_path) == []


def test_explicit_zeros_of_a_sparse_matrix_are_no_interaction(tmp_path):
    x = ratings(9)
    with_zeros = x.copy()
    with_zeros.data[::5] = 0  # stored, but zero
    assert with_zeros.nnz == x.nnz
    dropped = with_zeros.copy()
    dropped.eliminate_zeros()
    info = ingest(with_zeros, tmp_path / "z.zarr", test_fraction=0.0)
    assert info.nnz_train == dropped.nnz < x.nnz
    assert_bitwise(
        state_of(OrdNMF(2, max_iter=ITERS, tol=1e-12, n_members=1).fit(with_zeros)),
        state_of(OrdNMF(2, max_iter=ITERS, tol=1e-12, n_members=1).fit(dropped)),
    )


def test_store_arguments_keep_their_errors_with_a_hint(tmp_path):
    csv = write_csv(tmp_path / "r.csv", ratings())
    with pytest.raises(InputError, match=r"r\.csv: a file, not a store: .*ordnmf_dask\.ingest"):
        OrdNMF(2, n_members=1).fit(csv)
    store = ingest(csv, tmp_path / "r.zarr")
    with pytest.raises(InputError, match="ingest_options and store_out apply to data in memory"):
        OrdNMF(2, n_members=1).fit(store, ingest_options={"ratings": "integer"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'rating'"):
        OrdNMF(2, n_members=1).fit(ratings(), ingest_options={"rating": "integer"})
