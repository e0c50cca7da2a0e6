"""K chosen by validation against the default fixed K, side by side, with popularity as a floor.

On stores drawn from the model (``--stores``: U x I x density x K_true, ``datasets.synth``, shape
0.3, V = 10, 20% test; their training pairs re-ingested with a validation subset of
``--validation-fraction``, the test pairs kept as given) and on ml-latest-small (``--real``: half
stars, min_count 20, seed 0, the same validation fraction), every store is fitted twice from
``--seed``: at the default K (``--k``) and with ``select_components`` (``--grid``), both with the
store's validation subset for early stopping. Printed: the chosen K, NDCG@100 of the test split
at s = 1/5/10 (ml: 1/6/10) as a share of the generating factors' (synthetic stores) or as is
(ml), and seconds. Scores come from ``bench/quality.py``'s scorer (``postfit.evaluate``).

    python bench/select_k.py --stores 2000x1000x0.05x8 2000x1000x0.05x20 --real
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
from quality import figures, item_counts, scored

from ordnmf_dask import OrdNMF, ingest
from ordnmf_dask.datasets.synth import SynthParams, synth, true_factors
from ordnmf_dask.params import DEFAULTS
from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_ids
from ordnmf_dask.store.csr import load_block


def triples(info: StoreInfo, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw (user, item, class) triples of a split."""
    users, items = read_ids(info.path, "users"), read_ids(info.path, "items")
    rb, cb = info.row_bounds, info.col_bounds
    out: list[tuple[np.ndarray, ...]] = []
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = load_block(info.path, split, r, c)
            rows = np.repeat(np.arange(b.shape[0]), np.diff(b.indptr))
            out.append((users[rb[r] + rows], items[cb[c] + b.cols], b.y.astype(np.int64)))
    return tuple(np.concatenate(a) for a in zip(*out, strict=True))  # type: ignore[return-value]


def with_validation(info: StoreInfo, path: str, fraction: float, seed: int = 0) -> StoreInfo:
    """The store's training pairs split again with a validation subset; its test pairs kept.
    ``seed`` must differ from the seed of a store split by the hash (``ingest``): with the same
    seed every training pair hashes outside the validation range, which comes out empty."""
    return ingest_arrays(
        *triples(info, "train"),
        path,
        test=triples(info, "test"),
        ratings="integer",
        scale_max=info.n_classes,
        validation_fraction=fraction,
        seed=seed,
    )


def run(info: StoreInfo, levels: list[int], **kw: Any) -> dict[str, Any]:
    """One fit and its chosen K, seconds and test figures."""
    t0 = time.perf_counter()
    model = OrdNMF(**kw, n_members=1).fit(info.path)
    seconds = time.perf_counter() - t0
    chosen = model.selection_["chosen"] if model.selection_ else kw["n_components"]
    return {"k": chosen, "seconds": seconds, **figures(info, model, levels)}


def line(
    label: str,
    name: str,
    k: Any,
    nd: dict[int, float],
    ref: dict[int, float] | None,
    levels: list[int],
    seconds: float | None,
) -> None:
    cells = "/".join(f"{nd[s] / ref[s]:.1%}" if ref else f"{nd[s]:.4f}" for s in levels)
    sec = "" if seconds is None else f"{seconds:7.1f}"
    print(f"{label:<26} {name:<12} {k!s:>4} {cells:>24} {sec:>7}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--stores",
        nargs="*",
        default=["2000x1000x0.05x8", "2000x1000x0.05x20", "2000x1000x0.05x40"],
    )
    ap.add_argument("--store-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--k", type=int, default=DEFAULTS["n_components"])
    ap.add_argument("--grid", type=int, nargs="+", default=[5, 10, 20, 30, 50])
    ap.add_argument("--validation-fraction", type=float, default=0.1)
    ap.add_argument("--validation-every", type=int, default=DEFAULTS["validation_every"])
    ap.add_argument("--seed", type=int, default=0, help="seed of every fit")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--data", default=os.environ.get("DATA", "../shared/data"))
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{'store':<26} {'fit':<12} {'K':>4} {'NDCG@100 s=1/5/10':>24} {'s':>7}")
    with tempfile.TemporaryDirectory(prefix="select-k-") as work:
        for spec in args.stores:
            u, i, density, k_true = spec.split("x")
            u, i, k_true = int(u), int(i), int(k_true)
            for seed in args.store_seeds:
                drawn = synth(
                    os.path.join(work, f"{spec}-{seed}-drawn.zarr"),
                    u,
                    i,
                    int(u * i * float(density)),
                    k_true,
                    10,
                    seed=seed,
                )
                info = with_validation(
                    open_store(drawn.path),
                    os.path.join(work, f"{spec}-{seed}.zarr"),
                    args.validation_fraction,
                )
                p = SynthParams.from_attrs(drawn.attrs)
                ru, ri = read_ids(info.path, "users"), read_ids(info.path, "items")
                w0, h0 = true_factors(p, "users", 0, u)[ru], true_factors(p, "items", 0, i)[ri]
                levels = [1, 5, 10]
                truth = scored(info, w0, h0, levels)
                label = f"{u}x{i} {float(density):.0%} K*={k_true} seed {seed}"
                pop = scored(info, np.ones((len(ru), 1)), item_counts(info)[:, None], levels)
                line(label, "popularity", "", pop, truth, levels, None)
                fixed = run(
                    info,
                    levels,
                    n_components=args.k,
                    validation_every=args.validation_every,
                    seed=args.seed,
                )
                line(
                    label, f"K={args.k}", fixed["k"], fixed["ndcg"], truth, levels, fixed["seconds"]
                )
                sel = run(
                    info,
                    levels,
                    select_components=tuple(args.grid),
                    validation_every=args.validation_every,
                    seed=args.seed,
                )
                line(label, "selected", sel["k"], sel["ndcg"], truth, levels, sel["seconds"])
        if args.real:
            levels = [1, 6, 10]
            ratings = os.path.join(args.data, "ml-latest-small", "ratings.csv")
            info = ingest(
                ratings,
                os.path.join(work, "ml.zarr"),
                ratings="halfstar",
                min_count=20,
                seed=0,
                validation_fraction=args.validation_fraction,
            )
            label = "ml-latest-small s=1/6/10"
            pop = scored(info, np.ones((info.n_users, 1)), item_counts(info)[:, None], levels)
            line(label, "popularity", "", pop, None, levels, None)
            fixed = run(
                info,
                levels,
                n_components=args.k,
                validation_every=args.validation_every,
                seed=args.seed,
            )
            line(label, f"K={args.k}", fixed["k"], fixed["ndcg"], None, levels, fixed["seconds"])
            sel = run(
                info,
                levels,
                select_components=tuple(args.grid),
                validation_every=args.validation_every,
                seed=args.seed,
            )
            line(label, "selected", sel["k"], sel["ndcg"], None, levels, sel["seconds"])
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
