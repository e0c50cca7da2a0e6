"""Numba's first compilation, said out loud: the package's kernels are compiled on their first
call on a machine (``cache=True``: later processes load them from numba's cache in well under a
second), which takes seconds to tens of seconds with nothing else to show for it. A listener of
numba's compile events logs one WARNING when a compilation starts (numba compiles only on a
cache miss), so that the first fit or ``recommend`` on a machine does not wait in silence: one
line per group of kernels (a fit's, serving's) and process, however long the group takes.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from numba.core import event

log = logging.getLogger("ordnmf_dask")

#: seconds a first run's compilation took here, by group of kernels: those of a fit, those of
#: serving (docs/performance.md, "First run on a machine": 17 s each on 2 cores at load 8, a
#: few seconds on a quiet machine)
EXPECTED = {"fit": "5-20 s", "serving": "5-20 s"}


def _in_worker() -> bool:
    """Whether this runs in a task of a Dask worker process, whose stderr is not the user's
    (a LocalCluster's workers share the command's): no line there, so a first fit on a cluster
    is not announced (an in-process fit, the default on small stores, and serving are)."""
    if "distributed" not in sys.modules:
        return False
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def _group(ev: Any) -> str:
    """The group of kernels the compiled function belongs to ("serving" or "fit")."""
    module = getattr(getattr(ev.data.get("dispatcher"), "py_func", None), "__module__", "")
    return "serving" if module.endswith(".serving") else "fit"


class _Announcer(event.Listener):
    """Logs the first compilation of each group of kernels in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.said: set[str] = set()

    def on_start(self, ev: Any) -> None:
        what = _group(ev)
        with self.lock:
            first = what not in self.said
            self.said.add(what)
        if first and not _in_worker():
            log.warning(
                "compiling numba kernels (%s): their first use on this machine, about %s "
                "(longer on a loaded machine); later runs load them from numba's cache",
                what,
                EXPECTED[what],
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
