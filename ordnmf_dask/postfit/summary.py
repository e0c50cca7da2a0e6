"""What a fitted model says about itself: its active components and its learned thresholds as
class probabilities (``info MODEL``; docs/design.md, "Class probabilities"). Reads one factor
chunk at a time, in this process."""

from __future__ import annotations

from typing import Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.model import classlaw, components
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.postfit.classes import law_of

REACH = (0.01, 0.1, 0.5, 0.9, 0.99)  # the P(y > 0) of the typical rates the thresholds are shown at


def count_shares(model: ModelInfo) -> np.ndarray:
    """(K,) :func:`~ordnmf_dask.model.components.max_count_share` of the users, over every
    user-block of W."""
    alpha = float(model.attrs["params"]["alpha_W"])
    return np.max(
        [
            components.max_count_share(chunkstore.read_field(model.path, "W", r, "shape"), alpha)
            for r in range(model.n_blocks[0])
        ],
        axis=0,
    )


def active_components(model: ModelInfo) -> np.ndarray:
    """(K,) bool: whether each component is active (some user puts at least
    :data:`~ordnmf_dask.model.components.ACTIVE_SHARE` of its expected counts on it)."""
    return count_shares(model) >= components.ACTIVE_SHARE


def threshold_table(model: ModelInfo) -> list[dict[str, Any]] | None:
    """The learned thresholds as class laws: for each rate lambda at which the model gives a
    pair a chance ``reach`` (:data:`REACH`) of an interaction, ``lambda = -log(1 - reach) /
    theta_0``, P(y = v | y > 0) for v = 1..V and the expected class. None for a model without
    an ordinal law of its classes."""
    try:
        law = law_of(model)
    except InputError:
        return None
    if law.theta is None:  # not an ordinal law
        return None
    lam = -np.log1p(-np.asarray(REACH)) / law.theta[0]
    probs = classlaw.class_law(classlaw.plugin_hazards(lam, law.theta), law.limit, True)
    expected = classlaw.class_rating(probs, "expected")
    return [
        {
            "reach": r,
            "rate": float(x),
            "probs": p[1:].tolist(),
            "expected_class": float(e),
        }
        for r, x, p, e in zip(REACH, lam, probs, expected, strict=True)
    ]


def summary(model: ModelInfo) -> dict[str, Any]:
    """``info MODEL``'s summary: the fit, its active components and its thresholds."""
    a = model.attrs
    active = active_components(model)
    return {
        "path": model.path,
        "model": a.get("model"),
        "n_components": int(a["params"]["n_components"]),
        "n_active_components": int(active.sum()),
        "active_components": np.flatnonzero(active).tolist(),
        "n_users": int(a["store"]["n_users"]),
        "n_items": int(a["store"]["n_items"]),
        "n_classes": int(a["store"]["n_classes"]),
        "store": a["store"].get("path"),
        "n_iter": int(a["n_iter"]),
        "converged": bool(a["converged"]),
        "elbo": float(a["elbo"][-1]),
        "theta": a.get("theta"),
        "p": a.get("p"),
        "thresholds_as_classes": threshold_table(model),
    }
