"""A Ctrl-C swallowed where Python cannot raise it (a __del__) is raised at the next check."""

from __future__ import annotations

import signal

import pytest

from ordnmf_dask import interrupt


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
