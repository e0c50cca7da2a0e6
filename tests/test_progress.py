"""Progress reporting of batches of futures (log lines in batch jobs)."""

from __future__ import annotations

import logging

from ordnmf_dask.dist.progress import track


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
