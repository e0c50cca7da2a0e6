"""Progress reporting of batches of futures (log lines in batch jobs), and the show_progress
switch of fit, ingest and evaluate from Python."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF, evaluate, fitting, ingest_arrays
from ordnmf_dask.runtime.progress import reporting, track


def _slow(x):
    return x


def test_track_logs_each_tenth_and_the_end(client, caplog):
    futures = [client.submit(_slow, i, pure=False) for i in range(20)]
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        track(futures, "demo", min_seconds=0.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("demo")]
    assert lines[-1].startswith("demo: 20/20 done")
    assert 2 <= len(lines) <= 11
    assert [f.result() for f in futures] == list(range(20))


# ------------------------------------------------------------------ the show_progress switch


class FakeTTY(io.StringIO):
    """A terminal as far as the package can tell."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    train, test = dense_split(synthetic_ordinal(30, 20, 4, seed=2))
    return store_from_dense(tmp_path_factory.mktemp("progress") / "s.zarr", train, test, 4, (2, 2))


def _config() -> tuple:
    log = logging.getLogger("ordnmf_dask")
    return list(log.handlers), log.level, log.propagate


def _fit(store, stream, monkeypatch, **kw) -> str:
    """stderr of an in-process fit of 4 iterations with ``kw``, written to ``stream``; the
    logging configuration is checked to be as it was."""
    before = _config()
    monkeypatch.setattr(sys, "stderr", stream)
    OrdNMF(2, max_iter=4, tol=1e-300, seed=0, n_members=1).fit(store, **kw)
    assert _config() == before
    return stream.getvalue()


def test_a_fit_shows_log_lines_with_the_eta_on_a_plain_stream(small_store, monkeypatch):
    out = _fit(small_store, io.StringIO(), monkeypatch, show_progress=True)
    lines = out.splitlines()
    iters = [ln for ln in lines if " iter " in ln]
    assert [ln.split(" iter ")[1].split()[0] for ln in iters] == ["1/4", "2/4", "3/4", "4/4"]
    assert "ETA <= 0:00:" in iters[2] and "elapsed 0:00:" in iters[2]
    assert "\r" not in out  # no bar where stderr is no terminal


def test_a_fit_draws_a_bar_on_a_terminal_by_default(small_store, monkeypatch):
    """One tqdm line, redrawn at each iteration with the ELBO, its relative change and the
    stopping rule, cleared for each log line and removed at the end; the log line every
    SUMMARY_EVERY iterations (and the first) only."""
    out = _fit(small_store, FakeTTY(), monkeypatch)  # show_progress=None: auto
    bars = [part for part in out.split("\r") if part.startswith("fit iter ")]
    assert [b.split()[2].rstrip(",") for b in bars] == ["1", "2", "3", "4"]
    assert "elbo -" in bars[2] and "(stops at rel < 1e-300 or iter 4)" in bars[2]
    assert " iter    1/4 " in out and " iter    2/4 " not in out  # the line shows each one
    last = out[out.rindex("fit iter ") :]  # the line removed before the end line is logged
    assert re.search(r"\r +\r[0-9:]+ INFO ordnmf_dask: fit: stopped at max_iter", last)


def test_no_progress_when_off(small_store, monkeypatch, caplog):
    assert _fit(small_store, FakeTTY(), monkeypatch, show_progress=False) == ""
    assert _fit(small_store, io.StringIO(), monkeypatch, show_progress=False) == ""


def test_a_script_gets_a_summary_by_default(small_store, monkeypatch):
    """show_progress=None where stderr is no terminal (a script, a batch job): a start line,
    the first iteration and every SUMMARY_EVERY-th with the ETA, the store's held-out share
    (once per store and process), an end line; no bar."""
    stream = io.StringIO()
    before = _config()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(fitting, "_HELD_OUT_SAID", set())
    OrdNMF(2, max_iter=25, tol=1e-300, seed=0, n_members=1).fit(small_store)
    OrdNMF(2, max_iter=3, tol=1e-300, seed=0, n_members=1).fit(small_store)
    assert _config() == before
    lines = stream.getvalue().splitlines()
    iters = [ln.split(" iter ")[1].split()[0] for ln in lines if " iter " in ln]
    assert iters == ["1/25", "10/25", "20/25", "1/3"]
    assert all("ETA" in ln for ln in lines if " iter " in ln)
    starts = [ln for ln in lines if "fit: OrdNMF, K = 2, on " in ln]
    assert len(starts) == 2 and "at most 25 iterations" in starts[0]
    ends = [ln for ln in lines if "fit: stopped at max_iter after" in ln]
    assert len(ends) == 2 and "after 25 iterations" in ends[0]
    held = [ln for ln in lines if "as a test split" in ln]
    assert len(held) == 1 and "--test-fraction 0" in held[0]
    assert "\r" not in stream.getvalue()


def test_a_store_without_a_test_split_says_nothing_of_one(tmp_path, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    store = ingest_arrays(
        [1, 2, 3, 3],
        [5, 6, 5, 6],
        [1, 2, 3, 1],
        tmp_path / "s.zarr",
        test_fraction=0.0,
        show_progress=False,
    )
    OrdNMF(1, max_iter=2, n_members=1).fit(store)
    assert "fit: OrdNMF, K = 1" in stream.getvalue()
    assert "test split" not in stream.getvalue()


def test_a_small_store_on_a_given_client_says_it_would_fit_here(small_store, client, caplog):
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        OrdNMF(2, max_iter=2, n_members=1).fit(small_store, client)
        said = [
            r.getMessage() for r in caplog.records if "would fit in this process" in r.getMessage()
        ]
        assert len(said) == 1
        assert "running on the given client" in said[0] and "executor='cluster'" in said[0]
        OrdNMF(2, max_iter=2, executor="cluster", n_members=1).fit(small_store, client)
    assert len([r for r in caplog.records if "would fit in this process" in r.getMessage()]) == 1


COMPILED = """
import numpy as np
from ordnmf_dask.model.kernels import jit

@jit()
def twice(x):
    return 2 * x

print(twice(np.arange(3)).sum())
"""


def test_a_first_compilation_is_announced_once_and_a_cached_one_not(tmp_path):
    """A new kernel (here a module of its own) in a fresh numba cache: its first run says that
    it compiles, on stderr, in a script without any logging set up; the next process, loading
    it from the cache, says nothing."""
    (tmp_path / "kern.py").write_text(COMPILED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "kern.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert [r.stdout for r in runs] == ["6\n", "6\n"]
    first = runs[0].stderr.splitlines()
    assert len(first) == 1 and first[0].startswith("compiling numba kernels (fit): their first")
    assert runs[1].stderr == ""


def test_the_outermost_switch_decides(small_store, monkeypatch):
    """A fit inside a call switched off (as tune's fits are) shows nothing, whatever its own
    default would."""
    stream = FakeTTY()
    monkeypatch.setattr(sys, "stderr", stream)
    with reporting(False):
        OrdNMF(2, max_iter=2, n_members=1).fit(small_store)
    assert stream.getvalue() == ""


def test_a_users_handlers_get_what_they_got_before(small_store, monkeypatch):
    """With show_progress, the user's handler on the root logger (which gets WARNING and up)
    gets no INFO record of the fit: the progress goes to stderr only."""
    seen: list[logging.LogRecord] = []
    mine = logging.Handler()
    mine.emit = seen.append  # type: ignore[method-assign]
    root = logging.getLogger()
    root.addHandler(mine)
    try:
        out = _fit(small_store, io.StringIO(), monkeypatch, show_progress=True)
        logging.getLogger("ordnmf_dask").warning("after the fit")
    finally:
        root.removeHandler(mine)
    assert " iter    4/4 " in out
    assert [r.getMessage() for r in seen] == ["after the fit"]


def test_ingest_and_evaluate_report_when_on(small_store, monkeypatch, tmp_path):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    store = ingest_arrays(
        [1, 2, 3], [5, 6, 5], [1, 2, 3], tmp_path / "s.zarr", test_fraction=0.0, show_progress=True
    )
    said = f"ingest: {store.path}: 3 users x 2 items, 3 train / 0 test nonzeros"
    assert said in stream.getvalue()
    model = OrdNMF(2, max_iter=2, n_members=1).fit(small_store, show_progress=False)
    assert "iter" not in stream.getvalue()
    evaluate(small_store, model, show_progress=True)
    assert "(2 x 2 blocks): done in" in stream.getvalue()
    before = stream.getvalue()
    evaluate(small_store, model, show_progress=False)
    assert stream.getvalue() == before
    evaluate(small_store, model)  # a script's default: its one line
    assert stream.getvalue().count("(2 x 2 blocks): done in") == 2


def test_each_group_of_kernels_is_announced_once_per_process(caplog):
    """However long and however many compilations a group takes (a slow machine's compile
    of one kernel outlasting a minute once announced it again), one line per group; the group
    is what the process compiles for (a fit unless said)."""
    from ordnmf_dask.model import compiling

    announcer = compiling._Announcer()
    with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):
        for _ in range(2):
            announcer.on_start(None)
            announcer.on_end(None)
        with compiling.announced_as("evaluate"):
            announcer.on_start(None)
            with compiling.announced_as("fold-in"):
                announcer.on_start(None)
            announcer.on_start(None)
        announcer.on_start(None)
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in said] == [
        "compiling numba kernels (fit)",
        "compiling numba kernels (evaluate)",
        "compiling numba kernels (fold-in)",
    ]


def test_evaluate_says_its_compilations_are_its_own(small_store, monkeypatch):
    """What evaluate compiles is announced as evaluate's, not as a fit's (the notice said
    "(fit)"): the group in force while it scores the test split."""
    from ordnmf_dask.model import compiling
    from ordnmf_dask.postfit import evaluate as evaluating

    model = OrdNMF(2, max_iter=2, n_members=1).fit(small_store, show_progress=False)
    seen = []
    score_split = evaluating.score_split

    def spy(*args, **kwargs):
        seen.append(compiling._group())
        return score_split(*args, **kwargs)

    monkeypatch.setattr(evaluating, "score_split", spy)
    evaluate(small_store, model, show_progress=False)
    assert seen == ["evaluate"]
    assert compiling._group() == "fit"  # and nothing left behind
