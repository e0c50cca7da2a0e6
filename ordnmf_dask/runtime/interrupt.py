"""Ctrl-C and SIGTERM that are never lost: a handler that also leaves a flag checked between
iterations.

Python raises KeyboardInterrupt wherever the main thread is; inside a ``__del__`` (e.g. a Dask
future being released), a garbage-collector callback or a weakref callback the exception would
be printed ("Exception ignored in ...") and lost. So the handler raises only outside finalizers
(inside one it only sets the flag), an interruption that Python still swallows elsewhere is not
printed (:data:`sys.unraisablehook`), and the next iteration boundary raises it again. SIGTERM
(how batch schedulers preempt a job, before SIGKILL) raises
:class:`~ordnmf_dask.errors.Terminated`, so that the command shuts its cluster down and exits
while the scheduler's grace period runs. distributed's ``sync`` answers an interruption that
lands before its coroutine has started with a ``NameError`` logged on its event loop (its
``cancel`` callback reads a future not assigned yet); that one report is dropped while a signal
is being handled, since the interruption itself is what the command reports.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from ordnmf_dask.errors import Terminated

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested: dict[str, int] = {}  # "signal": the number of the last one that arrived
_arrived: dict[str, int] = {}  # the same, kept after check() consumed it, until clear()


def _interruption(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _requested["signal"] = signum
    _arrived["signal"] = signum
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return
        frame = frame.f_back
    raise _interruption(signum)


def _unraisable(hook: Callable[[Any], object]) -> Callable[[Any], None]:
    """``sys.unraisablehook`` that drops an interruption the flag still carries and passes
    anything else to ``hook``."""

    def unraisable(report: Any) -> None:
        if isinstance(report.exc_value, KeyboardInterrupt) and _requested:
            return  # raised again at the next check()
        hook(report)

    return unraisable


class _LateCancelFilter(logging.Filter):
    """Drops the ``NameError`` of distributed's ``sync.<locals>.cancel`` (run on the event loop
    after an interruption that came before the future it cancels existed) while a signal is
    being handled; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _arrived or not record.exc_info:
            return True
        _, exc, tb = record.exc_info
        if not isinstance(exc, NameError) or tb is None:
            return True
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        return not (
            code.co_name == "cancel"
            and code.co_filename.endswith(os.path.join("distributed", "utils.py"))
        )


_EVENT_LOOP_LOG = "tornado.application"  # where tornado logs a callback's exception


@contextmanager
def installed(restore: bool = True) -> Iterator[None]:
    """Route SIGINT and SIGTERM through the handler while the block runs (main thread only;
    the CLI runs each command in it), then put the handlers back (or, not ``restore``, ignore
    the signals: a process whose command ended has nothing left to stop, its exit code is
    decided), the unraisable hook too, and forget any signal left (the next command starts
    clean)."""
    clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {signum: signal.getsignal(signum) for signum in SIGNALS}
    hook = sys.unraisablehook
    sys.unraisablehook = _unraisable(hook)
    late_cancel = _LateCancelFilter()
    logging.getLogger(_EVENT_LOOP_LOG).addFilter(late_cancel)
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        logging.getLogger(_EVENT_LOOP_LOG).removeFilter(late_cancel)
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler if restore else signal.SIG_IGN)
        sys.unraisablehook = hook
        clear()


def check() -> None:
    """Raise KeyboardInterrupt (or Terminated) if a signal arrived and may have been
    swallowed; the signal is then consumed."""
    signum = _requested.pop("signal", None)
    if signum is not None:
        raise _interruption(signum)


def as_interruption(exc: BaseException) -> BaseException:
    """What a command that failed with ``exc`` ended by: the interruption of a signal that
    arrived while it ran when ``exc`` is another error (a library stopped half way by the
    signal, e.g. distributed's ``AssertionError: Status.init`` of a cluster interrupted while
    starting, fails with an error of its own), else ``exc``."""
    signum = _arrived.get("signal")
    if signum is None or isinstance(exc, KeyboardInterrupt):
        return exc
    return _interruption(signum)


def clear() -> None:
    """Forget a signal that arrived (a command that ends leaves nothing for the next one)."""
    _requested.clear()
    _arrived.clear()
