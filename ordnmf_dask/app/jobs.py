"""Run a fit described by a resolved job config on a client; the CLI and the launchers use it."""

from __future__ import annotations

import functools
import logging
from typing import Any

from ordnmf_dask.app.config import JobConfig, estimator_kwargs
from ordnmf_dask.app.provenance import record_config
from ordnmf_dask.engine import checkpoint
from ordnmf_dask.errors import InputError
from ordnmf_dask.estimator import ESTIMATORS, CaviEstimator
from ordnmf_dask.params import MODELS
from ordnmf_dask.store import files as locations

log = logging.getLogger("ordnmf_dask")


def check_required(cfg: JobConfig, where: str = "") -> None:
    """InputError unless the store and the output are set (``where``: how to set them)."""
    for value, what in [(cfg.store.path, "STORE"), (cfg.output.model, "--out MODEL")]:
        if value is None:
            raise InputError(f"missing {what}{where}")


def fit_job(
    cfg: JobConfig, client: Any, resume: bool = False, restart: bool = False,
    check: bool = False,
) -> CaviEstimator:
    """Fit ``cfg`` on ``client`` (None: a default LocalCluster), save the model with the
    resolved config as its ``resolved_config`` attribute, and return the estimator.
    A fit resumes from checkpoints of the same job in ``[checkpoint] dir`` by default;
    ``resume`` requires it, ``restart`` discards the checkpoints there first (see
    :meth:`OrdNMF.fit <ordnmf_dask.OrdNMF.fit>`). Without a checkpoint or work directory, a
    local model's checkpoints go to ``MODEL.checkpoints`` beside it (:func:`checkpoint.beside`),
    so that the same command run again continues; it is removed once the model is saved.
    ``check``: only check every conflict (store, warm-start model, output, checkpoints) without
    a cluster, and return the unfitted estimator."""
    check_required(cfg)
    name = MODELS[cfg.model.kind]
    kwargs, unused = estimator_kwargs(cfg, name)
    if unused:
        log.warning("not used by %s (kept in the resolved config): %s", name, ", ".join(unused))
    out = locations.location(cfg.output.model)
    beside = None
    if kwargs["checkpoint_dir"] is None and kwargs["work_dir"] is None \
            and not locations.is_url(out):
        beside = kwargs["checkpoint_dir"] = checkpoint.beside(out)
        checkpoint.check_beside(beside, out)
    estimator = ESTIMATORS[name](**kwargs)
    fit = functools.partial(
        estimator.fit, cfg.store.path, client, init=cfg.model.init,
        init_model=cfg.model.init_model, out=out, overwrite=cfg.output.overwrite,
        resume=resume, restart=restart,
    )
    if check:
        return fit(check=True)
    if beside is None:
        model = fit()
    else:
        checkpoint.make_beside(beside, out)
        try:
            model = fit()
        except BaseException:
            if not checkpoint.list_checkpoints(beside):  # refused, or stopped before any
                checkpoint.release(beside)
            raise
        checkpoint.release(beside)
    record_config(model.model_path_, cfg.to_dict())
    return model
