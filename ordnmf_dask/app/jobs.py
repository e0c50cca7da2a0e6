"""Run a fit described by a resolved job config on a client; the CLI and the launchers use it.

:func:`plan_job` checks the job without a cluster (:func:`ordnmf_dask.fitting.plan_fit`) and
:func:`run_job` fits it, as :func:`ordnmf_dask.postfit.export.plan_export` and
``write_export`` do for an export: a launcher plans before it starts its cluster.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ordnmf_dask.app.config import JobConfig, estimator_kwargs
from ordnmf_dask.app.provenance import record_config
from ordnmf_dask.engine import checkpoint
from ordnmf_dask.errors import ConfigError, InputError
from ordnmf_dask.fitting import FitPlan, plan_fit
from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.params import MODELS
from ordnmf_dask.store import locations
from ordnmf_dask.tuning.select import run_selected

log = logging.getLogger("ordnmf_dask")


def check_required(cfg: JobConfig, where: str = "") -> None:
    """InputError unless the store and the output are set (``where``: how to set them)."""
    for value, what in [(cfg.store.path, "STORE"), (cfg.output.model, "--out MODEL")]:
        if value is None:
            raise InputError(f"missing {what}{where}")


@dataclass(frozen=True)
class JobPlan:
    """A job checked by :func:`plan_job`: its fit, the checkpoint directory made beside the
    model (or None) and the resolved config the model records."""

    fit: FitPlan
    beside: str | None
    config: dict[str, Any]


def plan_job(cfg: JobConfig, resume: bool = False, restart: bool = False) -> JobPlan:
    """Check every conflict of ``cfg`` (store, warm-start model, output, checkpoints) without a
    cluster, writing nothing. A fit resumes from checkpoints of the same job in
    ``[checkpoint] dir`` by default; ``resume`` requires it, ``restart`` discards the
    checkpoints there first (see :meth:`OrdNMF.fit <ordnmf_dask.OrdNMF.fit>`). Without a
    checkpoint or work directory, a local model's checkpoints go to ``MODEL.checkpoints``
    beside it (:func:`checkpoint.beside`), so that the same command run again continues."""
    check_required(cfg)
    if cfg.model.init is not None and cfg.model.init_model is not None:
        where = f"{cfg.source}: " if cfg.source else ""
        raise ConfigError(
            f"{where}[model] init and init_model (--init, --init-model) are two warm starts: "
            "give one of them"
        )
    name = MODELS[cfg.model.kind]
    params, unused = estimator_kwargs(cfg, name)
    if unused:
        log.warning("not used by %s (kept in the resolved config): %s", name, ", ".join(unused))
    store, model_out = cfg.store.path, cfg.output.model
    assert store is not None and model_out is not None  # check_required
    out = locations.location(model_out)  # the path typed goes to plan_fit: a link
    beside = None  # to a model is never replaced through it (blocks.check_target)
    if (
        params["checkpoint_dir"] is None
        and params["work_dir"] is None
        and not locations.is_url(out)
    ):
        beside = params["checkpoint_dir"] = checkpoint.beside(out)
        checkpoint.check_beside(beside, out)
    plan = plan_fit(
        store,
        name,
        params,
        init=cfg.model.init,
        init_model=cfg.model.init_model,
        out=cfg.output.model,
        overwrite=cfg.output.overwrite,
        resume=resume,
        restart=restart,
    )
    return JobPlan(plan, beside, cfg.to_dict())


def run_job(plan: JobPlan, client: Any) -> ModelInfo:
    """Fit ``plan`` on ``client`` (None: a default LocalCluster) and save the model with the
    resolved config as its ``resolved_config`` attribute; the checkpoint directory made beside
    the model is removed once the model is saved."""
    beside = plan.beside
    if beside is None:
        model = run_selected(plan.fit, client)
    else:
        assert plan.fit.out is not None  # a checkpoint directory beside the model
        checkpoint.make_beside(beside, plan.fit.out)
        try:
            model = run_selected(plan.fit, client)
        except BaseException:
            if not checkpoint.list_checkpoints(beside):  # refused, or stopped before any
                checkpoint.release(beside)
            raise
        checkpoint.release(beside)
    record_config(model.path, plan.config)
    return model
