"""Post-fit computations on a small model start no cluster: export, recommend, fold-in and the
posterior predictive check run in-process (postfit.executor.client_for), with the results a
LocalCluster gives."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF, export, fold_in, posterior_predictive, recommend, recommend_for
from ordnmf_dask.store.blocks import read_ids

K = 3


@pytest.fixture(scope="module")
def fitted_inprocess(tmp_path_factory):
    """A 2 x 2 grid store and a model fitted on it in-process."""
    where = tmp_path_factory.mktemp("p")
    train, test = dense_split(synthetic_ordinal(30, 24, 4, seed=5))
    store = store_from_dense(where / "s.zarr", train, test, 4, (2, 2))
    model = OrdNMF(K, max_iter=6, executor="inprocess", n_members=1).fit(
        store, out=where / "m.zarr"
    )
    return store, model


def _outputs(store, model, client, out) -> dict[str, object]:
    items = read_ids(store.path, "items")[:3].tolist()
    users = read_ids(store.path, "users")[:4].tolist()
    export(model, out / "exp", client=client, n=5)
    recommend(store, model, client, n=5, out=out / "rec")
    w = fold_in(model, [items], [[4, 2, 1]], store=store, client=client)
    tables = {}
    for name, dataset in (
        ("exp", "user_factors"),
        ("exp", "item_factors"),
        ("exp", "recommendations"),
        ("rec", "recommendations"),
    ):
        table = pq.read_table(out / name / dataset)
        tables[name, dataset] = table.sort_by([(c, "ascending") for c in table.column_names[:2]])
    return {
        "tables": {k: t.to_pydict() for k, t in tables.items()},
        "users": recommend(store, model, client, n=5, users=users),
        "w": w.tolist(),
        "for": recommend_for(model, w, [items], n=5, store=store, client=client),
        "ppc": posterior_predictive(store, model, client, n_pairs=2000),
    }


@pytest.fixture(scope="module")
def inprocess(fitted_inprocess, tmp_path_factory) -> dict[str, object]:
    """The outputs with no client given and none current (module-scoped, so made before any
    test's ``client``, which would be current): computed in this process."""
    from distributed import Client

    from ordnmf_dask.runtime import cluster

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was used")

    with pytest.raises(ValueError):
        Client.current()  # a current client would be chosen instead
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cluster, "resolve_client", no_cluster)
        return _outputs(*fitted_inprocess, None, tmp_path_factory.mktemp("inprocess"))


@pytest.mark.cluster
def test_postfit_inprocess_is_the_cluster_result(fitted_inprocess, inprocess, client, tmp_path):
    assert inprocess == _outputs(*fitted_inprocess, client, tmp_path)


def test_postfit_on_a_small_model_imports_no_distributed(fitted_inprocess, tmp_path):
    """Not marked ``cluster``: a scheduler started here would fail the test (conftest)."""
    store, model = fitted_inprocess
    code = (
        "import sys\n"
        "from ordnmf_dask import (OrdNMF, export, fold_in, posterior_predictive, recommend,\n"
        "                         recommend_for)\n"
        "from ordnmf_dask.store.blocks import read_ids\n"
        f"store, model, out = {store.path!r}, {model.model_path_!r}, {str(tmp_path)!r}\n"
        "items = read_ids(store, 'items')[:2].tolist()\n"
        "export(model, out + '/exp', n=3)\n"
        "recommend(store, model, n=3, out=out + '/rec')\n"
        "w = fold_in(model, [items], [[4, 1]], store=store)\n"
        "recommend_for(model, w, [items], n=3, store=store)\n"
        "posterior_predictive(store, model, n_pairs=1000)\n"
        "print('distributed' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
    assert pq.read_table(tmp_path / "rec" / "recommendations").num_rows > 0
    assert np.isfinite(pq.read_table(tmp_path / "exp" / "user_factors").column(1).to_numpy()).all()
