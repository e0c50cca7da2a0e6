"""The paper's comparison, rerun on the shared datasets (or your own) with one command.

Protocol (Gouvert et al. 2020, section 5): filter items then users with >= 20 interactions,
80/20 random split of the nonzeros (one split), alpha = 0.3, tol = 1e-5, plain CAVI, K from a
grid, random restarts over several seeds. Models: OrdNMF on the ordinal classes (Q), BePoF and
PF on data binarized at >= 1 and at a high threshold (B), dcPF on raw counts (R, count data
only). For each model the K with the best mean NDCG@100 at the dataset's selection threshold
is reported, as mean +/- standard deviation over seeds, with the test log-likelihood, PPC and
figures.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.fitting import fit
from ordnmf_dask.params import COMMAND_PARAMS
from ordnmf_dask.postfit.evaluate import evaluate
from ordnmf_dask.postfit.ppc import posterior_predictive
from ordnmf_dask.runtime.cluster import choose_client
from ordnmf_dask.sources.ingest import ingest
from ordnmf_dask.store.blocks import StoreInfo

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger("ordnmf_dask")

#: Last.fm counts are per artist (summed over songs): the paper's per-song scale puts most of the
#: mass in its top classes, so we quantize at the rounded deciles of the play counts instead.
LASTFM_THRESHOLDS = (0, 40, 80, 130, 190, 260, 360, 500, 750, 1400)


@dataclass(frozen=True)
class Dataset:
    """How to ingest one dataset and which models / thresholds to compare on it."""

    name: str
    path: str
    ingest_options: dict[str, Any]
    high_threshold: int  # the "high" binarization threshold (class units)
    select_level: int  # NDCG threshold s used to choose K
    levels: tuple[int, ...]  # NDCG thresholds shown in the table
    counts: bool  # raw values are counts: dcPF applies
    notes: str = ""


def shared_datasets(data_dir: str | os.PathLike) -> dict[str, Dataset]:
    """The three datasets of ``../shared/data`` with the paper's preprocessing."""
    d = Path(data_dir)
    return {
        "movielens": Dataset(
            "movielens",
            str(d / "ml-latest-small" / "ratings.csv"),
            {"ratings": "halfstar"},
            high_threshold=8,
            select_level=8,
            levels=(1, 4, 6, 8, 10),
            counts=False,
            notes="ratings x2 -> classes 1..10",
        ),
        "tasteprofile": Dataset(
            "tasteprofile",
            str(
                d / "tasteprofile-gouvert-subset" / "derived" / "tps_98765_U1502_I786_triplets.txt"
            ),
            {"counts": "paper"},
            high_threshold=3,
            select_level=1,
            levels=(1, 2, 3, 4, 5, 6),
            counts=True,
            notes="play counts quantized at (0,1,2,5,10,20,50,100,200,500)",
        ),
        "lastfm": Dataset(
            "lastfm",
            str(d / "hetrec2011-lastfm-2k" / "user_artists.dat"),
            {"counts": list(LASTFM_THRESHOLDS)},
            high_threshold=6,
            select_level=1,
            levels=(1, 3, 5, 7, 9, 10),
            counts=True,
            notes=f"artist play counts quantized at rounded deciles {LASTFM_THRESHOLDS}",
        ),
    }


_ROWS = COMMAND_PARAMS["reproduce"]  # the defaults of the command's settings


@dataclass
class Protocol:
    """Settings of the comparison (those the command sets: the rows of its table)."""

    k_grid: tuple[int, ...] = _ROWS["k_grid"].default
    seeds: tuple[int, ...] = _ROWS["seeds"].default
    min_count: int = 20
    split_seed: int = 0
    alpha: float = 0.3
    tol: float = 1e-5
    max_iter: int = _ROWS["max_iter"].default
    optimizer: str = "cavi"  # the paper's algorithm, step for step
    ppc_pairs: int = 4_000_000
    n_jobs: int = _ROWS["n_jobs"].default
    extra: dict[str, Any] = field(default_factory=dict)


def model_specs(ds: Dataset) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, data kind, model, extra parameters) of each compared model."""
    s = ds.high_threshold
    specs: list[tuple[str, str, str, dict[str, Any]]] = [
        ("OrdNMF", "Q", "OrdNMF", {}),
        ("BePoF >=1", "B", "BePoF", {"threshold": 1}),
        (f"BePoF >={s}", "B", "BePoF", {"threshold": s}),
        ("PF >=1", "B", "PF", {"threshold": 1}),
        (f"PF >={s}", "B", "PF", {"threshold": s}),
    ]
    if ds.counts:
        specs.append(("dcPF", "R", "DcPF", {"p": 0.5, "t": 1.0}))
    return specs


def _one_run(
    client: Client,
    store: StoreInfo,
    label: str,
    kind: str,
    model: str,
    extra: dict[str, Any],
    k: int,
    seed: int,
    proto: Protocol,
    out: Path,
) -> dict[str, Any]:
    start = time.perf_counter()
    params = {
        "n_components": k,
        "n_members": 1,  # the paper's tables are of single fits
        "alpha_W": proto.alpha,
        "alpha_H": proto.alpha,
        "tol": proto.tol,
        "max_iter": proto.max_iter,
        "optimizer": proto.optimizer,
        "seed": seed,
        **extra,
    }
    model_dir = out / "models" / f"{label.replace(' ', '').replace('>=', 'ge')}-K{k}-s{seed}"
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    a = fit(store, model, params, client, out=model_dir, overwrite=True).attrs
    res = evaluate(store, model_dir, client)
    row = {
        "model": label,
        "data": kind,
        "K": k,
        "seed": seed,
        "n_iter": a["n_iter"],
        "converged": a["converged"],
        "elbo": a["elbo"][-1],
        "seconds": round(time.perf_counter() - start, 2),
        "test_loglik_mean": res["test_loglik_mean"],
        "model_dir": str(model_dir),
        **{f"ndcg@{res['k']} s={s}": v for s, v in res["ndcg"].items()},
    }
    log.info(
        "%-10s K=%-3d seed=%d: %d iterations, NDCG@100 s=1 %.4f (%.1fs)",
        label,
        k,
        seed,
        a["n_iter"],
        res["ndcg"][1],
        row["seconds"],
    )
    return row


def _summary_table(ds: Dataset, rows: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Markdown table: per model, the K with the best mean NDCG at ds.select_level."""
    sel = f"ndcg@100 s={ds.select_level}"
    lines = [
        "| model | data | K | " + " | ".join(f"s={s}" for s in ds.levels) + " | test loglik |",
        "|---" * (4 + len(ds.levels)) + "|",
    ]
    chosen = []
    for label in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == label]
        ks = sorted({r["K"] for r in mine})
        best_k = max(ks, key=lambda k: np.mean([r[sel] for r in mine if r["K"] == k]))
        runs = [r for r in mine if r["K"] == best_k]
        cells = []
        for s in ds.levels:
            v = np.array([r[f"ndcg@100 s={s}"] for r in runs])
            cells.append(f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0:.3f}")
        ll = [r["test_loglik_mean"] for r in runs if r["test_loglik_mean"] is not None]
        ll_sd = np.std(ll, ddof=1) if len(ll) > 1 else 0.0
        ll_cell = f"{np.mean(ll):.3f} ± {ll_sd:.3f}" if ll else "–"
        lines.append(
            f"| {label} | {runs[0]['data']} | {best_k} | " + " | ".join(cells) + f" | {ll_cell} |"
        )
        chosen.append({"model": label, "K": best_k, "runs": runs})
    return "\n".join(lines), chosen


def reproduce(
    datasets: Sequence[Dataset],
    out: str | os.PathLike,
    client: Client | None = None,
    protocol: Protocol | None = None,
    n_workers: int | None = None,
) -> str:
    """Run the comparison on ``datasets``; write results, tables and figures under ``out``.

    Each dataset's fits, evaluations and checks run on ``client`` if given, else on the
    current client, else in this process when ``n_jobs`` fits at the largest K fit in memory
    (:func:`~ordnmf_dask.runtime.cluster.choose_client`), else on a LocalCluster of
    ``n_workers`` started for that dataset.

    Returns the markdown report (also written to ``out/report.md``).
    """
    proto = protocol or Protocol()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = [
        "# OrdNMF vs BePoF, PF and dcPF",
        "",
        f"Protocol: items then users with >= {proto.min_count} interactions, one 80/20 split "
        f"(seed {proto.split_seed}), alpha = {proto.alpha}, tol = {proto.tol}, K in "
        f"{list(proto.k_grid)} (the K with the best mean NDCG at the selection threshold is "
        f"shown), seeds {list(proto.seeds)}; cells are mean ± sd over seeds of NDCG@100 with "
        "relevance y_test >= s. Test loglik: mean log P(y | y > 0) per test rating (OrdNMF: "
        "ordinal classes; dcPF: the class's count range).",
    ]
    for ds in datasets:
        report += _one_dataset(ds, out / ds.name, client, proto, n_workers)
    text = "\n".join(report) + "\n"
    _write_text(out / "report.md", text)
    return text


def _one_dataset(
    ds: Dataset, ddir: Path, client: Client | None, proto: Protocol, n_workers: int | None
) -> list[str]:
    """Ingest ``ds`` into ``ddir``, fit every model, K and seed of the protocol, write the runs
    and figures there, and return the dataset's section of the report."""
    from ordnmf_dask.app import plots

    ddir.mkdir(exist_ok=True)
    store = ingest(
        ds.path,
        ddir / "store.zarr",
        min_count=proto.min_count,
        seed=proto.split_seed,
        overwrite=True,
        **ds.ingest_options,
    )
    # n_jobs fits at once hold about the factor tables of one fit at n_jobs times the K
    at_once = max(proto.k_grid) * max(proto.n_jobs, 1)
    with choose_client(client, store, at_once, n_workers=n_workers, jobs=proto.n_jobs) as cl:
        jobs = [
            (label, kind, model, extra, k, seed)
            for label, kind, model, extra in model_specs(ds)
            for k in proto.k_grid
            for seed in proto.seeds
        ]
        with ThreadPoolExecutor(proto.n_jobs) as pool:
            futures = [
                pool.submit(_one_run, cl, store, *job, proto=proto, out=ddir) for job in jobs
            ]
            rows = [f.result() for f in futures]
        _write_runs(ddir / "runs.csv", rows)
        table, chosen = _summary_table(ds, rows)
        figures = _figures(plots, cl, store, ds, chosen, ddir, proto)
    return [
        "",
        f"## {ds.name}",
        "",
        f"{store.n_users} users x {store.n_items} items, {store.nnz_train} train / "
        f"{store.nnz_test} test nonzeros, {ds.notes}.",
        "",
        table,
        "",
        "PPC (training class counts vs simulated from the first seed's model, classes 1..V):",
        "",
        figures["ppc_table"],
        "",
        "Figures: " + ", ".join(f"`{p}`" for p in figures["files"]),
    ]


def _write_runs(path: Path, rows: list[dict[str, Any]]) -> None:
    """The rows of a dataset's runs as CSV, one line per fit."""
    runs = io.StringIO(newline="")
    writer = csv.DictWriter(runs, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _write_text(path, runs.getvalue())


def _write_text(path: Path, text: str) -> None:
    """A file of the reproduction, through the output rule (whole or absent, no link)."""
    from ordnmf_dask.store.outputs import write_file

    data = text.encode()
    write_file(str(path), lambda fh: fh.write(data), "the reproduction's results")


def _figures(
    plots: Any,
    client: Client,
    store: StoreInfo,
    ds: Dataset,
    chosen: list[dict[str, Any]],
    ddir: Path,
    proto: Protocol,
) -> dict[str, Any]:
    """ELBO traces, PPC histogram and thresholds of the chosen runs (first seed)."""
    from ordnmf_dask.estimator import CaviEstimator, OrdNMF

    first = {c["model"]: CaviEstimator.load(c["runs"][0]["model_dir"]) for c in chosen}
    traces = {label: m.elbo_ for label, m in first.items()}
    files = [plots.plot_elbo(traces, ddir / "elbo.png")]
    ppc, sims = {}, {}
    for label in ("OrdNMF", "dcPF"):
        if label in first:
            ppc[label] = posterior_predictive(store, first[label], client, n_pairs=proto.ppc_pairs)
            sims[label] = ppc[label]["model"]
    train = next(iter(ppc.values()))["train"]
    files.append(plots.plot_ppc(train, sims, ddir / "ppc.png", title=f"PPC, {ds.name}"))
    ordinal = first["OrdNMF"]
    assert isinstance(ordinal, OrdNMF)  # every comparison fits one
    files.append(
        plots.plot_thresholds(
            ordinal.theta_, ddir / "thresholds.png", title=f"OrdNMF thresholds, {ds.name}"
        )
    )
    _write_text(ddir / "ppc.json", json.dumps(ppc, indent=2))
    head = "| class | " + " | ".join(str(c) for c in range(1, len(train))) + " |"
    lines = [
        head,
        "|---" * len(train) + "|",
        "| train | " + " | ".join(f"{v:.0f}" for v in train[1:]) + " |",
    ]
    for label, hist in sims.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in hist[1:]) + " |")
    return {
        "files": [os.path.relpath(f, ddir.parent) for f in files],
        "ppc_table": "\n".join(lines),
    }
