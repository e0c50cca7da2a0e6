"""An in-process executor with the part of the ``distributed.Client`` API a fit uses.

The CAVI loop (:mod:`ordnmf_dask.engine.cavi`), the reductions (:mod:`.reduce`), checkpoints and
the model writer submit module-level functions whose arguments may hold futures (directly or
inside lists, tuples and dicts). :class:`InProcessClient` runs the same tasks in this process:
a task is handed to a FIFO thread pool (one thread per core) once every future it depends on
has finished, with those futures replaced by their results, exactly as a worker would receive
them. The numba kernels release the GIL, so the threads use the cores; nothing is pickled or
sent anywhere. Each task computes the same function of the same inputs as on a cluster, and
every sum has a fixed order (:mod:`.reduce`), so a fit gives bitwise the results of a
distributed one (docs/design.md §4).

Keywords that place or order tasks on a cluster (``workers``, ``allow_other_workers``,
``priority``, ``pure``, ``key``) are accepted and ignored.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_PLACEMENT = frozenset(
    {
        "workers",
        "allow_other_workers",
        "priority",
        "pure",
        "key",
        "resources",
        "retries",
        "fifo_timeout",
    }
)
NAME = "inprocess"  # the one "worker" this client reports


class InProcessFuture:
    """The result of a task of an :class:`InProcessClient` (status, result, exception)."""

    __slots__ = (
        "_client",
        "_fn",
        "_args",
        "_kwargs",
        "_deps",
        "_waiting",
        "_dependents",
        "_done",
        "_value",
        "_error",
        "__weakref__",
    )

    def __init__(
        self, client: InProcessClient, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]
    ) -> None:
        self._client = client
        self._fn: Callable[..., Any] | None = fn
        self._args: tuple | None = args
        self._kwargs: dict[str, Any] | None = kwargs
        self._deps: list[InProcessFuture] = []  # the futures among the arguments, in order
        self._waiting = 0  # unfinished dependencies
        self._dependents: list[InProcessFuture] = []
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def status(self) -> str:
        """ "pending", "finished" or "error", as a distributed future says."""
        if not self._done:
            return "pending"
        return "error" if self._error is not None else "finished"

    def done(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None) -> Any:
        """The task's value; raises its exception (or the first failed dependency's)."""
        self._client._wait_for([self], timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._client._wait_for([self], timeout)
        return self._error

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        """Pickled as its value, once finished: a result holding this future that Dask moves
        to another worker (or spills to disk) arrives there as the value."""
        return _identity, (self.result(),)

    def release(self) -> None:
        """Nothing to release: the result goes with the last reference to this future."""

    def cancel(self) -> None:
        """Tasks are not cancelled: one already queued runs, and its result is dropped with
        its future."""


def _futures_in(obj: Any) -> list[InProcessFuture]:
    """The distinct futures in ``obj`` (directly or inside lists, tuples and dicts), in order."""
    found: dict[int, InProcessFuture] = {}
    _collect(obj, found)
    return list(found.values())


def _collect(obj: Any, found: dict[int, InProcessFuture]) -> None:
    kind = type(obj)
    if kind is InProcessFuture:
        found[id(obj)] = obj
    elif kind is list or kind is tuple or kind is dict:
        for x in obj.values() if kind is dict else obj:
            if type(x) in _WALKED:
                _collect(x, found)


_WALKED = frozenset({InProcessFuture, list, tuple, dict})


def _resolved(obj: Any) -> Any:
    """``obj`` with every future replaced by its value (containers rebuilt, as Dask does)."""
    kind = type(obj)
    if kind is InProcessFuture:
        return obj._value
    if kind is list:
        return [_resolved(x) if type(x) in _WALKED else x for x in obj]
    if kind is tuple:
        return tuple([_resolved(x) if type(x) in _WALKED else x for x in obj])
    if kind is dict:
        return {k: _resolved(v) if type(v) in _WALKED else v for k, v in obj.items()}
    return obj


class InProcessClient:
    """Runs submitted tasks on a FIFO pool of ``threads`` threads in this process (default: one
    per core available to it); ``threads=0`` runs each task at once, in ``submit``.

    ``memory_limit`` (bytes) is what :meth:`scheduler_info` reports for the one worker (the
    block-caching decision reads it); default the machine's memory.
    """

    def __init__(self, threads: int | None = None, memory_limit: int | None = None) -> None:
        self.threads = available_cores() if threads is None else threads
        self.memory_limit = memory_limit or physical_memory()
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(self.threads, "ordnmf-inprocess") if self.threads else None

    # -- the Client API --------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> InProcessFuture:
        """Run ``fn(*args, **kwargs)`` once the futures among the arguments have finished."""
        kwargs = {k: v for k, v in kwargs.items() if k not in _PLACEMENT}
        fut = InProcessFuture(self, fn, args, kwargs)
        fut._deps = deps = _futures_in((args, kwargs))
        with self._cond:
            for d in deps:
                if not d._done:
                    d._dependents.append(fut)
                    fut._waiting += 1
        if fut._waiting == 0:
            self._start(fut)
        return fut

    def gather(self, futures: Any) -> Any:
        """The values of ``futures`` (a future, or a list / tuple / dict holding them)."""
        found = list(_futures_in(futures))
        self._wait_for(found, None)
        for f in found:
            if f._error is not None:
                raise f._error
        return _resolved(futures)

    def scatter(self, data: Any, broadcast: bool = False, hash: bool = True) -> InProcessFuture:
        """A finished future holding ``data`` (nothing is copied)."""
        fut = InProcessFuture(self, _identity, (), {})
        fut._fn = fut._args = fut._kwargs = None
        fut._value, fut._done = data, True
        return fut

    def scheduler_info(self, n_workers: int = -1) -> dict[str, Any]:
        """One worker with this process's threads and memory."""
        return {
            "workers": {NAME: {"nthreads": max(self.threads, 1), "memory_limit": self.memory_limit}}
        }

    def cancel(self, futures: Any) -> None:
        """See :meth:`InProcessFuture.cancel`."""

    def close(self) -> None:
        """Stop the threads after the running tasks; queued ones are dropped (nothing waits
        for them once the client is closed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> InProcessClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- execution -------------------------------------------------------------------------
    def _start(self, fut: InProcessFuture) -> None:
        if self._pool is None:
            self._run(fut)
        else:
            self._pool.submit(self._run, fut)

    def _run(self, fut: InProcessFuture) -> None:
        fn, args, kwargs, deps = fut._fn, fut._args, fut._kwargs, fut._deps
        fut._fn = fut._args = fut._kwargs = None  # the inputs are freed with the task
        fut._deps = []
        assert fn is not None and args is not None and kwargs is not None
        failed = next((d._error for d in deps if d._error), None)
        value, error = None, failed
        if failed is None:
            if deps:
                args, kwargs = _resolved(args), _resolved(kwargs)
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a task's error is its future's
                error = exc
        del args, kwargs, deps
        with self._cond:
            fut._value, fut._error, fut._done = value, error, True
            ready = []
            for d in fut._dependents:
                d._waiting -= 1
                if d._waiting == 0:
                    ready.append(d)
            fut._dependents = []
            self._cond.notify_all()
        for d in ready:
            self._start(d)

    def _wait_for(self, futures: Sequence[InProcessFuture], timeout: float | None) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: all(f._done for f in futures), timeout):
                raise TimeoutError(f"{sum(not f._done for f in futures)} task(s) not done")


def _identity(x: Any) -> Any:
    return x


def value(obj: Any) -> Any:
    """``obj`` with the in-process futures in it (directly or inside lists, tuples and dicts)
    replaced by their values, once finished; raises the first failed one's exception."""
    found = _futures_in(obj)
    for f in found:
        f.result()
    return _resolved(obj)


def wait(futures: Iterable[Any]) -> None:
    """Wait for ``futures`` to finish (or fail): in-process ones here, distributed ones with
    ``distributed.wait`` on their own client (which need not be the default one)."""
    futures = list(futures)
    mine = [f for f in futures if isinstance(f, InProcessFuture)]
    for f in mine:
        f.exception()
    others = [f for f in futures if not isinstance(f, InProcessFuture)]
    if others:
        from distributed import wait as distributed_wait

        with others[0].client.as_current():
            distributed_wait(others)


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def physical_memory() -> int:
    """Bytes of memory of the machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
