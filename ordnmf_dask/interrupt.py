"""Ctrl-C that is never lost: a SIGINT handler that also leaves a flag checked between iterations.

Python raises KeyboardInterrupt wherever the main thread is; when that is inside a ``__del__``
(e.g. a Dask future being released) the exception is printed and ignored. The flag makes the
next iteration boundary raise it again.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_requested = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT through the handler (main thread only; the CLI calls it)."""
    _requested.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived and may have been swallowed."""
    if _requested.is_set():
        raise KeyboardInterrupt
