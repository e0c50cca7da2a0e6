"""Ctrl-C and SIGTERM that are never lost: a handler that also leaves a flag checked between
iterations.

Python raises KeyboardInterrupt wherever the main thread is; inside a ``__del__`` (e.g. a Dask
future being released) the exception would be printed ("Exception ignored in ...") and lost.
So the handler raises only outside finalizers; inside one it only sets the flag, and the next
iteration boundary raises. SIGTERM (how batch schedulers preempt a job, before SIGKILL) raises
:class:`~ordnmf_dask.errors.Terminated`, so that the command shuts its cluster down and exits
while the scheduler's grace period runs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from ordnmf_dask.errors import Terminated

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested: dict[str, int] = {}  # "signal": the number of the last one that arrived


def _interruption(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _requested["signal"] = signum
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return
        frame = frame.f_back
    raise _interruption(signum)


def install() -> None:
    """Route SIGINT and SIGTERM through the handler (main thread only; the CLI calls it)."""
    clear()
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, _on_signal)


def check() -> None:
    """Raise KeyboardInterrupt (or Terminated) if a signal arrived and may have been
    swallowed; the signal is then consumed."""
    signum = _requested.pop("signal", None)
    if signum is not None:
        raise _interruption(signum)


def clear() -> None:
    """Forget a signal that arrived (a command that ends leaves nothing for the next one)."""
    _requested.clear()
