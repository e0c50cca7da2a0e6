"""Logging of an ``ordnmf-dask`` command: its handlers (stderr, --log-file), the Dask loggers
silenced unless --debug (also when distributed is first imported during the command, by an
import hook), and everything restored afterwards, so that :func:`~ordnmf_dask.app.cli.main`
can run in-process."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

log = logging.getLogger("ordnmf_dask")


def _dask_loggers() -> list[logging.Logger]:
    """The ``distributed`` and ``asyncio`` loggers and their children that exist now."""
    names = dict.fromkeys(["distributed", "asyncio", *logging.root.manager.loggerDict])
    return [logging.getLogger(n) for n in names if n.split(".")[0] in ("distributed", "asyncio")]


class _OnImport:
    """While in ``sys.meta_path``, runs ``then()`` right after module ``name`` is first
    imported (the import itself is left to the other finders and the module's own loader)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then
        self.loader: Any = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.loader is not None:
            return None
        sys.meta_path.remove(self)
        spec = next(
            filter(
                None,
                (
                    f.find_spec(fullname, path, target)
                    for f in sys.meta_path
                    if hasattr(f, "find_spec")
                ),
            ),
            None,
        )
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self  # type: ignore[assignment]  # a loader
        return spec

    def create_module(self, spec: Any) -> ModuleType | None:
        assert self.loader is not None
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self.loader is not None and module.__spec__ is not None
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then()


@contextlib.contextmanager
def logging_kept(quiet: bool) -> Iterator[None]:
    """Restore on exit what a command changes in logging: the ``ordnmf_dask`` logger's handlers,
    level and propagation and the levels of the Dask loggers (main() also runs in-process, in
    tests and notebooks); handlers added meanwhile are closed.

    distributed, imported only by commands that use a cluster, configures its loggers when
    first imported: their levels then are restored on exit, and a ``quiet`` command (no
    --debug) silences them again (:func:`silence_dask`)."""
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    levels = [(logger, logger.level) for logger in _dask_loggers()]
    hook = None
    if "distributed" not in sys.modules:

        def configured() -> None:
            levels.extend(
                (logger, logger.level)
                for logger in _dask_loggers()
                if logger.name.split(".")[0] == "distributed"
            )
            if quiet:
                silence_dask()

        hook = _OnImport("distributed", configured)
        sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        for h in log.handlers:
            if h not in handlers:
                h.close()
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate
        for logger, old in levels:
            logger.setLevel(old)


def setup_logging(args: argparse.Namespace) -> None:
    """INFO (DEBUG with --debug) to stderr and --log-file; -q raises only stderr to WARNING."""
    from ordnmf_dask.runtime.progress import FORMATTER as fmt
    from ordnmf_dask.runtime.progress import StderrHandler

    stderr = StderrHandler()
    if args.quiet and not args.debug:
        stderr.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stderr]
    if args.log_file:
        handlers.append(LogFile(args.log_file))
    for h in handlers:
        h.setFormatter(fmt)
    log.handlers[:] = handlers
    log.setLevel(logging.DEBUG if args.debug else logging.INFO)
    log.propagate = False
    if not args.debug:  # failures reach main() and become one line; --debug shows the rest
        silence_dask()


class LogFile(logging.FileHandler):
    """A log file (``--log-file``, a job file's ``[logging] file``), appended to at its real
    location and opened by the output rule's :func:`~ordnmf_dask.store.outputs.open_log`:
    never through a link at its name, never a FIFO or device."""

    def __init__(self, path: str) -> None:
        from ordnmf_dask.store import locations

        super().__init__(locations.location(path), encoding="utf-8")

    failure: OSError | None = None  # the first write that failed (a full disk, /dev/full)

    def _open(self) -> Any:
        from ordnmf_dask.store.outputs import open_log

        return open_log(self.baseFilename)

    def handleError(self, record: logging.LogRecord) -> None:
        """A record that could not be written is kept as the command's failure (reported by
        :func:`log_file_failure` in one line, exit 2), not printed as a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) and self.failure is None:
            self.failure = exc
        elif not isinstance(exc, OSError):
            super().handleError(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            self.failure = self.failure or exc

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:
            self.failure = self.failure or exc


def log_file_failure() -> str | None:
    """Why the command's log file could not be written (its path and the reason), or None:
    a log that lost records is an output that failed, reported as one (exit 2)."""
    for handler in log.handlers:
        if isinstance(handler, LogFile):
            handler.flush()
            if handler.failure is not None:
                reason = handler.failure.strerror or handler.failure
                return f"cannot write the log file {handler.baseFilename}: {reason}"
    return None


def silence_dask() -> None:
    """Silence the Dask loggers that exist: Dask's logging config gives some their own level
    (distributed.client: warning), and asyncio reports the client's tasks left behind by an
    interrupted gather. The worker processes of a LocalCluster we start take this level too
    (runtime.cluster)."""
    for logger in _dask_loggers():  # silent: the scheduler logs even a closed client at
        logger.setLevel(logging.CRITICAL + 1)  # CRITICAL, with a traceback


def warning_line(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Show a Python warning of a command as one log line, like its other messages (not the
    file, line and source text of the code that raised it)."""
    log.warning("%s: %s", category.__name__, message)
