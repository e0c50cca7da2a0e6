"""A Ctrl-C swallowed where Python cannot raise it (a __del__, a garbage-collector callback) is
raised at the next check, and nothing is printed about it."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time

import pytest

from ordnmf_dask.errors import Terminated
from ordnmf_dask.runtime import interrupt


@pytest.fixture
def unraisable():
    """What Python reports as "Exception ignored in ..." (pytest's own hook would turn it into
    a warning instead): recorded, then the hook put back."""
    reports: list[object] = []
    saved = sys.unraisablehook
    sys.unraisablehook = reports.append
    yield reports
    sys.unraisablehook = saved


def test_a_swallowed_sigint_is_raised_again_at_the_next_check():
    with interrupt.installed():
        interrupt.check()  # nothing pending
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # as if it had hit a __del__ and been printed and ignored
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
    with interrupt.installed():  # a new command starts clean
        interrupt.check()


def test_a_sigint_inside_a_finalizer_is_deferred_not_printed(unraisable):
    """In a __del__, the handler only sets the flag: nothing is printed as "Exception ignored",
    and the next check raises."""

    class Finalized:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)

    with interrupt.installed():
        Finalized()  # collected at once: the signal arrives inside __del__
        assert unraisable == []
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        with pytest.raises(KeyboardInterrupt):  # outside a finalizer it raises at once
            signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_a_gc_callback_is_deferred_not_printed(unraisable, signum):
    """distributed registers a garbage-collector callback; a SIGTERM that lands in it is
    swallowed by Python ("Exception ignored in ... _gc_callback"): nothing is printed and the
    next check raises it."""
    fired: list[bool] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and not fired:
            fired.append(True)
            signal.raise_signal(signum)

    gc.callbacks.append(callback)
    try:
        with interrupt.installed():
            gc.collect()
            assert fired
            assert unraisable == []
            with pytest.raises(Terminated if signum == signal.SIGTERM else KeyboardInterrupt):
                interrupt.check()
    finally:
        gc.callbacks.remove(callback)


def test_other_unraisable_exceptions_are_still_reported(unraisable):
    """Only the interruption the flag carries is dropped: another error in a finalizer still
    reaches the hook that was there before."""

    class Failing:
        def __del__(self) -> None:
            raise ValueError("finalizer failed")

    with interrupt.installed():
        Failing()
    assert [type(r.exc_value) for r in unraisable] == [ValueError]  # type: ignore[attr-defined]


def test_the_handlers_and_the_hook_are_put_back():
    handlers = {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS}
    hook = sys.unraisablehook
    with interrupt.installed():
        assert signal.getsignal(signal.SIGTERM) is not handlers[signal.SIGTERM]
        assert sys.unraisablehook is not hook
    assert {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS} == handlers
    assert sys.unraisablehook is hook


def test_a_process_whose_command_ended_ignores_the_signals_then():
    """The CLI's process (``restore=False``): a SIGINT after its command ended, exit code
    decided, must not kill it (exit -2 instead of the command's); the hook is put back."""
    handlers = {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS}
    hook = sys.unraisablehook
    try:
        with interrupt.installed(restore=False):
            pass
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in interrupt.SIGNALS)
        assert sys.unraisablehook is hook
        signal.raise_signal(signal.SIGINT)  # ignored: nothing raised
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_sigterm_raises_terminated_and_is_kept_for_the_next_check():
    """A batch scheduler's SIGTERM ends the command the same way (exit 143, not 130)."""
    with interrupt.installed():
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Terminated):
            interrupt.check()
    with interrupt.installed():
        interrupt.check()


def test_a_command_that_ended_leaves_no_signal_for_the_next_fit():
    """A signal that interrupted one command (in-process: a notebook, the tests) must not
    interrupt the next fit through the API, which checks the flag between iterations."""
    with interrupt.installed():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    interrupt.check()  # the command ended: its signal is forgotten
    with interrupt.installed():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()  # consumed once raised again
        interrupt.check()


@pytest.fixture
def event_loop_log():
    """The records that reach the handlers of tornado's callback log (where distributed's event
    loop reports a callback's exception), the handler removed afterwards."""
    records: list[logging.LogRecord] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("tornado.application")
    recorder = Recorder()
    logger.addHandler(recorder)
    yield records
    logger.removeHandler(recorder)


def test_a_signal_before_distributed_starts_its_call_logs_nothing(event_loop_log):
    """A Ctrl-C that reaches distributed's ``sync`` before its coroutine created the future
    makes its ``cancel`` callback fail with a NameError on the event loop: under the handler
    that report is dropped, and the interruption still comes out of the call."""
    from distributed.utils import LoopRunner, sync

    runner = LoopRunner(asynchronous=False)
    runner.start()
    try:

        async def nothing() -> None:
            return None

        busy = threading.Event()
        runner.loop.add_callback(lambda: (busy.set(), time.sleep(0.5)))  # the loop is held
        busy.wait()
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
        with interrupt.installed():
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                sync(runner.loop, nothing)  # interrupted before the loop reaches it
            sync(runner.loop, nothing)  # runs after the late cancel: its report was made
        timer.join()
    finally:
        runner.stop()
    assert [r.getMessage() for r in event_loop_log] == []


def test_other_event_loop_errors_still_reach_the_log(event_loop_log):
    """Only distributed's late cancel is dropped: another callback's NameError, logged while a
    signal is being handled, is reported as before."""
    with interrupt.installed():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        try:
            raise NameError("name 'x' is not defined")
        except NameError:
            logging.getLogger("tornado.application").exception("a callback failed")
    assert [r.getMessage() for r in event_loop_log] == ["a callback failed"]
