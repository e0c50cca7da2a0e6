"""Progress: of a batch of futures (a bar on a terminal, a log line per tenth otherwise), and of
a fit's iterations (:class:`IterationProgress`)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ordnmf_dask.dist.inprocess import InProcessFuture

if TYPE_CHECKING:
    from distributed import Future

log = logging.getLogger("ordnmf_dask")


def track(futures: Sequence[Future], label: str, min_seconds: float = 2.0) -> None:
    """Wait for ``futures``, reporting progress under ``label`` (errors surface at gather time).

    Where INFO records reach a terminal (stderr is a TTY and a handler writes INFO to it) a
    one-line bar is redrawn; otherwise a log line is written at each tenth, at most every
    ``min_seconds`` (so ``-q`` keeps them in the log file only).
    """
    total = len(futures)
    if total == 0 or not log.isEnabledFor(logging.INFO) or isinstance(futures[0], InProcessFuture):
        return  # in-process tasks (.inprocess) finish while the caller gathers
    from distributed import as_completed

    bar = sys.stderr.isatty() and _info_on_stderr()
    start = last = time.monotonic()
    reported = 0
    for done, _ in enumerate(as_completed(futures), start=1):
        now = time.monotonic()
        if bar:
            sys.stderr.write(f"\r{label} {_bar(done, total)} {done}/{total}")
            sys.stderr.flush()
        elif done == total or (10 * done // total > reported and now - last >= min_seconds):
            log.info("%s: %d/%d done (%.0f s)", label, done, total, now - start)
            reported, last = 10 * done // total, now
    if bar:
        sys.stderr.write("\n")


class IterationProgress:
    """Where a fit is: iteration n of ``total`` (max_iter), the elapsed time and an estimate of
    the rest, from the mean time of the iterations after the first one seen (the first reads
    blocks and compiles kernels). The estimate is an upper bound: the tol rule usually stops
    the fit before max_iter. Where INFO records reach a terminal, :meth:`draw` keeps a bar under
    the log lines (:meth:`clear` removes it before the next line is logged and at the end);
    elsewhere the iteration log lines carry the same figures. Only a fit run from the main
    thread draws a bar: fits run at once from threads (``tune``) would draw over each other."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar = (_terminal() and log.isEnabledFor(logging.INFO)
                    and threading.current_thread() is threading.main_thread())  # fmt: skip
        self.drawn = False
        self.first: tuple[int, float] | None = None  # (iteration, elapsed) first seen

    @staticmethod
    def clock(seconds: float) -> str:
        """``seconds`` as h:mm:ss."""
        s = int(round(seconds))
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"

    def eta(self, n: int, elapsed: float) -> str:
        """An estimate of the time left to max_iter after iteration ``n`` at ``elapsed``."""
        if self.first is None:
            self.first = (n, elapsed)
        if n >= self.total:
            return "at max_iter"
        n0, t0 = self.first
        if n == n0:
            return "ETA after the next iteration"
        rest = (self.total - n) * (elapsed - t0) / (n - n0)
        return f"ETA <= {self.clock(rest)} to max_iter"

    def draw(self, n: int, elapsed: float) -> None:
        if self.bar:
            sys.stderr.write(f"\rfit {_bar(n, self.total)} {n}/{self.total}  "
                             f"{self.clock(elapsed)}  {self.eta(n, elapsed)}")  # fmt: skip
            sys.stderr.flush()
            self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.drawn = False


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}]"


def _terminal() -> bool:
    """Whether INFO records are shown on a terminal (stderr is a TTY with an INFO handler)."""
    return sys.stderr.isatty() and _info_on_stderr()


def _info_on_stderr() -> bool:
    """Whether a handler of ``log`` (or of the loggers it propagates to) writes INFO to stderr."""
    logger: logging.Logger | None = log
    while logger is not None:
        for h in logger.handlers:
            if getattr(h, "stream", None) is sys.stderr and h.level <= logging.INFO:
                return True
        logger = logger.parent if logger.propagate else None
    return False
