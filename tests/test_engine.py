"""The distributed fit against the dense oracle, on real worker processes and zarr stores."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import oracle
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from distributed import Client, LocalCluster

from ordnmf_dask import OrdNMF, ingest
from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner
from ordnmf_dask.errors import InputError
from ordnmf_dask.model.families import OrdinalFamily
from ordnmf_dask.runtime.cluster import resolve_client

K = 3


@pytest.fixture(scope="module")
def problem():
    n_classes = 4
    y = synthetic_ordinal(30, 25, n_classes, seed=0)
    train, test = dense_split(y)
    rng = np.random.default_rng(0)
    return n_classes, train, test, rng.gamma(1, 1, (30, K)), rng.gamma(1, 1, (25, K))


def _assert_same_fit(model, ref, elbo_rtol=1e-9, factor_rtol=1e-6):
    assert model.n_iter_ == ref["n_iter"]
    np.testing.assert_allclose(model.elbo_, ref["elbo"], rtol=elbo_rtol)
    np.testing.assert_allclose(model.W_.compute(), ref["EW"], rtol=factor_rtol)
    np.testing.assert_allclose(model.H_.compute(), ref["EH"], rtol=factor_rtol)
    np.testing.assert_allclose(model.log_W_.compute(), ref["ElogW"], rtol=factor_rtol)
    np.testing.assert_allclose(model.delta_, ref["delta"], rtol=factor_rtol)


# the approximate local step is per block numerics: checked on one and on a multi-block grid
# (the 4 x 2 grid's extra row blocks are tested with the exact step)
@pytest.mark.parametrize(
    ("grid", "approx"),
    [((1, 1), False), ((2, 3), False), ((4, 2), False), ((1, 1), True), ((2, 3), True)],
)
def test_fit_matches_oracle_trajectory(tmp_path, client, problem, grid, approx):
    """The whole trajectory, a checkpoint read back within it (7) and the stopping rule: tol=1e-3
    stops both after 14 iterations (tol=1e-5 took ~40, and checks exactness no further)."""
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, grid)
    ref = oracle.fit(train, n_classes, w0, h0, tol=1e-3, approx=approx)
    assert ref["n_iter"] > 7
    model = OrdNMF(
        K, approx=approx, tol=1e-3, checkpoint_every=7, optimizer="cavi", n_members=1
    ).fit(store, client, init=(w0, h0))
    _assert_same_fit(model, ref)
    assert model.converged_
    objective = np.asarray(ref["objective"])
    assert np.all(np.diff(objective) >= -1e-12 * np.abs(objective[1:]))


def test_binary_data_is_bepof(tmp_path, client, problem):
    _, train, test, w0, h0 = problem
    tr, te = (train > 0).astype(np.int64), (test > 0).astype(np.int64)
    store = store_from_dense(tmp_path / "b.zarr", tr, te, 1, (2, 2))
    ref = oracle.fit(tr, 1, w0, h0, tol=1e-3, min_iter=5)  # 18 iterations (1e-6: 47)
    model = OrdNMF(K, tol=1e-3, min_iter=5, optimizer="cavi", n_members=1).fit(
        store, client, init=(w0, h0)
    )
    _assert_same_fit(model, ref)


def test_streaming_cached_and_checkpoints_agree_bitwise(tmp_path, client, problem):
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (3, 2))
    fits = [
        OrdNMF(K, max_iter=7, cache_blocks=cache, checkpoint_every=every, n_members=1).fit(
            store, client, init=(w0, h0)
        )
        for cache, every in [(True, 0), (False, 0), (True, 3)]
    ]
    for other in fits[1:]:
        assert other.elbo_ == fits[0].elbo_
        np.testing.assert_array_equal(other.W_.compute(), fits[0].W_.compute())


def test_one_and_two_workers_give_the_same_fit(tmp_path, client, problem):
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (3, 3))
    two = OrdNMF(K, max_iter=4, n_members=1).fit(store, client)  # an order of sums differs at once
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as one_client,
    ):
        one = OrdNMF(K, max_iter=4, n_members=1).fit(store, one_client)
    assert one.elbo_ == two.elbo_
    np.testing.assert_array_equal(one.H_.compute(), two.H_.compute())


def _mapped_on_reuse() -> int:
    """Bytes glibc holds in mmapped blocks (``mallinfo2``) while a 24 MiB array is alive,
    another having been freed just before: 24 MiB more where freed memory goes back to the OS
    at once (each large array mapped anew, and faulted in page by page), less where it is kept
    for reuse (the array taken from the heap)."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
            "keepcost".split()
        ]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = Info
    np.ones(3 << 20)  # made and freed
    array = np.ones(3 << 20)
    mapped = int(mallinfo2().hblkhd)
    del array
    return mapped


@pytest.mark.cluster
def test_a_plain_workers_fit_keeps_freed_memory(tmp_path, problem):
    """A worker that Dask's nanny started with its own malloc setting (MALLOC_TRIM_THRESHOLD_
    65536: each fresh large array faulted in page by page) keeps freed memory once a fit whose
    factors fit its memory has started (``runtime.mallocplugin.set_worker_malloc``)."""
    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (1, 2))
    environ = dict(os.environ)  # a plain LocalCluster's nannies leave their spawn settings there
    try:
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=2, processes=True, dashboard_address="127.0.0.1:0"
            ) as lc,
            Client(lc) as c,
        ):
            (before,) = c.run(_mapped_on_reuse).values()
            OrdNMF(K, max_iter=2, n_members=1).fit(store, c)
            (after,) = c.run(_mapped_on_reuse).values()
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert before >= 24 << 20
    assert after < 24 << 20


@pytest.mark.cluster
def test_workers_of_a_fit_that_spills_return_freed_memory(tmp_path):
    """Where the factors exceed the workers' memory (a 1400 x 1400 store at K = 1400: about
    479 MiB with CAVI, two workers of 600 MiB leaving 320), Dask spills them to disk and
    must see the process's memory fall: the fit's workers return freed memory at once, even
    those of the LocalCluster the package starts (which otherwise keep it), and a later fit
    that fits keeps it again."""
    users = np.r_[np.arange(1400), np.arange(1400)]
    items = np.r_[np.arange(1400), (np.arange(1400) + 1) % 1400]
    store = ingest(
        (users, items, np.ones(2800)), tmp_path / "s.zarr", test_fraction=0.0, grid=(4, 4)
    )
    with resolve_client(None, 2, memory_limit="600MiB") as c:
        kept = set(c.run(_mapped_on_reuse).values())
        OrdNMF(1400, max_iter=1, optimizer="cavi", n_members=1).fit(store, c)
        spilled = set(c.run(_mapped_on_reuse).values())
        OrdNMF(2, max_iter=1, n_members=1).fit(store, c)
        again = set(c.run(_mapped_on_reuse).values())
    assert max(kept) < 24 << 20 and max(again) < 24 << 20, (kept, again)
    assert min(spilled) >= 24 << 20, spilled


def test_random_init_does_not_depend_on_grid(tmp_path, client, problem):
    n_classes, train, test, _, _ = problem
    fits = []
    for grid in [(1, 1), (3, 2)]:
        store = store_from_dense(tmp_path / f"s{grid[0]}.zarr", train, test, n_classes, grid)
        fits.append(OrdNMF(K, max_iter=2, seed=3, n_members=1).fit(store, client))
    np.testing.assert_allclose(fits[0].elbo_, fits[1].elbo_, rtol=1e-12)
    other_seed = OrdNMF(K, max_iter=2, seed=4, n_members=1).fit(store, client)
    assert other_seed.elbo_[-1] != fits[1].elbo_[-1]


def test_scheduler_graph_stays_bounded(tmp_path, client, problem):
    """With checkpoints cutting the lineage, the scheduler holds no more tasks and the workers
    no more results at iteration 40 than at iteration 10."""
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (2, 2))
    counts = {}

    def count_tasks(info):
        n = info.iteration
        tasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        held = sum(client.run(lambda dask_worker: len(dask_worker.data)).values())
        counts[n] = (tasks, held)

    family = OrdinalFamily(tuple(store.hist_train.tolist()))
    runner = CaviRunner(
        client,
        store,
        family,
        CaviConfig(K, max_iter=40, tol=1e-300, optimizer="cavi"),
        str(tmp_path),
        cache_blocks=True,
        checkpoint_every=5,
    )
    runner.run(runner.random_init, count_tasks)
    # the scheduler's task count cycles with the checkpoint period instead of growing: without
    # the cut, iterations 31-40 would hold ~25 iterations' worth of tasks more than 6-15. How
    # fast the scheduler forgets the graph before a checkpoint depends on the machine's load
    # (the count just after one was 76 in one run, 108 in another), so only the peaks of a
    # period are compared, within one iteration's tasks
    per_iteration = counts[8][0] - counts[7][0]  # tasks one iteration adds within a period (~50)
    assert per_iteration > 20
    late, early_tasks = [counts[n][0] for n in range(31, 41)], [counts[n][0] for n in range(6, 16)]
    assert max(late) <= max(early_tasks) + per_iteration
    # results held by the workers: bounded. Around a checkpoint the count jumps for an
    # iteration while the state read back replaces the old one (87 against 30-43 seen), so
    # compare medians: one more result kept per iteration would add ~20 between the halves
    early = float(np.median([counts[n][1] for n in range(1, 21)]))
    assert np.median([counts[n][1] for n in range(21, 41)]) <= early + 5


@pytest.mark.cluster
def test_a_model_fitted_without_out_lives_until_the_process_exits(tmp_path, problem):
    """Without ``out``, the model goes to a temporary directory that the fitted attributes
    read from while the process runs, and that is removed when it exits (none left behind)."""
    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (2, 2))
    script = (
        "from ordnmf_dask import OrdNMF\n"
        f"m = OrdNMF({K}, max_iter=2, n_members=1).fit({store.path!r})\n"
        "print(m.model_path_, m.W_.compute().shape)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    path, shape = done.stdout.split(maxsplit=1)
    assert os.path.basename(os.path.dirname(path)).startswith("ordnmf-model-")
    assert shape.strip() == f"({train.shape[0]}, {K})"
    assert not os.path.exists(os.path.dirname(path))


def test_a_fit_that_cannot_start_leaves_no_scratch_directory(tmp_path, monkeypatch, problem):
    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (1, 1))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(NotADirectoryError, match="a-file"):
        OrdNMF(K, max_iter=1, checkpoint_dir=str(blocker / "ckpt"), n_members=1).fit(store)
    assert list(scratch.iterdir()) == []


def test_save_and_load_round_trip(tmp_path, problem):
    """(In-process: what is saved does not depend on the executor, tests/test_inprocess.py.)"""
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (2, 2))
    model = OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(
        store, out=tmp_path / "m.zarr"
    )
    model.save(tmp_path / "copy.zarr")
    loaded = OrdNMF.load(tmp_path / "copy.zarr")
    assert loaded.get_params() == model.get_params()
    assert loaded.elbo_ == model.elbo_
    np.testing.assert_array_equal(loaded.W_.compute(), model.W_.compute())
    assert not list(tmp_path.glob("*.tmp-*"))
    saved = {p.name for p in (tmp_path / "copy.zarr" / "W" / "0").iterdir() if p.is_dir()}
    assert saved == {"mean", "geo", "shape", "prior_rate", "log_mean", "rate"}


def test_resume_continues_exactly_and_skips_a_truncated_checkpoint(tmp_path, client, problem):
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (2, 3))
    ckpt = tmp_path / "ckpt"

    def est(max_iter: int) -> OrdNMF:
        return OrdNMF(
            K,
            optimizer="cavi",
            max_iter=max_iter,
            tol=1e-12,
            checkpoint_every=3,
            checkpoint_dir=str(ckpt),
            n_members=1,
        )

    whole = OrdNMF(K, optimizer="cavi", max_iter=10, tol=1e-12, n_members=1).fit(
        store, client, init=(w0, h0)
    )
    # "interrupted" after 7 iterations: checkpoints at 3 and 6 remain
    est(7).fit(store, client, init=(w0, h0))
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-00000003", "ckpt-00000006"]
    # a checkpoint holds the state only; a saved model also its derived log_mean and rate
    state = {"mean", "geo", "shape", "prior_rate"}
    chunk = ckpt / "ckpt-00000006" / "W" / "1"
    assert {p.name for p in chunk.iterdir() if p.is_dir()} == state
    interrupted = tmp_path / "interrupted"  # the same checkpoints again, for the truncation below
    shutil.copytree(ckpt, interrupted)
    resumed = est(10).fit(store, client, init=(w0, h0), resume=True)
    assert resumed.elbo_ == whole.elbo_
    np.testing.assert_array_equal(resumed.W_.compute(), whole.W_.compute())
    np.testing.assert_array_equal(resumed.H_.compute(), whole.H_.compute())

    # truncate a chunk of the newest checkpoint: it must be skipped, the older one used
    shutil.rmtree(ckpt)
    interrupted.rename(ckpt)
    newest = ckpt / "ckpt-00000006" / "W" / "1" / "mean" / "c" / "0" / "0"
    newest.write_bytes(newest.read_bytes()[:10])
    again = est(10).fit(store, client, init=(w0, h0), resume=True)
    assert again.elbo_ == whole.elbo_


def test_a_fit_stopping_at_a_checkpoint_iteration_leaves_no_checkpoint_for_it(
    tmp_path, client, problem
):
    """A checkpoint's chunks are written while its iteration runs; when that iteration ends
    the fit (converged), the writes are dropped: neither it nor a ``.tmp`` is left."""
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (2, 2))
    ckpt = tmp_path / "ckpt"
    model = OrdNMF(
        K,
        tol=1.0,
        min_iter=2,
        max_iter=10,
        checkpoint_every=1,
        checkpoint_dir=str(ckpt),
        n_members=1,
    ).fit(store, client, init=(w0, h0))
    assert model.converged_ and model.n_iter_ == 3
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-00000001", "ckpt-00000002"]
    plain = OrdNMF(K, tol=1.0, min_iter=2, max_iter=10, n_members=1).fit(
        store, client, init=(w0, h0)
    )
    assert model.elbo_ == plain.elbo_


def test_resume_refuses_a_checkpoint_of_another_configuration(tmp_path, client, problem):
    n_classes, train, test, w0, h0 = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (1, 2))
    ckpt = str(tmp_path / "ckpt")
    OrdNMF(K, max_iter=4, checkpoint_every=3, checkpoint_dir=ckpt, n_members=1).fit(store, client)
    # none after the last iteration: its state is the saved model
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-00000003"]
    other = OrdNMF(K, max_iter=4, alpha_W=1.0, checkpoint_every=3, checkpoint_dir=ckpt, n_members=1)
    fresh = OrdNMF(K, max_iter=4, alpha_W=1.0, n_members=1).fit(store, client)
    refused = re.escape(ckpt) + " holds checkpoints of another .* restart=True"
    for resume in (True, False):  # the checkpoints do not match: refused, and kept
        with pytest.raises(InputError, match=refused):
            other.fit(store, client, resume=resume)
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-00000003"]
    other.fit(store, client, restart=True)  # discards them and starts afresh
    assert other.elbo_ == fresh.elbo_


def test_restarts_keep_the_best_run(tmp_path, problem):
    """(In-process: n_init on a cluster runs in tests/test_estimator_contract.py and
    tests/test_output_safety.py; the executors agree bitwise, tests/test_inprocess.py.)"""
    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (2, 2))
    here = {"max_iter": 4, "executor": "inprocess"}
    best = OrdNMF(K, n_init=3, seed=10, **here, n_members=1).fit(store)
    singles = [OrdNMF(K, seed=s, **here, n_members=1).fit(store) for s in (10, 11, 12)]
    finals = [m.elbo_[-1] for m in singles]
    assert [r["elbo"] for r in best.runs_] == finals
    assert best.elbo_ == singles[int(np.argmax(finals))].elbo_
    assert [r["kept"] for r in best.runs_] == [f == max(finals) for f in finals]


def test_strip_block_and_chunk_homes():
    """Row strips go to the workers in contiguous runs of about as many blocks each; a strip's
    blocks and its user-block's W chunk go with it; restrictions are loose; none without
    workers."""
    from ordnmf_dask.engine.cavi import homes

    home = homes(["a", "b"], 4, [[0, 1, 2]], [[0], [1], [2], [3]])
    assert [h["workers"] for h in home["row"]] == [["a"], ["a"], ["b"], ["b"]]
    assert all(h["allow_other_workers"] for h in home["row"])
    assert [[h["workers"][0] for h in row] for row in home["block"]] == [
        ["a"] * 3,
        ["a"] * 3,
        ["b"] * 3,
        ["b"] * 3,
    ]
    assert [h["workers"] for h in home["col"]] == [["a"], ["a"], ["b"]]
    one_row = homes(["a", "b"], 1, [[0], [1, 2]], [[0]])  # one user-block cut into two strips
    assert [h["workers"][0] for h in one_row["strip"][0]] == ["a", "b"]
    assert [h["workers"][0] for h in one_row["block"][0]] == ["a", "b", "b"]
    assert one_row["row"][0]["workers"] == ["a"]
    # strips of 3, 1, 1 and 1 blocks on 2 workers: 3 blocks each, not 2 strips each
    uneven = homes(["a", "b"], 1, [[0, 1, 2], [3], [4], [5]], [[0]])
    assert [h["workers"][0] for h in uneven["strip"][0]] == ["a", "b", "b", "b"]
    for workers in ([], ["a"]):
        none = homes(workers, 2, [[0, 1]], [[0, 1]])
        assert none["row"] == [{}, {}] and none["block"] == [[{}, {}], [{}, {}]]
        assert none["colstrip"] == [[{}, {}]]


def test_column_strips_spread_over_all_workers():
    """The H-rate pass's column strips go to every worker that holds blocks, each to a worker
    holding one of its blocks, about as many blocks' worth to each (the first block's worker
    alone would leave half the workers idle: runs of two user-blocks)."""
    from ordnmf_dask.engine.cavi import homes

    workers = ["a", "b", "c", "d"]
    home = homes(workers, 4, [[0, 1], [2, 3]], [[0, 1], [2, 3]])
    placed = [[h["workers"][0] for h in line] for line in home["colstrip"]]
    assert sorted({w for line in placed for w in line}) == workers
    for run, line in zip([[0, 1], [2, 3]], placed, strict=True):
        for c, w in enumerate(line):
            assert w in {home["block"][r][c]["workers"][0] for r in run}
    assert sorted(w for line in placed for w in line) == sorted(workers * 2)


def test_item_block_sums_are_added_on_the_h_chunks_worker(tmp_path, client, problem):
    """SH and the H-rate terms of each item-block are summed (the last add of each tree) on
    the worker its H chunk prefers, where the next H update runs."""
    from distributed import wait

    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (4, 3))
    family = OrdinalFamily(tuple(store.hist_train.tolist()))
    runner = CaviRunner(client, store, family, CaviConfig(K), str(tmp_path), cache_blocks=True)
    w, h = runner.random_init()
    params = family.init_params()
    _, sh, _ = runner._local_pass(w, h, params)
    corr = runner._col_corrections(params, w)
    assert len(runner.row_runs) > 1  # H-rate terms summed over several column strips
    ends = [x[0] if isinstance(x, tuple) else x for x in sh + corr]
    wait(ends)
    where = client.run_on_scheduler(
        lambda dask_scheduler, keys: [
            sorted(dask_scheduler.tasks[k].worker_restrictions or ()) for k in keys
        ],
        keys=[f.key for f in ends],
    )
    homes = [runner._home["col"][c]["workers"] for c in range(store.grid[1])]
    assert where == homes + homes
    assert len({w for (w,) in homes}) == 2


def test_a_pass_on_two_workers_is_one_task_per_worker_and_the_same_fit(
    tmp_path, client, problem, monkeypatch
):
    """On several workers the strips of a pass run as one task per worker on its threads
    (docs/design.md §4, "One task per worker per pass"): 12 strips a pass on a 4 x 3 grid, 2
    tasks, which also add the subtrees of the sums whose strips are all theirs; the fit is
    bitwise the one with a task per strip."""
    from distributed import get_task_stream

    from ordnmf_dask.engine import cavi

    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (4, 3))

    def fit() -> tuple[OrdNMF, dict[str, list[str]]]:
        with get_task_stream(client) as stream:
            model = OrdNMF(K, max_iter=3, optimizer="cavi", n_members=1).fit(store, client)
        ran: dict[str, list[str]] = {}
        for task in stream.data:
            ran.setdefault(task["key"].rsplit("-", 1)[0], []).append(task["worker"])
        return model, ran

    batched, ran = fit()
    # the first local pass and 3 iterations of three passes, each one task on each worker
    for name, passes in [("local-strips", 4), ("row-correction-strips", 3)]:
        assert len(ran[name]) == 2 * passes
        assert len(set(ran[name])) == 2
    assert len(ran["col-correction-strips"]) == 2 * 3
    assert not any(name.startswith("local_strip") for name in ran)
    monkeypatch.setattr(cavi, "ONE_TASK_PER_WORKER", False)
    alone, ran_alone = fit()
    assert len(ran_alone["local_strip"]) == 4 * 12
    # the adds of a tree whose strips are one worker's run inside its pass task: fewer adds
    # (45 against 115 here) and fewer parts taken out as tasks of their own (102 against 140:
    # a part in a pass task, or a sum it made, is taken out before it moves to an add)
    assert len(ran["evaluate"]) < len(ran_alone["evaluate"]) / 2
    assert len(ran["_pick"]) < len(ran_alone["_pick"])
    assert alone.elbo_ == batched.elbo_
    for name in ("W_", "H_", "log_W_", "log_H_"):
        np.testing.assert_array_equal(
            getattr(alone, name).compute(), getattr(batched, name).compute()
        )
    np.testing.assert_array_equal(alone.delta_, batched.delta_)


def test_no_add_receives_a_pass_task_s_whole_result(tmp_path, client, problem):
    """A worker's pass task holds all its strips' results; an add reads it directly only on
    that worker (a node of its own home), elsewhere through the part taken out there
    (docs/design.md §4, "One task per worker per pass")."""
    from distributed import wait

    n_classes, train, test, _, _ = problem
    store = store_from_dense(tmp_path / "s.zarr", train, test, n_classes, (4, 3))
    family = OrdinalFamily(tuple(store.hist_train.tolist()))
    runner = CaviRunner(client, store, family, CaviConfig(K), str(tmp_path), cache_blocks=True)
    w, h = runner.random_init()
    params = family.init_params()
    sw, sh, small = runner._local_pass(w, h, params)
    ends = [*sw, *sh, small, *runner._row_corrections(params, h)]
    ends += runner._col_corrections(params, w)
    wait([x[0] if isinstance(x, tuple) else x for x in ends])

    def reads(dask_scheduler) -> list[tuple[str, list[str], list[str]]]:
        return [
            (dep.key, sorted(ts.worker_restrictions or ()), sorted(dep.worker_restrictions or ()))
            for ts in dask_scheduler.tasks.values()
            if ts.key.startswith("evaluate")
            for dep in ts.dependencies
            if dep.key.split("-")[-2] == "strips"
        ]

    direct = client.run_on_scheduler(reads)
    assert all(mine == theirs for _, mine, theirs in direct)
    assert len(ends) > 0


def test_strip_runs():
    """Runs of blocks per strip: few enough blocks and factor rows per strip, enough strips for
    MIN_STRIPS workers (when there are that many blocks), never depending on the cluster."""
    from ordnmf_dask.engine.cavi import MAX_STRIP_COLS, MIN_STRIPS, runs

    w = np.array([1000] * 6)
    assert runs(w, MIN_STRIPS, MAX_STRIP_COLS) == [[0, 1, 2, 3, 4, 5]]  # enough strips: one run
    assert runs(w, MIN_STRIPS // 2, MAX_STRIP_COLS) == [[0, 1, 2], [3, 4, 5]]  # 2 runs
    assert runs(w, 1, MAX_STRIP_COLS) == [[j] for j in range(6)]  # never more runs than blocks
    assert runs(np.array([10] * 20), MIN_STRIPS, MAX_STRIP_COLS) == [
        list(range(0, 7)),
        list(range(7, 14)),
        list(range(14, 20)),
    ]  # at most MAX_STRIP_BLOCKS = 8 blocks per strip
    wide = np.array([MAX_STRIP_COLS // 2 + 1] * 4)
    assert runs(wide, MIN_STRIPS, MAX_STRIP_COLS) == [[0], [1], [2], [3]]  # <= MAX_STRIP_COLS
    uneven = np.array([10, 10, 10, MAX_STRIP_COLS])  # 2 equal-count runs; the 2nd is too wide
    assert runs(uneven, MIN_STRIPS, MAX_STRIP_COLS) == [[0, 1], [2], [3]]
    assert runs(np.array([3 * MAX_STRIP_COLS]), MIN_STRIPS, MAX_STRIP_COLS) == [[0]]  # alone
    square = runs(np.array([1000] * 10), 10, MAX_STRIP_COLS)  # a 10 x 10 grid: 70 row strips
    assert square == [[0, 1], [2, 3], [4, 5], [6], [7], [8], [9]]


@pytest.mark.cluster
def test_own_local_cluster_spills_on_process_memory_only():
    """The LocalCluster a fit starts has Dask's managed-memory target off (spill, pause and
    restart thresholds unchanged); the caller's Dask config is left as it was."""
    import dask

    from ordnmf_dask.runtime.cluster import resolve_client

    before = dask.config.get("distributed.worker.memory.target")
    with resolve_client(None, 1, memory_limit="1GB") as c:
        fractions = c.run(
            lambda dask_worker: (
                dask_worker.memory_manager.memory_target_fraction,
                dask_worker.memory_manager.memory_spill_fraction,
                dask_worker.memory_manager.memory_pause_fraction,
            )
        )
    assert list(fractions.values()) == [(False, 0.7, 0.8)]
    assert dask.config.get("distributed.worker.memory.target") == before


@pytest.mark.cluster
def test_own_local_cluster_workers_keep_freed_memory():
    """The workers of the LocalCluster a fit starts run with the package's malloc settings
    instead of Dask's trimming, and the caller's Dask config is left as it was."""
    import os

    import dask

    from ordnmf_dask.runtime.cluster import WORKER_MALLOC, resolve_client

    before = dask.config.get("distributed.nanny.pre-spawn-environ")
    with resolve_client(None, 1, memory_limit="1GB") as c:
        env = c.run(lambda: {name: os.environ.get(name) for name in WORKER_MALLOC})
    assert list(env.values()) == [{name: str(v) for name, v in WORKER_MALLOC.items()}]
    assert dask.config.get("distributed.nanny.pre-spawn-environ") == before
