"""A Ctrl-C swallowed where Python cannot raise it (a __del__) is raised at the next check."""

from __future__ import annotations

import signal

import pytest

from ordnmf_dask.errors import Terminated
from ordnmf_dask.runtime import interrupt


@pytest.fixture(autouse=True)
def _handlers_kept():
    """install() replaces the SIGINT and SIGTERM handlers: put pytest's back."""
    saved = {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_swallowed_sigint_is_raised_again_at_the_next_check():
    previous = signal.getsignal(signal.SIGINT)
    try:
        interrupt.install()
        interrupt.check()  # nothing pending
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # as if it had hit a __del__ and been printed and ignored
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        interrupt.install()  # a new command starts clean
        interrupt.check()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_sigint_inside_a_finalizer_is_deferred_not_printed(capfd):
    """In a __del__, the handler only sets the flag: nothing is printed as "Exception ignored",
    and the next check raises."""
    previous = signal.getsignal(signal.SIGINT)

    class Finalized:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)

    try:
        interrupt.install()
        Finalized()  # collected at once: the signal arrives inside __del__
        assert "Exception ignored" not in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        with pytest.raises(KeyboardInterrupt):  # outside a finalizer it raises at once
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigterm_raises_terminated_and_is_kept_for_the_next_check():
    """A batch scheduler's SIGTERM ends the command the same way (exit 143, not 130)."""
    interrupt.install()
    with pytest.raises(Terminated):
        signal.raise_signal(signal.SIGTERM)
    with pytest.raises(Terminated):
        interrupt.check()
    interrupt.install()
    interrupt.check()


def test_a_command_that_ended_leaves_no_signal_for_the_next_fit():
    """A signal that interrupted one command (in-process: a notebook, the tests) must not
    interrupt the next fit through the API, which checks the flag between iterations."""
    interrupt.install()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    interrupt.clear()  # what cli.main does when it returns
    interrupt.check()
    interrupt.install()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        interrupt.check()  # consumed once raised again
    interrupt.check()
