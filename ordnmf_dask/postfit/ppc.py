"""Posterior predictive check of the class histogram, on the workers, one block at a time.

Data are simulated from p(Y* | W, H) q(W) q(H): per block, W and H rows are drawn from their
Gamma posteriors and classes are sampled at pairs (u, i) of the block: all of them for small
blocks, else a uniform sample scaled to the block's area, so U x I is never materialized. An
ensemble's law is the mixture of its members': each pair is drawn from a member chosen
uniformly, with that member's factors and thresholds.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.model import simulate
from ordnmf_dask.model.ensemble import member_columns
from ordnmf_dask.model.kernels import sddmm
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo, open_model
from ordnmf_dask.postfit.evaluate import check_compatible
from ordnmf_dask.postfit.executor import client_for
from ordnmf_dask.runtime.reduce import tree_sum
from ordnmf_dask.store.blocks import StoreInfo, open_store

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client


def _draw(model: str, name: str, index: int, rng: np.random.Generator) -> np.ndarray:
    chunk = chunkstore.load_chunk(model, name, index)
    assert chunk.shape is not None and chunk.rate is not None  # a fitted model's chunk
    return rng.gamma(chunk.shape, 1.0 / chunk.rate)


def _ppc_task(
    model: str,
    r: int,
    c: int,
    shape: tuple[int, int],
    budget: int,
    seed: int,
    spec: tuple,
    n_bins: int,
) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, r, c]))
    w, h = _draw(model, "W", r, rng), _draw(model, "H", c, rng)
    rows, cols, weight = simulate.sample_pairs(shape[0], shape[1], budget, rng)
    if spec[0] != "members":
        y = _sample(spec, sddmm(rows, cols, w, h), rng)
        return weight * np.bincount(np.minimum(y, n_bins - 1), minlength=n_bins)
    _, k, specs = spec  # an ensemble: each pair drawn from a member chosen uniformly
    n = len(specs)
    member = rng.integers(0, n, len(rows))
    hist = np.zeros(n_bins)
    for m, one in enumerate(specs):
        sel = member == m
        part = member_columns(k, m)  # the member's columns; its W held divided by M
        wm, hm = np.ascontiguousarray(w[:, part] * n), np.ascontiguousarray(h[:, part])
        y = _sample(one, sddmm(rows[sel], cols[sel], wm, hm), rng)
        hist += np.bincount(np.minimum(y, n_bins - 1), minlength=n_bins)
    return weight * hist


def _sample(spec: tuple, lam: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Classes drawn at the rates ``lam`` from one fit's law (``spec``)."""
    if spec[0] == "ordinal":
        return simulate.sample_ordinal(lam, spec[1], rng)
    return simulate.sample_dcpf(lam, spec[1], spec[2], rng, spec[3])


def _spec(store: StoreInfo, model: ModelInfo) -> tuple[tuple, np.ndarray]:
    """The sampler of ``model`` and the training histogram it is compared with (with zeros)."""
    a, header = model.attrs, model.header
    total = store.n_users * store.n_items
    specs: list[tuple] = []
    if a["family"] == "dcpf":
        edges = store.count_edges
        truth = store.hist_train.astype(np.float64)
        specs = [("dcpf", float(law.p or 0.0), float(law.t or 1.0), edges) for law in header.laws]
    else:
        specs = [("ordinal", law.theta) for law in header.laws]
        theta = specs[0][1]
        if len(theta) == store.n_classes + 1:
            truth = store.hist_train.astype(np.float64)
        else:  # a binarized model (BePoF, PF): compare with the binarized training data
            threshold = int(a["params"]["threshold"])
            truth = np.array([0.0, float(store.hist_train[threshold:].sum())])
    truth[0] = total - truth[1:].sum()
    if header.n_members == 1:
        return specs[0], truth
    return ("members", header.n_components, specs), truth


def posterior_predictive(
    store: str | os.PathLike | StoreInfo,
    model: Any,
    client: Client | None = None,
    *,
    n_pairs: int = 4_000_000,
    seed: int = 0,
    n_workers: int | None = None,
    allow_other_store: bool = False,
) -> dict[str, Any]:
    """Simulated vs training class histogram over all U x I pairs (class 0 = no interaction).

    Parameters
    ----------
    n_pairs : about how many (u, i) pairs are simulated in all (spread over blocks by area);
        blocks with fewer pairs than their share are simulated exactly.
    allow_other_store : use ``store`` even if the model was fitted on another store (by
        default an InputError: :func:`~ordnmf_dask.postfit.evaluate.check_compatible`).

    Returns
    -------
    dict with ``classes`` (0..V), ``train`` (training counts, zeros included) and ``model``
    (expected counts of the simulated data, same scale), as lists of floats.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import OrdNMF
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> from ordnmf_dask import posterior_predictive
    >>> check = posterior_predictive(store, model, n_pairs=10000)  # classes drawn from the model
    >>> sorted(check)
    ['classes', 'model', 'train']
    """
    info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    check_compatible(info, m, allow_other_store)
    spec, truth = _spec(info, m)
    n_r, n_c = info.grid
    total = info.n_users * info.n_items
    with client_for(client, m, n_workers, info) as cl:
        parts = []
        for r in range(n_r):
            for c in range(n_c):
                shape = info.block_shape(r, c)
                budget = max(1, math.ceil(n_pairs * shape[0] * shape[1] / total))
                parts.append(
                    cl.submit(_ppc_task, m.path, r, c, shape, budget, seed, spec, len(truth))
                )
        hist = cl.gather(tree_sum(cl, parts))
    return {
        "classes": list(range(len(truth))),
        "train": truth.tolist(),
        "model": np.asarray(hist, dtype=np.float64).tolist(),
    }
