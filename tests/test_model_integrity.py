"""A saved model's chunk files are checked on every read, as a store's are (size and CRC-32,
docs/model-format.md): a cut or changed factor or id chunk is an error naming the file (exit 2
on the command line), never other numbers or ids, for every reader of a model. Models of format
1, which record no checksums, still load with their sizes checked. ``evaluate`` refuses a store
without a test split."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import dense_split, store_from_dense, synthetic_ordinal
from test_cli_errors import one_error_line

from ordnmf_dask import OrdNMF, evaluate, export, fold_in, recommend
from ordnmf_dask.errors import InputError, StoreError

K = 2


@pytest.fixture(scope="module")
def fitted_paths(tmp_path_factory) -> tuple[str, str]:
    """A 2 x 2 grid store with a test split, and a model fitted on it in-process."""
    where = tmp_path_factory.mktemp("fitted")
    train, test = dense_split(synthetic_ordinal(20, 15, 3, seed=2))
    store = store_from_dense(where / "s.zarr", train, test, 3, (2, 2))
    model = OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(
        store, out=where / "m.zarr"
    )
    return store.path, model.model_path_


def _damaged(model: str, tmp_path: Path, key: str, damage: str) -> tuple[str, str]:
    """A copy of ``model`` whose chunk file ``key`` is cut by 8 bytes or has one bit flipped
    (same size); (model, damaged file)."""
    copy = tmp_path / "m.zarr"
    shutil.copytree(model, copy)
    path = copy / key
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[:-8])
    else:
        data[len(data) // 2] ^= 0x01
        path.write_bytes(data)
    return str(copy), str(path)


def _load_and_read(store: str, model: str, out: Path) -> None:
    est = OrdNMF.load(model)
    est.W_.compute(), est.H_.compute(), est.log_H_.compute()


def _serve(store: str, model: str, out: Path) -> None:
    OrdNMF.load(model).recommend([0, 19], n=3)


def _warm_start(store: str, model: str, out: Path) -> None:
    OrdNMF(K, max_iter=1, executor="inprocess", n_members=1).fit(
        store, init_model=model, out=out / "w.zarr"
    )


READERS: dict[str, Callable[[str, str, Path], object]] = {
    "load": _load_and_read,
    "evaluate": lambda store, model, out: evaluate(store, model),
    "recommend": lambda store, model, out: recommend(store, model, users=[0, 19], n=3),
    "serve": _serve,
    "export": lambda store, model, out: export(model, out / "exp", n=3),
    "fold_in": lambda store, model, out: fold_in(model, [[0, 1, 2]], [[3, 1, 2]], store=store),
    "warm start": _warm_start,
}
EVERY = tuple(READERS)


@pytest.mark.parametrize(
    ("key", "damage", "readers"),
    [
        (
            "W/0/mean/c/0/0",
            "flip",
            ("load", "evaluate", "recommend", "serve", "export", "warm start"),
        ),
        ("H/1/mean/c/0/0", "flip", EVERY),
        ("H/0/log_mean/c/0/0", "flip", ("load", "fold_in")),
        (
            "W/1/mean/c/0/0",
            "truncate",
            ("load", "evaluate", "recommend", "serve", "export", "warm start"),
        ),
        ("H/0/geo/c/0/0", "truncate", ("warm start",)),
        ("users/ids/c/0", "flip", ("serve", "export", "warm start")),
        ("items/ids/c/0", "flip", ("serve", "export", "warm start")),
    ],
)
def test_every_reader_names_a_damaged_model_chunk(fitted_paths, tmp_path, key, damage, readers):
    """Each reader of the chunk raises StoreError naming the file (it used to compute with the
    changed numbers or ids, or fail with a ValueError of zarr's) and writes nothing."""
    store, healthy = fitted_paths
    model, path = _damaged(healthy, tmp_path, key, damage)
    for name in readers:
        out = tmp_path / name
        out.mkdir()
        with pytest.raises(StoreError, match="chunk file") as err:
            READERS[name](store, model, out)
        assert path in str(err.value) and "damaged" in str(err.value), name
        assert os.listdir(out) == [], name
    for name in set(EVERY) - set(readers) - {"warm start"}:  # the others still work
        out = tmp_path / f"{name} ok"
        out.mkdir()
        READERS[name](store, model, out)


@pytest.mark.parametrize(
    ("key", "damage", "command"),
    [
        ("W/0/mean/c/0/0", "flip", ["evaluate", "{store}", "{model}"]),
        ("W/0/mean/c/0/0", "truncate", ["recommend", "{store}", "{model}", "--users", "0"]),
        ("H/1/mean/c/0/0", "flip", ["export", "{model}", "--out", "{out}"]),
        ("users/ids/c/0", "flip", ["export", "{model}", "--out", "{out}"]),
        (
            "H/0/mean/c/0/0",
            "flip",
            [
                "fit",
                "--n-members",
                "1",
                "{store}",
                "--init-model",
                "{model}",
                "--out",
                "{out}",
                "-k",
                "2",
                "--max-iter",
                "1",
            ],
        ),
    ],
)
def test_commands_exit_2_naming_the_damaged_chunk(
    fitted_paths, tmp_path, capsys, key, damage, command
):
    store, healthy = fitted_paths
    model, path = _damaged(healthy, tmp_path, key, damage)
    out = tmp_path / "out"
    args = [a.format(store=store, model=model, out=out) for a in command]
    code, line = one_error_line(capsys, args)
    assert code == 2
    assert line.startswith(f"ordnmf-dask {args[0]}: error: {path}: chunk file")
    assert not out.exists()


def _as_format_1(model: str, tmp_path: Path) -> str:
    """A copy of ``model`` as format 1 wrote it: no chunk inventory on the factor arrays."""
    copy = tmp_path / "old.zarr"
    shutil.copytree(model, copy)
    root = zarr.open_group(str(copy), mode="r+")
    root.attrs["format_version"] = 1
    for name in ("W", "H"):
        for _, chunk in root[name].groups():
            for _, array in chunk.arrays():
                array.attrs.pop("chunk_files")
    return str(copy)


def test_a_model_of_format_1_loads_with_its_sizes_checked(fitted_paths, tmp_path):
    """Saved before models recorded checksums: it reads the same numbers, and a cut chunk is
    still named (by its size, which its shape gives)."""
    store, healthy = fitted_paths
    old = _as_format_1(healthy, tmp_path)
    new, loaded = OrdNMF.load(healthy), OrdNMF.load(old)
    np.testing.assert_array_equal(loaded.W_.compute(), new.W_.compute())
    np.testing.assert_array_equal(loaded.log_H_.compute(), new.log_H_.compute())
    assert loaded.recommend([0, 19], n=3) == new.recommend([0, 19], n=3)
    cut = Path(old) / "H" / "1" / "mean" / "c" / "0" / "0"
    cut.write_bytes(cut.read_bytes()[:-8])
    with pytest.raises(StoreError, match=f"{cut}: chunk file has"):
        OrdNMF.load(old)
    with pytest.raises(StoreError, match=f"{cut}: chunk file has"):
        evaluate(store, old)


def test_a_model_of_format_2_without_an_inventory_is_refused(fitted_paths, tmp_path):
    store, healthy = fitted_paths
    model = tmp_path / "m.zarr"
    shutil.copytree(healthy, model)
    zarr.open_array(str(model / "H" / "0" / "mean"), mode="r+").attrs.pop("chunk_files")
    with pytest.raises(StoreError, match="H/0/mean: no chunk inventory"):
        OrdNMF.load(str(model))
    with pytest.raises(StoreError, match="H/0/mean: no chunk inventory"):
        recommend(store, str(model), users=[0], n=3)


def test_evaluate_refuses_a_store_without_a_test_split(tmp_path, capsys):
    """It used to return NaN metrics (API) and fail formatting them (exit 1)."""
    train, _ = dense_split(synthetic_ordinal(20, 15, 3, seed=2))
    store = store_from_dense(tmp_path / "s.zarr", train, np.zeros_like(train), 3, (1, 2))
    model = OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(
        store, out=tmp_path / "m.zarr", show_progress=False
    )
    with pytest.raises(InputError, match=f"{store.path}: the store has no test split"):
        evaluate(store.path, model)
    code, line = one_error_line(capsys, ["evaluate", store.path, model.model_path_])
    assert code == 2
    assert "no test split" in line and "--test-fraction" in line and "--test FILE" in line


def _edit_meta(path: Path, change: str) -> None:
    """Damage the zarr metadata file ``path`` as ``change`` says."""
    import json

    if change == "garbage":
        path.write_bytes(b"{garbage")
        return
    if change == "not-an-object":
        path.write_text("[1, 2]")
        return
    meta = json.loads(path.read_text())
    if change == "an-array":
        meta = json.loads((path.parent / "0" / "mean" / "zarr.json").read_text())
    elif change == "huge-shape":
        meta["shape"] = [10**12, K]
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [10**12, K]
    elif change == "huge-chunk":
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [10**12]
    elif change == "tiny-chunks":
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [1, 1]
    elif change == "complex":
        meta["data_type"] = "complex128"
    elif change == "float-shape":
        meta["shape"] = [10.0, K]
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("key", "change", "reason"),
    [
        ("W/zarr.json", "garbage", "not zarr metadata (not JSON"),
        ("W/zarr.json", "an-array", "an array where the model has a group"),
        ("H/1/zarr.json", "not-an-object", "not zarr metadata (a JSON list)"),
        ("users/zarr.json", "garbage", "not zarr metadata"),
        ("seen/indices/zarr.json", "garbage", "not zarr metadata"),
        ("W/0/rate/zarr.json", "huge-shape", "shape [1000000000000, 2], but the model's header"),
        ("H/0/log_mean/zarr.json", "tiny-chunks", "not one chunk of its shape"),
        ("W/1/geo/zarr.json", "complex", "data type 'complex128', not float64"),
        ("W/0/mean/zarr.json", "float-shape", "shape [10.0, 2], but"),
        ("items/ids/zarr.json", "huge-chunk", "not regular chunks of at most its shape (15,)"),
        ("seen/indptr/0/zarr.json", "complex", "data type 'complex128', not int64"),
    ],
)
def test_a_model_whose_zarr_metadata_is_damaged_is_refused_on_opening(
    fitted_paths, tmp_path, capsys, key, change, reason
):
    """Every node's metadata is read and checked against the header when the model is opened
    (store/nodes.py), those no command reads included: a garbage group ``zarr.json``, an array
    claiming 10^12 rows or chunks larger than itself, another data type, is refused in one
    line naming the file, by serving and by the API, never served or allocated."""
    copy = Path(shutil.copytree(fitted_paths[1], tmp_path / "m.zarr"))
    _edit_meta(copy / key, change)
    for args in (["recommend", str(copy), "--users", "0"], ["info", str(copy)]):
        code, line = one_error_line(capsys, args)
        assert code == 2 and f"{copy / key}: " in line and reason in line, line
    with pytest.raises(StoreError, match=str(copy / key)):
        OrdNMF.load(str(copy))
