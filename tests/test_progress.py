"""Progress reporting of batches of futures (log lines in batch jobs), and the show_progress
switch of fit, ingest and evaluate from Python."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF, evaluate, ingest_arrays
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
    OrdNMF(2, max_iter=4, tol=1e-300, seed=0).fit(store, **kw)
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
    out = _fit(small_store, FakeTTY(), monkeypatch)  # show_progress=None: auto
    bars = [part for part in out.split("\r") if part.startswith("fit [")]
    assert [b.split()[2] for b in bars] == ["1/4", "2/4", "3/4", "4/4"]
    assert "ETA <= 0:00:" in bars[2]
    assert " iter    4/4 " in out


def test_no_progress_when_off_or_not_interactive(small_store, monkeypatch, caplog):
    assert _fit(small_store, FakeTTY(), monkeypatch, show_progress=False) == ""
    assert _fit(small_store, io.StringIO(), monkeypatch) == ""  # auto, no terminal


def test_the_outermost_switch_decides(small_store, monkeypatch):
    """A fit inside a call switched off (as tune's fits are) shows nothing, whatever its own
    default would."""
    stream = FakeTTY()
    monkeypatch.setattr(sys, "stderr", stream)
    with reporting(False):
        OrdNMF(2, max_iter=2).fit(small_store)
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
    store = ingest_arrays([1, 2, 3], [5, 6, 5], [1, 2, 3], tmp_path / "s.zarr", test_fraction=0.0,
                          show_progress=True)
    said = f"ingest: {store.path}: 3 users x 2 items, 3 train / 0 test nonzeros"
    assert said in stream.getvalue()
    model = OrdNMF(2, max_iter=2).fit(small_store, show_progress=False)
    assert "iter" not in stream.getvalue()
    evaluate(small_store, model, show_progress=True)
    assert "(2 x 2 blocks): done in" in stream.getvalue()
    before = stream.getvalue()
    evaluate(small_store, model)
    assert stream.getvalue() == before
