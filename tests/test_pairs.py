"""``ordnmf-dask predict`` / :func:`ordnmf_dask.predict_pairs` (ordnmf_dask/postfit/pairs.py) on
a real LocalCluster: class probabilities of pairs read from Parquet row groups, against the
in-memory predict_proba (itself checked against a dense oracle in tests/test_predict.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_predict import N_ITEMS, N_USERS, Model, V

from ordnmf_dask import predict_pairs
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError


def _pairs_file(path, m, n=500, row_group=128, seed=0):
    rng = np.random.default_rng(seed)
    users = m.users[rng.integers(0, N_USERS, n)]
    items = m.items[rng.integers(0, N_ITEMS, n)].astype(np.int64)
    pq.write_table(pa.table({"user": users, "item": items}), path, row_group_size=row_group)
    return users, items


@pytest.mark.parametrize("given", [False, True])
def test_predict_pairs_on_a_cluster_matches_predict_proba(tmp_path, client, given):
    m = Model(tmp_path)
    users, items = _pairs_file(tmp_path / "pairs.parquet", m)
    posterior = "gamma" if given else "mean"
    out = predict_pairs(
        m.path,
        tmp_path / "pairs.parquet",
        tmp_path / "out",
        client=client,
        given_interaction=given,
        posterior=posterior,
    )
    parts = sorted(os.listdir(f"{out}/predictions"))
    assert parts == [f"part-{j:05d}.parquet" for j in range(4)]  # one per row group
    got = pq.read_table(f"{out}/predictions").to_pandas()
    assert list(got.columns) == ["user", "item", *(f"p{v}" for v in range(V + 1))]
    assert got["user"].tolist() == users.tolist() and got["item"].tolist() == items.tolist()
    want = m.model.predict_proba(users, items, given_interaction=given, posterior=posterior)
    np.testing.assert_allclose(got[[f"p{v}" for v in range(V + 1)]].to_numpy(), want, rtol=1e-12)
    manifest = json.loads(open(f"{out}/_SUCCESS").read())
    assert manifest["datasets"]["predictions"]["rows"] == [128, 128, 128, 116]


def test_predict_pairs_refuses_unknown_ids_and_writes_nothing(tmp_path, client):
    m = Model(tmp_path)
    pq.write_table(
        pa.table({"user": ["u1", "u4", "nobody"], "item": [100, 105, 110]}),
        tmp_path / "bad.parquet",
    )
    with pytest.raises(InputError, match=r"bad.parquet, row group 0: unknown user id 'nobody'"):
        predict_pairs(m.path, tmp_path / "bad.parquet", tmp_path / "out", client=client)
    assert not (tmp_path / "out").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("out")]
    pq.write_table(pa.table({"u": ["u1"], "item": [100]}), tmp_path / "cols.parquet")
    with pytest.raises(InputError, match="cols.parquet: no column user"):
        predict_pairs(m.path, tmp_path / "cols.parquet", tmp_path / "out", client=client)


@pytest.mark.parametrize(
    ("table", "reason"),
    [
        (pa.table({"user": pa.nulls(2), "item": [100, 105]}), r"column 'user' is of type null;"),
        (pa.table({"user": [["u1"], ["u4"]], "item": [100, 105]}), r"column 'user' is of type"),
        (pa.table({"user": ["u1"], "item": [True]}), r"column 'item' is of type bool;"),
        (
            pa.Table.from_arrays(
                [pa.array(["u1"]), pa.array(["u4"]), pa.array([100])],
                names=["user", "user", "item"],
            ),
            r"2 columns named 'user'; pairs need one of each",
        ),
    ],
)
def test_predict_pairs_refuses_id_columns_that_hold_no_ids(tmp_path, table, reason):
    """Ids are integer, string or integral float columns, one of each role: any other column
    is refused in one line naming the file and the column, before any work, and nothing is
    written (ingest's rule for id columns)."""
    m = Model(tmp_path)
    pq.write_table(table, tmp_path / "odd.parquet")
    with pytest.raises(InputError, match=rf"odd\.parquet: {reason}"):
        predict_pairs(m.path, tmp_path / "odd.parquet", tmp_path / "out")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("out")]
    argv = ["predict", m.store.path, m.path, "--pairs", str(tmp_path / "odd.parquet")]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2


def test_cli_predict(tmp_path):
    m = Model(tmp_path)
    users, items = _pairs_file(tmp_path / "pairs.parquet", m, n=50, row_group=20)
    argv = ["predict", m.store.path, m.path, "--pairs", str(tmp_path / "pairs.parquet")]
    assert main([*argv, "--out", str(tmp_path / "o"), "--posterior", "gamma"]) == 0
    got = pq.read_table(tmp_path / "o" / "predictions").to_pandas()
    want = m.model.predict_proba(users, items, posterior="gamma")
    np.testing.assert_allclose(got[[f"p{v}" for v in range(V + 1)]].to_numpy(), want, rtol=1e-12)
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2  # exists: refused
    assert main([*argv, "--out", str(m.path), "--overwrite"]) == 2  # a model: never replaced
