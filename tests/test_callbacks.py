"""Fit callbacks (IterationInfo, stopping a fit, the default log kept), progress and the
first-iteration notice, and the LocalCluster's dashboard."""

from __future__ import annotations

import logging
import urllib.request

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF
from ordnmf_dask.engine import cavi
from ordnmf_dask.engine.cavi import IterationInfo
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.runtime.progress import IterationProgress

K = 3


@pytest.fixture
def store_40x30(tmp_path):
    train, test = dense_split(synthetic_ordinal(40, 30, 4, seed=2))
    return store_from_dense(tmp_path / "s.zarr", train, test, 4, (2, 2))


def test_a_callback_sees_every_iteration_and_can_stop_the_fit(store_40x30, client, caplog):
    seen: list[IterationInfo] = []

    def stop_at_4(info: IterationInfo) -> bool:
        seen.append(info)
        return info.iteration == 4

    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        est = OrdNMF(K, max_iter=50, tol=1e-12, n_members=1).fit(
            store_40x30, client, callback=stop_at_4
        )
    assert [i.iteration for i in seen] == [1, 2, 3, 4] and est.n_iter_ == 4
    assert all(i.max_iter == 50 for i in seen)
    assert [i.elbo for i in seen] == est.elbo_
    assert seen[0].rel_change == np.inf and seen[1].rel_change > 0
    elapsed = [i.elapsed for i in seen]
    assert elapsed == sorted(elapsed) and all(i.seconds >= 0 for i in seen)
    assert all(i.validation is None and i.best_iteration is None for i in seen)
    np.testing.assert_array_equal(seen[-1].params, est.delta_)
    model = open_model(est.model_path_)
    assert model.attrs["stop_reason"] == "callback" and not est.converged_
    # the default iteration log stays on with a callback: n of max_iter, elapsed, ETA
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("iter ")]
    assert len(lines) == 4 and lines[0].startswith("iter    1/50")
    assert "elapsed 0:00:" in lines[3] and "ETA <= " in lines[3]


def test_info_stop_stops_the_fit(store_40x30, client):
    def stop_at_2(info: IterationInfo) -> None:
        if info.iteration == 2:
            info.stop()

    est = OrdNMF(K, max_iter=50, tol=1e-12, n_members=1).fit(
        store_40x30, client, callback=stop_at_2
    )
    assert est.n_iter_ == 2


def test_a_slow_first_iteration_is_explained(store_40x30, client, caplog, monkeypatch):
    monkeypatch.setattr(cavi, "FIRST_NOTICE_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        OrdNMF(K, max_iter=2, n_members=1).fit(store_40x30, client)
    assert (
        "iteration 1 of 2 still running after 0 s: the workers read the training blocks"
        in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(store_40x30)
    assert "still running after 0 s: this process reads the training blocks" in caplog.text
    assert "workers" not in caplog.text


def test_progress_estimates_the_rest_from_iterations_after_the_first():
    p = IterationProgress(100)
    assert p.eta(1, 30.0) == "ETA after the next iteration"  # the first: reads and compiles
    assert p.eta(3, 34.0) == f"ETA <= {p.clock(97 * 2.0)} to max_iter"
    assert p.clock(3725) == "1:02:05"
    assert p.eta(100, 300.0) == "at max_iter"
    resumed = IterationProgress(100)
    resumed.eta(40, 5.0)
    assert resumed.eta(50, 15.0) == f"ETA <= {p.clock(50.0)} to max_iter"


def test_the_dashboard_link_works(client):
    """The dashboard the LocalCluster serves is bokeh's, not the page saying bokeh is missing."""
    with urllib.request.urlopen(client.dashboard_link, timeout=30) as page:
        text = page.read().decode(errors="replace")
    assert page.status == 200 and "bokeh" in text.lower()
    assert "Dask needs bokeh" not in text


def test_only_a_fit_on_the_main_thread_draws_a_bar(monkeypatch):
    """On a terminal showing INFO, the main thread's fit draws a bar; fits run from other
    threads (tune's concurrent trials) do not, so their bars cannot overwrite each other."""
    import threading

    from ordnmf_dask.runtime import progress

    monkeypatch.setattr(progress, "_terminal", lambda: True)
    monkeypatch.setattr(progress.log, "isEnabledFor", lambda level: True)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(IterationProgress(10).bar))
    worker.start()
    worker.join()
    assert IterationProgress(10).bar is True
    assert seen == [False]


def test_on_a_terminal_one_line_shows_the_elbo_and_the_log_is_periodic(
    store_40x30, monkeypatch, caplog, capsys
):
    """With a progress line drawn (a terminal), it carries the ELBO, its relative change and
    the stopping rule, not a bar scaled to max_iter; the iteration log lines come every
    SUMMARY_EVERY iterations (and the first) only."""
    from ordnmf_dask.runtime import progress

    monkeypatch.setattr(progress, "_terminal", lambda: True)
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        OrdNMF(K, max_iter=12, tol=1e-12, executor="inprocess", n_members=1).fit(store_40x30)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("iter ")]
    assert [int(m.split()[1].split("/")[0]) for m in logged] == [1, 10]
    drawn = capsys.readouterr().err
    assert "fit iter " in drawn and ", elbo " in drawn  # tqdm's line (it redraws at its pace)
    assert "(stops at rel < 1e-12 or iter 12)" in drawn
    assert "[#" not in drawn and "/12" not in drawn
