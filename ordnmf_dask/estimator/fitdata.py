"""Data in memory given to an estimator's ``fit``, as scikit-learn and ``implicit`` users hold
it, ingested into a store the fit owns, so that the model is the one ``ingest`` + ``fit(store)``
give.

``fit(X, ingest_options={...})`` writes ``ingest(X, out, test_fraction=0, **ingest_options)``
(on the fit's client for a dask DataFrame) to a new temporary directory,
so that all of X trains the model unless a test split is asked for, and fits on that store. The
directory is removed at once when ingesting or fitting fails, else when the estimator is fitted
again, garbage-collected, or the process exits: until then ``recommend(filter_already_seen=True)``
and ``evaluate`` read the training store. ``store_out`` writes the store there instead, and keeps
it.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.datakinds import is_dask_dataframe, memory_label
from ordnmf_dask.store.blocks import StoreInfo

FIT_DEFAULTS: dict[str, Any] = {"test_fraction": 0.0}  # all of X trains, as in scikit-learn

ACCEPTED = (
    "a store (its path, or the StoreInfo ordnmf_dask.ingest returns) or data in memory: a "
    "scipy.sparse matrix (rows users, columns items, entries the values), a pandas or dask "
    "DataFrame or a pyarrow Table (columns told by name), or a (users, items, values) "
    "tuple of 1-D arrays"
)

Fit = TypeVar("Fit", bound=Callable[..., Any])


def accepts_data_in_memory(fit: Fit) -> Fit:
    """``fit(self, store, ...)`` that also takes data in memory as ``store``, with two more
    keyword arguments: ``ingest_options`` (keyword arguments of ``ordnmf_dask.ingest``) and
    ``store_out`` (where to write and keep the store); see the module docstring."""
    signature = inspect.signature(fit)
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        for name, annotation in (
            ("ingest_options", "Mapping[str, Any] | None"),
            ("store_out", "str | os.PathLike | None"),
        )
    ]

    @functools.wraps(fit)
    def wrapper(
        self: Any,
        store: Any,
        *args: Any,
        ingest_options: Mapping[str, Any] | None = None,
        store_out: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> Any:
        check = bool(kwargs.get("check"))
        if isinstance(store, str | os.PathLike | StoreInfo):
            if ingest_options is not None or store_out is not None:
                raise InputError(
                    "ingest_options and store_out apply to data in memory; "
                    f"{_name(store)} is a store, already ingested"
                )
            _check_not_a_file(store)
            fitted = fit(self, store, *args, **kwargs)
            if not check:
                _own(self, None)
            return fitted
        check_kind(store)
        work_dir = self._validate()[1].engine.work_dir  # parameter errors before any data is read
        client = kwargs.get("client", args[0] if args else None)
        if store_out is not None:
            ingest_for_fit(store, store_out, client, ingest_options)
            fitted = fit(self, store_out, *args, **kwargs)
            if not check:
                _own(self, None)
            return fitted
        if work_dir:  # where the workers see it
            os.makedirs(work_dir, exist_ok=True)
        parent = tempfile.mkdtemp(prefix="ordnmf-data-", dir=work_dir or None)
        path = os.path.join(parent, "store.zarr")
        try:
            ingest_for_fit(store, path, client, ingest_options)
            fitted = fit(self, path, *args, **kwargs)
        except InputError as exc:  # name the data given, not the store removed here
            shutil.rmtree(parent, ignore_errors=True)
            label = f"the {memory_label(store, 'input') or 'input DataFrame'}"
            named = str(exc).replace(path, label).replace(parent, label)
            raise type(exc)(named).with_traceback(exc.__traceback__) from None
        except BaseException:
            shutil.rmtree(parent, ignore_errors=True)
            raise
        if check:
            shutil.rmtree(parent, ignore_errors=True)
        else:
            _own(self, parent)
        return fitted

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *extra]
    )
    return wrapper  # type: ignore[return-value]


def check_kind(data: object) -> None:
    """Raise TypeError, naming what ``fit`` takes, unless ``data`` is data in memory that
    ``ingest`` reads."""
    if memory_label(data, "input") is not None or is_dask_dataframe(data):
        return
    hint = ""
    if type(data).__module__ == "numpy":
        hint = (
            " A numpy array is ambiguous: pass scipy.sparse.csr_matrix(X) for a users x "
            "items matrix (zeros: no interaction), or (X[:, 0], X[:, 1], X[:, 2]) for rows "
            "of (user, item, value)."
        )
    elif isinstance(data, list | tuple):
        hint = " For arrays of users, items and values pass the tuple (users, items, values)."
    raise TypeError(
        f"fit() takes {ACCEPTED}; got {type(data).__name__}.{hint} Files are "
        "ingested by ordnmf_dask.ingest(inputs, out), whose store fit() takes."
    )


def ingest_for_fit(
    data: Any, out: str | os.PathLike, client: Any, options: Mapping[str, Any] | None
) -> StoreInfo:
    """The store of ``data`` at ``out``: ``ingest`` with ``FIT_DEFAULTS`` and ``options``;
    a message naming an ingest keyword spells it as ``fit`` takes it."""
    # here, not at the top: importing the estimators loads no ingest machinery (pyarrow, Dask)
    from ordnmf_dask.sources.ingest import ingest

    opts = {**FIT_DEFAULTS, **(options or {})}
    # other data in memory is already in this process: built here, not sent to the cluster
    frame = is_dask_dataframe(data) or is_dask_dataframe(opts.get("test"))
    try:
        return ingest(data, out, client=client if frame else None, **opts)
    except InputError as exc:
        raise type(exc)(fit_spelling(str(exc))).with_traceback(exc.__traceback__) from None


def fit_spelling(message: str) -> str:
    """``message`` with ingest's keywords spelled as ``fit`` takes them:
    ``ratings='halfstar'`` -> ``ingest_options={'ratings': 'halfstar'}``, a bare ``ratings=``
    -> ``ingest_options['ratings']``."""
    from ordnmf_dask.sources.options import INGEST_DEFAULTS  # as ingest: not at import time

    names = "|".join(sorted(INGEST_DEFAULTS, key=len, reverse=True))
    message = re.sub(
        rf"(?<![\w./'-])({names})=('[^']*'|[^\s,;()']+)",
        lambda m: f"ingest_options={{'{m[1]}': {m[2]}}}",
        message,
    )
    return re.sub(rf"(?<![\w./'-])({names})=", r"ingest_options['\1']", message)


def _check_not_a_file(store: Any) -> None:
    """InputError for a local file given as a store (a store is a directory), saying how to
    ingest it."""
    if isinstance(store, StoreInfo):
        return
    name = os.fspath(store)
    if "://" not in name and os.path.isfile(name):
        raise InputError(
            f"{name}: a file, not a store: fit() takes the store "
            f"ordnmf_dask.ingest({name!r}, 'ratings.zarr') writes, or data in "
            "memory"
        )


def _name(store: str | os.PathLike | StoreInfo) -> str:
    return store.path if isinstance(store, StoreInfo) else os.fspath(store)


def _own(estimator: object, directory: str | None) -> None:
    """Give ``estimator`` the temporary store directory ``directory`` (None: none), removed
    when the estimator is garbage-collected or the process exits; the one it had is removed."""
    old = vars(estimator).pop("_data_dir", None)
    if old is not None:
        old()
    if directory is not None:
        vars(estimator)["_data_dir"] = weakref.finalize(
            estimator, shutil.rmtree, directory, ignore_errors=True
        )
