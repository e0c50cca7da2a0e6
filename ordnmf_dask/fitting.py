"""The functional core of a fit: :func:`plan_fit` checks and resolves everything, without a
cluster and without writing; :func:`run_fit` does the work; :func:`fit` is the two in a row.

The estimators (:mod:`ordnmf_dask.estimator`), the CLI's fit job, ``tune`` and ``reproduce`` all
fit through these functions: a model is named by its class name (``"OrdNMF"``, ``"BePoF"``,
``"PF"``, ``"DcPF"``) and its parameters are those of :mod:`ordnmf_dask.params` (missing ones
take the table's defaults), so that one fit gives one model whichever door it came through.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ordnmf_dask.engine import checkpoint, warmstart
from ordnmf_dask.engine.cavi import (
    CaviConfig,
    CaviRunner,
    CaviState,
    IterationCallback,
    IterationInfo,
    Validation,
)
from ordnmf_dask.engine.stops import stop_words
from ordnmf_dask.engine.substart import subsample_start
from ordnmf_dask.engine.svdstart import svd_start
from ordnmf_dask.errors import InputError
from ordnmf_dask.model.ensemble import stack_members
from ordnmf_dask.model.families import DcPFFamily, Family, OrdinalFamily
from ordnmf_dask.modelstore.model import (
    ModelInfo,
    model_target,
    open_model,
    save_model,
    store_fingerprint,
)
from ordnmf_dask.modelstore.modelheader import ModelHeader
from ordnmf_dask.params import (
    DEFAULTS,
    ModelSettings,
    Settings,
    ValidationSettings,
    accepted,
    settings,
    validate,
)
from ordnmf_dask.postfit.evaluate import loglik_spec, score_split
from ordnmf_dask.runtime import interrupt
from ordnmf_dask.runtime.cluster import checkpoint_schedule, choose_client
from ordnmf_dask.runtime.inprocess import InProcessClient
from ordnmf_dask.runtime.memory import block_bytes, check_fit_memory, fit_tables
from ordnmf_dask.runtime.progress import SUMMARY_EVERY, IterationProgress, summary
from ordnmf_dask.sources.infile import read_npz
from ordnmf_dask.store import locations, writelock
from ordnmf_dask.store.blocks import VALIDATION, StoreInfo, open_store
from ordnmf_dask.store.kinds import CHECKPOINT_DIRECTORY
from ordnmf_dask.store.outputs import check_apart, check_place

if TYPE_CHECKING:  # distributed is imported where it is used
    from distributed import Client

log = logging.getLogger("ordnmf_dask")

InitArg = str | os.PathLike[str] | tuple[np.ndarray, np.ndarray] | None
Scorer = Callable[["Client"], Validation]


def resolve_params(model: str, params: Mapping[str, Any]) -> tuple[CaviConfig, Settings]:
    """The engine's settings and every parameter of ``model`` (the table's default for those
    not given), checked against the table's rules, by section; InputError naming the first
    that breaks one, or a parameter ``model`` does not take."""
    names = accepted(model)
    unknown = [name for name in params if name not in names]
    if unknown:
        raise InputError(f"{model} has no parameter {unknown[0]!r}")
    given = {**params, **{name: DEFAULTS[name] for name in names if name not in params}}
    values = validate(given)
    cfg = CaviConfig(**{f.name: values[f.name] for f in fields(CaviConfig)})
    return cfg, settings(model, values)


def family(model: str, values: ModelSettings, store: StoreInfo) -> Family:
    """The model family (:mod:`ordnmf_dask.model.families`) of ``model`` with the checked
    parameters ``values`` on ``store``; InputError for a threshold the store cannot give."""
    if model == "DcPF":
        kind = "raw" if store.header.value_kind == "counts" else "class"
        assert values.p is not None and values.t is not None  # DcPF's parameters
        return DcPFFamily(kind, float(values.p), float(values.t), bool(values.update_p))
    approx = model == "PF" or bool(values.approx)
    if model == "OrdNMF":
        return OrdinalFamily(tuple(int(n) for n in store.hist_train), approx=approx)
    assert values.threshold is not None  # BePoF's and PF's parameter
    s = int(values.threshold)  # BePoF, PF: an integer >= 1 (validated); the store bounds it
    if s > store.n_classes:
        raise InputError(f"threshold must be an integer in 1..{store.n_classes}, got {s!r}")
    kept = int(store.hist_train[s:].sum())
    if kept == 0:
        raise InputError(f"no training nonzero has class >= {s}")
    fixed = None if values.learn_threshold else (0.0, 1.0)
    return OrdinalFamily((0, kept), approx=approx, binarize_at=s, fixed_delta=fixed)


def fit_settings(
    values: Settings,
    init: tuple[np.ndarray, np.ndarray] | warmstart.Source | None,
    seed: int,
) -> dict[str, Any]:
    """What the trajectory of the run from ``seed`` (or warm-started from ``init``: arrays or a
    saved model) depends on (checked when resuming from a checkpoint): the model, its model
    parameters and the warm start."""
    params = values.fingerprinted()
    warm: str | bool | dict[str, str] = False
    if isinstance(init, warmstart.Source):
        warm = init.describe()
    elif init is not None:
        digest = hashlib.sha256()
        for a in init:
            digest.update(np.ascontiguousarray(a).data)
        warm = digest.hexdigest()
    return {"model": values.estimator, **params, "seed": seed, "warm_start": warm}


@dataclass(frozen=True)
class FitPlan:
    """A fit checked and resolved by :func:`plan_fit`, for :func:`run_fit`: the store, the
    model and its parameters, the warm start, the validation, where the model goes and the
    checkpoint fingerprint of each restart."""

    model: str
    info: StoreInfo
    config: CaviConfig
    settings: Settings
    family: Family
    init: tuple[np.ndarray, np.ndarray] | None
    source: warmstart.Source | None  # an ensemble's: member 0's (sources: each member's)
    validation: Scorer | None
    out: str | None
    overwrite: bool
    resume: bool
    restart: bool
    prints: list[str]
    selection: dict[str, Any] | None = None  # how K was chosen (select_components)
    sources: tuple[warmstart.Source, ...] = ()  # an ensemble's warm start: one per member


def plan_fit(
    store: str | os.PathLike[str] | StoreInfo,
    model: str,
    params: Mapping[str, Any],
    *,
    init: InitArg = None,
    init_model: Any = None,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    restart: bool = False,
) -> FitPlan:
    """Check a fit without a cluster, writing and removing nothing: the parameters, the store,
    K (at most min(n_users, n_items)), the warm start (``init`` arrays or ``.npz``, or
    ``init_model``), the validation settings, the output path and the checkpoint directory
    as the fit would find them; InputError naming the first conflict. The arguments are
    those of :meth:`ordnmf_dask.OrdNMF.fit`."""
    cfg, values = resolve_params(model, params)
    settled, ckpt, work_dir = values.model, values.checkpoint.dir, values.engine.work_dir
    info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
    _check_ranks(info, cfg.n_components, settled.select_components, init, init_model, resume)
    fam = family(model, settled, info)
    init_arrays = _read_init(init, info, cfg.n_components)
    n_init, n_members = settled.n_init, settled.n_members
    sources = _warm_sources(init, init_model, model, fam, cfg.n_components, info, n_members)
    source = sources[0] if sources else None
    _check_starts(settled, init_arrays is not None, source is not None, resume, restart, ckpt)
    scorer = _validation(info, fam, values.validation)
    check_apart({"out": out, "checkpoint_dir": ckpt})
    if out is not None:
        out = model_target(out, overwrite, info.path)
    if ckpt:
        check_place(ckpt, "checkpoints", CHECKPOINT_DIRECTORY, {"training store": info.path})
    if work_dir:  # new temporary directories go in it: it may hold the store
        check_place(work_dir, "work_dir")  # not inside a store or model
    prints = [  # one per restart or member: its trajectory depends on its seed and start
        checkpoint.fingerprint(
            info.attrs,
            info.path,
            fit_settings(values, sources[j] if sources else init_arrays, cfg.seed + j),
        )
        for j in range(max(n_init, n_members))
    ]
    if ckpt and (locations.is_url(ckpt) or os.path.isdir(ckpt)) and not restart:
        _claim(locations.location(ckpt), prints, False, n_init, dry_run=True)
    return FitPlan(
        model,
        info,
        cfg,
        values,
        fam,
        init_arrays,
        source,
        scorer,
        None if out is None else os.fspath(out),
        overwrite,
        resume,
        restart,
        prints,
        sources=sources if n_members > 1 else (),
    )


def _check_ranks(
    info: StoreInfo,
    k: int,
    candidates: Sequence[int] | None,
    init: InitArg,
    init_model: Any,
    resume: bool,
) -> None:
    """K, or each candidate of ``select_components``, fits the store; a selection has a
    validation subset and no warm start or resume (its fits start from random draws)."""
    for rank in candidates or [k]:
        check_rank(rank, info)
    if candidates:
        check_selection(info, candidates)
        if init is not None or init_model is not None or resume:
            raise InputError(
                "select_components chooses K by fits from random draws: no init=, "
                "init_model= or resume= with it"
            )


def _warm_sources(
    init: InitArg,
    init_model: Any,
    model: str,
    fam: Family,
    k: int,
    info: StoreInfo,
    n_members: int,
) -> tuple[warmstart.Source, ...]:
    """The warm start of each member from ``init_model`` (none without it): each member
    continues the model's member of its rank."""
    if init_model is None:
        return ()
    if init is not None:
        raise InputError("init and init_model are two warm starts: give one of them")
    return tuple(
        warmstart.open_source(init_model, model, fam, k, info, n_members, j)
        for j in range(n_members)
    )


def _check_starts(
    settled: ModelSettings,
    arrays: bool,
    model: bool,
    resume: bool,
    restart: bool,
    ckpt: str | None,
) -> None:
    """InputError for starts that exclude each other: ``init`` arrays (``arrays``), a model
    to continue (``model``), checkpoints to resume from, the ``start`` setting, restarts
    (``n_init``) and members (``n_members``)."""
    n_init, n_members = settled.n_init, settled.n_members
    if resume and restart:
        raise InputError("resume and restart contradict each other: give one of them")
    if resume and not ckpt:
        raise InputError("resume=True needs checkpoint_dir (where the checkpoints are)")
    if settled.start != "random" and (arrays or model):
        raise InputError(
            f"start={settled.start!r} is a start of its own: no init= or init_model= with it"
        )
    if n_init > 1 and (arrays or model or resume):
        raise InputError(
            "n_init > 1 restarts from random draws: no init=, init_model= or resume= with it"
        )
    if n_members > 1 and arrays:
        raise InputError(
            "n_members > 1 fits its members from independent random draws: no init= arrays "
            "with it (give n_members=1, or init_model= an ensemble of as many members)"
        )
    if n_members > 1 and n_init > 1:
        raise InputError(
            "n_init keeps one of several restarts, n_members averages them: give one of them"
        )


def run_fit(
    plan: FitPlan, client: Client | None = None, callback: IterationCallback | None = None
) -> ModelInfo:
    """Fit ``plan`` on ``client`` (default: see :meth:`ordnmf_dask.OrdNMF.fit`), its
    ``n_init`` restarts one after the other, and save the kept one; the saved model. A fit
    resumes from checkpoints of the same fit in the checkpoint directory (required with
    ``resume``; ``restart`` first removes every checkpoint there). ``callback`` is called
    after each iteration's log line; its True stops the fit."""
    values, info, fam = plan.settings, plan.info, plan.family
    if isinstance(fam, DcPFFamily) and fam.values == "class":  # documented, but rare
        log.warning(
            "dcPF models raw counts, but %s holds classes (value_kind %r): it fits "
            "the classes 1..%d as counts; to fit play counts, ingest them with "
            "counts='paper' (--counts paper), which keeps the raw counts",
            info.path,
            info.header.value_kind,
            info.n_classes,
        )
    if values.model.select_components:  # the search runs fits: it lives above this module
        raise InputError(
            "select_components: K is chosen by ordnmf_dask.tuning.select.run_selected "
            "(OrdNMF.fit and the CLI's fit call it), not by run_fit"
        )
    with writelock.held(plan.out, values.checkpoint.dir):  # one writer of each, or none
        return _run_fit(plan, client, callback)


def check_selection(info: StoreInfo, candidates: Sequence[int]) -> None:
    """InputError when ``info`` has no validation subset to score the candidates of
    ``select_components`` on."""
    if VALIDATION not in info.splits:
        raise InputError(
            f"select_components {list(candidates)}: {info.path} has no validation subset to "
            "choose K on: ingest it with validation_fraction (--validation-fraction), e.g. 0.1"
        )


def _run_fit(plan: FitPlan, client: Client | None, callback: IterationCallback | None) -> ModelInfo:
    """:func:`run_fit`, its outputs locked: the members of an ensemble (:func:`_fit_members`)
    or the restarts of one fit (:func:`_fit_restarts`), then the model saved."""
    cfg, values, info = plan.config, plan.settings, plan.info
    work = values.engine.work_dir or tempfile.mkdtemp(prefix="ordnmf-work-")
    try:
        os.makedirs(work, exist_ok=True)
        ckpt_dir = values.checkpoint.dir or os.path.join(work, "checkpoints")
        ckpt_dir = locations.location(ckpt_dir)
        if not locations.is_url(ckpt_dir):  # object stores have no directories
            os.makedirs(ckpt_dir, exist_ok=True)
        ours = _claim(ckpt_dir, plan.prints, plan.restart, values.model.n_init)
        out = plan.out if plan.out is not None else _temporary_model_dir()
        tables = fit_tables(cfg.optimizer)
        executor = values.engine.executor
        width = cfg.n_components * values.model.n_members  # the members' factors at once
        with choose_client(client, info, width, executor, tables=tables) as cl:
            cache = decide_cache(values.engine.cache_blocks, cl, info)
            fits = check_fit_memory(cl, info, width, cache, tables)  # before any iteration
            if not isinstance(cl, InProcessClient):  # freed memory returned where they spill
                from ordnmf_dask.runtime.mallocplugin import set_worker_malloc

                set_worker_malloc(cl, keep=fits)
            _say_held_out(info)
            started = time.perf_counter()
            log.info(
                "fit: %s, K = %d, on %s (%d users x %d items, %d training nonzeros), "
                "at most %d iterations",
                plan.model,
                cfg.n_components,
                info.path,
                info.n_users,
                info.n_items,
                info.nnz_train,
                values.model.max_iter,
            )
            scorer = None if plan.validation is None else plan.validation(cl)
            run = _Run(plan, cl, ckpt_dir, cache, bool(ours), scorer, work, callback, out)
            fitted = _fit_members(run) if values.model.n_members > 1 else _fit_restarts(run)
            with info.reading():  # its id maps and training items are copied from the store
                save_model(
                    cl,
                    fitted.w,
                    fitted.h,
                    out,
                    fitted.header.to_attrs(),
                    overwrite=plan.overwrite,
                    before_publish=info.check_unchanged,
                )
            log.info(
                "fit: %s, in %.1f s; model in %s",
                fitted.said,
                time.perf_counter() - started,
                out,
            )
    finally:
        if values.engine.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return open_model(out)


@dataclass(frozen=True)
class _Run:
    """Where and how the fits of a plan run: the client, the checkpoint directory (and whether
    its checkpoints are this fit's to resume from), the cached blocks, the validation scorer,
    the scratch directory, the user's callback and the model's path."""

    plan: FitPlan
    cl: Client
    ckpt_dir: str
    cache: bool
    ours: bool
    scorer: Validation | None
    work: str
    callback: IterationCallback | None
    out: str


@dataclass(frozen=True)
class _Fitted:
    """What a fit saves: the factor chunks, the model's header, and the log's words on it."""

    w: list[Any]
    h: list[Any]
    header: ModelHeader
    said: str


def _fit_members(run: _Run) -> _Fitted:
    """The ``n_members`` fits of an ensemble, side by side, stacked into one model."""
    plan, cl = run.plan, run.cl
    scorer = run.scorer
    states = _run_members(
        plan, cl, run.ckpt_dir, run.cache, run.ours, scorer, run.work, run.callback
    )
    members = [_run_record(r, plan.config.seed + j) for j, r in enumerate(states)]
    for r in members:
        r["kept"] = True
    header = _header(plan, states, scorer is not None, run.cache, members, run.out)
    w = _stacked(cl, [r.w for r in states], float(len(states)))
    h = _stacked(cl, [r.h for r in states], 1.0)
    iterations = "/".join(str(r.n_iter) for r in states)
    return _Fitted(w, h, header, f"{len(states)} members after {iterations} iterations")


def _fit_restarts(run: _Run) -> _Fitted:
    """The ``n_init`` restarts of one fit, one after the other; the best one kept
    (:func:`_better`)."""
    plan, cfg, info = run.plan, run.plan.config, run.plan.info
    n_init = plan.settings.model.n_init
    scorer = run.scorer
    runs: list[dict[str, Any]] = []
    state: CaviState | None = None
    kept = 0
    for j in range(n_init):
        run_cfg = replace(cfg, seed=cfg.seed + j)
        runner = CaviRunner(
            run.cl,
            info,
            plan.family,
            run_cfg,
            run.ckpt_dir,
            run.cache,
            *checkpoint_schedule(run.cl, plan.settings.values()),
            plan.prints[j],
        )
        with info.reading():  # the store opened, whole, or an error saying it changed
            one = _run_one(plan, runner, run_cfg, run.work, run.ours, scorer, run.callback)
        runs.append(_run_record(one, run_cfg.seed))
        if n_init > 1:  # its checkpoints would collide with the next run's
            checkpoint.discard(run.ckpt_dir, plan.prints[j])
            log.info(
                "restart %d/%d (seed %d): ELBO %.10e after %d iterations%s",
                j + 1,
                n_init,
                run_cfg.seed,
                runs[-1]["elbo"],
                one.n_iter,
                _validation_text(runs[-1]),
            )
        if state is None or _better(runs[-1], runs[kept]):
            state, kept = one, j
    assert state is not None
    for j, r in enumerate(runs):
        r["kept"] = j == kept
    header = _header(plan, [state], scorer is not None, run.cache, runs, run.out)
    stop = stop_words(state.stop_reason, state.converged)
    said = f"{stop} after {state.n_iter} iterations, ELBO {state.elbo[-1]:.10e}"
    return _Fitted(state.w, state.h, header, said)


_HELD_OUT_SAID: set[str] = set()  # stores whose test split a fit of this process named


def _say_held_out(info: StoreInfo) -> None:
    """Say, once per store and process, that its test split is held out of every fit."""
    if not info.nnz_test or info.path in _HELD_OUT_SAID:
        return
    _HELD_OUT_SAID.add(info.path)
    total = info.nnz_train + info.nnz_test + info.nnz_validation
    log.info(
        "fit: %s holds out %.1f%% of its nonzeros as a test split (%d of %d), which no fit "
        "sees; to train on all of them, ingest with test_fraction=0 (--test-fraction 0)",
        info.path,
        100 * info.nnz_test / total,
        info.nnz_test,
        total,
    )


def fit(
    store: str | os.PathLike[str] | StoreInfo,
    model: str,
    params: Mapping[str, Any],
    client: Client | None = None,
    *,
    callback: IterationCallback | None = None,
    **options: Any,
) -> ModelInfo:
    """Check (:func:`plan_fit`, which takes the ``options``), then fit (:func:`run_fit`)."""
    return run_fit(plan_fit(store, model, params, **options), client, callback)


def _run_one(
    plan: FitPlan,
    runner: CaviRunner,
    cfg: CaviConfig,
    work: str,
    resume: bool,
    scorer: Validation | None,
    callback: IterationCallback | None,
    label: str = "",
    stopped: threading.Event | None = None,
    member: int = 0,
) -> CaviState:
    """One restart (or ensemble member ``member``, ``label`` in front of its log lines; it
    stops when ``stopped`` is set): its initial state (random draws, the SVD start, the
    subsample start, arrays, or a saved model), then the loop."""
    params0 = None
    source, arrays = (plan.sources[member] if plan.sources else plan.source), plan.init
    if source is not None:
        params0 = warmstart.start_params(plan.family, source)
        alpha = {"W": cfg.alpha_W, "H": cfg.alpha_H}

        def start() -> Any:
            return warmstart.initial_chunks(runner, source, params0, alpha)
    elif arrays is None:
        starts: dict[str, Callable[[], Any]] = {
            "random": runner.random_init,
            "svd": partial(svd_start, runner),
            "subsample": partial(subsample_start, runner),
        }
        start = starts[plan.settings.model.start]
    else:

        def start() -> Any:  # writes the arrays only when called
            return runner.warm_init(*_write_init(arrays, work))

    model = plan.settings.model
    fit_log = _FitLog(plan.family, callback, model.max_iter, model.tol, label, stopped)
    try:
        return runner.run(
            start,
            fit_log,
            resume=resume,
            required=plan.resume,
            init_params=params0,
            validation=scorer,
        )
    finally:
        fit_log.close()


def _run_members(
    plan: FitPlan,
    cl: Client,
    ckpt_dir: str,
    cache: bool,
    resume: bool,
    scorer: Validation | None,
    work: str,
    callback: IterationCallback | None,
) -> list[CaviState]:
    """The ``n_members`` fits of an ensemble, side by side: each on a thread of this process
    driving its own CAVI loop on ``cl`` (the members never wait for each other; the cluster's
    workers, or this process's pool, run their tasks as they come). Each member checkpoints
    and resumes under its own fingerprint and name. When one fails or the fit is interrupted,
    the others stop at their next iteration."""
    cfg, values = plan.config, plan.settings
    n = values.model.n_members
    stopped = threading.Event()

    def member(j: int) -> CaviState:
        run_cfg = replace(cfg, seed=cfg.seed + j)
        runner = CaviRunner(
            cl,
            plan.info,
            plan.family,
            run_cfg,
            ckpt_dir,
            cache,
            *checkpoint_schedule(cl, values.values()),
            plan.prints[j],
            checkpoint_tag=checkpoint.member_tag(j),
        )
        label = f"member {j + 1}/{n} (seed {run_cfg.seed}): "
        with plan.info.reading():
            state = _run_one(
                plan, runner, run_cfg, work, resume, scorer, callback, label, stopped, j
            )
        log.info(
            "%sELBO %.10e after %d iterations (%s)",
            label,
            state.elbo[state.best_iteration - 1],
            state.n_iter,
            stop_words(state.stop_reason, state.converged),
        )
        return state

    log.info("fit: %d members side by side (seeds %d..%d)", n, cfg.seed, cfg.seed + n - 1)
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="ordnmf-member")
    try:
        futures = [pool.submit(member, j) for j in range(n)]
        wait(futures, return_when=FIRST_EXCEPTION)  # the first failure stops the others
        failed = [e for f in futures if f.done() and (e := f.exception()) is not None]
        if failed:
            raise next((e for e in failed if not isinstance(e, _Stopped)), failed[0])
        return [f.result() for f in futures]
    except BaseException:
        stopped.set()  # the others stop at their next iteration
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stacked(cl: Client, members: list[list[Any]], divisor: float) -> list[Any]:
    """Futures of the ensemble's factor chunks: block by block, its members' chunks side by
    side (:func:`ordnmf_dask.model.ensemble.stack_members`), on the workers that hold them."""
    return [
        cl.submit(_stack, divisor, *chunks, pure=False) for chunks in zip(*members, strict=True)
    ]


def _stack(divisor: float, *chunks: Any) -> Any:
    return stack_members(chunks, divisor)


def _header(
    plan: FitPlan,
    states: list[CaviState],
    validated: bool,
    cache: bool,
    runs: list[dict[str, Any]],
    out: str,
) -> ModelHeader:
    """The header of the model saved at ``out``: of its one kept fit, or of the ensemble of
    ``states`` (:meth:`ModelHeader.from_fit`)."""
    source = plan.source
    return ModelHeader.from_fit(
        model=plan.model,
        family=plan.family,
        params=plan.settings.values(),
        info=plan.info,
        fingerprint=store_fingerprint(plan.info.path),
        states=states,
        validation=asdict(plan.settings.validation) if validated else None,
        runs=runs,
        warm_start=plan.init is not None or source is not None,
        init_model=None if source is None else _described(source),
        cache_blocks=cache,
        selection=plan.selection,
        where=out,
    )


def _described(source: warmstart.Source) -> dict[str, Any]:
    """What a model records of the model it was warm-started from (an ensemble's members
    each from their own member of it)."""
    return {k: v for k, v in source.describe().items() if k != "member"}


class _Stopped(Exception):
    """A member stopped because another failed or the fit was interrupted."""


class _FitLog:
    """The default iteration log (with progress and the validation scores), then the user's
    ``callback``, whose True stops the fit; :meth:`close` removes a progress bar."""

    def __init__(
        self,
        family: Family,
        callback: IterationCallback | None,
        max_iter: int,
        tol: float,
        label: str = "",
        stopped: threading.Event | None = None,
    ):
        self.family, self.callback, self.tol = family, callback, tol
        self.label, self.stopped = label, stopped
        self.progress = IterationProgress(max_iter)

    def __call__(self, info: IterationInfo) -> bool:
        interrupt.check()
        if self.stopped is not None and self.stopped.is_set():
            raise _Stopped()
        progress = self.progress
        progress.clear()
        # a summary, or a terminal whose progress line shows every iteration: every N-th logged
        periodic = summary() or progress.bar
        shown = not periodic or info.iteration == 1 or info.iteration % SUMMARY_EVERY == 0
        log.log(
            logging.INFO if shown else logging.DEBUG,
            "%siter %4d/%d  elbo %.10e  rel %.3e  %.2fs  %s  (elapsed %s, %s)",
            self.label,
            info.iteration,
            info.max_iter,
            info.elbo,
            info.rel_change,
            info.seconds,
            self.family.summary(info.params),
            progress.clock(info.elapsed),
            progress.eta(info.iteration, info.elapsed),
        )
        if info.validation is not None:
            v = info.validation
            ndcg = "  ".join(f"ndcg@{v['k']}(s={s}) {x:.4f}" for s, x in v["ndcg"].items())
            loglik = "" if v["loglik_mean"] is None else f"  loglik/nz {v['loglik_mean']:.5f}"
            log.info(
                "%svalidation at iter %d: %s%s  (best: iter %d; %.2fs)",
                self.label,
                info.iteration,
                ndcg,
                loglik,
                info.best_iteration,
                v["seconds"],
            )
        progress.draw(info.iteration, info.elapsed, info.elbo, info.rel_change, self.tol)
        return bool(self.callback(info)) if self.callback is not None else False

    def close(self) -> None:
        self.progress.close()


def _validation(
    info: StoreInfo, family: Family, rules: ValidationSettings
) -> Callable[[Client], Validation] | None:
    """How a fit on a client scores its states on the store's validation subset (None when the
    store has none or ``validation_every`` is 0); InputError for a metric the data cannot
    give, before any cluster starts."""
    if not rules.every or "validation" not in info.splits:
        return None
    k, s, metric = rules.k, rules.s, rules.metric
    hist = np.asarray(info.header.hist_validation)
    if not 1 <= s <= info.n_classes or hist[s:].sum() == 0:
        raise InputError(
            f"validation_s = {s}: the validation subset of {info.path} has no "
            f"nonzero of class >= {s} (classes 1..{info.n_classes})"
        )

    def describe(params: Any) -> dict[str, Any]:
        return {"family": family.name, **family.describe(params)}

    if metric == "loglik" and loglik_spec(info, describe(family.init_params())) is None:
        raise InputError(
            "validation_metric = 'loglik': this model does not give the "
            "likelihood of the store's classes (binarized); use 'ndcg'"
        )
    levels = sorted({1, s})

    def scorer(cl: Client) -> Validation:
        def score(w: list[Any], h: list[Any], params: Any) -> dict[str, Any]:
            out = score_split(
                cl, info, "validation", w, h, levels, k, loglik_spec(info, describe(params))
            )
            ndcg = {str(t): out["ndcg"][t] for t in levels}
            return {
                "k": k,
                "ndcg": ndcg,
                "loglik_mean": out["loglik_mean"],
                "metric": ndcg[str(s)] if metric == "ndcg" else out["loglik_mean"],
            }

        return Validation(score, rules.every, rules.patience, rules.window)

    return scorer


def _run_record(run: CaviState, seed: int) -> dict[str, Any]:
    """What ``attrs["runs"]`` keeps of one restart: the kept state's ELBO and, with validation,
    its score."""
    best = next((v for v in run.validation if v["iteration"] == run.best_iteration), None)
    return {
        "seed": seed,
        "elbo": run.elbo[run.best_iteration - 1],
        "n_iter": run.n_iter,
        "passes": run.passes,
        "best_iteration": run.best_iteration,
        "converged": run.converged,
        "stop_reason": run.stop_reason,
        "validation": None if best is None else best["metric"],
    }


def _better(run: dict[str, Any], than: dict[str, Any]) -> bool:
    """Restarts are chosen by the validation metric when there is one, else by the ELBO."""
    if run["validation"] is not None and than["validation"] is not None:
        return bool(run["validation"] > than["validation"])
    return bool(run["elbo"] > than["elbo"])


def _validation_text(run: dict[str, Any]) -> str:
    return (
        ""
        if run["validation"] is None
        else (f", validation {run['validation']:.5f} at iteration {run['best_iteration']}")
    )


def check_rank(k: int, info: StoreInfo) -> None:
    """InputError for more latent factors than the smaller side of the rating matrix: the rank
    of U x I data is at most min(U, I), and every factor costs memory and time."""
    most = min(info.n_users, info.n_items)
    if k > most:
        raise InputError(
            f"K (n_components) = {k} is larger than min(users, items) = {most} of "
            f"{info.path} ({info.n_users} users x {info.n_items} items): give "
            f"K <= {most}"
        )


def _read_init(init: InitArg, info: StoreInfo, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    if init is None:
        return None
    source = "initialization arrays"
    if isinstance(init, str | os.PathLike):
        source = os.fspath(init)
        path = Path(init)
        arrays = read_npz(source, {"W": (info.n_users, k), "H": (info.n_items, k)})
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
        zarr.create_array(
            path, data=arr, chunks=(min(len(arr), 1 << 16), arr.shape[1]), overwrite=True
        )
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
