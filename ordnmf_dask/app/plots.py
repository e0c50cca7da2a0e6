"""Figures a person looks at: ELBO per iteration, PPC histogram, learned thresholds, reliability
diagrams of the class probabilities.

Needs matplotlib (``pip install ordnmf-dask[plots]``); every function writes one PNG.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("plots need matplotlib: pip install 'ordnmf-dask[plots]'") from exc
    return plt


def _save(plt: Any, fig: Any, path: str | os.PathLike) -> str:
    """Write ``fig`` as a PNG at exactly ``path`` (no suffix added), through the output rule
    (:func:`~ordnmf_dask.store.outputs.write_file`: checked, whole or absent); its real path."""
    from ordnmf_dask.store.outputs import write_file

    try:
        return write_file(
            os.fspath(path), lambda fh: fig.savefig(fh, format="png", dpi=120), "the figure"
        )
    finally:
        plt.close(fig)


def plot_elbo(traces: Mapping[str, Sequence[float]], path: str | os.PathLike) -> str:
    """ELBO per iteration, one line per model (``{label: elbo trace}``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, elbo in traces.items():
        ax.plot(np.arange(1, len(elbo) + 1), elbo, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("ELBO")
    ax.set_title("ELBO per iteration")
    ax.legend()
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_ppc(
    train: Sequence[float],
    simulated: Mapping[str, Sequence[float]],
    path: str | os.PathLike,
    title: str = "Posterior predictive check",
) -> str:
    """Class histogram of the training data vs data simulated from each model (log scale),
    classes 1..V (class 0, the zeros, dwarfs the others and is left out), as the paper's figure."""
    plt = _pyplot()
    classes = np.arange(1, len(train))
    width = 0.8 / (1 + len(simulated))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(classes - 0.4 + width / 2, np.asarray(train)[1:], width, label="train data")
    for j, (label, hist) in enumerate(simulated.items(), start=1):
        ax.bar(classes - 0.4 + width * (j + 0.5), np.asarray(hist)[1:], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(classes)
    ax.set_xlabel("class")
    ax.set_ylabel("count")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_thresholds(theta: Sequence[float], path: str | os.PathLike, title: str = "") -> str:
    """Learned thresholds b_v = 1 / theta_v, v = 0..V-1, on a log scale."""
    plt = _pyplot()
    upper = np.asarray(theta, dtype=np.float64)[:-1]
    b = 1.0 / upper[upper > 0]  # an empty class (Delta = 0) can leave theta_{V-1} = 0
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(len(b)), b, "o-")
    ax.set_yscale("log")
    ax.set_xlabel("v")
    ax.set_ylabel("b_v = 1 / theta_v")
    ax.set_title(title or "Learned thresholds")
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_reliability(
    reliability: Mapping[int, Sequence[Sequence[float]]], path: str | os.PathLike, title: str = ""
) -> str:
    """A reliability diagram per level s: for each bin of the predicted P(y >= s | y > 0), the
    observed frequency of y >= s against the mean prediction (marker area: the bin's pairs),
    beside the diagonal of perfect calibration (``evaluate``'s ``calibration["reliability"]``:
    {s: [[pairs, mean prediction, observed frequency], ...]})."""
    plt = _pyplot()
    levels = list(reliability)
    cols = min(5, len(levels))
    rows = -(-len(levels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.ravel()[len(levels) :]:
        ax.set_visible(False)
    for ax, s in zip(axes.ravel(), levels, strict=False):
        bins = np.asarray(reliability[s], dtype=np.float64).reshape(-1, 3)
        ax.plot([0, 1], [0, 1], color="0.6", lw=0.8)
        if len(bins):
            area = 200 * bins[:, 0] / bins[:, 0].max()
            ax.plot(bins[:, 1], bins[:, 2], "-", lw=0.8)
            ax.scatter(bins[:, 1], bins[:, 2], s=area, alpha=0.6)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"y >= {s}", fontsize=9)
        ax.set_xlabel("predicted", fontsize=8)
        ax.set_ylabel("observed", fontsize=8)
    fig.suptitle(title or "Reliability of P(y >= s | y > 0)")
    fig.tight_layout()
    return _save(plt, fig, path)
