"""Scikit-learn style estimator for IG-OrdNMF on a Dask cluster."""

from __future__ import annotations

import atexit
import hashlib
import inspect
import logging
import os
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ordnmf_dask.dist import interrupt
from ordnmf_dask.dist.cluster import checkpoint_schedule, choose_client
from ordnmf_dask.dist.memory import block_bytes, check_fit_memory
from ordnmf_dask.dist.progress import IterationProgress, shows_progress
from ordnmf_dask.engine import checkpoint, warmstart
from ordnmf_dask.engine.cavi import (
    CaviConfig,
    CaviRunner,
    CaviState,
    IterationCallback,
    IterationInfo,
    Validation,
)
from ordnmf_dask.errors import InputError
from ordnmf_dask.model.families import DcPFFamily, Family, OrdinalFamily
from ordnmf_dask.modelstore.model import (
    ModelInfo,
    copy_model,
    model_target,
    open_model,
    save_model,
    store_fingerprint,
)
from ordnmf_dask.params import DEFAULTS, PARAMS, RENAMED, accepted, validate
from ordnmf_dask.postfit.evaluate import loglik_spec, score_split
from ordnmf_dask.sources.fitdata import accepts_data_in_memory
from ordnmf_dask.store import files as locations
from ordnmf_dask.store.blocks import StoreInfo, open_store
from ordnmf_dask.store.files import READ_ERRORS
from ordnmf_dask.store.kinds import CHECKPOINT_DIRECTORY
from ordnmf_dask.store.outputs import check_apart, check_place

if TYPE_CHECKING:  # distributed and dask.array are imported where they are used
    import dask.array as da
    from distributed import Client

log = logging.getLogger("ordnmf_dask")

InitArg = str | os.PathLike | tuple[np.ndarray, np.ndarray] | None
_FACTORS = (("W", "mean"), ("H", "mean"), ("W", "log_mean"), ("H", "log_mean"))  # W_ .. log_H_


def _params_doc(estimator: str) -> str:
    """The Parameters section of an estimator's docstring, from the table."""
    lines = []
    for name in accepted(estimator):
        default = "" if DEFAULTS[name] is None else f" (default {DEFAULTS[name]!r})"
        text = f"{name} : {PARAMS[name].doc}{default}."
        lines.append(textwrap.fill(text, 96, initial_indent="    ", subsequent_indent="        "))
    return "\n".join(lines) + """\n
    Checkpoints are written by the workers and read back, which also cuts the task lineage;
    none after the last iteration, whose state is the saved model. A fit that finds checkpoints
    of the same store and model parameters in ``checkpoint_dir`` resumes from them; one that
    finds another fit's refuses to start (see :meth:`fit`'s ``restart``). ``checkpoint_dir``
    inside the default ``work_dir`` is removed after the fit.
"""


_SHARED_ATTRS_DOC = """
    W_, H_ : dask arrays (U, K), (I, K): posterior means E[W], E[H], chunked by block (made
        when first used: a fit alone imports no dask).
    log_W_, log_H_ : dask arrays: E[log W], E[log H].
    elbo_ : list of ELBO values, one per iteration; n_iter_ : len(elbo_); converged_ : bool.
    model_path_ : the zarr directory holding the fitted factors.
    runs_ : one dict per restart: seed, the ELBO of its kept state, n_iter, best_iteration,
        converged, stop_reason, validation (the kept state's validation metric, or None), kept
        (restarts are chosen by the validation metric when the store has a validation subset,
        else by the ELBO).

    With a validation subset in the store (``ingest --validation-fraction``), the fit scores
    it every ``validation_every`` iterations, stops after ``validation_patience`` scores
    without improvement of their mean over the last ``validation_window``, and saves the state
    that rule keeps (attributes ``best_iteration``, ``stop_reason`` and ``validation`` of the
    model: docs/model-format.md).
"""


class CaviEstimator:
    """Shared fit / save / load of the models that run on the CAVI engine."""

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        alpha_W: float = DEFAULTS["alpha_W"],
        alpha_H: float = DEFAULTS["alpha_H"],
        tol: float = DEFAULTS["tol"],
        max_iter: int = DEFAULTS["max_iter"],
        min_iter: int = DEFAULTS["min_iter"],
        seed: int = DEFAULTS["seed"],
        n_init: int = DEFAULTS["n_init"],
        cache_blocks: bool | str = DEFAULTS["cache_blocks"],
        executor: str = DEFAULTS["executor"],
        work_dir: str | None = DEFAULTS["work_dir"],
        checkpoint_dir: str | None = DEFAULTS["checkpoint_dir"],
        checkpoint_every: int = DEFAULTS["checkpoint_every"],
        checkpoint_minutes: float | None = DEFAULTS["checkpoint_minutes"],
        validation_every: int = DEFAULTS["validation_every"],
        validation_patience: int = DEFAULTS["validation_patience"],
        validation_window: int = DEFAULTS["validation_window"],
        validation_metric: str = DEFAULTS["validation_metric"],
        validation_k: int = DEFAULTS["validation_k"],
        validation_s: int = DEFAULTS["validation_s"],
    ) -> None:
        self.n_components = n_components
        self.alpha_W = alpha_W
        self.alpha_H = alpha_H
        self.tol = tol
        self.max_iter = max_iter
        self.min_iter = min_iter
        self.seed = seed
        self.n_init = n_init
        self.cache_blocks = cache_blocks
        self.executor = executor
        self.work_dir = work_dir
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.checkpoint_minutes = checkpoint_minutes
        self.validation_every = validation_every
        self.validation_patience = validation_patience
        self.validation_window = validation_window
        self.validation_metric = validation_metric
        self.validation_k = validation_k
        self.validation_s = validation_s

    def _family(self, store: StoreInfo) -> Family:
        raise NotImplementedError

    def _set_family_attrs(self, attrs: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- scikit-learn protocol -----------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            if "__init__" in vars(klass) and issubclass(klass, CaviEstimator):
                sig = inspect.signature(klass.__init__)
                names += [p for p in sig.parameters if p not in ("self", "kwargs")]
        return list(dict.fromkeys(names))

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> CaviEstimator:
        for name, value in params.items():
            if name not in self._param_names():
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _validate(self) -> tuple[CaviConfig, dict[str, Any]]:
        """The engine's settings and every parameter, checked against the table's rules."""
        values = validate(self.get_params())
        cfg = CaviConfig(**{f.name: values[f.name] for f in fields(CaviConfig)})
        return cfg, values

    # -- fitting -------------------------------------------------------------------------
    @shows_progress
    @accepts_data_in_memory
    def fit(
        self,
        store: str | os.PathLike | StoreInfo,
        client: Client | None = None,
        *,
        init: InitArg = None,
        init_model: str | os.PathLike | CaviEstimator | None = None,
        out: str | os.PathLike | None = None,
        overwrite: bool = False,
        callback: IterationCallback | None = None,
        resume: bool = False,
        restart: bool = False,
        check: bool = False,
    ) -> CaviEstimator:
        """Fit on the training blocks of a store written by :func:`ordnmf_dask.ingest`, or on
        data in memory.

        Parameters
        ----------
        store : path of the zarr store (or an opened :class:`StoreInfo`), or data in memory: a
            scipy.sparse matrix (rows users, columns items, stored entries the values; explicit
            zeros are no interaction), a pandas or dask DataFrame or a pyarrow Table (columns
            user, item, value), or a ``(users, items, values)`` tuple of 1-D arrays. Data in
            memory is ingested as :func:`ordnmf_dask.ingest` does with ``ingest_options``, except
            that all of it trains the model by default (``test_fraction=0``): the model is the
            one of ``fit(ingest(X, out, test_fraction=0, **ingest_options))``. Users and items
            without an entry are not in it: the rows of W_ and H_ are the others, in increasing
            id (row or column index of a matrix).
        ingest_options : for data in memory, keyword arguments of :func:`ordnmf_dask.ingest`,
            e.g. ``{"ratings": "halfstar"}``, ``{"counts": "paper"}``, ``{"test_fraction":
            0.2}``, ``{"columns": ["user", "item", "rating"]}``.
        store_out : for data in memory, where to write its store and keep it. Without it the
            store goes to a temporary directory (inside ``work_dir`` when set: a cluster on
            other machines needs one they all see), removed if the fit fails, else when the
            estimator is fitted again, garbage-collected or the process exits (``recommend``'s
            seen-items filter reads it).
        client : a ``distributed.Client``; default the current one, else (``executor``) this
            process's threads for a store that fits in memory, or a LocalCluster of 2 worker
            processes x 1 thread started for the fit and closed after it (for another cluster,
            start it and pass its client).
        init : warm start: ``(W0, H0)`` arrays of shape (U, K), (I, K), or an ``.npz`` file with
            arrays ``W`` and ``H``; replaces the random initialization (E[W] = W0, E[H] = H0).
        init_model : warm start from a saved model (its directory, or a fitted estimator) of the
            same class, K and number of classes, on this store or one that grew: users and items
            are matched by raw id; known ones start from their old posterior, new ones from a
            fold-in against the old factors (or as a cold fit, without interactions with known
            ones); Delta (or p) starts at the old value (docs/design.md, "Warm start").
        out : directory of the saved model (default: a temporary directory, removed when the
            Python process exits; :meth:`save` copies the model to keep it). An existing ``out``
            is replaced only with ``overwrite`` and only if it is a model; never the store.
        callback : called after each iteration (after the default log line) with an
            :class:`~ordnmf_dask.engine.cavi.IterationInfo`: iteration, max_iter, ELBO, relative
            change, seconds, elapsed, params (Delta, or p for dcPF), the validation scores when
            the iteration was scored, best_iteration. Returning True (or calling
            ``info.stop()``) stops the fit after this iteration; with validation, the best
            scored state is still the one saved.
        resume : require resuming: InputError unless ``checkpoint_dir`` holds a usable checkpoint
            of this fit. Without it, a fit resumes from the newest valid checkpoint of the same
            model, settings and store when there is one (an interrupted or resubmitted job
            continues), and starts afresh when there is none.
        restart : first remove every checkpoint ordnmf_dask wrote in the checkpoint directory
            (they are logged), whatever fit wrote it, and start afresh. Without it, a directory
            holding another fit's checkpoints is refused (InputError), and nothing is removed.

        check : only check, and return: the store, the warm start, the output path and the
            checkpoint directory as the fit would find them; no cluster is used, nothing is
            written or removed (a launcher runs it before it starts its cluster).

        Every conflict (store, warm-start model, output path, checkpoints) is checked before
        the cluster is used, and so is K (at most min(n_users, n_items)); factors that cannot
        fit the workers' memory limits (in-process: the memory available) are refused before
        the first iteration (:func:`ordnmf_dask.dist.memory.check_fit_memory`).
        """
        cfg, values = self._validate()
        info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
        check_rank(cfg.n_components, info)
        family = self._family(info)
        init_arrays = _read_init(init, info, cfg.n_components)
        source = None
        if init_model is not None:
            if init is not None:
                raise InputError("init and init_model are two warm starts: give one of them")
            source = warmstart.open_source(init_model, type(self).__name__, family,
                                           cfg.n_components, info)
        if resume and restart:
            raise InputError("resume and restart contradict each other: give one of them")
        if resume and not values["checkpoint_dir"]:
            raise InputError("resume=True needs checkpoint_dir (where the checkpoints are)")
        n_init = values["n_init"]
        if n_init > 1 and (init_arrays is not None or source is not None or resume):
            raise InputError(
                "n_init > 1 restarts from random draws: no init=, init_model= or resume= with it"
            )
        validation = _validation(info, family, values)
        check_apart({"out": out, "checkpoint_dir": values["checkpoint_dir"]})
        if out is not None:
            out = model_target(out, overwrite, info.path)
        if values["checkpoint_dir"]:
            check_place(values["checkpoint_dir"], "checkpoints", CHECKPOINT_DIRECTORY,
                        {"training store": info.path})
        prints = [  # one per restart: its trajectory depends on its seed
            checkpoint.fingerprint(info.attrs, info.path,
                                   self._fit_settings(values, source or init_arrays, s))
            for s in range(cfg.seed, cfg.seed + n_init)
        ]
        if check:
            ckpt = values["checkpoint_dir"]
            if ckpt and (locations.is_url(ckpt) or os.path.isdir(ckpt)) and not restart:
                _claim(locations.location(ckpt), prints, False, n_init, dry_run=True)
            return self
        if isinstance(family, DcPFFamily) and family.values == "class":  # documented, but rare
            log.warning("dcPF models raw counts, but %s holds classes (value_kind %r): it fits "
                        "the classes 1..%d as counts; to fit play counts, ingest them with "
                        "counts='paper' (--counts paper), which keeps the raw counts",
                        info.path, info.attrs.get("value_kind"), info.n_classes)
        work = values["work_dir"] or tempfile.mkdtemp(prefix="ordnmf-work-")
        try:
            os.makedirs(work, exist_ok=True)
            ckpt_dir = values["checkpoint_dir"] or os.path.join(work, "checkpoints")
            ckpt_dir = locations.location(ckpt_dir)
            if not locations.is_url(ckpt_dir):  # object stores have no directories
                os.makedirs(ckpt_dir, exist_ok=True)
            ours = _claim(ckpt_dir, prints, restart, n_init)
            if out is None:
                out = _temporary_model_dir()
            with choose_client(client, info, cfg.n_components, values["executor"]) as cl:
                cache = decide_cache(values["cache_blocks"], cl, info)
                check_fit_memory(cl, info, cfg.n_components, cache)  # before any iteration
                scorer = None if validation is None else validation(cl)
                state: CaviState | None = None
                runs: list[dict[str, Any]] = []
                kept = 0
                for j in range(n_init):
                    run_cfg = replace(cfg, seed=cfg.seed + j)
                    runner = CaviRunner(
                        cl, info, family, run_cfg, ckpt_dir, cache,
                        *checkpoint_schedule(cl, values), prints[j],
                    )
                    params0 = None
                    if source is not None:
                        params0 = warmstart.start_params(family, source)
                        alpha = {"W": run_cfg.alpha_W, "H": run_cfg.alpha_H}

                        def start(runner=runner, params0=params0, alpha=alpha):
                            return warmstart.initial_chunks(runner, source, params0, alpha)
                    elif init_arrays is None:
                        start = runner.random_init
                    else:
                        def start(runner=runner):  # writes the arrays only when called
                            return runner.warm_init(*_write_init(init_arrays, work))
                    fit_log = _FitLog(family, callback, values["max_iter"])
                    try:
                        run = runner.run(start, fit_log, resume=bool(ours), required=resume,
                                         init_params=params0, validation=scorer)  # fmt: skip
                    finally:
                        fit_log.close()
                    runs.append(_run_record(run, run_cfg.seed))
                    if n_init > 1:  # its checkpoints would collide with the next run's
                        checkpoint.discard(ckpt_dir, prints[j])
                        log.info("restart %d/%d (seed %d): ELBO %.10e after %d iterations%s",
                                 j + 1, n_init, run_cfg.seed, runs[-1]["elbo"], run.n_iter,
                                 _validation_text(runs[-1]))  # fmt: skip
                    if state is None or _better(runs[-1], runs[kept]):
                        state, kept = run, j
                assert state is not None
                for j, r in enumerate(runs):
                    r["kept"] = j == kept
                attrs = {
                    "model": type(self).__name__,
                    "family": family.name,
                    "params": values,
                    **family.describe(state.params),
                    "elbo": state.elbo,
                    "n_iter": state.n_iter,
                    "converged": state.converged,
                    "stop_reason": state.stop_reason,
                    "best_iteration": state.best_iteration,
                    "validation": None if scorer is None else {
                        **{k.removeprefix("validation_"): values[k]
                           for k in values if PARAMS[k].section == "validation"},
                        "history": state.validation,
                    },
                    "warm_start": init_arrays is not None or source is not None,
                    "init_model": None if source is None else source.describe(),
                    "store": {
                        "path": info.path,
                        "fingerprint": store_fingerprint(info.path),
                        "n_users": info.n_users,
                        "n_items": info.n_items,
                        "n_classes": info.n_classes,
                        "nnz_train": info.nnz_train,
                    },
                    "row_bounds": info.row_bounds.tolist(),
                    "col_bounds": info.col_bounds.tolist(),
                    "cache_blocks": cache,
                    "runs": runs,
                }
                save_model(cl, state.w, state.h, os.fspath(out), attrs, overwrite=overwrite)
        finally:
            if values["work_dir"] is None:
                shutil.rmtree(work, ignore_errors=True)
        self._set_fitted(open_model(os.fspath(out)))
        return self

    def _fit_settings(
        self, values: dict[str, Any],
        init: tuple[np.ndarray, np.ndarray] | warmstart.Source | None, seed: int,
    ) -> dict[str, Any]:
        """What the trajectory of the run from ``seed`` (or warm-started from ``init``: arrays
        or a saved model) depends on (checked when resuming from a checkpoint): the model
        parameters of the table and the warm start."""
        params = {k: v for k, v in values.items() if PARAMS[k].model}
        warm: str | bool | dict[str, str] = False
        if isinstance(init, warmstart.Source):
            warm = init.describe()
        elif init is not None:
            digest = hashlib.sha256()
            for a in init:
                digest.update(np.ascontiguousarray(a).data)
            warm = digest.hexdigest()
        return {"model": type(self).__name__, **params, "seed": seed, "warm_start": warm}

    def _set_fitted(self, model: ModelInfo) -> None:
        a = model.attrs
        self.model_path_ = model.path
        self._set_family_attrs(a)
        self.elbo_ = list(a["elbo"])
        self.n_iter_ = int(a["n_iter"])
        self.runs_ = list(a.get("runs", []))
        self.converged_ = bool(a["converged"])
        for name, field in _FACTORS:  # a damaged model is an error now, not at first use
            model.factor_chunks(name, field)
        self._model = model
        self._factors: dict[tuple[str, str], da.Array] = {}

    def _factor(self, name: str, field: str) -> da.Array:
        """A factor of the fitted model as a dask array, made on first use (a command that
        only fits imports no dask.array) and kept."""
        if "_factors" not in vars(self):
            raise AttributeError(f"{type(self).__name__} is not fitted: call fit() or load()")
        if (name, field) not in self._factors:
            self._factors[name, field] = self._model.factor(name, field)
        return self._factors[name, field]

    @property
    def W_(self) -> da.Array:
        return self._factor("W", "mean")

    @property
    def H_(self) -> da.Array:
        return self._factor("H", "mean")

    @property
    def log_W_(self) -> da.Array:
        return self._factor("W", "log_mean")

    @property
    def log_H_(self) -> da.Array:
        return self._factor("H", "log_mean")

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the parameters and, once fitted, the model directory's path instead of the
        factors: unpickling reopens that model, so it must still exist (:meth:`save` keeps one)."""
        state = {k: v for k, v in vars(self).items()
                 if not k.endswith("_") and not k.startswith("_")}  # fmt: skip
        if hasattr(self, "model_path_"):
            state["model_path_"] = self.model_path_
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = state.pop("model_path_", None)
        vars(self).update(state)
        if path is not None:
            self._set_fitted(open_model(path))

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike, overwrite: bool = False) -> str:
        """Copy the fitted model directory to ``path`` (a directory or a URL: zarr arrays and
        JSON attributes); an existing ``path`` is replaced only with ``overwrite`` and only if
        it is a model."""
        return copy_model(open_model(self.model_path_), path, overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CaviEstimator:
        """The estimator (of the saved model's class) with its parameters and fitted state."""
        model = open_model(os.fspath(path))
        klass = ESTIMATORS.get(model.attrs.get("model", ""))
        if klass is None or not issubclass(klass, cls):
            raise InputError(f"{model.path}: holds a {model.attrs.get('model')!r} model, "
                             f"not a {cls.__name__}")
        params = {RENAMED.get(k, k): v for k, v in model.attrs["params"].items()}
        est = klass(**{k: v for k, v in params.items() if k is not None})
        est._set_fitted(model)
        return est

    # -- serving in memory, no cluster (ordnmf_dask.postfit.serving) ---------------------
    def _server(self, store: str | os.PathLike | None = None) -> Any:
        from ordnmf_dask.postfit.serving import server

        return server(self.model_path_, store)

    def recommend(
        self, user_ids: Any, n: int = 10, *, filter_already_seen: bool = True,
        items: Sequence[Any] | None = None, exclude: Sequence[Any] | None = None,
        store: str | os.PathLike | None = None,
    ) -> dict[Any, list[tuple[Any, float]]]:
        """Top-``n`` items per user by E[w_u] . E[h_i], in memory:
        ``{user id as given: [(raw item id, score), ...]}``, best first, ties to the lower item
        index. ``filter_already_seen`` leaves out the user's training items (from the model's
        own index of them, or from ``store``, needed only by models saved without that index);
        ``items`` restricts the candidates to these raw ids; ``exclude`` removes these."""
        return self._server(store).recommend(user_ids, n, filter_already_seen, items, exclude)

    def recommend_for(
        self, w: np.ndarray, n: int = 10, *, exclude: Sequence[Sequence[Any]] | None = None,
        items: Sequence[Any] | None = None,
    ) -> dict[int, list[tuple[Any, float]]]:
        """Top-``n`` items for users given by their factors (from :meth:`fold_in_users`),
        row j without the raw items ``exclude[j]``: ``{j: [(raw item id, score), ...]}``, as
        :meth:`recommend` keyed by the row of ``w``."""
        return self._server().recommend_for(w, n, exclude, items)

    def similar_items(self, item_ids: Any, n: int = 10) -> dict[Any, list[tuple[Any, float]]]:
        """The ``n`` items most similar to each given one (cosine of E[h]), itself excluded."""
        return self._server().similar("items", item_ids, n)

    def similar_users(self, user_ids: Any, n: int = 10) -> dict[Any, list[tuple[Any, float]]]:
        """The ``n`` users most similar to each given one (cosine of E[w]), itself excluded."""
        return self._server().similar("users", user_ids, n)

    def score(self, user_ids: Sequence[Any], item_ids: Sequence[Any]) -> np.ndarray:
        """E[w_u] . E[h_i] for the pairs (user_ids[j], item_ids[j]): the ranking score."""
        return self._server().score(user_ids, item_ids)

    def fold_in_users(
        self, items: Sequence[Sequence[Any]], values: Sequence[Sequence[float]], *,
        max_iter: int = 500, tol: float = 1e-6, seed: int | None = None,
    ) -> np.ndarray:
        """E[w] (n_new, K) of NEW users from their (raw item id, value) interactions, with
        q(H) and the thresholds fixed (see :func:`ordnmf_dask.fold_in`), in memory."""
        return self._server().fold_in("users", items, values, max_iter, tol, seed)

    def fold_in_items(
        self, users: Sequence[Sequence[Any]], values: Sequence[Sequence[float]], *,
        max_iter: int = 500, tol: float = 1e-6, seed: int | None = None,
    ) -> np.ndarray:
        """E[h] (n_new, K) of NEW items from their (raw user id, value) interactions, with
        q(W) and the thresholds fixed, in memory."""
        return self._server().fold_in("items", users, values, max_iter, tol, seed)


def _claim(
    ckpt_dir: str, prints: list[str], restart: bool, n_init: int, dry_run: bool = False
) -> list[str]:
    """:func:`checkpoint.claim`, and InputError if a fit of several restarts finds its own
    checkpoints (it does not resume)."""
    ours = checkpoint.claim(ckpt_dir, prints, restart, dry_run)
    if ours and n_init > 1:
        raise InputError(
            f"{ckpt_dir} holds checkpoints of this fit, but a fit with n_init > 1 does not "
            "resume: pass restart=True to discard them"
        )
    return ours


def _temporary_model_dir() -> str:
    """Where to write a model fitted without ``out``: a path in a new directory that is removed
    when the process exits (the fitted attributes read from it lazily, so it must outlive the
    fit)."""
    parent = tempfile.mkdtemp(prefix="ordnmf-model-")
    atexit.register(shutil.rmtree, parent, ignore_errors=True)
    return os.path.join(parent, "model.zarr")


class OrdNMF(CaviEstimator):
    __doc__ = (
        """Ordinal NMF with inverse-gamma thresholds (IG-OrdNMF), fitted by exact CAVI on Dask.

    Implements Gouvert, Oberlin & Fevotte, "Ordinal Non-negative Matrix Factorization for
    Recommendation", ICML 2020, in the variant the published numbers were computed with
    (docs/design.md §2): empirical-Bayes prior rates, closed-form Delta (VBEM), W then H
    updated in turn so that the ELBO never decreases. ``approx=True`` fixes q(n) = delta_1
    ("PF on binarized data" when V = 1); Delta is still learned and the reported bound is still
    the local ELBO with E[n] = 1, as in the published code.

    Parameters
    ----------
"""
        + _params_doc("OrdNMF")
        + """
    Attributes
    ----------"""
        + _SHARED_ATTRS_DOC
        + """    delta_ : (V + 1,) threshold decrements (delta_[0] = 0).
    theta_ : (V + 1,) thresholds theta_v = sum_{l > v} Delta_l (theta_V = 0).
    """
    )

    def __init__(
        self, n_components: int = DEFAULTS["n_components"], *,
        approx: bool = DEFAULTS["approx"], **kwargs: Any,
    ) -> None:
        super().__init__(n_components, **kwargs)
        self.approx = approx

    def _family(self, store: StoreInfo) -> Family:
        return OrdinalFamily(tuple(int(n) for n in store.hist_train), approx=bool(self.approx))

    def _set_family_attrs(self, attrs: dict[str, Any]) -> None:
        self.delta_ = np.asarray(attrs["delta"])
        self.theta_ = np.asarray(attrs["theta"])


class BePoF(OrdNMF):
    """Bernoulli-Poisson factorization: OrdNMF with V = 1 on data binarized at ``threshold``.

    Blocks of the store are binarized when read (class >= ``threshold`` -> 1, others dropped),
    so one ingested ordinal store serves every threshold. theta_0 = Delta_1 is learned, or fixed
    at 1 with ``learn_threshold=False`` (the paper's BePoF). ``approx=True`` is PF on the
    binarized data (see :class:`PF`). Other parameters and attributes as :class:`OrdNMF`.
    """

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        threshold: int = DEFAULTS["threshold"],
        learn_threshold: bool = DEFAULTS["learn_threshold"],
        approx: bool = DEFAULTS["approx"],
        **kwargs: Any,
    ) -> None:
        super().__init__(n_components, approx=approx, **kwargs)
        self.threshold = threshold
        self.learn_threshold = learn_threshold

    def _family(self, store: StoreInfo) -> Family:
        s = int(self.threshold)  # an integer >= 1 (validated); the store bounds it above
        if s > store.n_classes:
            raise InputError(f"threshold must be an integer in 1..{store.n_classes}, got {s!r}")
        kept = int(store.hist_train[s:].sum())
        if kept == 0:
            raise InputError(f"no training nonzero has class >= {s}")
        fixed = None if self.learn_threshold else (0.0, 1.0)
        return OrdinalFamily(
            (0, kept), approx=bool(self.approx), binarize_at=int(s), fixed_delta=fixed
        )


class PF(BePoF):
    """Poisson factorization on data binarized at ``threshold``: BePoF with q(n) = delta_1.

    As in the published code, Delta_1 is still learned and the reported bound keeps the
    log(expm1(.)) local term. Parameters and attributes as :class:`BePoF` (``approx`` is True).
    """

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        threshold: int = DEFAULTS["threshold"],
        learn_threshold: bool = DEFAULTS["learn_threshold"],
        **kwargs: Any,
    ) -> None:
        kwargs.pop("approx", None)
        super().__init__(
            n_components, threshold=threshold, learn_threshold=learn_threshold, approx=True,
            **kwargs,
        )

    @classmethod
    def _param_names(cls) -> list[str]:
        return [n for n in super()._param_names() if n != "approx"]


class DcPF(CaviEstimator):
    __doc__ = (
        """dcPF with the logarithmic element distribution (Gouvert et al., UAI 2019), on raw counts.

    The baseline of the paper for play counts (docs/design.md §5): counts are sums of
    Log(p) elements whose number is Poisson(t Lambda). Iteration order: prior rates, p (10
    Newton steps, kept only if they improve), W, H, local step. Counts are the store's raw
    values when it holds counts (``value_kind == "counts"``), its classes otherwise.
    ``p = 0`` (fixed) is PF on the raw counts, ``p = 1`` (fixed) PF on binary data.

    A learned p becomes 0, and stays there, once sum E[n] reaches sum y (no overdispersion
    left: the bound rises all the way to the Poisson limit).

    Parameters
    ----------
"""
        + _params_doc("DcPF")
        + """
    Attributes
    ----------"""
        + _SHARED_ATTRS_DOC
        + """    p_ : the learned element parameter.
    """
    )

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        p: float = DEFAULTS["p"],
        t: float = DEFAULTS["t"],
        update_p: bool = DEFAULTS["update_p"],
        **kwargs: Any,
    ) -> None:
        super().__init__(n_components, **kwargs)
        self.p = p
        self.t = t
        self.update_p = update_p

    def _family(self, store: StoreInfo) -> Family:
        values = "raw" if store.attrs.get("value_kind") == "counts" else "class"
        return DcPFFamily(values, float(self.p), float(self.t), bool(self.update_p))

    def _set_family_attrs(self, attrs: dict[str, Any]) -> None:
        self.p_ = float(attrs["p"])


ESTIMATORS: dict[str, type[CaviEstimator]] = {
    k.__name__: k for k in (OrdNMF, BePoF, PF, DcPF)
}


class _FitLog:
    """The default iteration log (with progress and the validation scores), then the user's
    ``callback``, whose True stops the fit; :meth:`close` removes a progress bar."""

    def __init__(self, family: Family, callback: IterationCallback | None, max_iter: int):
        self.family, self.callback = family, callback
        self.progress = IterationProgress(max_iter)

    def __call__(self, info: IterationInfo) -> bool:
        interrupt.check()
        progress = self.progress
        progress.clear()
        log.info("iter %4d/%d  elbo %.10e  rel %.3e  %.2fs  %s  (elapsed %s, %s)",
                 info.iteration, info.max_iter, info.elbo, info.rel_change, info.seconds,
                 self.family.summary(info.params), progress.clock(info.elapsed),
                 progress.eta(info.iteration, info.elapsed))  # fmt: skip
        if info.validation is not None:
            v = info.validation
            ndcg = "  ".join(f"ndcg@{v['k']}(s={s}) {x:.4f}" for s, x in v["ndcg"].items())
            loglik = "" if v["loglik_mean"] is None else f"  loglik/nz {v['loglik_mean']:.5f}"
            log.info("validation at iter %d: %s%s  (best: iter %d; %.2fs)", info.iteration,
                     ndcg, loglik, info.best_iteration, v["seconds"])  # fmt: skip
        progress.draw(info.iteration, info.elapsed)
        return bool(self.callback(info)) if self.callback is not None else False

    def close(self) -> None:
        self.progress.clear()


def _validation(
    info: StoreInfo, family: Family, values: dict[str, Any]
) -> Callable[[Client], Validation] | None:
    """How a fit on a client scores its states on the store's validation subset (None when the
    store has none or ``validation_every`` is 0); InputError for a metric the data cannot
    give, before any cluster starts."""
    if not values["validation_every"] or "validation" not in info.splits:
        return None
    k, s, metric = values["validation_k"], values["validation_s"], values["validation_metric"]
    hist = np.asarray(info.attrs["hist_validation"])
    if not 1 <= s <= info.n_classes or hist[s:].sum() == 0:
        raise InputError(f"validation_s = {s}: the validation subset of {info.path} has no "
                         f"nonzero of class >= {s} (classes 1..{info.n_classes})")
    describe = lambda params: {"family": family.name, **family.describe(params)}  # noqa: E731
    if metric == "loglik" and loglik_spec(info, describe(family.init_params())) is None:
        raise InputError("validation_metric = 'loglik': this model does not give the "
                         "likelihood of the store's classes (binarized); use 'ndcg'")
    levels = sorted({1, s})

    def scorer(cl: Client) -> Validation:
        def score(w: list[Any], h: list[Any], params: Any) -> dict[str, Any]:
            out = score_split(cl, info, "validation", w, h, levels, k,
                              loglik_spec(info, describe(params)))  # fmt: skip
            ndcg = {str(t): out["ndcg"][t] for t in levels}
            return {"k": k, "ndcg": ndcg, "loglik_mean": out["loglik_mean"],
                    "metric": ndcg[str(s)] if metric == "ndcg" else out["loglik_mean"]}

        return Validation(score, values["validation_every"], values["validation_patience"],
                          values["validation_window"])

    return scorer


def _run_record(run: CaviState, seed: int) -> dict[str, Any]:
    """What ``attrs["runs"]`` keeps of one restart: the kept state's ELBO and, with validation,
    its score."""
    best = next((v for v in run.validation if v["iteration"] == run.best_iteration), None)
    return {"seed": seed, "elbo": run.elbo[run.best_iteration - 1], "n_iter": run.n_iter,
            "best_iteration": run.best_iteration, "converged": run.converged,
            "stop_reason": run.stop_reason,
            "validation": None if best is None else best["metric"]}  # fmt: skip


def _better(run: dict[str, Any], than: dict[str, Any]) -> bool:
    """Restarts are chosen by the validation metric when there is one, else by the ELBO."""
    if run["validation"] is not None and than["validation"] is not None:
        return run["validation"] > than["validation"]
    return run["elbo"] > than["elbo"]


def _validation_text(run: dict[str, Any]) -> str:
    return "" if run["validation"] is None else (
        f", validation {run['validation']:.5f} at iteration {run['best_iteration']}")


def check_rank(k: int, info: StoreInfo) -> None:
    """InputError for more latent factors than the smaller side of the rating matrix: the rank
    of U x I data is at most min(U, I), and every factor costs memory and time."""
    most = min(info.n_users, info.n_items)
    if k > most:
        raise InputError(f"K (n_components) = {k} is larger than min(users, items) = {most} of "
                         f"{info.path} ({info.n_users} users x {info.n_items} items): give "
                         f"K <= {most}")


def _read_init(init: InitArg, info: StoreInfo, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    if init is None:
        return None
    source = "initialization arrays"
    if isinstance(init, str | os.PathLike):
        source = os.fspath(init)
        path = Path(init)
        if not path.is_file():
            raise InputError(f"{path}: initialization file not found")
        arrays: dict[str, np.ndarray] = {}  # a single .npy array holds neither
        try:
            loaded = np.load(path, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):
                with loaded:
                    arrays = {n: loaded[n] for n in ("W", "H") if n in loaded.files}
        except READ_ERRORS as exc:  # truncated or damaged, or no .npz at all
            raise InputError(f"{path}: not a readable .npz file ({exc})") from None
        missing = sorted({"W", "H"} - set(arrays))
        if missing:
            raise InputError(f"{path}: missing array(s) {missing} (need W and H)")
        w0, h0 = arrays["W"], arrays["H"]
    else:
        w0, h0 = init
    w0 = np.asarray(w0, dtype=np.float64)
    h0 = np.asarray(h0, dtype=np.float64)
    if w0.shape != (info.n_users, k) or h0.shape != (info.n_items, k):
        raise InputError(
            f"{source}: shapes W{w0.shape}, H{h0.shape} do not match "
            f"(n_users, K) = ({info.n_users}, {k}) and (n_items, K) = ({info.n_items}, {k})"
        )
    if not (np.all(np.isfinite(w0)) and np.all(np.isfinite(h0)) and w0.min() > 0 and h0.min() > 0):
        raise InputError(f"{source}: W and H must be finite and strictly positive")
    return w0, h0


def _write_init(arrays: tuple[np.ndarray, np.ndarray], work: str) -> tuple[str, str]:
    """Write warm-start arrays to zarr in ``work`` so that workers read only their rows."""
    paths = []
    for name, arr in zip(("W", "H"), arrays, strict=True):
        path = f"{work}/init-{name}.zarr"
        zarr.create_array(path, data=arr, chunks=(min(len(arr), 1 << 16), arr.shape[1]),
                          overwrite=True)
        paths.append(path)
    return paths[0], paths[1]


def decide_cache(setting: bool | str, client: Client, info: StoreInfo) -> bool:
    """Cache training blocks on the workers when they take under a quarter of worker memory."""
    if setting != "auto":
        return bool(setting)
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    limits = [w.get("memory_limit") or 0 for w in workers]
    if not limits or min(limits) == 0:
        return True
    return block_bytes(info) < 0.25 * sum(limits)
