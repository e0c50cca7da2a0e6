"""The ``ordnmf-dask`` exit codes, and the one-line message and code of each failure.

Exit codes: 0 success; 1 internal error (a bug: please report it with ``--debug`` output);
2 bad input, configuration or local I/O (a path that cannot be written), or an input its
reader cannot hold (memory, a number or nesting past their range); 3 cluster failure
(scheduler unreachable, workers lost); 4 numerical failure (ELBO decreased or became
non-finite); 130 interrupted (Ctrl-C / SIGINT); 141 standard output closed (``| head``);
143 terminated (SIGTERM, e.g. a preempted job).
"""

from __future__ import annotations

import argparse
import errno
import re
from typing import TypeGuard

from ordnmf_dask.errors import InputError, Terminated

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_CLUSTER, EXIT_NUMERIC = 0, 1, 2, 3, 4


EXIT_INTERRUPTED = 130


EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a job killed by it


EXIT_PIPE = 141  # 128 + SIGPIPE: the reader of standard output went away (`| head`)


# OSErrors of the local file system rather than of the network: a path that cannot be written
# (read-only, full, over quota) or is of the wrong kind
_LOCAL_IO_ERRORS = (
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    FileNotFoundError,
)


_LOCAL_IO_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EROFS,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EIO,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)


OUTPUT_FLAGS = {
    "out": "--out",
    "json_out": "--json",
    "reliability": "--reliability",
    "log_file": "--log-file",
    "checkpoint_dir": "--checkpoint-dir",
    "work_dir": "--work-dir",
}  # argparse destination -> flag of every path a command writes (cli._check_outputs)

INPUT_FLAGS = {
    "inputs": "input",
    "test": "test input",
    "store": "training store",
    "model": "model",
    "init": "warm start",
    "init_model": "warm-start model",
    "config": "job file",
    "pairs": "pairs input",
    "ratings": "ratings file",
    "users_from": "user id file",
    "items_from": "item id file",
    "scheduler_file": "scheduler file",
    "tls_ca_file": "TLS CA file",
    "tls_cert": "TLS certificate",
    "tls_key": "TLS key",
}  # argparse destination -> how a message names it, of every path a command reads: outputs
# are kept apart from each (cli._check_outputs)

FILE_OUTPUTS = frozenset({"json_out", "reliability", "log_file"})  # those that are one file

# dotted job-file key -> how a message names it, of every path a job file makes a command write
JOB_OUTPUTS = {
    "output.model": "[output] model",
    "logging.file": "[logging] file",
    "checkpoint.dir": "[checkpoint] dir",
    "engine.work_dir": "[engine] work_dir",
}
# the dotted job-file keys of every path a job file makes a command read
JOB_INPUTS = (
    "store.path",
    "model.init",
    "model.init_model",
    "cluster.scheduler_file",
    "cluster.ca_file",
    "cluster.cert",
    "cluster.key",
)


def _local_io_error(exc: BaseException) -> TypeGuard[OSError]:
    if not isinstance(exc, OSError) or isinstance(exc, ConnectionError | TimeoutError):
        return False
    return (
        isinstance(exc, _LOCAL_IO_ERRORS)
        or exc.errno in _LOCAL_IO_ERRNOS
        or exc.filename is not None
    )


def _io_message(exc: OSError, args: argparse.Namespace) -> str:
    """The path and the reason; a failed write names no file (ENOSPC): then the outputs, or
    standard output for a command given none."""
    if exc.filename is not None:
        path = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        return f"{path}: {exc.strerror or exc}"
    outputs = [
        f"{flag} {getattr(args, dest)}"
        for dest, flag in OUTPUT_FLAGS.items()
        if getattr(args, dest, None)
    ]
    if exc.errno is None:
        return str(exc)
    if not outputs:  # a command that writes nothing but its standard output
        return f"{exc.strerror} (writing standard output)"
    return f"{exc.strerror} (writing {', '.join(outputs)})"


def exit_code(exc: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    if isinstance(exc, Terminated):
        return EXIT_TERMINATED, "terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, InputError):
        return EXIT_INPUT, str(exc)
    if _local_io_error(exc):
        return EXIT_INPUT, _io_message(exc, args)
    from ordnmf_dask.errors import ELBODecreaseError

    if isinstance(exc, ELBODecreaseError | FloatingPointError):
        return EXIT_NUMERIC, str(exc)
    if isinstance(exc, OSError):  # distributed's CommClosedError, timeouts, refused connections
        return EXIT_CLUSTER, f"cluster failure: {exc}"
    if type(exc).__module__.startswith("distributed"):
        return EXIT_CLUSTER, f"cluster failure: {type(exc).__name__}: {exc}"
    foreign = _foreign_input_error(exc)
    if foreign is not None:
        return EXIT_INPUT, foreign
    return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def _foreign_input_error(exc: BaseException) -> str | None:
    """The one-line message of an error a library raises on what it was given to read or
    hold (memory exhausted, a number or nesting past its range, a file pyarrow cannot parse),
    which no check of this package caught first: bad input or too little memory (exit 2),
    not a bug; None for any other error."""
    if isinstance(exc, MemoryError):
        return (
            "out of memory: the command needs more memory than this machine or its limits "
            "(ulimit -v, a container's) allow; give it more, or a smaller input"
        )
    if isinstance(exc, RecursionError):
        return f"input nested too deeply to read: {exc}"
    if isinstance(exc, OverflowError):
        return f"a number out of range: {exc}"
    if type(exc).__module__.startswith("pyarrow") and type(exc).__name__.startswith("Arrow"):
        return f"cannot read the input: {exc}"
    return None


def flag_spelling(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with the API's keyword words spelled as the command's flags:
    ``overwrite=True`` -> ``--overwrite``, ``min_count=20`` -> ``--min-count 20``,
    ``test_fraction`` -> ``--test-fraction``, ``k must`` -> ``--k must``."""
    edge = r"(?<![\w/.-])"  # not inside a path or a flag
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag, dest = max(action.option_strings, key=len), re.escape(action.dest)

        def spell(m: re.Match[str], flag: str = flag) -> str:
            value = m.group(2)
            return flag if value in (None, "", "True") else f"{flag} {value}"

        message = re.sub(rf"{edge}{dest}=(['\"]?)([^\s,;()'\"]*)\1", spell, message)
        word = rf"{edge}{dest}(?![\w/.-])" if "_" in action.dest else rf"{edge}{dest}(?= must\b)"
        message = re.sub(word, flag, message)
    return message
