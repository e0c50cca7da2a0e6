"""Evaluation on the held-out nonzeros, per user-block on the workers (docs/design.md §3).

NDCG@k, precision@k, recall@k, MAP@k and AUC for each relevance threshold s (relevance
``y_test >= s``, the user's pairs in the other subsets excluded) and the test log-likelihood of
the nonzeros. Each task scores one user-block against one item-block, a slab of rows at a time;
only per-block sums travel to the client. :func:`score_split` does the work for a saved model
(:func:`evaluate`) and for the factor chunks of a running fit (validation, on its ``validation``
subset).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.model import compiling, dcpf, metrics
from ordnmf_dask.model.kernels import CsrBlock, sddmm
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo, open_model, store_fingerprint
from ordnmf_dask.params import rows_doc, validate_call
from ordnmf_dask.postfit.calibrate import calibrate
from ordnmf_dask.runtime.cluster import choose_client
from ordnmf_dask.runtime.progress import shows_progress, track
from ordnmf_dask.runtime.reduce import tree_reduce, tree_sum
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_block
from ordnmf_dask.store.csr import load_block

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client

log = logging.getLogger("ordnmf_dask")


def sampled_users(r: int, n_rows: int, fraction: float, seed: int) -> np.ndarray:
    """Local rows of user-block r whose ranking is evaluated: all of them, or each independently
    with probability ``fraction`` from the stream ``SeedSequence([seed, r])`` (the same sample
    whatever the cluster)."""
    if fraction >= 1.0:
        return np.arange(n_rows)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, r])))
    return np.flatnonzero(rng.random(n_rows) < fraction)


@dataclass(frozen=True)
class SavedChunk:
    """A factor chunk of a saved model, read where it is used; ``mean`` as a fit's chunk has."""

    model: str
    name: str
    index: int

    @property
    def mean(self) -> np.ndarray:
        return chunkstore.read_field(self.model, self.name, self.index, "mean")


def _held_out_block(
    w: Any, h: Any, store: str, split: str, r: int, c: int, col_offset: int, keep: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The held-out nonzeros of block (r, c) of ``split`` (local row, global item, class) and
    their scores; ``w``, ``h``: chunks with a ``mean`` (a fit's, or :class:`SavedChunk`)."""
    b = load_block(store, split, r, c).take_rows(keep)
    local = b.rows
    x = sddmm(local, b.cols, w.mean[keep], h.mean)
    return local, b.cols.astype(np.int64) + col_offset, b.y, x


def _held_out_task(*parts: tuple[np.ndarray, ...]) -> metrics.HeldOut:
    return metrics.HeldOut.by_row(*(np.concatenate(a) for a in zip(*parts, strict=True)))


def _known_block(store: str, known: tuple[str, ...], r: int, c: int, keep: np.ndarray) -> CsrBlock:
    """The nonzeros of block (r, c), rows ``keep``, in the subsets ``known`` (disjoint): the
    pairs a held-out ranking excludes."""
    parts = [load_block(store, split, r, c).take_rows(keep) for split in known]
    if len(parts) == 1:
        return parts[0]
    rows = np.concatenate([b.rows for b in parts])
    cols = np.concatenate([b.cols for b in parts])
    order = np.lexsort((cols, rows))
    return CsrBlock.from_coo(
        rows[order], cols[order], np.concatenate([b.y for b in parts])[order], parts[0].shape
    )


def _candidates_task(
    w: Any,
    h: Any,
    store: str,
    known: tuple[str, ...],
    r: int,
    c: int,
    col_offset: int,
    k: int,
    keep: np.ndarray,
    held: metrics.HeldOut,
) -> metrics.Candidates:
    """Top-k and rank counts of block (r, c), the ``known`` subsets' items excluded."""
    excluded = _known_block(store, known, r, c, keep)
    return metrics.candidates_block(w.mean[keep], h.mean, excluded, col_offset, k, held)


_RANKING = ("ndcg", "n_users", "precision", "recall", "map", "auc", "n_users_auc")  # sums' rows


def _ranking_task(
    cands: metrics.Candidates, held: metrics.HeldOut, levels: list[int], k: int
) -> np.ndarray:
    """One user-block's sums, a row per entry of :data:`_RANKING`, flattened."""
    top = cands.top[1]
    ndcg, counts = metrics.ndcg_sums(top, held.rows, held.items, held.y, levels, k)
    topk = metrics.topk_sums(top, held.rows, held.items, held.y, levels, k)
    auc, auc_counts = metrics.auc_sums(held, cands.below, cands.equal, cands.free, levels)
    return np.concatenate([ndcg, counts, topk.ravel(), auc, auc_counts])


def _loglik_task(w: Any, h: Any, store: str, split: str, r: int, c: int, spec: tuple) -> np.ndarray:
    b = read_block(store, split, r, c)
    rows, y = b.rows, b.classes
    ew, eh = w.mean, h.mean
    if spec[0] == "ordinal":
        value = metrics.test_loglik(rows, b.cols, y, ew, eh, spec[1])
    elif spec[0] == "members":
        value = metrics.ensemble_loglik(rows, b.cols, y, ew, eh, spec[2], spec[1])
    else:
        _, p, t, edges = spec
        lam = sddmm(rows, b.cols, ew, eh)
        value = float(dcpf.count_loglik(y, lam, p, t, edges).sum())
    return np.array([value, len(y)])


def _by_level(levels: list[int], values: np.ndarray, kind: type) -> dict[int, Any]:
    return {int(s): kind(v) for s, v in zip(levels, values, strict=True)}


def loglik_spec(store: StoreInfo, attrs: dict[str, Any]) -> tuple | None:
    """How to score the test classes under a model with attributes ``attrs`` (a saved model's,
    or a running fit's family and global parameters), or None when it does not model them.

    OrdNMF: the ordinal likelihood with its thresholds (an ensemble: the mixture of its
    members' laws). dcPF: the probability of the test class (the count range of the class,
    exactly) on count stores, of the count itself otherwise (an ensemble of dcPF fits: None).
    Binarized models (BePoF, PF, dcPF at p = 1) model {0, 1}, not the classes: None.
    """
    a = attrs
    if int(a.get("n_members", 1)) > 1:
        deltas = [np.asarray(m.get("delta", ()), dtype=np.float64) for m in a["members"]]
        if a.get("family") == "ordinal" and all(len(d) == store.n_classes + 1 for d in deltas):
            return ("members", int(a["params"]["n_components"]), deltas)
        return None
    if a.get("family") == "dcpf":
        if float(a["p"]) == 1.0:  # PF on binary data: it does not model the classes
            return None
        edges = store.count_edges
        return ("dcpf", float(a["p"]), float(a["t"]), edges)
    if a.get("family") == "ordinal" and len(a["delta"]) == store.n_classes + 1:
        return ("ordinal", np.asarray(a["delta"], dtype=np.float64))
    return None


def check_compatible(store: StoreInfo, model: ModelInfo, allow_other_store: bool = False) -> None:
    """InputError unless ``model`` was fitted on a store with the same shape and block grid,
    and (unless ``allow_other_store``) on this very store: the store fingerprint the model
    records must be ``store``'s. A store of the same ratings split with another seed has
    another fingerprint (its train and test chunks differ): scoring a model on it would score
    the model on its own training pairs."""
    s, h = model.header.store, model.header
    same = (
        s.n_users == store.n_users
        and s.n_items == store.n_items
        and s.n_classes == store.n_classes
        and list(h.row_bounds) == store.row_bounds.tolist()
        and list(h.col_bounds) == store.col_bounds.tolist()
    )
    if not same:
        raise InputError(
            f"model {model.path} was fitted on {s.path} "
            f"({s.n_users} users x {s.n_items} items, V={s.n_classes}), "
            f"which does not match store {store.path}"
        )
    if not allow_other_store and s.fingerprint != store_fingerprint(store.path):
        raise InputError(
            f"model {model.path} was fitted on store {s.path}, whose content or split differs "
            f"from store {store.path} (their fingerprints differ); pass allow_other_store=True "
            "to use it anyway"
        )


def check_has_test(store: StoreInfo) -> None:
    """InputError unless ``store`` holds test nonzeros: without them every metric would be an
    empty mean (NaN)."""
    if store.nnz_test == 0:
        raise InputError(
            f"{store.path}: the store has no test split (0 test nonzeros), so there is nothing to "
            "evaluate; make one with `ordnmf-dask ingest` and --test-fraction F (F > 0) or "
            "--test FILE"
        )


@shows_progress
@rows_doc("evaluate")
def evaluate(
    store: str | os.PathLike | StoreInfo,
    model: Any,
    client: Client | None = None,
    *,
    k: int = 100,
    levels: list[int] | None = None,
    n_workers: int | None = None,
    user_fraction: float = 1.0,
    seed: int = 0,
    allow_other_store: bool = False,
    posterior: str = "mean",
) -> dict[str, Any]:
    """NDCG@k, precision@k, recall@k, MAP@k and AUC per threshold, the test
    log-likelihood, and the calibration and rating error of a fitted model (definitions:
    docs/design.md §3 and "Class probabilities").

    Parameters
    ----------
    store : the store the model was fitted on (its ``test`` split is evaluated).
    model : a model directory path or a fitted estimator (uses its ``model_path_``).
    <the rows of params.COMMAND_PARAMS["evaluate"]>
    allow_other_store : score the model on ``store`` even if it was fitted on another store
        (another split of the same ratings, say); by default that is an InputError
        (:func:`check_compatible`).

    Returns
    -------
    dict with ``ndcg``, ``precision``, ``recall``, ``map`` ({s: mean over the (sampled) users
    with a relevant item}), ``n_users`` ({s: their number}), ``auc`` ({s: mean over the (sampled)
    users with a relevant item and a non-relevant candidate}), ``n_users_auc`` ({s: their
    number}), ``test_loglik`` (sum over test nonzeros), ``test_loglik_mean`` (per
    nonzero), ``k``, ``nnz_test``, ``user_fraction`` and ``calibration`` (on every test
    nonzero, :func:`~ordnmf_dask.postfit.calibrate.calibrate`: log-loss, Brier score, ECE and
    reliability per level, RMSE and MAE of the expected rating; None for a model without a law
    of the store's classes).

    Notes
    -----
    Ranking all items costs U x I x K: an hour for 1M users x 200k items on two cores, a minute
    for 2% of the users (:func:`sampled_users`); the log-likelihood covers every test nonzero.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import OrdNMF
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> from ordnmf_dask import evaluate
    >>> scores = evaluate(store, model)  # the store's test split, NDCG@100 and more per level
    >>> scores["k"], len(scores["ndcg"]) == store.n_classes
    (100, True)
    """
    given = {"k": k, "levels": levels, "user_fraction": user_fraction, "seed": seed}
    v = validate_call("evaluate", {**given, "posterior": posterior})  # its table's rows
    k, user_fraction, seed = v["k"], v["user_fraction"], v["seed"]
    info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
    check_has_test(info)
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    check_compatible(info, m, allow_other_store)
    levels = _levels(info, v["levels"])
    start = time.monotonic()
    with (
        compiling.announced_as("evaluate"),
        choose_client(client, info, m.header.width, n_workers=n_workers) as cl,  # K per member
        m.reading(),
        info.reading(),  # one version of the store too, or an error saying it changed
    ):
        out = _score_test(cl, info, m, levels, k, user_fraction, seed)
        calibration = calibrate(cl, info, m, "test", levels, posterior)
    n_r, n_c = info.grid
    took, where = time.monotonic() - start, f"the test split of {info.path} ({n_r} x {n_c} blocks)"
    log.info("evaluate: %s on %s: done in %.1f s", m.path, where, took)
    return _results(k, out, user_fraction, calibration)


def _score_test(
    cl: Client,
    info: StoreInfo,
    m: ModelInfo,
    levels: list[int],
    k: int,
    user_fraction: float,
    seed: int,
) -> dict[str, Any]:
    """The ranking metrics and the log-likelihood of the saved model ``m`` on the test split
    of ``info`` (:func:`score_split` over the model's factor chunks)."""
    w = [SavedChunk(m.path, "W", r) for r in range(info.grid[0])]
    h = [SavedChunk(m.path, "H", c) for c in range(info.grid[1])]
    return score_split(
        cl,
        info,
        "test",
        w,
        h,
        levels,
        k,
        loglik_spec(info, m.attrs),
        user_fraction,
        seed,
        progress="evaluate: user-blocks and blocks",
    )


def _levels(info: StoreInfo, given: Sequence[int] | None) -> list[int]:
    """The relevance thresholds ``given`` (default 1..V), each a class of the store ``info``;
    InputError naming those outside."""
    levels = list(range(1, info.n_classes + 1)) if given is None else list(given)
    outside = [s for s in levels if not 1 <= s <= info.n_classes]
    if outside or not levels:
        raise InputError(
            f"levels must be thresholds in 1..{info.n_classes} (the classes of "
            f"{info.path}), got {outside or 'none'}"
        )
    return levels


def _results(
    k: int, out: dict[str, Any], user_fraction: float, calibration: dict[str, Any] | None
) -> dict[str, Any]:
    """What :func:`evaluate` returns, from the scores ``out`` of the test split."""
    return {
        "k": k,
        "ndcg": out["ndcg"],
        "n_users": out["n_users"],
        "test_loglik": out["loglik"],
        "test_loglik_mean": out["loglik_mean"],
        "nnz_test": out["nnz"],
        "user_fraction": float(user_fraction),
        **{name: out[name] for name in ("precision", "recall", "map", "auc", "n_users_auc")},
        "calibration": calibration,
    }


def score_split(
    cl: Client,
    info: StoreInfo,
    split: str,
    w: list[Any],
    h: list[Any],
    levels: list[int],
    k: int,
    spec: tuple | None,
    user_fraction: float = 1.0,
    seed: int = 0,
    progress: str | None = None,
) -> dict[str, Any]:
    """The ranking metrics and log-likelihood of the held-out ``split`` ("test" or
    "validation") of ``info`` under factor chunks ``w``, ``h`` (futures or values of chunks
    with a ``mean``: a running fit's, or :class:`SavedChunk`), on the workers of ``cl``.

    A user's ranked candidates are the items of ``split`` and the items the user has no pair
    with in any subset: the user's pairs in the other subsets (training, and the other held-out
    one) are known interactions and excluded, for the validation ranking as for the test one
    (docs/design.md §3), so that neither score depends on the other subset's scores. ``spec``:
    :func:`loglik_spec` (None: no log-likelihood). ``progress``: label of a progress report
    while waiting.

    Returns ``ndcg``, ``precision``, ``recall``, ``map``, ``auc`` ({s: mean}), ``n_users``,
    ``n_users_auc`` ({s: count}), ``loglik`` (sum, None without ``spec``), ``loglik_mean`` and
    ``nnz``.
    """
    n_r, n_c = info.grid
    cb, rb = [int(x) for x in info.col_bounds], [int(x) for x in info.row_bounds]
    known = tuple(name for name in info.splits if name != split)
    per_row = []
    for r in range(n_r):
        keep = sampled_users(r, rb[r + 1] - rb[r], user_fraction, seed)
        parts = [
            cl.submit(_held_out_block, w[r], h[c], info.path, split, r, c, cb[c], keep)
            for c in range(n_c)
        ]
        held = cl.submit(_held_out_task, *parts)
        cands = [
            cl.submit(_candidates_task, w[r], h[c], info.path, known, r, c, cb[c], k, keep, held)
            for c in range(n_c)
        ]
        merged = tree_reduce(cl, cands, metrics.merge_candidates, k)
        per_row.append(cl.submit(_ranking_task, merged, held, levels, k))
    ll = (
        [
            cl.submit(_loglik_task, w[r], h[c], info.path, split, r, c, spec)
            for r in range(n_r)
            for c in range(n_c)
        ]
        if spec is not None
        else []
    )
    if progress is not None:
        track(per_row + ll, progress)
    ranking = cl.gather(tree_sum(cl, per_row)).reshape(len(_RANKING), len(levels))
    nnz = info.nnz_test if split == "test" else info.nnz_validation
    ll_v = cl.gather(tree_sum(cl, ll)) if ll else np.array([np.nan, nnz])
    sums = dict(zip(_RANKING, ranking, strict=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = {
            name: sums[name] / sums["n_users_auc" if name == "auc" else "n_users"]
            for name in ("ndcg", "precision", "recall", "map", "auc")
        }
    return {
        **{name: _by_level(levels, means[name], float) for name in means},
        "n_users": _by_level(levels, sums["n_users"], int),
        "n_users_auc": _by_level(levels, sums["n_users_auc"], int),
        "loglik": None if spec is None else float(ll_v[0]),
        "loglik_mean": None if spec is None or not ll_v[1] else float(ll_v[0] / ll_v[1]),
        "nnz": int(ll_v[1]),
    }
