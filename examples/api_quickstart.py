"""The Python API in a few lines: ingest, fit, evaluate, save and reload.

Run from anywhere: ``python examples/api_quickstart.py``. Reads MovieLens latest-small from
``$DATA/ml-latest-small/ratings.csv`` when DATA is set, else through
:func:`ordnmf_dask.datasets.fetch_movielens_small` (the user cache, then the copy shipped in
examples/data, else a download); writes to ``out/quickstart`` (or ``$OUT``).
"""

import os
from pathlib import Path

from ordnmf_dask import OrdNMF, evaluate, ingest
from ordnmf_dask.datasets import fetch_movielens_small

if __name__ == "__main__":
    data = os.environ.get("DATA")
    ratings = Path(data) / "ml-latest-small" / "ratings.csv" if data else fetch_movielens_small()
    out = Path(os.environ.get("OUT") or Path(__file__).resolve().parents[1] / "out" / "quickstart")
    out.mkdir(parents=True, exist_ok=True)
    store = ingest(
        ratings, out / "store.zarr", ratings="halfstar", min_count=20, seed=0, overwrite=True
    )
    # without a client a store this small is fitted in this process; fit(store, client) with a
    # distributed.Client (e.g. Client(LocalCluster(n_workers=2))) runs it on that cluster
    model = OrdNMF(n_components=50, alpha_W=0.3, alpha_H=0.3, tol=1e-5, seed=0).fit(store)
    # an ensemble of n_members=4 fits by default: each member's iterations, member 1's thresholds
    print("/".join(str(r["n_iter"]) for r in model.runs_), "iterations;", model.theta_[0])
    print(evaluate(store, model)["ndcg"])
    model.save(out / "model.zarr", overwrite=True)
    print(OrdNMF.load(out / "model.zarr").W_)  # dask array (U, K), chunked by user-block
