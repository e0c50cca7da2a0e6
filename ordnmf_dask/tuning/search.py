"""Hyper-parameter search with successive halving, many fits at once on one Dask cluster.

:func:`tune` draws trials (K, alpha_W, alpha_H) from a space (:mod:`ordnmf_dask.tuning.schedule`),
fits each for the first rung's number of iterations, scores it on the store's validation subset,
keeps the best ``1 / eta`` and continues those to the next rung's budget, up to ``max_iter``.
The fits of a rung run concurrently from client-side threads on the same ``distributed.Client``
(a fit only submits futures and waits for its own). A survivor continues from its own
checkpoints: ``max_iter`` is a runtime setting, not part of the checkpoint fingerprint, so the
same fit with a larger ``max_iter`` resumes where it was and follows exactly the trajectory of
one uninterrupted fit. Layout of the output directory (docs/design.md, "Tuning"):
``tune.json`` (the settings; marks the directory as a tune's), ``trials/<n>/model`` and
``trials/<n>/checkpoints``, ``results.csv`` and ``results.parquet`` (a row per trial and rung),
and ``best`` (the best trial's model).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from distributed import Client

from ordnmf_dask.engine import checkpoint
from ordnmf_dask.errors import ELBODecreaseError, InputError, shown
from ordnmf_dask.fitting import check_rank, fit
from ordnmf_dask.modelstore.model import copy_model, model_target, open_model
from ordnmf_dask.params import (
    ALL,
    DEFAULTS,
    MODELS,
    accepted,
    rows_doc,
    validate,
    validate_call,
)
from ordnmf_dask.postfit.evaluate import SavedChunk, loglik_spec, score_split
from ordnmf_dask.runtime import interrupt
from ordnmf_dask.runtime.cluster import resolve_client
from ordnmf_dask.runtime.progress import shows_progress
from ordnmf_dask.store import locations
from ordnmf_dask.store.blocks import VALIDATION, StoreInfo, open_store
from ordnmf_dask.store.kinds import is_model
from ordnmf_dask.store.outputs import write_file
from ordnmf_dask.tuning import schedule

log = logging.getLogger("ordnmf_dask")

TUNE_KIND = "ordnmf_dask.tune"  # the ``kind`` of DIR/tune.json, which marks DIR as a tune's
#: parameters tune sets for every trial itself (validation_*: tune's own arguments)
MANAGED = (
    "checkpoint_dir",
    "work_dir",
    "n_init",
    "n_members",
    "max_iter",
    "executor",
    "validation_metric",
    "validation_k",
    "validation_s",
)
#: how a fit ended for good: a larger budget would change nothing
FINAL_STOPS = ("tol", "patience")


class _Stopped(Exception):
    """Raised in a trial's fit when another trial failed or the search was interrupted."""


class _TrialLabels(logging.Filter):
    """Prefixes what a trial's thread logs on the package's logger with the trial's number:
    the fits of a rung log at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        trial = getattr(self.local, "trial", None)
        if trial is not None:
            record.msg = f"[trial {trial}] {record.msg}"
        return True


@dataclass
class Trial:
    """One point of the space and where its fit lives."""

    number: int
    params: dict[str, Any]  # the searched values
    directory: str
    done: bool = False  # its fit ended for good (FINAL_STOPS)
    value: float = math.nan  # the score of its last fit

    @property
    def model(self) -> str:
        return os.path.join(self.directory, "model")

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.directory, "checkpoints")


@dataclass(frozen=True)
class TuneResult:
    """The table (a dict per trial and rung), the best row, and where things were written."""

    rows: list[dict[str, Any]]
    best: dict[str, Any]
    best_model: str
    split: str
    metric: str
    csv: str
    parquet: str


@shows_progress
@rows_doc("tune")
def tune(
    store: str | os.PathLike | StoreInfo,
    space: schedule.Space,
    client: Client | None = None,
    *,
    out: str | os.PathLike,
    model: str = "ordnmf",
    params: Mapping[str, Any] | None = None,
    n_trials: int | None = None,
    sample_seed: int = 0,
    max_iter: int = DEFAULTS["max_iter"],
    min_budget: int | None = None,
    eta: int = 3,
    validation_metric: str = "ndcg",
    validation_k: int = 100,
    validation_s: int | None = None,
    allow_test: bool = False,
    user_fraction: float = 1.0,
    n_jobs: int = 4,
    n_workers: int | None = None,
    overwrite: bool = False,
) -> TuneResult:
    """Search ``space`` by successive halving on a validation metric; save the best model.

    Parameters
    ----------
    store : the store (path or :class:`StoreInfo`); its validation subset scores the trials.
    space : parameter -> list of values or :class:`~ordnmf_dask.LogUniform` range, for
        ``n_components``, ``alpha_W``, ``alpha_H``.
    client : a ``distributed.Client``; default the current one, else a LocalCluster of
        ``n_workers`` processes started for the search.
    out : directory of the results, the trials' models and checkpoints and the best model
        (``out/best``); visible to the workers. It must be new or empty, or, with
        ``overwrite``, a directory an earlier tune wrote.
    model : ``ordnmf``, ``bepof``, ``pf`` or ``dcpf`` (or the class name).
    params : the other estimator parameters, fixed for every trial (tol, seed, threshold, ...);
        tune sets max_iter, checkpoint_dir, n_init (1), executor and the validation metric
        itself; its trials are single fits (``n_members`` 1).
    <the rows of params.COMMAND_PARAMS["tune"]>

    Returns
    -------
    :class:`TuneResult`.

    Examples
    --------
    >>> import numpy as np
    >>> from ordnmf_dask import LogUniform, OrdNMF, ingest_arrays, tune
    >>> rng = np.random.default_rng(0)
    >>> users, items = np.divmod(rng.choice(200 * 100, 4000, replace=False), 100)
    >>> stars = rng.integers(1, 6, 4000)
    >>> store = ingest_arrays(users, items, stars, "v.zarr", validation_fraction=0.2)
    >>> result = tune(store, {"alpha_W": LogUniform(0.1, 1.0)}, out="t", n_trials=2, max_iter=10)
    >>> best = OrdNMF.load(result.best_model)  # the best trial's model, refitted and saved
    >>> result.metric, best.user_factors.shape[0] == store.n_users
    ('validation ndcg@100 s>=1', True)
    """
    given = {
        "n_trials": n_trials,
        "sample_seed": sample_seed,
        "max_iter": max_iter,
        "min_budget": min_budget,
        "eta": eta,
        "validation_metric": validation_metric,
        "validation_k": validation_k,
        "validation_s": validation_s,
        "allow_test": allow_test,
        "user_fraction": user_fraction,
        "n_jobs": n_jobs,
        "overwrite": overwrite,
    }
    plan = _plan_tune(store, space, out, model, params, validate_call("tune", given))
    search = _Search(plan.info, plan.name, plan.fixed, *plan.scoring, plan.every, plan.label)
    with resolve_client(client, n_workers) as cl:
        rows = _halving(search, cl, plan.trials, plan.budgets, plan.eta, plan.n_jobs, plan.tables)
    best = next(r for r in rows if r["rung"] == len(plan.budgets) - 1 and r["kept"])
    copy_model(open_model(best["model"]), plan.best_path, plan.overwrite)
    _write_json(os.path.join(plan.out, "tune.json"), {**plan.settings, "best": best})
    _log_best(plan, best)
    return TuneResult(rows, best, plan.best_path, plan.split, plan.label, *plan.tables)


def _log_best(plan: _TunePlan, best: dict[str, Any]) -> None:
    """The search's one line of outcome: the best trial, its settings, its score and model."""
    log.info(
        "tune: best trial %d (%s): %s %.6g; model in %s",
        best["trial"],
        _describe(plan.trials[best["trial"]].params),
        plan.label,
        best["value"],
        plan.best_path,
    )


@dataclass(frozen=True)
class _TunePlan:
    """A search checked and prepared by :func:`_plan_tune`: the store, the model and its fixed
    parameters, the trials (their directories made), the rungs, how the trials are scored,
    where the results go (``tune.json`` written) and the settings it records."""

    info: StoreInfo
    name: str
    fixed: dict[str, Any]
    trials: list[Trial]
    budgets: list[int]
    eta: int
    n_jobs: int
    split: str
    scoring: tuple[str, str, int, int, float]  # split, metric, k, level, user_fraction
    label: str
    every: int
    out: str
    best_path: str
    overwrite: bool
    settings: dict[str, Any]

    @property
    def tables(self) -> tuple[str, str]:
        return os.path.join(self.out, "results.csv"), os.path.join(self.out, "results.parquet")


def _plan_tune(
    store: str | os.PathLike | StoreInfo,
    space: schedule.Space,
    out: str | os.PathLike,
    model: str,
    params: Mapping[str, Any] | None,
    v: dict[str, Any],
) -> _TunePlan:
    """Check every argument of :func:`tune` (``v``: those of its table, checked) before
    anything is written, then make ``out`` with the trials' directories and ``tune.json``."""
    info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
    name = MODELS.get(model, model)
    if name not in ALL:
        raise InputError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    fixed = _fixed_params(name, dict(params or {}), space)
    n_trials, seed, max_iter, eta = v["n_trials"], v["sample_seed"], v["max_iter"], v["eta"]
    drawn = schedule.grid(space) if n_trials is None else schedule.sample(space, n_trials, seed)
    trials_params = [validate(p) for p in drawn]
    for p in trials_params:  # every trial's K, before any fit
        check_rank({**fixed, **p}["n_components"], info)
    first = max(1, max_iter // eta**2) if v["min_budget"] is None else v["min_budget"]
    budgets = schedule.rungs(first, max_iter, eta)
    split = _split(info, v["allow_test"])
    metric, k = v["validation_metric"], v["validation_k"]
    level = _level(info, split, name, fixed, metric, v["validation_s"])
    # the fits keep their state best by this same metric (validation during the fit)
    fixed.update(validation_metric=metric, validation_k=k, validation_s=level)
    label = f"{split} " + (f"ndcg@{k} s>={level}" if metric == "ndcg" else "loglik per nonzero")
    out, best_path, overwrite = _targets(out, v["overwrite"], info)
    _prepare(out)
    every = _continuation_every(fixed["checkpoint_every"], budgets[0])
    settings = {
        "kind": TUNE_KIND,
        "store": info.path,
        "model": name,
        "fixed": fixed,
        "space": {n: v if isinstance(v, list | tuple) else vars(v) for n, v in space.items()},
        "n_trials": n_trials,
        "sample_seed": seed,
        "rungs": budgets,
        "eta": eta,
        "metric": label,
        "split": split,
        "checkpoint_every": every,
    }
    _write_json(os.path.join(out, "tune.json"), settings)
    trials = [
        Trial(j, p, os.path.join(out, "trials", f"{j:04d}")) for j, p in enumerate(trials_params)
    ]
    for t in trials:
        os.mkdir(t.directory)
    log.info(
        "tune: %d trials of %s, rungs of %s iterations (eta %d), scored by %s",
        len(trials),
        name,
        budgets,
        eta,
        label,
    )
    scoring = (split, metric, k, level, v["user_fraction"])
    return _TunePlan(
        info,
        name,
        fixed,
        trials,
        budgets,
        eta,
        v["n_jobs"],
        split,
        scoring,
        label,
        every,
        out,
        best_path,
        overwrite,
        settings,
    )


def _targets(out: str | os.PathLike, overwrite: bool, info: StoreInfo) -> tuple[str, str, bool]:
    """``out`` as a location, its best model's path and whether an earlier tune's results are
    replaced: both checked (never the training store, nor inside it) before any write."""
    out = locations.location(out)
    overwrite = _check_out(out, overwrite)
    best_path = (
        model_target(os.path.join(out, "best"), overwrite, info.path)
        if os.path.isdir(out)
        else os.path.join(model_target(out, False, info.path), "best")
    )
    return out, best_path, overwrite


def _halving(
    search: _Search,
    cl: Client,
    trials: list[Trial],
    budgets: list[int],
    eta: int,
    n_jobs: int,
    tables: tuple[str, str],
) -> list[dict[str, Any]]:
    """The rungs of successive halving on ``cl``: each rung fits the trials still alive for
    its budget, keeps the best ``n // eta`` and rewrites the results ``tables`` (CSV,
    Parquet); the rows of every rung. Every trial's checkpoints are removed at the end."""
    rows: list[dict[str, Any]] = []
    log.addFilter(search.labels)
    try:
        alive = trials
        for rung, budget in enumerate(budgets):
            last = rung == len(budgets) - 1
            log.info(
                "tune: rung %d/%d, max_iter %d: %d trial(s)",
                rung + 1,
                len(budgets),
                budget,
                len(alive),
            )
            found = search.rung(cl, alive, rung, budget, n_jobs)
            keep = _survivors(alive, found, eta, last)
            for row in found:
                row["kept"] = row["trial"] in keep
            rows += found
            _write_table(rows, *tables)
            for t in alive:
                if t.number not in keep:
                    _drop_checkpoints(t)
            alive = [t for t in alive if t.number in keep]
    finally:
        log.removeFilter(search.labels)
        for t in trials:
            with contextlib.suppress(OSError, InputError):  # kept, not lost: never masks a failure
                _drop_checkpoints(t)
    return rows


def _outcome(
    status: str,
    value: float,
    model: str | None,
    error: str | None = None,
    start: float | None = None,
    end: float | None = None,
    scored: float | None = None,
) -> dict[str, Any]:
    """The last columns of a trial's row at a rung: how it went ("carried" from an earlier
    rung, "failed" or "fit"), its score, its model, the error, and the start and end of its
    fit and the end of its scoring, in seconds since the search began (none for a carried
    trial, no scoring for a failed one)."""
    return {
        "status": status,
        "value": value,
        "seconds": 0.0 if start is None or end is None else round(end - start, 3),
        "eval_seconds": 0.0 if end is None or scored is None else round(scored - end, 3),
        "start": None if start is None else round(start, 3),
        "end": None if end is None else round(end, 3),
        "model": model,
        "error": error,
    }


def _survivors(alive: list[Trial], rows: list[dict[str, Any]], eta: int, last: bool) -> set[int]:
    """The trial numbers that go on: the best ``n // eta`` (the best one after the final rung);
    a failed trial never."""
    scores = {r["trial"]: r["value"] for r in rows if r["status"] != "failed"}
    if not scores:
        raise FloatingPointError(f"every one of the {len(alive)} trials failed numerically")
    order = [t for t in schedule.ranked(scores) if not math.isnan(scores[t])]
    if not order:
        raise FloatingPointError("no trial has a finite score")
    return set(order[: 1 if last else schedule.n_kept(len(alive), eta)])


def _fixed_params(name: str, fixed: dict[str, Any], space: schedule.Space) -> dict[str, Any]:
    """Every parameter of estimator ``name`` but the searched ones, from ``fixed`` or the
    defaults; InputError for one it does not take or one tune sets itself."""
    taken = accepted(name)
    for key, value in fixed.items():
        if key not in taken:
            raise InputError(f"{name} has no parameter {key!r}")
        if key == "max_iter":
            raise InputError("give max_iter to tune itself: it is the final rung's budget")
        if key in MANAGED and value != DEFAULTS[key]:
            raise InputError(f"{key} is set by tune for each trial (got {shown(value)})")
    both = sorted(set(space) & set(fixed))
    if both:
        raise InputError(f"{both[0]} is both searched and fixed: give it in one place")
    return validate(
        {k: fixed.get(k, DEFAULTS[k]) for k in taken if k not in space and k not in MANAGED}
    )


def _split(info: StoreInfo, allow_test: bool) -> str:
    """The subset that scores the trials: validation, or test when allowed (with a warning)."""
    if VALIDATION in info.splits:
        return VALIDATION
    if not allow_test:
        raise InputError(
            f"{info.path} has no validation subset: ingest it with --validation-fraction (or "
            "pass allow_test=True to tune on the test subset, whose figures are then no "
            "longer a fair estimate)"
        )
    log.warning(
        "TUNING ON THE TEST SUBSET of %s (it has no validation subset): the test "
        "figures of the chosen model are optimistic; ingest with --validation-fraction "
        "for a fair estimate",
        info.path,
    )
    return "test"


def _level(
    info: StoreInfo,
    split: str,
    name: str,
    fixed: dict[str, Any],
    metric: str,
    level: int | None,
) -> int:
    """The relevance threshold s of the metric (``level``, default the model's threshold),
    checked against the store's classes and the model (the table checks the other settings)."""
    s = int(fixed.get("threshold", 1)) if level is None else level
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= info.n_classes:
        raise InputError(f"validation_s must be a class in 1..{info.n_classes}, got {s!r}")
    if not sum(getattr(info.header, f"hist_{split}")[s:]):
        raise InputError(
            f"validation_s = {s}: the {split} subset of {info.path} has no nonzero of class >= {s}"
        )
    binarized = name in ("BePoF", "PF") or (name == "DcPF" and fixed.get("p") == 1.0)
    if metric == "loglik" and binarized:
        raise InputError(f"validation_metric loglik: {name} models binarized data, not the classes")
    return s


def _continuation_every(every: int, first: int) -> int:
    """Trials checkpoint by count, often enough that a survivor resumes at most a quarter of
    the first rung before where it stopped (the last iteration of a fit is never
    checkpointed); ``every`` (0: not given) makes it more often."""
    quarter = max(1, first // 4)
    return min(every, quarter) if every else quarter


def _check_out(out: str, overwrite: bool) -> bool:
    """InputError unless ``out`` is new or empty, an earlier tune's and ``overwrite``, or an
    earlier tune's that never finished (stopped by a signal: its ``tune.json`` names no best
    trial), which the same command run again starts over, as README's exit codes advise.
    Whether what an earlier tune left there may be replaced."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise InputError(f"{out}: exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        try:
            with open(os.path.join(out, "tune.json")) as fh:
                doc = json.load(fh)
            ours = doc.get("kind") == TUNE_KIND
            finished = "best" in doc
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise InputError(
                f"{out}: exists and is not a directory written by ordnmf-dask "
                "tune; choose another directory"
            )
        if not overwrite and finished:
            raise InputError(
                f"{out}: holds an earlier tune's results; pass overwrite=True to replace them"
            )
        return True
    return overwrite


def _prepare(out: str) -> None:
    """Create ``out/trials``, after removing the trials of an earlier tune there (their models
    and checkpoints). Everything is checked first: anything else found in a trial's directory
    is an InputError naming it, and then nothing has been removed."""
    trials = os.path.join(out, "trials")
    found = [
        Trial(-1, {}, os.path.join(trials, entry))
        for entry in (sorted(os.listdir(trials)) if os.path.isdir(trials) else [])
    ]
    for t in found:
        if not os.path.isdir(t.directory) or os.path.islink(t.directory):
            _refuse(t.directory)
        for entry in sorted(os.listdir(t.directory)):
            path = os.path.join(t.directory, entry)
            if os.path.islink(path):
                _refuse(path)
            elif path == t.model:
                if not is_model(path):
                    _refuse(path)
            elif path == t.checkpoints:
                for other in checkpoint.foreign(path) if os.path.isdir(path) else [path]:
                    _refuse(other)
            else:
                _refuse(path)
    for t in found:
        if is_model(t.model):
            shutil.rmtree(t.model)
        _drop_checkpoints(t)
        os.rmdir(t.directory)
    os.makedirs(trials, exist_ok=True)


def _refuse(path: str) -> NoReturn:
    """Refuse to replace an earlier tune's results: ``path`` among them is not ours."""
    raise InputError(
        f"{path}: not written by ordnmf-dask tune; an earlier tune's results are "
        "replaced only when nothing else is among them: move it and run again"
    )


def _drop_checkpoints(trial: Trial) -> None:
    """Remove the checkpoints the trial's fit wrote (finished or not: checkpoint.claim with
    restart), then the directory; anything else left in it is kept and named (OSError)."""
    if os.path.isdir(trial.checkpoints):
        checkpoint.claim(trial.checkpoints, [], restart=True)
        os.rmdir(trial.checkpoints)


class _Search:
    """Runs the trials of a rung concurrently and scores them."""

    def __init__(
        self,
        info: StoreInfo,
        name: str,
        fixed: dict[str, Any],
        split: str,
        metric: str,
        k: int,
        level: int,
        user_fraction: float,
        every: int,
        label: str,
    ) -> None:
        self.info, self.name, self.fixed, self.split = info, name, fixed, split
        self.metric, self.k, self.level, self.user_fraction = metric, k, level, user_fraction
        self.every, self.label = every, label
        self.clock = time.perf_counter()
        self.stop = threading.Event()
        self.labels = _TrialLabels()

    def rung(
        self, cl: Client, alive: list[Trial], rung: int, budget: int, n_jobs: int
    ) -> list[dict[str, Any]]:
        """A row per trial of ``alive`` fitted to ``budget`` iterations (a trial whose fit ended
        for good earlier is carried over as it was), in trial order."""
        self.stop.clear()
        pool = ThreadPoolExecutor(n_jobs, thread_name_prefix="tune")
        futures = [pool.submit(self._run, cl, t, rung, budget) for t in alive]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):  # stop the others, then report
                self.stop.set()  # the error that stopped them
                wait(futures)
                errors = [f.exception() for f in futures]
                raise next(e for e in errors if e is not None and not isinstance(e, _Stopped))
            return [f.result() for f in futures]
        except BaseException:
            self.stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, cl: Client, t: Trial, rung: int, budget: int) -> dict[str, Any]:
        self.labels.local.trial = t.number
        try:
            return self._fit(cl, t, rung, budget)
        finally:
            self.labels.local.trial = None

    def _fit(self, cl: Client, t: Trial, rung: int, budget: int) -> dict[str, Any]:
        row: dict[str, Any] = {
            "trial": t.number,
            "rung": rung,
            "max_iter": budget,
            **{n: self.fixed.get(n) for n in schedule.SEARCHED},
            **t.params,
            "metric": self.label,
        }
        if t.done:
            previous = open_model(t.model).attrs
            return {**row, **self._figures(previous), **_outcome("carried", t.value, t.model)}
        if self.stop.is_set():
            raise _Stopped()
        params = {
            **self.fixed,
            **t.params,
            "max_iter": budget,
            "n_members": 1,  # trials are single fits: they compare settings, not ensembles
            "checkpoint_dir": t.checkpoints,
            "checkpoint_every": self.every,
        }
        start = time.perf_counter() - self.clock
        try:  # a survivor resumes from its checkpoints (same fingerprint: max_iter is not in it)
            fit(
                self.info,
                self.name,
                params,
                cl,
                out=t.model,
                overwrite=True,
                callback=self._callback,
            )
        except (ELBODecreaseError, FloatingPointError) as exc:
            end = time.perf_counter() - self.clock
            log.warning("tune: %s failed: %s", _describe(t.params), exc)
            return {
                **row,
                "n_iter": None,
                "stop_reason": None,
                "best_iteration": None,
                "elbo": None,
                **_outcome("failed", math.nan, None, str(exc), start, end),
            }
        end = time.perf_counter() - self.clock
        attrs = open_model(t.model).attrs
        t.done = attrs["stop_reason"] in FINAL_STOPS
        t.value = self._score(cl, t.model)
        scored = time.perf_counter() - self.clock
        log.info(
            "tune: %s, max_iter %d: %s %.6g at iteration %d of %d (%.1f s)",
            _describe(t.params),
            budget,
            self.label,
            t.value,
            attrs["best_iteration"],
            attrs["n_iter"],
            end - start,
        )
        done = _outcome("fit", t.value, t.model, None, start, end, scored)
        return {**row, **self._figures(attrs), **done}

    @staticmethod
    def _figures(attrs: dict[str, Any]) -> dict[str, Any]:
        """Iterations run, why the fit stopped, the kept state's iteration and ELBO."""
        best = int(attrs["best_iteration"])
        return {
            "n_iter": int(attrs["n_iter"]),
            "stop_reason": attrs["stop_reason"],
            "best_iteration": best,
            "elbo": float(attrs["elbo"][best - 1]),
        }

    def _callback(self, *args: Any, **kwargs: Any) -> None:
        """Per iteration of every trial: stop when told to (no iteration log: the fits run at
        once, their lines would interleave)."""
        interrupt.check()
        if self.stop.is_set():
            raise _Stopped()

    def _score(self, cl: Client, path: str) -> float:
        """The trial's metric on the scoring subset: the figure its fit recorded for the kept
        state when it validated by this metric, else computed by the evaluation code of
        :mod:`ordnmf_dask.postfit.evaluate` (the test subset, or validation_every = 0)."""
        m = open_model(path)
        validated = m.attrs.get("validation")
        if validated is not None:
            return next(
                float(v["metric"])
                for v in validated["history"]
                if v["iteration"] == m.attrs["best_iteration"]
            )
        n_r, n_c = self.info.grid
        w = [SavedChunk(m.path, "W", r) for r in range(n_r)]
        h = [SavedChunk(m.path, "H", c) for c in range(n_c)]
        spec = loglik_spec(self.info, m.attrs) if self.metric == "loglik" else None
        res = score_split(
            cl, self.info, self.split, w, h, [self.level], self.k, spec, self.user_fraction
        )
        value = res["loglik_mean"] if self.metric == "loglik" else res["ndcg"][self.level]
        return math.nan if value is None else float(value)


def _describe(params: Mapping[str, Any]) -> str:
    return " ".join(
        f"{n}={v:.4g}" if isinstance(v, float) else f"{n}={v}" for n, v in params.items()
    )


def _write_json(path: str, value: dict[str, Any]) -> None:
    text = json.dumps(value, indent=2, default=_plain).encode()
    write_file(path, lambda fh: fh.write(text), "the tune's results")


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


COLUMNS = (
    "trial",
    "rung",
    "max_iter",
    *schedule.SEARCHED,
    "status",
    "n_iter",
    "stop_reason",
    "best_iteration",
    "metric",
    "value",
    "elbo",
    "seconds",
    "eval_seconds",
    "start",
    "end",
    "kept",
    "model",
    "error",
)


def _write_table(rows: list[dict[str, Any]], csv_path: str, parquet_path: str) -> None:
    """The rows as CSV and Parquet, each written whole then renamed into place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = [{c: r.get(c) for c in COLUMNS} for r in rows]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(table)
    data = text.getvalue().encode()
    write_file(csv_path, lambda fh: fh.write(data), "the tune's table")
    write_file(
        parquet_path,
        lambda fh: pq.write_table(pa.Table.from_pylist(table), fh),
        "the tune's table",
    )
