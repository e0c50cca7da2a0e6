"""Every exception the package raises on purpose, and what the command line makes of it.

Input problems (exit code 2) derive from :class:`InputError`; cluster problems (exit 3) from
:class:`ClusterConnectError` or distributed's own errors; numerical failures (exit 4) are
:class:`ELBODecreaseError` and ``FloatingPointError``.
"""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """Bad user input: the message names the file and 1-based line number, or the id.

    Pickled without calling ``__init__`` again, so that an InputError raised in a task on a
    worker reaches the client as itself (an exit code 2), whatever the signature of a subclass:
    Dask replaces an exception that does not survive pickling by a plain ``Exception``.

    Examples
    --------
    >>> from ordnmf_dask import InputError, ingest_arrays
    >>> try:
    ...     ingest_arrays([1, 2], [10, 11], [4.0, float("nan")], "bad.zarr")
    ... except InputError as err:
    ...     print("refused:", type(err).__name__)
    refused: InputError
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[InputError], args: tuple[Any, ...], state: dict[str, Any]) -> InputError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


SHOWN_MOST = 100  # characters of a value's repr a message shows (an id can be megabytes long)


def shown(value: Any) -> str:
    """``repr(value)`` for a message, with numpy scalars (also inside lists and tuples) as the
    plain numbers they hold: ``50.0``, not ``np.float64(50.0)``; a repr longer than
    :data:`SHOWN_MOST` cut there, saying how long the value is, so that a message about a
    megabyte-long id stays a line one can read."""
    text = repr(_plain(value))
    if len(text) <= SHOWN_MOST:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} shown"
    return f"{text[:SHOWN_MOST]}... ({size})"


def _plain(value: Any) -> Any:
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    if type(value) in (list, tuple):
        return type(value)(_plain(v) for v in value)
    return value


class StoreError(InputError):
    """A store that is absent, incomplete, unreadable or written by a newer format.

    Examples
    --------
    >>> from ordnmf_dask import StoreError, open_store
    >>> try:
    ...     open_store("missing.zarr")
    ... except StoreError as err:
    ...     print(str(err).endswith("missing.zarr: no store here (path does not exist)"))
    True
    """


class ConfigError(InputError):
    """A config file (or flag) with an unknown key, a wrong type or an invalid value."""


class UsageError(InputError):
    """A command-line value that parses but makes no sense."""


class CheckpointError(RuntimeError):
    """No usable checkpoint, or one written for another store or configuration."""


class ELBODecreaseError(RuntimeError):
    """The ELBO decreased by more than round-off: a bug, never silenced."""


class ClusterConnectError(OSError):
    """The scheduler could not be reached or refused us (exit code 3)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: a batch scheduler preempting the job, or a plain ``kill`` (exit 143)."""
