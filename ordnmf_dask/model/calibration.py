"""Calibration and rating error of a class law on held-out classes, as sums that add over blocks
(docs/design.md, "Class probabilities"): pure functions on arrays.

The sums of one block are a flat float64 array: log-loss, Brier score, count, squared and
absolute error of the expected rating, then for each level s and each of :data:`BINS` equal-width
bins of the predicted P(y >= s | y > 0): the pairs in the bin, their summed prediction and their
summed outcome 1[y >= s].
"""

from __future__ import annotations

import numpy as np

BINS = 10
_HEAD = 5  # log-loss, Brier, n, squared error, absolute error


def sums(
    law: np.ndarray, log_prob: np.ndarray, y: np.ndarray, values: np.ndarray, levels: list[int]
) -> np.ndarray:
    """The sums of held-out pairs: ``law`` (n, V + 1) P(y = v | y > 0), ``log_prob`` (n,) the
    log-probability of the observed classes ``y`` (n,) in 1..V, ``values`` (V + 1,) the
    rating of each class (on the store's scale, or the class itself)."""
    y = np.asarray(y, dtype=np.int64)
    n = len(y)
    onehot = np.zeros_like(law)
    onehot[np.arange(n), y] = 1.0
    brier = ((law - onehot) ** 2).sum()
    err = law @ values - values[y]
    head = [-log_prob.sum(), brier, float(n), (err * err).sum(), np.abs(err).sum()]
    tail = np.cumsum(law[:, ::-1], axis=1)[:, ::-1]  # tail[:, s] = P(y >= s | y > 0)
    out = [np.asarray(head, dtype=np.float64)]
    for s in levels:
        q = np.clip(tail[:, s], 0.0, 1.0)
        b = np.minimum((q * BINS).astype(np.int64), BINS - 1)
        hit = (y >= s).astype(np.float64)
        out.append(
            np.stack(
                [
                    np.bincount(b, minlength=BINS).astype(np.float64),
                    np.bincount(b, weights=q, minlength=BINS),
                    np.bincount(b, weights=hit, minlength=BINS),
                ]
            ).ravel()
        )
    return np.concatenate(out)


def size(levels: list[int]) -> int:
    """Length of the sums for ``levels``."""
    return _HEAD + 3 * BINS * len(levels)


def summary(total: np.ndarray, levels: list[int]) -> dict[str, object]:
    """The metrics from summed sums: ``log_loss`` and ``brier`` (means per pair; Brier summed
    over the classes 1..V), ``rmse`` and ``mae`` of the expected rating, ``ece`` ({s: expected
    calibration error of P(y >= s | y > 0), the bins' |mean prediction - mean outcome|
    weighted by their share of the pairs}), ``reliability`` ({s: per bin [pairs, mean
    prediction, mean outcome]}, bins with no pair left out) and ``n``."""
    log_loss, brier, n, sq, ab = total[:_HEAD]
    ece, reliability = {}, {}
    for j, s in enumerate(levels):
        start = _HEAD + 3 * BINS * j
        count, pred, hit = total[start : start + 3 * BINS].reshape(3, BINS)
        used = count > 0
        ece[int(s)] = float(np.abs(pred[used] - hit[used]).sum() / n) if n else float("nan")
        reliability[int(s)] = [
            [int(c), float(p / c), float(h / c)]
            for c, p, h in zip(count[used], pred[used], hit[used], strict=True)
        ]
    mean = (lambda x: float(x / n)) if n else (lambda x: float("nan"))
    return {
        "log_loss": mean(log_loss),
        "brier": mean(brier),
        "rmse": float(np.sqrt(sq / n)) if n else float("nan"),
        "mae": mean(ab),
        "ece": ece,
        "reliability": reliability,
        "n": int(n),
    }
