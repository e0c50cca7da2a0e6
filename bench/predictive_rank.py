"""Ranking by the predictive class probability instead of the mean rate, on one store.

Usage: ``python bench/predictive_rank.py --store U x I x density x K_true [--store-seed 0]
[--members 4] [-k 50] [--alpha SHAPE]`` (or ``--real ml``; stores as in ``bench/optimum.py``).

Fits ``OrdNMF(k, n_members=M)`` and scores NDCG@100 per level s (the share of the generating
factors' on a store drawn from the model) for three rankings of every user's items: the
package's mean rate ``E[W] E[H]^T`` (averaged over the members), the mixture of the members'
plug-in ``P(y >= s) = 1 - exp(-theta_{s-1} E[lambda])``, and the mixture of their
``P(y >= s)`` with lambda taken Gamma with its posterior mean and variance
(``model/classlaw.gamma_hazards``' law), which ranks an uncertain pair below a certain one of
the same mean. Item popularity is printed beside. Dense (U x I) score tables: small stores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from optimum import store as make_store  # noqa: E402
from optimum import store_arguments  # noqa: E402
from quality import item_counts, scored  # noqa: E402

from ordnmf_dask import OrdNMF  # noqa: E402
from ordnmf_dask.modelstore import chunkstore  # noqa: E402
from ordnmf_dask.modelstore.model import open_model  # noqa: E402
from ordnmf_dask.postfit.classes import law_of  # noqa: E402


def field(model: str, name: str, n_chunks: int, what: str) -> np.ndarray:
    """One field of a factor, all its chunks stacked."""
    return np.concatenate([chunkstore.read_field(model, name, i, what) for i in range(n_chunks)])


def at_least(e: np.ndarray, v: np.ndarray | None, theta: float) -> np.ndarray:
    """P(y >= s) for rates of mean ``e`` (variance ``v``; None: the plug-in law)."""
    if v is None:
        return -np.expm1(-theta * e)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(v > 0, e * e / v * np.log1p(theta * v / np.maximum(e, 1e-300)), e * theta)
    return -np.expm1(-h)


def main() -> None:
    ap = argparse.ArgumentParser()
    store_arguments(ap)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("-k", type=int, default=50)
    ap.add_argument("--alpha", type=float)
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    info, levels, truth = make_store(args, work)
    shapes = {} if args.alpha is None else {"alpha_W": args.alpha, "alpha_H": args.alpha}
    t0 = time.perf_counter()
    m = OrdNMF(args.k, n_members=args.members, **shapes).fit(info.path)
    print(f"fit {time.perf_counter() - t0:.1f} s")
    n, k = m.n_members_, m.n_components
    ew = field(m.model_path_, "W", info.grid[0], "mean") * n  # a member's own E[w]
    sw = field(m.model_path_, "W", info.grid[0], "shape")
    eh = field(m.model_path_, "H", info.grid[1], "mean")
    sh = field(m.model_path_, "H", info.grid[1], "shape")
    law = law_of(open_model(m.model_path_))
    members = law.members or (law,)

    def shown(nd: dict[int, float]) -> str:
        cells = [f"{100 * nd[s] / truth[s]:.1f}%" if truth else f"{nd[s]:.4f}" for s in levels]
        return " / ".join(cells)

    print("mean rate           ", shown(scored(info, m.user_factors, m.item_factors, levels)))
    pop = item_counts(info)[:, None]
    print("popularity          ", shown(scored(info, np.ones((info.n_users, 1)), pop, levels)))
    eye = np.eye(info.n_items)
    for kind in ("plug-in", "gamma"):
        found = {}
        for s in levels:
            p = np.zeros((info.n_users, info.n_items))
            for j, member in enumerate(members):
                c = slice(j * k, (j + 1) * k)
                e = ew[:, c] @ eh[:, c].T
                v = None
                if kind == "gamma":
                    vw, vh = ew[:, c] ** 2 / sw[:, c], eh[:, c] ** 2 / sh[:, c]
                    v = vw @ (eh[:, c] ** 2 + vh).T + ew[:, c] ** 2 @ vh.T
                p += at_least(e, v, float(member.theta[s - 1]))
            found[s] = scored(info, p, eye, [s])[s]
        print(f"P(y >= s), {kind:8s} ", shown(found))


if __name__ == "__main__":
    main()
