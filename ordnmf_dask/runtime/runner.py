"""Run I/O tasks in-process or on a ``distributed`` cluster with one small interface.

Tasks are module-level functions of small arguments (paths, index ranges, O(U + I) arrays at
most); big data moves through files in a scratch directory, never through the client. An
``InputError`` raised by a task is returned as a value and re-raised on the client for the
*first* failing task in submission order, so that error messages name the same file and line
whatever the scheduling.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.progress import track
from ordnmf_dask.runtime.reduce import fold


@dataclass(frozen=True)
class _Failed:
    """An ``InputError`` raised inside a task (its message)."""

    message: str


def _guard(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except InputError as exc:
        return _Failed(str(exc))


def _combine(fn: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    if isinstance(a, _Failed):
        return a
    if isinstance(b, _Failed):
        return b
    return fn(a, b)


def _key(fn: Callable[..., Any]) -> str:
    """A new task key whose prefix (what the dashboard groups by) is ``fn``'s name."""
    return f"{fn.__name__.strip('_').replace('_', '-')}-{uuid.uuid4().hex}"


def _raise_first(results: Sequence[Any]) -> None:
    for res in results:
        if isinstance(res, _Failed):
            raise InputError(res.message)


class Runner:
    """Map tasks over items in-process (``client=None``) or on a ``distributed.Client``.

    Parameters
    ----------
    client : distributed.Client or None
        None runs every task in the calling process, one after the other.

    Attributes
    ----------
    settled : bool
        False while a task this runner started may still run: one submitted and not finished
        (an interrupt between submitting and gathering), or one left unfinished by a failure
        (an error other than ``InputError``, or an interrupt, while gathering): those are
        cancelled, but one already running on a worker finishes, so it may still write after
        the failure reached the caller.
    """

    def __init__(self, client: Any = None, label: str = "ingest") -> None:
        self.client = client
        self.label = label
        self._settled = True
        self._live: list[Any] = []  # futures submitted and not yet seen finished
        self._pruned = 64

    @property
    def settled(self) -> bool:
        self._live = [h for h in self._live if not h.done()]
        return self._settled and not self._live

    @settled.setter
    def settled(self, value: bool) -> None:
        self._settled = value

    def share(self, obj: Any) -> Any:
        """Send a read-only argument used by many tasks once (broadcast to every worker);
        None is passed as is."""
        if self.client is None or obj is None:
            return obj
        return self.client.scatter(obj, broadcast=True, hash=False)

    def submit(self, fn: Callable[..., Any], items: Sequence[Any], *args: Any) -> list[Any]:
        """Start ``fn(item, *args)`` for every item; returns handles (futures or values)."""
        if self.client is None:
            return [_guard(fn, item, *args) for item in items]
        handles = [self.client.submit(_guard, fn, item, *args, key=_key(fn)) for item in items]
        self._live.extend(handles)
        if len(self._live) >= 2 * self._pruned:  # the finished ones go, in amortized O(1)
            self._live = [h for h in self._live if not h.done()]
            self._pruned = max(len(self._live), 64)
        return handles

    def gather(self, handles: Sequence[Any]) -> list[Any]:
        """Results of ``handles`` in order; raises the first task's ``InputError``."""
        results = self.gather_all(handles)
        _raise_first(results)
        return results

    def gather_all(self, handles: Sequence[Any]) -> list[Any]:
        """Results of ``handles`` in order, failures included (see ``failure``); another error
        cancels the tasks left (see ``settled``)."""
        if self.client is None:
            return list(handles)
        try:
            track(list(handles), f"{self.label}: tasks")
            return self.client.gather(list(handles))
        except BaseException:
            self._settled = self._settled and all(h.done() for h in handles)
            self.client.cancel(list(handles))
            raise

    @staticmethod
    def failure(result: Any) -> str | None:
        """The ``InputError`` message of a failed task's result, else None."""
        return result.message if isinstance(result, _Failed) else None

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *args: Any) -> list[Any]:
        """``[fn(item, *args) for item in items]``, run as tasks; results must be small."""
        return self.gather(self.submit(fn, items, *args))

    def map_reduce(
        self,
        fn: Callable[..., Any],
        items: Sequence[Any],
        combine: Callable[[Any, Any], Any],
        *args: Any,
    ) -> Any:
        """Fold ``fn(item, *args)`` over ``items`` with ``combine`` along the package's one
        fixed tree (:func:`~.reduce.fold`), on the workers.

        ``combine`` must be associative; the tree depends only on ``len(items)``, so results
        are reproducible. Tasks are submitted depth first, so a combine runs as soon as its two
        halves are done: results are not all held at once. An ``InputError`` of the earliest
        failed item wins.
        """
        client = self.client

        def pair(left: Any, right: Any) -> Any:
            if client is None:
                return _combine(combine, left, right)
            return client.submit(_combine, combine, left, right, key=_key(combine))

        root = fold(len(items), lambda j: self.submit(fn, [items[j]], *args)[0], pair)
        return self.gather([root])[0]
