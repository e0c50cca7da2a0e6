"""Settings a fit cannot run with are refused in one line before the work starts: K above the
rank of the data, worker memory limits a worker cannot run a task under, factors larger than
the memory they would live in; and messages show the user's numbers as plain numbers."""

from __future__ import annotations

import logging

import dask
import numpy as np
import psutil
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from distributed import system

from ordnmf_dask import PF, BePoF, DcPF, OrdNMF, ingest
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.cluster import resolve_client
from ordnmf_dask.runtime.memory import MIN_WORKER_MEMORY, check_fit_memory
from ordnmf_dask.sources.values import check_thresholds
from ordnmf_dask.tuning.search import tune


@pytest.fixture
def store_1x1(tmp_path):
    """20 users x 15 items, classes 1..3."""
    return store_from_dense(
        tmp_path / "s.zarr", *dense_split(synthetic_ordinal(20, 15, 3)), 3, (1, 1)
    )


def one_error_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    """Run main(args) with -q: its exit code and its stderr, which must be one line."""
    code = main([*args, "-q"])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ordnmf-dask {args[0]}: error: ")
    return code, lines[0]


def diagonal_store(path, n: int, grid: tuple[int, int] | None = None):
    """An n x n store of 2n ratings (each user rates two items), K up to n allowed."""
    users = np.r_[np.arange(n), np.arange(n)]
    items = np.r_[np.arange(n), (np.arange(n) + 1) % n]
    return ingest((users, items, np.ones(2 * n)), path, test_fraction=0.0, grid=grid)


# -- K --------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", [OrdNMF, BePoF, PF, DcPF])
def test_more_factors_than_the_smaller_side_are_refused_before_the_fit(
    store_1x1, tmp_path, estimator
):
    out = tmp_path / "m.zarr"
    with pytest.raises(
        InputError,
        match=r"K \(n_components\) = 16 is larger than min\(users, "
        r"items\) = 15 of .*s\.zarr \(20 users x 15 items\)",
    ):
        estimator(16, max_iter=1).fit(store_1x1, out=out)
    assert not out.exists()
    estimator(15).fit(store_1x1, out=out, check=True)  # the rank itself is fine


def test_cli_refuses_k_above_the_rank_in_one_line(store_1x1, tmp_path, capsys):
    code, line = one_error_line(
        capsys,
        [
            "fit",
            "--n-members",
            "1",
            store_1x1.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "16",
            "--max-iter",
            "1",
        ],
    )
    assert code == 2
    assert "K (--n-components) = 16 is larger than min(users, items) = 15" in line
    assert not (tmp_path / "m.zarr").exists()


def test_tune_refuses_a_trial_k_above_the_rank_before_any_fit(store_1x1, tmp_path):
    with pytest.raises(InputError, match=r"K \(n_components\) = 16 is larger than min"):
        tune(store_1x1, {"n_components": [2, 16]}, out=tmp_path / "t", allow_test=True)
    assert not (tmp_path / "t").exists()


# -- worker memory limits -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "config", "shown"),
    [
        (["--memory-limit", "1KB"], None, "'1KB' is 1000 bytes per worker"),
        ([], "memory_limit = 4", "4 is 4 bytes per worker"),
    ],
)
def test_a_worker_memory_limit_no_task_runs_under_is_refused_before_any_cluster(
    store_1x1, tmp_path, capsys, given, config, shown
):
    """A worker paused at its limit before its first task never runs one: the fit would wait
    for it forever (this test is not marked cluster: a scheduler started here fails)."""
    args, where = (
        [
            "fit",
            "--n-members",
            "1",
            store_1x1.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "2",
            *given,
        ],
        "",
    )
    if config is not None:
        where = str(tmp_path / "job.toml")
        (tmp_path / "job.toml").write_text(f"[cluster.local]\n{config}\n")
        args += ["--config", where]
    code, line = one_error_line(capsys, args)
    assert code == 2 and f"{where or 'command line'}: key 'local.memory_limit'" in line
    assert shown in line and f"below the {MIN_WORKER_MEMORY >> 20} MiB a worker needs" in line
    assert not (tmp_path / "m.zarr").exists()


def test_too_many_workers_for_the_machine_are_refused_before_any_cluster(
    store_1x1, tmp_path, capsys
):
    """ "auto" shares the machine's memory among the workers: so many that each gets less
    than a worker needs is refused before a process starts (not marked cluster)."""
    workers = system.MEMORY_LIMIT // (MIN_WORKER_MEMORY // 2)
    code, line = one_error_line(
        capsys,
        [
            "fit",
            "--n-members",
            "1",
            store_1x1.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "2",
            "--workers",
            str(workers),
        ],
    )
    assert code == 2 and f"LocalCluster of {workers} workers (memory limit auto)" in line
    assert "per worker, below the" in line


# -- the factors' memory ----------------------------------------------------------------------
@pytest.mark.cluster
def test_factors_larger_than_the_workers_memory_are_refused_before_any_iteration(tmp_path):
    """Two workers of 600 MiB (160 MiB each below the pause threshold, less the process) that
    do not spill to disk: a
    1000 x 1000 store at K = 1000 with CAVI's 16 tables per row (about 256 MB of factors), or
    at K = 500 with SQUAREM's 32, fits in the two but not in the one worker that holds its
    single block; 1400 x 1400 at K = 1400 fits in neither. K = 600 on the 1400 x 1400 store
    fits with CAVI and not with SQUAREM; a small K runs on the same workers. (Both optimizers
    on one cluster and the same two stores: starting them is most of the test's time.)"""
    one_block = diagonal_store(tmp_path / "a.zarr", 1000)
    two_by_two = diagonal_store(tmp_path / "b.zarr", 1400, grid=(2, 2))
    calls = []
    with (
        dask.config.set({"distributed.worker.memory.spill": False}),
        resolve_client(None, 2, memory_limit="600MiB") as client,
    ):
        for optimizer, tables, k_one, two_workers in [
            ("squarem", 32, 500, 957),
            ("cavi", 16, 1000, 479),  # last: its K = 600 fit leaves the workers' memory used
        ]:
            with pytest.raises(
                InputError,
                match=rf"K = {k_one} on 1000 users x 1000 items needs "
                rf"about 244 MiB on one worker .*{tables} tables.*lower K",
            ):
                OrdNMF(k_one, max_iter=1, optimizer=optimizer, n_members=1).fit(
                    one_block, client, callback=calls.append
                )
            with pytest.raises(
                InputError,
                match=rf"K = 1400 on 1400 users x 1400 items needs "
                rf"about {two_workers} MiB .* left by 2 workers with a "
                r"memory limit of 600 MiB each, which do not spill to disk",
            ):
                OrdNMF(1400, max_iter=1, optimizer=optimizer, n_members=1).fit(
                    two_by_two, client, callback=calls.append
                )
            assert calls == []  # no iteration ran
            middle = OrdNMF(600, max_iter=1, optimizer=optimizer, n_members=1)
            if optimizer == "cavi":
                assert middle.fit(two_by_two, client).n_iter_ == 1
            else:
                with pytest.raises(InputError, match=rf"K = 600 on 1400 users .*{tables} tables"):
                    middle.fit(two_by_two, client)
            small = OrdNMF(2, max_iter=2, optimizer=optimizer, n_members=1).fit(two_by_two, client)
            assert small.n_iter_ == 2


@pytest.mark.cluster
def test_factors_larger_than_workers_that_spill_are_a_warning_not_a_refusal(tmp_path, caplog):
    """Workers that spill (Dask's default) move the chunks a task does not use to disk, so
    factors larger than all their memory are a warning (a fit of 10^9 nonzeros on 2 GB
    workers runs so: docs/performance.md); the largest chunks, which one task holds at once,
    must still fit one worker."""
    one_block = diagonal_store(tmp_path / "a.zarr", 1000)
    four_by_four = diagonal_store(tmp_path / "b.zarr", 1400, grid=(4, 4))
    with resolve_client(None, 2, memory_limit="600MiB") as client:
        with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):
            check_fit_memory(client, four_by_four, 1400, False)
        (record,) = [r for r in caplog.records if "spill factor chunks to disk" in r.message]
        assert "K = 1400 on 1400 users x 1400 items needs about 479 MiB" in record.message
        with pytest.raises(InputError, match=r"about 244 MiB on one worker"):
            check_fit_memory(client, one_block, 1000, False)


def test_an_inprocess_fit_larger_than_the_available_memory_is_refused(tmp_path):
    """A store and K whose factors alone take at least twice the memory available now: refused
    before any iteration (n is chosen from this machine's available memory)."""
    n = int(np.sqrt(2 * psutil.virtual_memory().available / 256))  # 16 x 8 bytes x K x 2n
    info = diagonal_store(tmp_path / "s.zarr", n)
    calls = []
    with pytest.raises(
        InputError,
        match=rf"K = {n} on {n} users x {n} items needs about .* "
        r"in this process .* of memory available",
    ):
        OrdNMF(n, max_iter=1, executor="inprocess", n_members=1).fit(info, callback=calls.append)
    assert calls == []


# -- raw counts -------------------------------------------------------------------------------
def test_counts_ingested_as_ratings_get_the_counts_hint(tmp_path, capsys):
    (tmp_path / "plays.csv").write_text("u1,a,3\nu1,b,352698\nu2,a,12\n")
    with pytest.raises(
        InputError,
        match=r"got 352698; if the values are counts .*, pass "
        r"counts='paper' .* or binarize=S",
    ):
        ingest(str(tmp_path / "plays.csv"), tmp_path / "s.zarr")
    code, line = one_error_line(
        capsys, ["ingest", str(tmp_path / "plays.csv"), "--out", str(tmp_path / "s.zarr")]
    )
    assert code == 2 and "pass --counts paper (the paper's count classes) or --binarize S" in line
    assert not (tmp_path / "s.zarr").exists()


def test_dcpf_on_a_class_store_warns_in_one_line(store_1x1, tmp_path, caplog):
    counts = ingest(
        (np.r_[0, 0, 1, 1, 2], np.r_[0, 1, 0, 2, 1], np.r_[3.0, 700, 1, 12, 2]),
        tmp_path / "counts.zarr",
        counts="paper",
        test_fraction=0.0,
    )
    with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):
        DcPF(2, max_iter=1, n_members=1).fit(counts)
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        DcPF(2, max_iter=1, n_members=1).fit(store_1x1)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "dcPF models raw counts" in warning and store_1x1.path in warning
    assert "'ratings-integer'" in warning and "--counts paper" in warning


# -- numbers in messages ----------------------------------------------------------------------
def test_messages_show_numpy_numbers_as_plain_numbers(store_1x1):
    """K, n, ids and values taken from numpy arrays are shown as the user wrote them."""
    with pytest.raises(InputError, match=r"n_components must be an integer >= 1, got 50\.0$"):
        OrdNMF(np.float64(50.0), n_members=1).fit(store_1x1)
    model = OrdNMF(2, max_iter=2, n_members=1).fit(store_1x1)
    cases = [
        (lambda: model.recommend([np.float64(50.0)]), "unknown user id 50.0: not in"),
        (lambda: model.recommend([0], n=np.float64(50.0)), "got 50.0"),
        (lambda: model.fold_in_users([[0]], [[np.float64(50.0)]]), "rating 50 is off the"),
        (lambda: check_thresholds(np.array([0.0, 100.0, 50.0])), "got [0.0, 100.0, 50.0]"),
    ]
    for call, text in cases:
        with pytest.raises(InputError) as err:
            call()
        assert text in str(err.value) and "np." not in str(err.value)
