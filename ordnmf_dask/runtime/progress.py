"""Progress: of a batch of futures (a tqdm bar on a terminal, a log line per tenth otherwise), and
of a fit's iterations (:class:`IterationProgress`), as INFO records of the ``ordnmf_dask`` logger
and one tqdm line under them; and the switch that shows them from Python
(:func:`shows_progress`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

from ordnmf_dask.runtime.inprocess import InProcessFuture

if TYPE_CHECKING:
    from distributed import Future

log = logging.getLogger("ordnmf_dask")

FORMATTER = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

ShowProgress = bool | None
SWITCH_DOC = (
    "True shows progress on stderr (where stderr is a terminal or Jupyter, a fit's tqdm line "
    "redrawn at each iteration with the ELBO, its relative change and the stopping rule, "
    "under a log line every SUMMARY_EVERY iterations; a log line per iteration "
    "otherwise), False nothing, None (default) as True "
    "where stderr is a terminal or Jupyter, else (a script, a batch job) a summary: a "
    "start line, a line every SUMMARY_EVERY iterations with the ETA, an end line."
)
SUMMARY_EVERY = 10  # iterations between a fit's log lines in a summary (show_progress=None)

F = TypeVar("F", bound=Callable[..., Any])


def _tqdm(**kwargs: Any) -> Any:
    """A tqdm display on stderr (imported here: most calls never draw one)."""
    from tqdm import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, mininterval=0, **kwargs)


def track(futures: Sequence[Future], label: str, min_seconds: float = 2.0) -> None:
    """Wait for ``futures``, reporting progress under ``label`` (errors surface at gather time).

    Where INFO records reach a terminal (stderr is a TTY and a handler writes INFO to it) a
    tqdm bar counts the futures done; otherwise a log line is written at each tenth, at most
    every ``min_seconds`` (so ``-q`` keeps them in the log file only).
    """
    total = len(futures)
    if total == 0 or not log.isEnabledFor(logging.INFO) or isinstance(futures[0], InProcessFuture):
        return  # in-process tasks (.inprocess) finish while the caller gathers
    from distributed import as_completed

    bar = _tqdm(total=total, desc=label, unit="task") if _terminal() else None
    start = last = time.monotonic()
    reported = 0
    try:
        for done, _ in enumerate(as_completed(futures), start=1):
            now = time.monotonic()
            if bar is not None:
                bar.update(1)
            elif done == total or (10 * done // total > reported and now - last >= min_seconds):
                log.info("%s: %d/%d done (%.0f s)", label, done, total, now - start)
                reported, last = 10 * done // total, now
    finally:
        if bar is not None:
            bar.close()


class IterationProgress:
    """Where a fit is: iteration n of at most ``total`` (max_iter), the elapsed time and an
    estimate of the rest, from the mean time of the iterations after the first one seen (the
    first reads blocks and compiles kernels). The estimate is an upper bound: the tol rule
    usually stops the fit before max_iter. Where INFO records reach a terminal, :meth:`draw`
    keeps one tqdm line under the log lines (:meth:`clear` takes it away while a line is
    logged, :meth:`close` at the end); elsewhere the iteration log lines carry the same
    figures. Only a fit run from the main thread draws one: fits run at once from threads
    (``tune``) would draw over each other."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar = (
            _terminal()
            and log.isEnabledFor(logging.INFO)
            and threading.current_thread() is threading.main_thread()
        )
        self._line: Any = None  # the tqdm display, from the first draw
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

    def draw(self, n: int, elapsed: float, elbo: float, rel: float, tol: float) -> None:
        """Show iteration ``n``, the ELBO and its relative change against the stopping rule
        (``tol``, else ``max_iter``) on the tqdm line: the iterations done and their rate,
        not a bar scaled to max_iter, which a fit stopped by ``tol`` seldom reaches."""
        if not self.bar:
            return
        text = (
            f"elbo {elbo:.6e}  rel {rel:.2e}  (stops at rel < {tol:g} or iter {self.total})  "
            f"{self.clock(elapsed)}"
        )
        if self._line is None:  # drawn as it is made
            self._line = _tqdm(
                desc="fit",
                initial=n,
                postfix=text,
                leave=False,
                bar_format="{desc} iter {n_fmt}{postfix}",
            )
        else:
            self._line.n = n
            self._line.set_postfix_str(text)

    def clear(self) -> None:
        """Take the line away while a log line is written (the next draw shows it again)."""
        if self._line is not None:
            self._line.clear()

    def close(self) -> None:
        """Remove the line at the end of the fit."""
        if self._line is not None:
            self._line.close()
            self._line = None


def _terminal() -> bool:
    """Whether INFO records are shown on a terminal (stderr is interactive, with an INFO
    handler)."""
    return interactive(sys.stderr) and _info_on_stderr()


def interactive(stream: IO[str]) -> bool:
    """Whether ``stream`` shows a redrawn bar: a TTY, or a Jupyter kernel's output stream."""
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        tty = False
    return tty or type(stream).__module__.split(".")[0] == "ipykernel"


def _info_on_stderr() -> bool:
    """Whether a handler of ``log`` (or of the loggers it propagates to) writes INFO to stderr."""
    logger: logging.Logger | None = log
    while logger is not None:
        for h in logger.handlers:
            if getattr(h, "stream", None) is sys.stderr and h.level <= logging.INFO:
                return True
        logger = logger.parent if logger.propagate else None
    return False


def _info_handled() -> bool:
    """Whether INFO records of ``log`` reach a handler (the command line's, or a logging
    configuration of the user's)."""
    logger: logging.Logger | None = log
    while logger is not None:
        if any(h.level <= logging.INFO for h in logger.handlers):
            return True
        logger = logger.parent if logger.propagate else None
    return False


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record (with :data:`FORMATTER`
    unless given another)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(FORMATTER)

    @property  # type: ignore[override]
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


class _Forward(logging.Handler):
    """Passes the records at ``level`` or above on to ``parent``, as propagation would: while
    :func:`reporting` lowers the logger's level, the user's own handlers still get only what
    they got before."""

    def __init__(self, parent: logging.Logger, level: int) -> None:
        super().__init__(level)
        self.parent = parent

    def emit(self, record: logging.LogRecord) -> None:
        self.parent.handle(record)


_depth = 0  # calls inside reporting(), in any thread: the outermost one decides
_depth_lock = threading.Lock()
_summary = False  # whether the outermost reporting() shows a summary (see SWITCH_DOC)


def summary() -> bool:
    """Whether progress is shown as a summary now: a fit logs its iterations at INFO only every
    :data:`SUMMARY_EVERY` (and the first), the others at DEBUG."""
    return _summary


@contextlib.contextmanager
def reporting(show_progress: ShowProgress) -> Iterator[None]:
    """While active, progress (the INFO records of ``log`` and, on a terminal, their bar) goes
    to stderr as the switch says (:data:`ShowProgress`; None: in full on a terminal, else as a
    :func:`summary`). Nothing changes when it is off, inside
    another call's (``tune``'s fits: the outermost switch decides), when ``log`` has handlers
    of its own (the command line's, or a caller's setup for this package) or when INFO records
    already reach a handler; otherwise a stderr handler is added, and the logging configuration
    is restored on exit."""
    global _depth, _summary
    with _depth_lock:
        outermost = _depth == 0
        _depth += 1
    try:
        on = True if show_progress is None else bool(show_progress)
        if (
            not outermost
            or not on
            or log.handlers
            or (log.isEnabledFor(logging.INFO) and _info_handled())
        ):
            yield
            return
        _summary = show_progress is None and not interactive(sys.stderr)
        level, propagate = log.level, log.propagate
        added: list[logging.Handler] = [StderrHandler()]
        added[0].setLevel(logging.INFO)
        if propagate and log.parent is not None:
            added.append(_Forward(log.parent, log.getEffectiveLevel()))
        for h in added:
            log.addHandler(h)
        log.propagate = False
        log.setLevel(min(log.getEffectiveLevel(), logging.INFO))
        try:
            yield
        finally:
            _summary = False
            for h in added:
                log.removeHandler(h)
            log.setLevel(level)
            log.propagate = propagate
    finally:
        with _depth_lock:
            _depth -= 1


def shows_progress(fn: F) -> F:
    """``fn`` with the keyword ``show_progress`` (:data:`ShowProgress`, default None): its
    progress is shown as :func:`reporting` says while it runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, show_progress: ShowProgress = None, **kwargs: Any) -> Any:
        with reporting(show_progress):
            return fn(*args, **kwargs)

    sig = inspect.signature(fn)
    switch = inspect.Parameter(
        "show_progress", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="ShowProgress"
    )
    params = list(sig.parameters.values())
    at = next((j for j, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    wrapper.__signature__ = sig.replace(parameters=[*params[:at], switch, *params[at:]])  # type: ignore[attr-defined]
    wrapper.__doc__ = _with_switch_doc(fn.__doc__ or "")
    return wrapper  # type: ignore[return-value]


def _with_switch_doc(doc: str) -> str:
    """``doc`` (numpy style) with ``show_progress`` as the last entry of its Parameters section,
    so that help() and the API reference list it with the others."""
    lines = inspect.cleandoc(doc).splitlines()
    entry = textwrap.wrap(f"show_progress : {SWITCH_DOC}", 92, subsequent_indent="    ")
    headers = [j for j in range(len(lines) - 1) if re.fullmatch(r"-{3,}", lines[j + 1])]
    after = [j for j in headers if j > 0 and lines[j] != "Parameters"]
    params = [j for j in headers if lines[j] == "Parameters"]
    at = next((j for j in after if params and j > params[0]), len(lines))
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    if not params:
        entry = ["", "Parameters", "----------", *entry]
    gap = [""] if at < len(lines) and lines[at].strip() else []
    return "\n".join([*lines[:at], *entry, *gap, *lines[at:]])
