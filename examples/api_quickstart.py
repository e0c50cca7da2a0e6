"""The Python API in a few lines: ingest, fit on a Dask client, evaluate, save and reload.

Run from the repository root: ``python examples/api_quickstart.py`` (needs ../shared/data).
"""

from pathlib import Path

from distributed import Client, LocalCluster

from ordnmf_dask import OrdNMF, evaluate, ingest

if __name__ == "__main__":
    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-latest-small"
    out = Path("out/quickstart")
    out.mkdir(parents=True, exist_ok=True)
    store = ingest(data / "ratings.csv", out / "store.zarr", ratings="halfstar", min_count=20,
                   overwrite=True)
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        model = OrdNMF(n_components=50, seed=0).fit(store, client)
        print(model.n_iter_, model.elbo_[-1], model.theta_)
        print(evaluate(store, model, client)["ndcg"])
        model.save(out / "model.zarr", overwrite=True)
    print(OrdNMF.load(out / "model.zarr").W_)  # dask array (U, K), chunked by user-block
