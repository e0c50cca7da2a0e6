"""Progress of a batch of futures: a bar on a terminal, a log line per tenth otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

from distributed import Future, as_completed

from ordnmf_dask.dist.inprocess import InProcessFuture

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
    bar = sys.stderr.isatty() and _info_on_stderr()
    start = last = time.monotonic()
    reported = 0
    for done, _ in enumerate(as_completed(futures), start=1):
        now = time.monotonic()
        if bar:
            filled = 30 * done // total
            sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
            sys.stderr.flush()
        elif done == total or (10 * done // total > reported and now - last >= min_seconds):
            log.info("%s: %d/%d done (%.0f s)", label, done, total, now - start)
            reported, last = 10 * done // total, now
    if bar:
        sys.stderr.write("\n")


def _info_on_stderr() -> bool:
    """Whether a handler of ``log`` (or of the loggers it propagates to) writes INFO to stderr."""
    logger: logging.Logger | None = log
    while logger is not None:
        for h in logger.handlers:
            if getattr(h, "stream", None) is sys.stderr and h.level <= logging.INFO:
                return True
        logger = logger.parent if logger.propagate else None
    return False
