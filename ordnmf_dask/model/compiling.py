"""Numba's first compilation, said out loud: the package's kernels are compiled on their first
call on a machine (``cache=True``: later processes load them from numba's cache in well under a
second), which takes seconds to tens of seconds with nothing else to show for it. A listener of
numba's compile events logs one WARNING when a compilation starts (numba compiles only on a
cache miss), so that the first fit, ``evaluate`` or fold-in on a machine does not wait in
silence: one line per group of kernels and process, however long the group takes. The group is
what the process compiles for (:func:`announced_as`: ``evaluate``, fold-in and serving say so;
a fit by default). Serving a few users (a CLI call) runs no kernel at all.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

from numba.core import event

log = logging.getLogger("ordnmf_dask")

#: seconds a first run's compilation takes, by group of kernels (docs/performance.md, "First
#: run on a machine: the command line": 2.7-3.0 s for a fit's on an idle machine, 6-18 s at
#: load 8-10)
EXPECTED = "3 s"

_doing: list[str] = []  # what the process compiles for now, innermost last (a fit if empty)
_doing_lock = threading.Lock()


@contextlib.contextmanager
def announced_as(what: str) -> Iterator[None]:
    """While this runs, a compilation is announced as one of ``what``'s kernels ("evaluate",
    "fold-in"; a fit's otherwise), once per group and process."""
    with _doing_lock:
        _doing.append(what)
    try:
        yield
    finally:
        with _doing_lock:  # the innermost entry of that name (calls may overlap in threads)
            del _doing[len(_doing) - 1 - _doing[::-1].index(what)]


def _in_worker() -> bool:
    """Whether this runs in a task of a Dask worker process, whose stderr is not the user's
    (a LocalCluster's workers share the command's): no line there, so a first fit on a cluster
    is not announced (an in-process fit, the default on small stores, and fold-in are)."""
    if "distributed" not in sys.modules:
        return False
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def _group() -> str:
    """The group of kernels compiled now: what :func:`announced_as` says, else a fit's."""
    with _doing_lock:
        return _doing[-1] if _doing else "fit"


class _Announcer(event.Listener):
    """Logs the first compilation of each group of kernels in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.said: set[str] = set()

    def on_start(self, ev: Any) -> None:
        what = _group()
        with self.lock:
            first = what not in self.said
            self.said.add(what)
        if first and not _in_worker():
            log.warning(
                "compiling numba kernels (%s): their first use on this machine, about %s "
                "(longer on a loaded machine); later runs load them from numba's cache",
                what,
                EXPECTED,
            )

    def on_end(self, ev: Any) -> None:
        pass


_ANNOUNCER = _Announcer()
_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Register the announcer with numba once per process (called where the kernels are
    defined)."""
    global _installed
    with _install_lock:
        if not _installed:
            event.register("numba:compile", _ANNOUNCER)
            _installed = True
