"""Shared fixtures: a session-wide LocalCluster of worker processes, and small stores."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store.blocks import StoreInfo, write_store
from ordnmf_dask.store.grid import balanced_bounds, block_sort

CHECKOUT = Path(__file__).resolve().parents[1]
# the command line of ``ordnmf-dask`` run by the interpreter running the tests (so that it runs
# the package they import, whatever ``ordnmf-dask`` on PATH is)
CLI = [sys.executable, "-m", "ordnmf_dask"]
# where the real datasets are looked for, in order: $DATA (as examples/*.sh read it), shared/data
# beside the checkout, then the copy of MovieLens latest-small that examples/data ships
DATA_ROOTS = [
    *([Path(os.environ["DATA"])] if os.environ.get("DATA") else []),
    CHECKOUT.parent / "shared" / "data",
    CHECKOUT / "examples" / "data",
]
# zarr 3.0 (the floor) warns on every open of an array of strings (the id maps) that their
# codec is not in the format's specification; newer zarr does not
ZARR_CODEC_WARNING = "UserWarning: The codec `vlen-utf8` is currently not part in the Zarr"
# the notice of numba's first compilation (ordnmf_dask/model/compiling.py), which a command
# run with an empty cache logs as a warning
COMPILE_NOTICE = "compiling numba kernels ("
# where a skipped test's reason sends the reader for the datasets and DATA (tests/test_datasets.py)
DATA_DOC = 'docs/guide/data.md, "Data shipped and used"'
# files of the real datasets, relative to a data root
ML = "ml-latest-small/ratings.csv"
LASTFM = "hetrec2011-lastfm-2k/user_artists.dat"
TPS = "tasteprofile-gouvert-subset/derived/tps_98765_U1502_I786_triplets.txt"


def data_root(relative: str) -> Path:
    """The first of DATA_ROOTS that holds the dataset file ``relative``; skips the calling test,
    naming the dataset and DATA, where none does (Last.fm and the Taste Profile are not shipped:
    their licences do not allow it)."""
    for root in DATA_ROOTS:
        if (root / relative).is_file():
            return root
    name = relative.split("/")[0]
    pytest.skip(f"needs {name}: set DATA=/path/to/data holding {name}/ ({DATA_DOC})")


def data_file(relative: str) -> Path:
    """The path of the dataset file ``relative`` (see :func:`data_root`)."""
    return data_root(relative) / relative


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_pytest(tmp_path_factory):
    """Directories the code under test makes with ``tempfile`` (a fit's default model and work
    directories, Dask's scratch space, subprocesses via TMPDIR) go under pytest's own temporary
    tree, which pytest prunes, instead of piling up in /tmp run after run."""
    root = str(tmp_path_factory.mktemp("tmp"))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = root, root
    yield
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]


# loggers whose configuration a test must leave as it found it ("" is the root logger)
KEPT_LOGGERS = ("", "ordnmf_dask", "distributed", "asyncio")


def _own(handlers: list[logging.Handler]) -> list[logging.Handler]:
    """The handlers that are not pytest's (its capture handlers come and go with each phase)."""
    return [h for h in handlers if not type(h).__module__.startswith("_pytest")]


def _logging_state() -> dict[str, tuple]:
    return {
        name: (_own(logger.handlers), logger.level, logger.propagate, logger.disabled)
        for name in KEPT_LOGGERS
        for logger in [logging.getLogger(name)]
    }


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's own


@pytest.fixture(autouse=True)
def _global_state_kept():
    """Fail a test that leaves the logging configuration, ``os.environ`` or the working
    directory changed, after restoring them, so that the leak cannot change the tests after it
    (a logger left without propagation, for one, makes later tests see every record twice)."""
    logs, env, cwd = _logging_state(), _environment(), os.getcwd()
    yield
    leaks = []
    for name, (handlers, level, propagate, disabled) in logs.items():
        logger = logging.getLogger(name)
        if (_own(logger.handlers), logger.level, logger.propagate, logger.disabled) != (
            handlers,
            level,
            propagate,
            disabled,
        ):
            leaks.append(f"logger {name or 'root'!r}")
            pytests = [h for h in logger.handlers if h not in _own(logger.handlers)]
            logger.handlers[:] = [*handlers, *pytests]
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled
    now = _environment()
    if now != env:
        changed = sorted(k for k in env.keys() | now.keys() if env.get(k) != now.get(k))
        leaks.append(f"environment variables {changed}")
        for name in now.keys() - env.keys():
            del os.environ[name]
        os.environ.update(env)
    if os.getcwd() != cwd:
        leaks.append(f"working directory {os.getcwd()}")
        os.chdir(cwd)
    if leaks:
        pytest.fail("the test changed global state: " + "; ".join(leaks), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """Before any test process starts (in pytest's own process, not in xdist's workers): fill
    numba's cache once (tests/warmup.py), so that with an empty cache the test processes and
    the processes they start load the kernels instead of compiling them side by side. A failed
    warm-up only costs time: the tests that compile report their own errors."""
    if hasattr(config, "workerinput") or config.option.collectonly or config.option.help:
        return
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("warmup.py")), work],
            capture_output=True,
            text=True,
            timeout=600,
        )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        sys.stderr.write(f"tests/warmup.py failed ({done.returncode}): {tail}\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``cluster`` every test that uses the session's cluster, directly or through a fixture
    built on it (the other tests that start one carry the marker themselves)."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


# run by a Dask scheduler as a preload: a scheduler started by a test not marked `cluster` fails
NO_SCHEDULER = 'raise RuntimeError("a Dask scheduler started in a test not marked cluster")'


@pytest.fixture(autouse=True)
def _clusters_only_where_marked(request: pytest.FixtureRequest):
    """Make every Dask scheduler a test not marked ``cluster`` starts fail, in this process and
    in the commands it runs, so that ``-m "not cluster"`` never needs one. (Not monkeypatch:
    instantiated here, it would undo the test's own patches after ``_global_state_kept`` looked.)"""
    if request.node.get_closest_marker("cluster"):
        yield
        return
    name = "DASK_DISTRIBUTED__SCHEDULER__PRELOAD"
    saved = os.environ.get(name)
    os.environ[name] = NO_SCHEDULER
    try:
        with dask.config.set({"distributed.scheduler.preload": [NO_SCHEDULER]}):
            yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


@pytest.fixture(scope="session")
def cluster():
    """Two single-threaded worker processes on loopback (the realistic default here)."""
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as lc:
        yield lc


@pytest.fixture
def client(cluster):
    with Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def mclient(cluster):
    """A client of the session's cluster for the module-scoped fixtures of a test module."""
    with Client(cluster) as c:
        yield c


def poisson_class_store(
    path, n_users: int, n_items: int, validation_fraction: float = 0.0
) -> StoreInfo:
    """A store of counts drawn from a rank-3 Poisson factorization with strong signal, as
    classes 1..5, 20% of them held out for test."""
    rng = np.random.default_rng(0)
    w = rng.gamma(0.3, 1.0, (n_users, 3))
    h = 3.0 * rng.gamma(0.3, 1.0, (n_items, 3))
    n = rng.poisson(w @ h.T)
    u, i = np.nonzero(n)
    return ingest_arrays(
        u,
        i,
        np.minimum(n[u, i], 5),
        path,
        ratings="integer",
        test_fraction=0.2,
        validation_fraction=validation_fraction,
    )


def synthetic_ordinal(
    n_users: int, n_items: int, n_classes: int, k: int = 3, density: float = 0.3, seed: int = 0
) -> np.ndarray:
    """Dense (U, I) classes 0..V drawn from a low-rank Gamma model; every class occurs."""
    rng = np.random.default_rng(seed)
    lam = rng.gamma(1.0, 1.0, (n_users, k)) @ rng.gamma(1.0, 1.0, (k, n_items))
    score = lam * rng.gamma(2.0, 0.5, lam.shape)
    mask = rng.random(lam.shape) < density
    edges = np.quantile(score[mask], np.linspace(0, 1, n_classes + 1)[1:-1])
    y = np.where(mask, 1 + np.searchsorted(edges, score), 0)
    y[0, :n_classes] = np.arange(1, n_classes + 1)  # every class present
    return y.astype(np.int64)


def dense_split(y: np.ndarray, test_fraction: float = 0.2, seed: int = 1):
    """Split the nonzeros of a dense matrix into dense train / test matrices."""
    rng = np.random.default_rng(seed)
    test = (rng.random(y.shape) < test_fraction) & (y > 0)
    test[0, :] = False  # keep every class in train
    return np.where(test, 0, y), np.where(test, y, 0)


def store_from_dense(
    path: Path,
    train: np.ndarray,
    test: np.ndarray,
    n_classes: int,
    grid: tuple[int, int],
    user_ids: np.ndarray | None = None,
    item_ids: np.ndarray | None = None,
) -> StoreInfo:
    """Write a store holding exactly these dense train / test matrices on a given grid
    (raw ids default to the indices)."""
    u, i = np.nonzero(train)
    rb = balanced_bounds(np.bincount(u, minlength=train.shape[0]), grid[0])
    cb = balanced_bounds(np.bincount(i, minlength=train.shape[1]), grid[1])

    def blocked(m: np.ndarray):
        uu, ii = np.nonzero(m)
        return block_sort(uu, ii, m[uu, ii], m[uu, ii].astype(float), rb, cb)

    hist = lambda m: np.bincount(m[m > 0], minlength=n_classes + 1).tolist()  # noqa: E731
    attrs = {
        "n_users": train.shape[0],
        "n_items": train.shape[1],
        "n_classes": n_classes,
        "value_kind": "ratings-integer",
        "thresholds": None,
        "binarize": None,
        "nnz_train": int((train > 0).sum()),
        "nnz_test": int((test > 0).sum()),
        "hist_train": hist(train),
        "hist_test": hist(test),
        "grid": list(grid),
        "split": "file",
        "seed": None,
    }
    return write_store(
        path,
        attrs,
        rb,
        cb,
        blocked(train),
        blocked(test),
        np.arange(train.shape[0]) if user_ids is None else np.asarray(user_ids),
        np.arange(train.shape[1]) if item_ids is None else np.asarray(item_ids),
    )


# a 12 x 10 ratings file (user,item,class): the input of tests/test_safety_paths.py and
# tests/test_safety_writers.py
SMALL_CSV = "".join(
    f"{u},{i},{1 + (u * i) % 5}\n" for u in range(12) for i in range(10) if (u + i) % 3
)


@pytest.fixture(scope="module")
def small_fitted(tmp_path_factory) -> tuple[Path, Path]:
    """A 20 x 15 store with a test split (grid 2 x 2) and a K = 2 model fitted on it in-process,
    for the tests that only read or copy them (never written to)."""
    from ordnmf_dask import OrdNMF

    where = tmp_path_factory.mktemp("fitted")
    train, test = dense_split(synthetic_ordinal(20, 15, 3, seed=2))
    store = store_from_dense(where / "o.zarr", train, test, 3, (2, 2))
    model = OrdNMF(2, max_iter=2, executor="inprocess", n_members=1).fit(
        store, out=where / "bm.zarr"
    )
    return Path(store.path), Path(model.model_path_)
