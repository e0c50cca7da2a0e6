"""The rule of checkpoints read back (docs/design.md, "Safety rules", "Inputs"): a checkpoint's
header is typed and bounded by the fit that resumes (``engine/snapshot.py``) and its chunks are
held to the model's rules before anything is resumed; a bad checkpoint is skipped with a
warning naming it (the fit resumes from an older sound one) or, when resuming is required,
refused naming it (exit 2), never resumed into a NaN bound or an error about the output model."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from test_safety_inputs import one_line_error

from ordnmf_dask import OrdNMF
from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore import chunkstore

K = 3
SETTINGS = dict(tol=1e-12, checkpoint_every=2, executor="inprocess")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A store, the checkpoints at iterations 2 and 4 of a fit stopped after 5, and the ELBO
    trace of the same fit run to 7 iterations at once."""
    where = tmp_path_factory.mktemp("ckpt")
    y = synthetic_ordinal(30, 20, 3, seed=4)
    store = store_from_dense(where / "s.zarr", *dense_split(y), 3, (2, 2))
    ckpt = where / "ckpt"
    OrdNMF(K, max_iter=5, checkpoint_dir=str(ckpt), **SETTINGS, n_members=1).fit(
        store, out=where / "a"
    )
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-00000002", "ckpt-00000004"]
    whole = OrdNMF(K, max_iter=7, tol=1e-12, executor="inprocess", n_members=1).fit(store)
    return store, ckpt, whole.elbo_


@pytest.fixture
def ckpt(fitted, tmp_path):
    """A copy of the checkpoints, to damage."""
    copy = tmp_path / "ckpt"
    shutil.copytree(fitted[1], copy)
    return copy


def edit_header(path, change) -> None:
    """Apply ``change`` to the root attributes of the checkpoint at ``path``."""
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    change(doc["attributes"])
    meta.write_text(json.dumps(doc))


def negate(path, name: str, index: int, *fields: str) -> None:
    """Rewrite chunk ``name/index`` with ``fields`` negated, as a valid chunk with its own
    inventory (size and CRC-32 consistent)."""
    chunk = chunkstore.load_chunk(str(path), name, index)
    changed = dataclasses.replace(chunk, **{f: -getattr(chunk, f) for f in fields})
    chunkstore.save_chunk(changed, str(path), name, index, derived=False)


def negate_all_w(path) -> None:
    """Every W chunk's E[W] negated, with the column sums and w_sum that match it."""
    for j in range(2):
        negate(path, "W", j, "mean", "geo")

    def change(attrs):
        attrs["colsums"]["W"] = [[-x for x in sums] for sums in attrs["colsums"]["W"]]
        w_sum = attrs["snapshot"]["w_sum"]
        attrs["snapshot"]["w_sum"] = [-x for x in w_sum[:-1]] + w_sum[-1:]

    edit_header(path, change)


def set_snapshot(field: str, value):
    def change(attrs):
        attrs["snapshot"][field] = value

    return change


def claim_rows(path) -> None:
    """W/1's E[W] claims 10^12 rows in its metadata (chunk shape and inventory untouched)."""
    meta = path / "W" / "1" / "mean" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = doc["chunk_grid"]["configuration"]["chunk_shape"] = [10**12, K]
    meta.write_text(json.dumps(doc))


def fifo_in_place(path) -> None:
    """W/1's E[W] metadata is a FIFO (zarr would block on it, waiting for a writer)."""
    meta = path / "W" / "1" / "mean" / "zarr.json"
    meta.unlink()
    os.mkfifo(meta)


NEWEST = "ckpt-00000004"
DAMAGE = {
    "elbo": (
        lambda p: edit_header(p, set_snapshot("elbo", "lots")),
        "checkpoint attribute snapshot.elbo must be a list of 4 finite numbers, got 'lots'",
    ),
    "iteration": (
        lambda p: edit_header(p, set_snapshot("iteration", 10**12)),
        "snapshot.iteration must be an integer in 1..6, got 1000000000000",
    ),
    "params": (
        lambda p: edit_header(p, set_snapshot("params", [0.0, -1.0, 0.5, 0.5])),
        "snapshot.params must be 4 finite decrements >= 0 with delta[0] = 0",
    ),
    "negated geo": (
        lambda p: negate(p, "W", 1, "geo", "shape"),
        f"{NEWEST}/W/1: geo holds values < 0",
    ),
    "negated factors": (
        negate_all_w,
        "snapshot.w_sum must be 3 column sums >= 0 and a bound",
    ),
    "claimed rows": (
        claim_rows,
        f"{NEWEST}/W/1: mean records shape (1000000000000, 3), not (15, 3)",
    ),
    "fifo": (fifo_in_place, f"{NEWEST}/W/1/mean/zarr.json: is a FIFO inside the checkpoint"),
    "colsums": (
        lambda p: edit_header(p, lambda a: a["colsums"]["H"].pop()),
        "checkpoint attribute colsums.H must be a list of 2 chunks' column sums",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_skipped_naming_it_and_the_older_one_resumed(
    fitted, ckpt, damage, caplog
):
    """The damaged newest checkpoint is skipped with a warning naming it and the field; the
    fit resumes from the older one and ends exactly where the uninterrupted fit does."""
    store, _, whole = fitted
    spoil, expected = DAMAGE[damage]
    spoil(ckpt / NEWEST)
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        again = OrdNMF(K, max_iter=7, checkpoint_dir=str(ckpt), **SETTINGS, n_members=1).fit(
            store, resume=True
        )
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    skipped = [m for m in skipped if m.startswith("skipping checkpoint")]
    assert len(skipped) == 1 and str(ckpt / NEWEST) in skipped[0], skipped
    assert expected in skipped[0], skipped
    assert f"resuming from {ckpt / 'ckpt-00000002'} (iteration 2)" in caplog.text
    assert again.elbo_ == whole
    assert np.isfinite(again.W_.compute()).all()


def test_with_no_sound_checkpoint_resuming_is_refused_naming_them(fitted, ckpt, tmp_path):
    """``--resume`` requires one: refused in one line naming the checkpoints and what is wrong
    with each, exit 2; without ``resume`` the fit starts afresh (and says why)."""
    store = fitted[0]
    DAMAGE["elbo"][0](ckpt / NEWEST)
    DAMAGE["negated geo"][0](ckpt / "ckpt-00000002")
    line = one_line_error(
        [
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "m"),
            "-k",
            str(K),
            "--max-iter",
            "7",
            "--tol",
            "1e-12",
            "--checkpoint-every",
            "2",
            "--checkpoint-dir",
            str(ckpt),
            "--executor",
            "inprocess",
            "--resume",
        ],
        f"cannot resume: no usable checkpoint in {ckpt}",
        f"{ckpt / NEWEST}: checkpoint attribute snapshot.elbo",
        f"{ckpt / 'ckpt-00000002'}/W/1: geo holds values < 0",
    )
    assert "nan" not in line.lower()
    assert not (tmp_path / "m").exists()
    with pytest.raises(InputError, match="cannot resume: no usable checkpoint"):
        OrdNMF(K, max_iter=7, checkpoint_dir=str(ckpt), **SETTINGS, n_members=1).fit(
            store, resume=True
        )


def test_a_checkpoint_header_larger_than_its_fit_allows_is_not_parsed(fitted, ckpt, caplog):
    """The root zarr.json is bounded by the fit's layout (the numbers its K, blocks and
    max_iter allow) before it is parsed."""
    store, _, whole = fitted
    meta = ckpt / NEWEST / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:-1] + b" " * (2 << 20) + b"}")
    with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):
        again = OrdNMF(K, max_iter=7, checkpoint_dir=str(ckpt), **SETTINGS, n_members=1).fit(
            store, resume=True
        )
    assert f"skipping checkpoint: {ckpt / NEWEST}: its zarr.json holds more than" in caplog.text
    assert again.elbo_ == whole


def test_the_size_bound_admits_the_longest_header_of_its_layout(tmp_path):
    """Every number at its longest, as zarr writes it (indented, one a line): the header is
    parsed, although it is larger than the bound's slack alone."""
    import zarr

    from ordnmf_dask.engine.snapshot import CheckpointHeader, Layout, Snapshot, parse
    from ordnmf_dask.model.families import OrdinalFamily

    blocks, k, max_iter, long = 100, 50, 20_000, -1.2345678901234567e-300
    rows = {name: [1] * blocks for name in ("W", "H", "SW", "SH")}
    layout = Layout(rows, k, OrdinalFamily((0, 1, 1, 1)), max_iter)
    many = [long] * (k + 1)
    snap = Snapshot(max_iter - 1, [long] * 4, [long] * (max_iter - 1), long, many, many, many)
    colsums = {name: [[long] * k] * blocks for name in rows}
    path = tmp_path / "ckpt-00019999"
    zarr.open_group(path, mode="w", attributes=CheckpointHeader("p", snap, colsums).to_attrs())
    text = (path / "zarr.json").read_bytes()
    assert 1 << 20 < len(text) <= layout.max_bytes()
    assert parse(text, str(path), layout)["snapshot"]["iteration"] == max_iter - 1
