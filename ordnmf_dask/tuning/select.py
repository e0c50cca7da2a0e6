"""K chosen by validation: tune's successive-halving search over the candidate values of
``n_components`` on the store's validation subset (never the ELBO), then the plain fit at the
chosen K (:func:`ordnmf_dask.fitting.run_fit`). It runs fits, so it sits above the fit's
core: the estimator and the CLI's fit call :func:`run_selected`."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ordnmf_dask.engine.cavi import IterationCallback
from ordnmf_dask.fitting import FitPlan, check_selection, plan_fit, run_fit
from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.runtime.cluster import choose_client
from ordnmf_dask.store import writelock
from ordnmf_dask.store.blocks import StoreInfo

log = logging.getLogger("ordnmf_dask")

#: what the search leaves to the fit it chooses for (not parameters of its trials)
_NOT_FIXED = ("n_components", "select_components", "max_iter", "n_init", "n_members")


def select_rank(
    info: StoreInfo,
    model: str,
    values: Mapping[str, Any],
    client: Any = None,
) -> dict[str, Any]:
    """The K among ``values["select_components"]`` that tune's successive halving (eta 3,
    rungs up to ``max_iter``) ranks best by the fit's validation metric, with every
    candidate's scores: ``{"chosen": K, "metric": ..., "candidates": [{"n_components",
    "scores"}, ...]}``, ``scores`` one per rung the candidate reached (None: its fit failed
    numerically); the chosen K is the best at the final rung. The
    search's models and checkpoints live in a temporary directory inside ``work_dir``,
    removed after it."""
    # here, not at the top: the estimators import this module, and a fit without a
    # selection loads no search (nor Dask's cluster machinery, tests/test_inprocess.py)
    from ordnmf_dask.tuning.search import MANAGED, tune

    candidates = list(values["select_components"])
    check_selection(info, candidates)
    fixed = {
        k: v
        for k, v in values.items()
        if k not in _NOT_FIXED and (k not in MANAGED or k in ("work_dir", "executor"))
    }
    fixed.pop("executor")
    work = fixed.pop("work_dir")
    n_jobs = max(1, min(len(candidates), os.cpu_count() or 1))
    parent = tempfile.mkdtemp(prefix="ordnmf-select-", dir=work)
    try:
        with choose_client(
            client, info, max(candidates) * n_jobs, values["executor"], jobs=n_jobs
        ) as cl:
            res = tune(
                info,
                {"n_components": candidates},
                cl,
                out=os.path.join(parent, "search"),
                model=model,
                params=fixed,
                max_iter=values["max_iter"],
                validation_metric=values["validation_metric"],
                validation_k=values["validation_k"],
                validation_s=values["validation_s"],
                n_jobs=n_jobs,
            )
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    scores: dict[int, list[float | None]] = {k: [] for k in candidates}
    for row in res.rows:  # in rung order
        failed = row["status"] == "failed"
        scores[row["n_components"]].append(None if failed else float(row["value"]))
    return {
        "chosen": int(res.best["n_components"]),
        "metric": res.metric,
        "rungs": [
            int(r["max_iter"]) for r in res.rows if r["n_components"] == res.best["n_components"]
        ],
        "candidates": [{"n_components": k, "scores": scores[k]} for k in candidates],
    }


def run_selected(
    plan: FitPlan, client: Any = None, callback: IterationCallback | None = None
) -> ModelInfo:
    """:func:`run_fit` of ``plan``; with ``select_components``, the plain fit at the K the
    validation search chose, which records the search (attribute ``selection``). The outputs
    are held through the search too (one writer of each)."""
    values = plan.settings.values()
    if not plan.settings.model.select_components:
        return run_fit(plan, client, callback)
    with writelock.held(plan.out, plan.settings.checkpoint.dir):
        selection = select_rank(plan.info, plan.model, values, client)
        log.info(
            "select_components: K = %d chosen by %s (%s)",
            selection["chosen"],
            selection["metric"],
            ", ".join(f"K={c['n_components']}: {c['scores'][0]}" for c in selection["candidates"]),
        )
        chosen = {**values, "n_components": selection["chosen"], "select_components": None}
        at_k = plan_fit(
            plan.info,
            plan.model,
            chosen,
            out=plan.out,
            overwrite=plan.overwrite,
            restart=plan.restart,
        )
        return run_fit(replace(at_k, selection=selection), client, callback)
