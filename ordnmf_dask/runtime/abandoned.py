"""Temporary directories of interrupted writes that a task still running may write into: kept
until the workers that ran those tasks are gone (a LocalCluster or in-process pool this process
started is closed, :mod:`ordnmf_dask.runtime.cluster`), then removed, so that a signal leaves
nothing behind."""

from __future__ import annotations

import shutil

_ABANDONED: set[str] = set()


def abandoned(path: str) -> None:
    """Record the local temporary directory ``path`` of an interrupted write, to be removed by
    :func:`sweep_abandoned`."""
    _ABANDONED.add(path)


def forget(path: str) -> None:
    """``path`` was removed by its writer: nothing left to sweep there."""
    _ABANDONED.discard(path)


def sweep_abandoned() -> list[str]:
    """Remove the recorded directories, once no task can write there any more. Returns what
    was removed."""
    removed = sorted(_ABANDONED)
    for scratch in removed:
        shutil.rmtree(scratch, ignore_errors=True)
        _ABANDONED.discard(scratch)
    return removed
