"""Calibration and rating error of a saved model on held-out pairs, per block on the workers
(docs/design.md, "Class probabilities"): each task reads one block of the split and the
model's factor rows it needs, scores its pairs a slab at a time, and returns the block's sums
(:mod:`ordnmf_dask.model.calibration`); only those sums reach the client, by a fixed-order tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.model import calibration, classlaw
from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.postfit.classes import ClassLaw, factor_moments, law_of
from ordnmf_dask.runtime.reduce import tree_sum
from ordnmf_dask.store.blocks import StoreInfo, read_block

if TYPE_CHECKING:
    from distributed import Client

SLAB = 1 << 16  # pairs scored at a time: a task holds a few (SLAB, K) arrays


def rating_values(law: ClassLaw) -> np.ndarray:
    """The rating of each class 0..V that the rating errors are measured in: the store's
    scale for ratings, the class for count classes (which have no expected count)."""
    if law.value_kind.startswith("ratings-"):
        return classlaw.class_values(law.value_kind, law.n_classes)
    return np.arange(law.n_classes + 1, dtype=np.float64)


def block_sums(
    model: str,
    store: str,
    split: str,
    r: int,
    c: int,
    law: ClassLaw,
    levels: list[int],
    gamma: bool,
) -> np.ndarray:
    """The calibration sums of block (r, c) of ``split``; on a worker."""
    b = read_block(store, split, r, c, values=("y",))
    w = factor_moments(model, "W", r, gamma)
    h = factor_moments(model, "H", c, gamma)
    rows = np.repeat(np.arange(b.shape[0]), np.diff(b.indptr))
    values = rating_values(law)
    total = np.zeros(calibration.size(levels))
    for start in range(0, b.nnz, SLAB):
        part = slice(start, start + SLAB)
        y = b.classes[part].astype(np.int64)
        pairs = (rows[part], b.cols[part], w[0], w[1], h[0], h[1])
        probs = law.pair_probs(*pairs, True)
        total += calibration.sums(probs, law.pair_log_prob(*pairs, y), y, values, levels)
    return total


def calibration_law(model: ModelInfo) -> ClassLaw | None:
    """The model's law of the store's classes, or None when it has none (binarized models,
    dcPF on classes or at p = 1): those are not calibrated on the classes."""
    try:
        law = law_of(model)
    except InputError:
        return None
    return None if law.binarized else law


def calibrate(
    cl: Client, info: StoreInfo, model: ModelInfo, split: str, levels: list[int], posterior: str
) -> dict[str, Any] | None:
    """:func:`~ordnmf_dask.model.calibration.summary` of ``split`` of ``info`` under ``model``
    (``posterior`` as :meth:`~ordnmf_dask.estimator.CaviEstimator.predict_proba`), or None
    for a model without a law of the store's classes."""
    if posterior not in classlaw.POSTERIORS:
        raise InputError(
            f"posterior must be one of {', '.join(classlaw.POSTERIORS)}, got {posterior!r}"
        )
    law = calibration_law(model)
    if law is None:
        return None
    gamma = posterior == "gamma" and law.family == "ordinal"
    n_r, n_c = info.grid
    parts = [
        cl.submit(block_sums, model.path, info.path, split, r, c, law, levels, gamma, pure=False)
        for r in range(n_r)
        for c in range(n_c)
    ]
    total = cl.gather(tree_sum(cl, parts))
    return {**calibration.summary(total, levels), "posterior": posterior if gamma else "mean"}
