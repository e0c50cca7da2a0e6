"""Store and model headers are checked before use (ordnmf_dask/store/header.py,
ordnmf_dask/modelstore/modelheader.py): every field has a type and a range and agrees with the
others and with the arrays' recorded shapes, so that a damaged or hostile header is one error line
naming the store or model and the field (exit 2), never an allocation, a hang, a NaN answer or
ids cut short (issue 38, cases 6 and 7), and a random mutation of any field gives that error or
the right answer."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from conftest import dense_split, store_from_dense, synthetic_ordinal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_errors import one_error_line

from ordnmf_dask import OrdNMF, evaluate, export
from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.model.families import OrdinalFamily
from ordnmf_dask.modelstore.model import store_fingerprint
from ordnmf_dask.modelstore.modelheader import ModelHeader
from ordnmf_dask.store.blocks import open_store, read_block, write_array

K = 2
V = 3


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[str, str]:
    """A 2 x 2 grid store (20 users, 15 items, V = 3) and a model fitted on it in-process."""
    where = tmp_path_factory.mktemp("headers")
    train, test = dense_split(synthetic_ordinal(20, 15, V, seed=2))
    store = store_from_dense(where / "s.zarr", train, test, V, (2, 2))
    model = OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(
        store, out=where / "m.zarr"
    )
    return store.path, model.model_path_


def _copy(source: str, to: Path) -> str:
    shutil.copytree(source, to)
    return str(to)


def _edit(node: Path | str, change: dict[str, Any], key: str = "attributes") -> None:
    """Set ``change`` in the ``key`` table of the zarr.json of ``node`` (a group or array)."""
    meta = Path(node) / "zarr.json"
    doc = json.loads(meta.read_text())
    doc[key].update(change)
    meta.write_text(json.dumps(doc))  # NaN as JSON writes it, as a careless writer would


def _attrs(node: str) -> dict[str, Any]:
    return json.loads((Path(node) / "zarr.json").read_text())["attributes"]


# ----------------------------------------------------------------------- case 6: sizes believed


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"n_classes": 10**9}, "n_classes"),
        ({"hist_train": [0] + [1] * 10**6}, "hist_train"),
    ],
)
def test_a_store_header_claiming_huge_sizes_is_refused_before_use(
    fitted, tmp_path, capsys, change, field
):
    store = _copy(fitted[0], tmp_path / "s.zarr")
    _edit(store, change)
    for args in (
        ["info", store, "--verify"],
        [
            "fit",
            "--n-members",
            "1",
            store,
            "--out",
            str(tmp_path / "new.zarr"),
            "-k",
            "2",
            "--max-iter",
            "1",
        ],
        ["evaluate", store, fitted[1]],
    ):
        code, line = one_error_line(capsys, args)
        assert code == 2
        assert store in line and f"attribute {field} must be" in line
    assert not (tmp_path / "new.zarr").exists()


def test_a_chunk_shape_of_10_12_rows_is_refused_without_allocating(fitted, tmp_path, capsys):
    model = _copy(fitted[1], tmp_path / "m.zarr")
    meta = Path(model) / "W/0/mean/zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = [10**12, K]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [10**12, K]
    meta.write_text(json.dumps(doc))
    for args in (
        ["evaluate", fitted[0], model],
        ["export", model, "--out", str(tmp_path / "ex")],
        ["recommend", fitted[0], model, "--users", "1"],
    ):
        code, line = one_error_line(capsys, args)
        assert code == 2, line
        assert "W/0/mean" in line and "shape" in line
    assert not (tmp_path / "ex").exists()


def test_a_store_chunk_of_10_12_elements_is_refused_without_allocating(fitted, tmp_path, capsys):
    """A decode buffer is one chunk: a chunk shape of 10^12 would be a 8 TB allocation."""
    store = _copy(fitted[0], tmp_path / "s.zarr")
    meta = Path(store) / "train/raw/zarr.json"
    doc = json.loads(meta.read_text())
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [10**12]
    meta.write_text(json.dumps(doc))
    code, line = one_error_line(capsys, ["info", store, "--verify"])
    assert code == 2 and "train/raw/zarr.json: chunk grid" in line and "[1000000000000]" in line


# ----------------------------------------------------------------- case 7: contradictions


def test_a_histogram_with_a_class_beyond_v_is_refused(fitted, tmp_path, capsys):
    store = _copy(fitted[0], tmp_path / "s.zarr")
    a = _attrs(store)
    _edit(store, {"hist_train": [*a["hist_train"], 4], "nnz_train": a["nnz_train"] + 4})
    code, line = one_error_line(capsys, ["info", store, "--verify"])
    assert code == 2 and "hist_train" in line and f"{V + 1} counts" in line
    with pytest.raises(StoreError, match="hist_train"):
        open_store(store)


def test_counts_that_disagree_with_the_histogram_are_refused(fitted, tmp_path):
    store = _copy(fitted[0], tmp_path / "s.zarr")
    _edit(store, {"nnz_test": _attrs(store)["nnz_test"] + 1})
    with pytest.raises(StoreError, match="hist_test.*summing to nnz_test"):
        open_store(store)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda a: {"delta": [*a["delta"][:3], math.nan, *a["delta"][4:]]}, "delta"),
        (lambda a: {"delta": [0.0, -1.0, *a["delta"][2:]]}, "delta"),
        (lambda a: {"params": {**a["params"], "alpha_W": -1}}, "params.alpha_W"),
        (lambda a: {"params": {**a["params"], "n_components": 0}}, "params.n_components"),
        (lambda a: {"row_bounds": [0, 7, 19]}, "row_bounds"),
        (lambda a: {"theta": [t * 2 for t in a["theta"]]}, "theta"),
        # the store's value rule, which fold-in maps values through (a TypeError there before)
        (lambda a: {"store": {**a["store"], "binarize": {}}}, "store.binarize"),
        (lambda a: {"store": {**a["store"], "binarize": ""}}, "store.binarize"),
        (lambda a: {"store": {**a["store"], "binarize_on": [1]}}, "store.binarize_on"),
    ],
)
def test_a_model_header_contradiction_is_one_line_naming_the_field(
    fitted, tmp_path, capsys, change, field
):
    """delta[3] = NaN gave a NaN log-likelihood with exit 0, alpha_W = -1 negative fold-in
    factors: now each is refused on opening, by every reader."""
    model = _copy(fitted[1], tmp_path / "m.zarr")
    _edit(model, change(_attrs(model)))
    code, line = one_error_line(capsys, ["evaluate", fitted[0], model])
    assert code == 2 and model in line and f"attribute {field} must be" in line
    with pytest.raises(StoreError, match=f"attribute {field} must be"):
        OrdNMF.load(model).fold_in_users([[0, 1]], [[1, 3]])


def test_more_or_fewer_ids_than_rows_of_w_are_refused(fitted, tmp_path, capsys):
    """60 user ids for the model's 20 users were cut silently by export (fewer: ArrowInvalid,
    an IndexError in similar_users)."""
    for n in (60, 12):
        model = _copy(fitted[1], tmp_path / f"m{n}.zarr")
        group = zarr.open_group(model, mode="a")
        del group["users"]["ids"]
        write_array(group["users"], "ids", np.arange(n, dtype=np.int64))
        code, line = one_error_line(capsys, ["export", model, "--out", str(tmp_path / f"e{n}")])
        assert code == 2 and f"users/ids holds {n} ids for the model's 20 users" in line
        with pytest.raises(StoreError, match=f"holds {n} ids"):
            OrdNMF.load(model).similar_users([0], n=2)


# ------------------------------------------------------------------ random header mutations

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def _mutation(attrs: dict[str, Any]):
    """A field of ``attrs`` (or of a table in it) and a random value for it, or the field
    dropped: ``(key, inner key or None, value or ...)``."""
    tables = [k for k, v in attrs.items() if isinstance(v, dict) and v]
    near = st.sampled_from(sorted(attrs)).flatmap(
        lambda k: st.tuples(st.just(k), st.none(), _nearby(attrs[k]) | _JSON | st.just(...))
    )
    if not tables:
        return near
    inner = st.sampled_from(sorted(tables)).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.sampled_from(sorted(attrs[k])),
            _JSON | st.just(...),
        )
    )
    return near | inner


def _nearby(value: Any):
    """Values close to a valid one: a number off by a little or a lot, a list one longer or
    shorter or with one entry changed."""
    if isinstance(value, bool) or value is None:
        return st.just(not value)
    if isinstance(value, int | float):
        return st.sampled_from([value + 1, value - 1, -value, value * 10**9, math.nan, 0])
    if isinstance(value, list) and value:
        return st.one_of(
            st.just(value[:-1]),
            st.just([*value, value[-1]]),
            st.integers(0, len(value) - 1).flatmap(
                lambda j: _JSON.map(lambda x: [*value[:j], x, *value[j + 1 :]])
            ),
        )
    return _JSON


def _apply(attrs: dict[str, Any], mutation: tuple) -> dict[str, Any]:
    key, inner, value = mutation
    out = json.loads(json.dumps(attrs))
    target = out if inner is None else out[key]
    name = key if inner is None else inner
    if value is ...:
        target.pop(name, None)
    else:
        target[name] = value
    return out


def _one_line(exc: BaseException) -> None:
    assert isinstance(exc, InputError), repr(exc)
    assert "\n" not in str(exc)


MUTATIONS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@MUTATIONS
@given(data=st.data())
def test_any_store_header_mutation_is_an_error_or_the_same_blocks(fitted, tmp_path, data):
    store = str(tmp_path / "s.zarr")
    if not Path(store).exists():
        _copy(fitted[0], Path(store))
    original = _attrs(store)
    want = _blocks(store)
    mutation = data.draw(_mutation(original))
    _set_attrs(store, _apply(original, mutation))
    try:
        got = _blocks(store)
    except Exception as exc:  # noqa: BLE001 - which one is what is tested
        _one_line(exc)
    else:
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    finally:
        _set_attrs(store, original)


def _blocks(store: str) -> list[tuple[np.ndarray, ...]]:
    info = open_store(store)
    n_r, n_c = info.grid
    out = []
    for split in info.splits:
        for r in range(n_r):
            for c in range(n_c):
                b = read_block(store, split, r, c)
                out.append((b.indptr, b.cols, b.y, b.raw))
    return out


def _set_attrs(node: str, attrs: dict[str, Any]) -> None:
    meta = Path(node) / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"] = attrs
    meta.write_text(json.dumps(doc))


@MUTATIONS
@given(data=st.data())
def test_any_model_header_mutation_is_an_error_or_a_finite_answer(fitted, tmp_path, data):
    """Recommendations depend on the factors and the training items only: after a mutation
    they are those of the intact model, or the model is refused in one line; a fold-in gives
    finite nonnegative factors or the refusal."""
    model = str(tmp_path / "m.zarr")
    if not Path(model).exists():
        _copy(fitted[1], Path(model))
    original = _attrs(model)
    want = _answers(model)
    mutation = data.draw(_mutation(original))
    _set_attrs(model, _apply(original, mutation))
    try:
        recs, w = _answers(model)
    except Exception as exc:  # noqa: BLE001 - which one is what is tested
        _one_line(exc)
    else:
        assert recs == want[0]
        assert np.all(np.isfinite(w)) and w.min() >= 0
    finally:
        _set_attrs(model, original)


def _answers(model: str) -> tuple[dict, np.ndarray]:
    est = OrdNMF.load(model)
    recs = est.recommend([0, 7, 19], n=3)
    w = est.fold_in_users([[0, 3, 9]], [[1, 2, 3]], max_iter=20)
    return recs, w


def test_the_api_readers_refuse_a_damaged_header_as_the_commands_do(fitted, tmp_path):
    model = _copy(fitted[1], tmp_path / "m.zarr")
    _edit(model, {"delta": [0.0, math.inf, 1.0, 1.0]})
    for read in (
        lambda: evaluate(fitted[0], model),
        lambda: export(model, tmp_path / "ex"),
    ):
        with pytest.raises(StoreError, match="attribute delta must be"):
            read()


# ------------------------------------------------------------- one writer: ModelHeader.from_fit


@dataclass
class _State:
    """A fit's end as the engine reports it (the fields ``ModelHeader.from_fit`` records)."""

    params: Any
    elbo: list[float] = field(default_factory=lambda: [-3.0, -2.0])
    passes: int = 2
    extrapolations: list[int] = field(default_factory=lambda: [0, 0])
    converged: bool = False
    stop_reason: str = "max_iter"
    best_iteration: int = 2
    validation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_iter(self) -> int:
        return len(self.elbo)


def _from_fit(store: str, states: list[_State], where: str) -> ModelHeader:
    info = open_store(store)
    return ModelHeader.from_fit(
        model="OrdNMF",
        family=OrdinalFamily(tuple(int(n) for n in info.hist_train)),
        params=OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).get_params(),
        info=info,
        fingerprint=store_fingerprint(store),
        states=states,
        validation=None,
        runs=[],
        warm_start=False,
        init_model=None,
        cache_blocks=True,
        selection=None,
        where=where,
    )


def test_a_fit_header_is_written_in_the_keys_and_order_of_the_saved_model(fitted, tmp_path):
    store, model = fitted
    saved = _attrs(model)
    delta = np.asarray(saved["delta"])
    header = _from_fit(store, [_State(delta)], str(tmp_path / "m.zarr"))
    attrs = header.to_attrs()
    assert list(attrs) == list(saved)  # what save_model wrote, key for key
    for key in ("model", "family", "params", "delta", "theta", "store", "row_bounds", "kind"):
        assert attrs[key] == saved[key], key
    assert header.n_components == K and header.n_members == 1 and header.delta is not None
    two = _from_fit(store, [_State(delta), _State(delta, elbo=[-1.0])], str(tmp_path / "e"))
    law = {"delta": saved["delta"], "theta": saved["theta"]}
    assert two.n_members == 2 and two.to_attrs()["members"] == [law, law]
    assert (two.to_attrs()["n_iter"], two.to_attrs()["elbo"]) == (2, [])


def test_a_fit_header_its_readers_would_refuse_is_refused_before_it_is_written(fitted, tmp_path):
    store, model = fitted
    delta = np.asarray(_attrs(model)["delta"])
    delta[1] = -1.0  # a negative decrement: no thresholds
    with pytest.raises(StoreError, match="delta"):
        _from_fit(store, [_State(delta)], str(tmp_path / "m.zarr"))
    assert not (tmp_path / "m.zarr").exists()
