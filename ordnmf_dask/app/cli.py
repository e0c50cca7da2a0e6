"""The ``ordnmf-dask`` command's entry point, :func:`main`: parse (:mod:`.parser`), check the
output paths, set up logging (:mod:`.logs`), run the command (:mod:`.commands`) and turn any
failure into one line and an exit code (:mod:`.exits`). Also ``python -m ordnmf_dask``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import gc
import io
import logging
import os
import select
import stat
import sys
import warnings
from collections.abc import Sequence

from ordnmf_dask.app.commands import COMMANDS
from ordnmf_dask.app.exits import (
    EXIT_INPUT,
    EXIT_PIPE,
    FILE_OUTPUTS,
    INPUT_FLAGS,
    JOB_OUTPUTS,
    OUTPUT_FLAGS,
    exit_code,
    flag_spelling,
)
from ordnmf_dask.app.logs import log_file_failure, logging_kept, setup_logging, warning_line
from ordnmf_dask.app.parser import build_parser, subcommand
from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime import interrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ordnmf-dask``; returns the exit code.

    Logging and the SIGINT / SIGTERM handlers are left as they were found
    (:func:`~ordnmf_dask.runtime.interrupt.installed`), so that calling it in-process changes
    no global state; a process that runs this one command (``argv`` None) ignores them once the
    command ended, so that a signal then (with the exit code decided) does not kill it (-2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # the process runs this one command and ends: the OS frees its memory,
        atexit.register(gc.freeze)  # without the interpreter's final collection of every object
        _system_allocator_under_a_limit()
    with logging_kept(quiet=not args.debug), warnings.catch_warnings():
        warnings.showwarning = warning_line
        code = _run(args, parser, process=argv is None)
    if argv is None:
        _interruption_handled()
    return code


def _interruption_handled() -> None:
    """CPython marks a KeyboardInterrupt that left an ``eval`` or ``exec`` of a string (a
    signal met inside namedtuple's, while a module imports) as never handled, even once
    :func:`_run` caught it and chose the exit code, and ``python -m ordnmf_dask`` then ends
    by killing itself with SIGINT (-2, not 130): an eval that completes clears that mark."""
    eval("None")  # a constant, for the side effect above


def _system_allocator_under_a_limit() -> None:
    """Under an address-space limit (``ulimit -v``), pyarrow allocates through the system
    allocator, in this process and the workers it starts: its default, mimalloc, reserves a GiB
    of address space at its first use, which the limit counts as used (``score --pairs`` of 10^7
    pairs under 2 GiB ran out of it). Set before pyarrow loads; a choice of the user's stays."""
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        if "pyarrow" not in sys.modules:
            os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def _check_outputs(args: argparse.Namespace) -> None:
    """The one rule of every output (:func:`ordnmf_dask.store.outputs.check_outputs`), before
    anything is read or written: every path the command writes, given as a flag
    (:data:`~.exits.OUTPUT_FLAGS`) or as a key of its job file (:data:`~.exits.JOB_OUTPUTS`),
    checked against every input and against one another."""
    from ordnmf_dask.store import kinds, outputs

    # what each command's --out is (the kind of directory it writes); the other outputs are
    # --checkpoint-dir (a checkpoint directory), --work-dir and the files of FILE_OUTPUTS
    out_kinds = {
        "ingest": kinds.STORE_MARK,
        "synth": kinds.STORE_MARK,
        "fit": kinds.MODEL_KIND,
        "export": kinds.EXPORT,
        "recommend": kinds.EXPORT,
    }
    given = {flag: getattr(args, dest, None) for dest, flag in OUTPUT_FLAGS.items()}
    files = {OUTPUT_FLAGS[dest] for dest in FILE_OUTPUTS}
    for label, path in _job_outputs(args).items():
        given[label] = path
        if label.endswith("file"):
            files.add(label)
    given = {label: path for label, path in given.items() if path is not None}
    inputs: dict[str, str] = {}
    for dest, label in INPUT_FLAGS.items():
        value = getattr(args, dest, None)
        paths = value if isinstance(value, list) else [value]
        for j, path in enumerate(paths):
            # a glob or standard input ("-") names no path to keep outputs apart from
            if isinstance(path, str) and path != "-" and not any(c in path for c in "*?["):
                inputs[f"{label} {j + 1}" if len(paths) > 1 else label] = path
    writes = {"--out": out_kinds.get(args.command), "--checkpoint-dir": kinds.CHECKPOINT_DIRECTORY}
    writes |= {"[output] model": kinds.MODEL_KIND, "[checkpoint] dir": writes["--checkpoint-dir"]}
    try:
        outputs.check_outputs(given, inputs, writes, files)
    except InputError as exc:  # about a key of the job file: named as the file and its key
        if any(label in str(exc) for label in JOB_OUTPUTS.values()):
            from ordnmf_dask.errors import ConfigError

            raise ConfigError(f"{args.config}: {exc}") from None
        raise


# the commands whose job file (--config) sets their outputs (commands._job), and which
_JOB_COMMANDS = {
    "fit": tuple(JOB_OUTPUTS),
    "tune": ("logging.file", "checkpoint.dir", "engine.work_dir"),
    "evaluate": ("logging.file",),
}


def _job_outputs(args: argparse.Namespace) -> dict[str, str]:
    """The outputs the job file sets (how a message names each -> its path), but those a flag
    of the command overrides (they are checked as flags). The job file of every command is
    read and validated here, before any work, even where the command uses none of it (ingest
    without --distributed): a FIFO, a device or a bad file is refused, never ignored."""
    if not getattr(args, "config", None):
        return {}
    from operator import attrgetter

    from ordnmf_dask.app.config import flag_overrides, resolve

    cfg = resolve(args.config)
    keys = _JOB_COMMANDS.get(args.command, ())
    flags = flag_overrides(vars(args))
    found = {JOB_OUTPUTS[key]: attrgetter(key)(cfg) for key in keys if key not in flags}
    return {label: path for label, path in found.items() if path is not None}


# commands whose writer locks --out itself (store/blocks.py: check_target, temporary_path)
_OUT_LOCKED_BELOW = frozenset({"ingest", "synth", "fit", "export", "recommend", "predict"})


def _outputs_locked(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """The locks of the directories the command writes that no lower level locks
    (:mod:`ordnmf_dask.store.writelock`), held while it runs: a second writer of one is
    refused before any work."""
    from ordnmf_dask.store import writelock

    dests: tuple[str, ...] = ("checkpoint_dir", "work_dir")
    if args.command not in _OUT_LOCKED_BELOW:
        dests = ("out", *dests)
    return writelock.held(*(getattr(args, dest, None) for dest in dests))


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head`` that has read what
    it wanted): then the command ends as if its last write had failed (exit 141), in every
    output format, however little it wrote."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser, process: bool) -> int:
    from ordnmf_dask.store.outputs import streams_kept

    with streams_kept():  # the streams the check of the outputs opened, until written
        return _checked_run(args, parser, process)


def _checked_run(args: argparse.Namespace, parser: argparse.ArgumentParser, process: bool) -> int:
    try:
        _check_outputs(args)
    except InputError as exc:
        from ordnmf_dask.errors import ConfigError

        message = " ".join(str(exc).split())
        if not isinstance(exc, ConfigError):  # those name config keys
            message = flag_spelling(message, subcommand(parser, args.command))
        print(f"ordnmf-dask {args.command}: error: {message}", file=sys.stderr)
        return EXIT_INPUT
    try:
        setup_logging(args)
    except (OSError, InputError) as exc:
        message = " ".join(str(exc).split())
        print(
            f"ordnmf-dask {args.command}: error: cannot write --log-file: {message}",
            file=sys.stderr,
        )
        return EXIT_INPUT
    try:
        with interrupt.installed(restore=not process), _outputs_locked(args):
            try:
                code = COMMANDS[args.command](args)
                lost = log_file_failure()
                if lost is not None:  # the log is an output: one that failed fails the command
                    raise InputError(lost)
                sys.stdout.flush()  # a reader gone is seen here, not at the interpreter's exit
                if _reader_gone():  # all of it fit in the pipe, but nobody reads it all
                    raise BrokenPipeError(errno.EPIPE, "standard output closed")
            except Exception as exc:  # stopped by a signal, whatever a library raised then
                stopped = interrupt.as_interruption(exc)
                if stopped is exc:
                    raise
                raise stopped from exc
        return code
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one message + exit code
        if isinstance(exc, SystemExit):
            raise
        if isinstance(exc, BrokenPipeError):  # not an error of ours: stop writing, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_PIPE
        code, message = exit_code(exc, args)
        from ordnmf_dask.errors import ConfigError

        if code == EXIT_INPUT and not isinstance(exc, ConfigError):  # those name config keys
            message = flag_spelling(message, subcommand(parser, args.command))
        message = " ".join(message.split())  # one line, even for multi-line exception texts
        if args.debug:
            logging.getLogger("ordnmf_dask").exception("failed")
        print(f"ordnmf-dask {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
