"""The in-process executor (runtime/inprocess.py): bitwise the fits of a LocalCluster, chosen
automatically for small stores, and the Client behaviour the engine relies on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import DcPF, OrdNMF, evaluate
from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.runtime import cluster
from ordnmf_dask.runtime.inprocess import InProcessClient, wait
from ordnmf_dask.runtime.memory import inprocess_bytes

K = 3


@pytest.fixture(scope="module")
def store_2x3(tmp_path_factory):
    """A 2 x 3 grid: several strips, trees of partial sums and chunks per factor."""
    train, test = dense_split(synthetic_ordinal(40, 30, 4, seed=3))
    return store_from_dense(tmp_path_factory.mktemp("s") / "s.zarr", train, test, 4, (2, 3))


def _result(model) -> dict[str, object]:
    m = open_model(model.model_path_)
    out = {
        name: np.asarray(m.factor(f[0], f[1]).compute())
        for name, f in {
            "W": ("W", "mean"),
            "H": ("H", "mean"),
            "logW": ("W", "log_mean"),
            "logH": ("H", "log_mean"),
        }.items()
    }
    out["elbo"] = list(model.elbo_)
    out["params"] = model.delta_.tolist() if hasattr(model, "delta_") else model.p_
    return out


def _assert_bitwise(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], np.ndarray):
            assert np.array_equal(a[name], b[name]), name
        else:
            assert a[name] == b[name], name  # floats compared exactly


@pytest.mark.cluster
@pytest.mark.parametrize("every", [0, 3])
@pytest.mark.parametrize("klass", [OrdNMF, DcPF])
def test_an_inprocess_fit_is_bitwise_the_cluster_fit(tmp_path, store_2x3, client, klass, every):
    def fit(where, **kw):  # a work_dir of its own: the in-process fit checkpoints too
        est = klass(
            K,
            max_iter=5,  # (with every = 3: one checkpoint written and read back mid-fit)
            tol=1e-12,
            checkpoint_every=every,
            work_dir=str(tmp_path / f"work{len(kw)}"),
            **kw,
            n_members=1,
        )
        return _result(est.fit(store_2x3, where, out=tmp_path / f"{len(list(tmp_path.iterdir()))}"))

    on_cluster = fit(client)
    in_process = fit(None, executor="inprocess")
    assert len(on_cluster["elbo"]) == 5
    _assert_bitwise(on_cluster, in_process)


@pytest.mark.cluster
def test_a_one_block_fit_in_the_calling_thread_is_bitwise_the_cluster_fit(tmp_path, client):
    train, test = dense_split(synthetic_ordinal(30, 20, 3, seed=5))
    one = store_from_dense(tmp_path / "one.zarr", train, test, 3, (1, 1))

    def fit(where, **kw):
        est = OrdNMF(
            K,
            max_iter=6,
            tol=1e-12,
            checkpoint_every=2,
            work_dir=str(tmp_path / f"work{len(kw)}"),
            **kw,
            n_members=1,
        )
        return _result(est.fit(one, where, out=tmp_path / f"m{len(kw)}"))

    _assert_bitwise(fit(client), fit(None, executor="inprocess"))


@pytest.mark.cluster
def test_on_one_worker_a_step_is_one_task_and_the_fit_is_bitwise_the_inprocess_fit(
    tmp_path, store_2x3, cluster
):
    """A cluster of one worker runs each step of a fit as one task (``cavi.run_step``: the
    step's graph on the worker's threads) and picks its result: no task of the graph reaches
    the scheduler, and the model is the in-process one, with SQUAREM and a checkpoint read
    back mid-fit, and for dcPF on streamed blocks. (The session's ``cluster`` is started
    first: its nannies set the environment that this one's would.)"""
    from distributed import Client, LocalCluster, get_task_stream

    cases = [
        (OrdNMF, {"optimizer": "squarem", "checkpoint_every": 4}),
        (DcPF, {"optimizer": "cavi", "cache_blocks": False}),
    ]
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc, set_as_default=False) as one,
    ):
        for j, (klass, kw) in enumerate(cases):

            def fit(where, name, klass=klass, kw=kw, **more):
                work = str(tmp_path / f"w{name}")
                est = klass(K, max_iter=9, tol=1e-12, work_dir=work, n_members=1, **kw, **more)
                return est.fit(store_2x3, where, out=tmp_path / name)

            with get_task_stream(one) as stream:
                on_one = fit(one, f"one{j}")
            kinds = [str(t["key"]).rsplit("-", 1)[0] for t in stream.data]
            steps = [k for k in kinds if k in ("cavi-iteration", "cavi-extrapolation")]
            assert 9 <= len(steps) <= 12  # 9 iterations, and any refused extrapolation
            assert kinds.count("cavi-start") == 1
            assert not {"local_strip", "update_factor", "next_params"} & set(kinds)
            _assert_bitwise(_result(on_one), _result(fit(None, f"here{j}", executor="inprocess")))


@pytest.mark.cluster
def test_a_fit_resumes_across_executors_bitwise(tmp_path, store_2x3, client):
    """Checkpoints written in-process, resumed on a cluster: the same model as one
    uninterrupted run."""
    ckpt = str(tmp_path / "ckpt")

    def est(n: int, **kw) -> OrdNMF:
        return OrdNMF(
            K, max_iter=n, tol=1e-12, checkpoint_every=3, checkpoint_dir=ckpt, **kw, n_members=1
        )

    est(7, executor="inprocess").fit(store_2x3, out=tmp_path / "a")  # leaves ckpt-6 behind
    resumed = est(12).fit(store_2x3, client, out=tmp_path / "b", resume=True)
    whole = OrdNMF(
        K, max_iter=12, tol=1e-12, checkpoint_every=3, executor="inprocess", n_members=1
    ).fit(store_2x3, out=tmp_path / "c")
    _assert_bitwise(_result(whole), _result(resumed))


@pytest.mark.cluster
def test_evaluate_inprocess_is_the_cluster_evaluation(tmp_path, store_2x3, client):
    model = OrdNMF(K, max_iter=5, executor="inprocess", n_members=1).fit(
        store_2x3, out=tmp_path / "m"
    )
    with InProcessClient() as threads:
        assert evaluate(store_2x3, model, client, k=5) == evaluate(store_2x3, model, threads, k=5)


def test_a_small_fit_without_a_client_starts_no_cluster(tmp_path, store_2x3):
    """Not marked ``cluster``: a scheduler started here would fail the fit (conftest)."""
    model = OrdNMF(K, max_iter=4, checkpoint_every=2, n_members=1).fit(
        store_2x3, out=tmp_path / "m"
    )
    assert model.n_iter_ == 4 and np.isfinite(model.elbo_[-1])
    res = evaluate(store_2x3, model, k=5)
    assert res["nnz_test"] == store_2x3.nnz_test


def test_auto_runs_inprocess_within_the_memory_budget_only(store_2x3):
    need = inprocess_bytes(store_2x3, K)
    assert need > store_2x3.nnz_train * 9
    assert cluster.runs_inprocess(store_2x3, K, memory=int(need / cluster.INPROCESS_MEMORY))
    assert not cluster.runs_inprocess(store_2x3, K, memory=need)
    big = replace(store_2x3, nnz_train=cluster.INPROCESS_MAX_NNZ + 1)
    assert cluster.runs_inprocess(store_2x3, 1, memory=1 << 50)
    assert not cluster.runs_inprocess(big, 1, memory=1 << 50)


def test_fits_sharing_a_client_from_threads_run_inline_and_match_fits_alone(tmp_path, store_2x3):
    """``jobs`` > 1 fits at once on one in-process client (as ``reproduce`` runs them): each task
    runs in the thread that submits it, and each fit is bitwise the same fit run alone."""
    from concurrent.futures import ThreadPoolExecutor

    def fit(seed: int, client: object, name: str) -> dict[str, object]:
        est = OrdNMF(K, max_iter=5, tol=1e-12, seed=seed, n_members=1)
        return _result(est.fit(store_2x3, client, out=tmp_path / f"{name}{seed}"))

    with cluster.choose_client(None, store_2x3, K, "inprocess") as alone:
        assert alone.threads > 0  # a 2 x 3 grid: a pool
        solo = [fit(seed, alone, "alone") for seed in (1, 2)]
    with cluster.choose_client(None, store_2x3, K, "inprocess", jobs=2) as shared:
        assert shared.threads == 0
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda seed: fit(seed, shared, "shared"), (1, 2)))
    for a, b in zip(solo, together, strict=True):
        _assert_bitwise(a, b)


def test_inprocess_checkpoints_only_where_a_later_fit_can_find_them(tmp_path):
    values = {
        "checkpoint_dir": None,
        "work_dir": None,
        "checkpoint_every": 4,
        "checkpoint_minutes": 2.0,
    }
    with InProcessClient(0) as threads:
        assert cluster.checkpoint_schedule(threads, values) == (0, None)
        for where in ("checkpoint_dir", "work_dir"):
            given = {**values, where: str(tmp_path)}
            assert cluster.checkpoint_schedule(threads, given) == (4, 2.0)
    assert cluster.checkpoint_schedule(object(), values) == (4, 2.0)  # a cluster's client


def test_executor_values_are_checked(tmp_path, store_2x3):
    with pytest.raises(InputError, match="^executor must be 'auto', 'inprocess' or 'cluster'"):
        OrdNMF(K, executor="threads", n_members=1).fit(store_2x3)
    with pytest.raises(InputError, match="executor='inprocess' runs without a cluster"):
        OrdNMF(K, executor="inprocess", n_members=1).fit(store_2x3, client=object())


def _add(a, b):
    return a + b


def _boom(x):
    raise ValueError(f"bad {x}")


def _total(parts, named):
    return sum(parts) + named["x"][0] + named["x"][1]


@pytest.mark.parametrize("threads", [0, 2])
def test_futures_in_arguments_are_resolved_and_errors_reach_the_dependents(threads):
    with InProcessClient(threads) as c:
        a = c.submit(_add, 1, 2, workers=["w"], allow_other_workers=True, priority=1, pure=False)
        b = c.submit(_add, a, 10)
        total = c.submit(_total, [a, b], {"x": (a, c.scatter(100))})
        assert c.gather([a, (b, {"t": total})]) == [3, (13, {"t": 3 + 13 + 3 + 100})]
        bad = c.submit(_boom, a)
        after = c.submit(_add, bad, 1)
        wait([bad, after, total])
        assert (bad.status, after.status, total.status) == ("error", "error", "finished")
        with pytest.raises(ValueError, match="bad 3"):
            after.result()
        with pytest.raises(ValueError, match="bad 3"):
            c.gather([total, after])
        assert isinstance(bad.exception(), ValueError)
        assert list(c.scheduler_info()["workers"].values())[0]["memory_limit"] > 0


def test_a_result_holding_futures_is_read_and_pickled_as_their_values():
    """What a step run as one task returns (``cavi.run_step``): its picks read the values of
    the futures in it (``inprocess.value``), and Dask moving or spilling it pickles them as
    values; a failed one raises its error."""
    import pickle

    from ordnmf_dask.runtime.inprocess import value

    with InProcessClient(2) as c:
        a = c.submit(_add, 1, 2)
        held = {"x": [a, (c.submit(_add, a, 10), "field")], "n": 5}
        assert value(held) == {"x": [3, (13, "field")], "n": 5}
        assert pickle.loads(pickle.dumps(held)) == value(held)
        bad = c.submit(_boom, a)
        with pytest.raises(ValueError, match="bad 3"):
            value([a, bad])


def _cli_fit(store_2x3, out, *flags: str) -> str:
    done = subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            store_2x3.path,
            "--out",
            str(out),
            "-k",
            "2",
            "--max-iter",
            "2",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_cli_fit_without_cluster_flags_runs_inprocess(tmp_path, store_2x3):
    """Not marked ``cluster``: the command would fail if it started a scheduler (conftest)."""
    assert "running in-process" in _cli_fit(store_2x3, tmp_path / "m.zarr")


@pytest.mark.cluster
def test_a_cluster_flag_gets_the_cluster_it_asks_for(tmp_path, store_2x3):
    err = _cli_fit(store_2x3, tmp_path / "m.zarr", "--workers", "1")
    assert "started LocalCluster: 1 workers" in err and "running in-process" not in err


def test_the_kernels_import_and_run_where_numba_can_cache_nowhere():
    """Numba refuses ``cache=True`` when it finds no writable cache directory (simulated by
    allowing only its IPython locator): the kernels are then compiled in the process."""
    code = (
        "from ordnmf_dask.model.gamma import digamma_lgamma\n"
        "from ordnmf_dask.model import kernels\n"
        "print(digamma_lgamma(1.0)[0])\n"
    )
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "IPythonCacheLocator"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(-0.5772156649015329, rel=1e-14)  # -Euler's gamma


# not scipy.sparse: numba's first call loads scipy.linalg, which imports it in older scipy (1.13)
HEAVY = [
    "distributed",
    "dask",
    "dask.array",
    "dask.dataframe",
    "pyarrow",
    "pandas",
    "bokeh",
    "scipy.stats",
    "scipy.special",
]


def test_an_inprocess_cli_fit_imports_no_cluster_machinery(tmp_path, store_2x3):
    """A fit that runs in-process pays no start-up for distributed, nor for dask itself (the
    fitted W_ / H_ are dask arrays made when first used), pyarrow, pandas, bokeh or the scipy
    modules the fit does not use; the fitted factors are still there as dask arrays."""
    code = (
        "import sys\n"
        "from ordnmf_dask.app.cli import main\n"
        "from ordnmf_dask import OrdNMF\n"
        f"code = main(['fit', '--n-members', '1', {store_2x3.path!r}, "
        f"'--out', {str(tmp_path / 'm.zarr')!r}, '-k', '2', '--max-iter', '2', '-q'])\n"
        f"print(code, [m for m in {HEAVY!r} if m in sys.modules])\n"
        f"model = OrdNMF.load({str(tmp_path / 'm.zarr')!r})\n"
        "print('dask' in sys.modules, model.W_.shape, type(model.log_H_).__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-3:] == [
        "0 []",
        f"False ({store_2x3.n_users}, 2) dask.array.core",
        "",
    ]


def test_a_fit_in_a_new_process_loads_every_kernel_from_numba_s_cache(tmp_path, store_2x3):
    """The numba functions a fit runs are compiled once per machine: a later process loads
    each from the cache and compiles none (one that numba cannot cache would cost its compile,
    seconds, in every command)."""
    code = (
        "from numba.core import event\n"
        "from ordnmf_dask import OrdNMF\n"
        "compiles = event.RecordingListener()\n"
        "with event.install_listener('numba:compile', compiles):\n"
        f"    model = OrdNMF(2, max_iter=2, n_members=1).fit({store_2x3.path!r}, "
        f"out={str(tmp_path / 'm')!r}, "
        "overwrite=True)\n"
        "names = {e.data['dispatcher'].py_func.__qualname__ for _, e in compiles.buffer}\n"
        "print(model.n_iter_, sorted(names))\n"
    )
    for _ in range(2):  # the first one compiles what the cache does not hold yet
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout == "2 []\n"


def test_importing_the_estimators_imports_no_dask_nor_cluster_machinery():
    code = (
        "import sys\n"
        "import ordnmf_dask.estimator, ordnmf_dask.app.jobs\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_distributed_imported_during_a_command_takes_its_logging_levels():
    """distributed sets its loggers' levels when first imported: imported in the middle of a
    quiet command (a cluster started after the in-process choice was ruled out) they are
    silenced again, and after the command they are distributed's own, as found."""
    code = (
        "import logging, sys\n"
        "from ordnmf_dask.app import cli, logs\n"
        "assert 'distributed' not in sys.modules\n"
        "with logs.logging_kept(quiet=True):\n"
        "    logs.silence_dask()\n"
        "    import distributed\n"
        "    during = [logging.getLogger(n).level for n in ('distributed', "
        "'distributed.client')]\n"
        "after = [logging.getLogger(n).level for n in ('distributed', 'distributed.client')]\n"
        "print(during, after, distributed.__spec__.loader is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    silent = logging.CRITICAL + 1
    assert done.stdout.split() and done.stdout.strip() == (
        f"[{silent}, {silent}] [{logging.INFO}, {logging.WARNING}] True"
    )


def test_checkpoints_are_by_time_by_default(store_2x3, tmp_path):
    """The default schedule (checkpoint_minutes, no count) writes no checkpoint in a fit of
    seconds; the same fit asked for one every 4 iterations writes them; the models are equal."""
    from ordnmf_dask.params import DEFAULTS

    assert (DEFAULTS["checkpoint_every"], DEFAULTS["checkpoint_minutes"]) == (0, 5.0)
    written, elbo = {}, {}
    for name, kw in (("default", {}), ("every", {"checkpoint_every": 4})):
        ckpt = tmp_path / name
        model = OrdNMF(K, max_iter=10, tol=1e-12, checkpoint_dir=str(ckpt), **kw, n_members=1)
        elbo[name] = model.fit(store_2x3, show_progress=False).elbo_
        written[name] = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("ckpt-"))
    assert written == {"default": [], "every": ["ckpt-00000004", "ckpt-00000008"]}
    assert elbo["default"] == elbo["every"]
