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
    theta_0``, P(y = v | y > 0) for v = 1..V and the expected class (an ensemble's: the mean
    of its members' laws, each at that reach; ``rate`` their mean). None for a model without
    an ordinal law of its classes."""
    try:
        law = law_of(model)
    except InputError:
        return None
    if law.family != "ordinal":
        return None
    laws = law.members or (law,)  # an ensemble: each member at that reach, mixed
    thetas = [m.theta for m in laws if m.theta is not None]  # an ordinal law's
    lams = [-np.log1p(-np.asarray(REACH)) / theta[0] for theta in thetas]
    probs = np.mean(
        [
            classlaw.class_law(classlaw.plugin_hazards(lam, theta), m.limit, True)
            for lam, theta, m in zip(lams, thetas, laws, strict=True)
        ],
        axis=0,
    )
    lam = np.mean(lams, axis=0)
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
        "elbo": float(a["elbo"][-1]) if a["elbo"] else None,  # an ensemble's: per member
        "theta": a.get("theta"),
        "p": a.get("p"),
        "n_members": int(a.get("n_members", 1)),
        "members": a.get("members"),
        "thresholds_as_classes": threshold_table(model),
    }
