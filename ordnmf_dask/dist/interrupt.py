"""Ctrl-C that is never lost: a SIGINT handler that also leaves a flag checked between iterations.

Python raises KeyboardInterrupt wherever the main thread is; inside a ``__del__`` (e.g. a Dask
future being released) the exception would be printed ("Exception ignored in ...") and lost.
So the handler raises only outside finalizers; inside one it only sets the flag, and the next
iteration boundary raises.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_requested = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return
        frame = frame.f_back
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
