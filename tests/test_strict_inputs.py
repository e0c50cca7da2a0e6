"""Ids and arguments are read strictly (issue 38, cases 11-14 and 18): text becomes an integer
id only in its canonical decimal form (ordnmf_dask/store/idmap.py), a bare string where a list
of ids belongs is a TypeError, missing ids are refused in every input kind, the numeric
arguments of fold-in are checked by the parameter table (ordnmf_dask/params.py), a complex
matrix is refused, and the messages name what the user gave."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from conftest import dense_split, store_from_dense, synthetic_ordinal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_errors import one_error_line

from ordnmf_dask import OrdNMF, fold_in, ingest, ingest_arrays, recommend, recommend_for
from ordnmf_dask.errors import InputError
from ordnmf_dask.postfit.serving import id_map
from ordnmf_dask.sources.filtering import encode_ids
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.store import idmap

K = 2


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[str, str]:
    """A store of 20 users and 15 items with integer ids 0..19, 0..14, and a model of it."""
    where = tmp_path_factory.mktemp("strict")
    train, test = dense_split(synthetic_ordinal(20, 15, 3, seed=4))
    store = store_from_dense(where / "s.zarr", train, test, 3, (2, 2))
    model = OrdNMF(K, max_iter=3, executor="inprocess", n_members=1).fit(
        store, out=where / "m.zarr"
    )
    return store.path, model.model_path_


# ------------------------------------------------------------- case 11: canonical integer ids


@pytest.mark.parametrize("text", ["1_0", "١٠", "+10", "010", "-0", "1e1", "0x0a"])
def test_only_the_canonical_text_of_an_integer_names_it(fitted, text):
    """int('1_0') == int('١٠') == 10: each answered for user 10; now each is unknown."""
    est = OrdNMF.load(fitted[1])
    assert list(est.recommend(["10", 10, " 10 ", "10.0"], n=2)) == ["10", 10, " 10 ", "10.0"]
    with pytest.raises(InputError, match="unknown user id"):
        est.recommend([text], n=2)
    with pytest.raises(InputError, match="unknown user id"):
        est.score([text], ["1"])
    with pytest.raises(InputError, match="unknown user id"):
        recommend(fitted[0], fitted[1], users=[text], n=2, client=None)


def test_the_command_line_reads_ids_as_the_api_does(fitted, capsys):
    code, line = one_error_line(capsys, ["recommend", fitted[0], fitted[1], "--users", "1_0"])
    assert code == 2 and "unknown user id '1_0'" in line


# ----------------------------------------------------------- case 12: a string is not a list


def test_a_bare_string_where_a_list_of_ids_belongs_is_a_type_error(fitted):
    """exclude=['12'] left out items 1 and 2, fold_in_users(['12'], ...) folded in '1', '2'."""
    est = OrdNMF.load(fitted[1])
    w = est.fold_in_users([[1, 2]], [[3, 1]])
    calls = {
        "exclude[0]": lambda: est.recommend_for(w, 5, exclude=["12"]),
        "items[0]": lambda: est.fold_in_users(["12"], [[5, 7]]),
        "user_ids": lambda: est.recommend("12", 2),
        "item_ids": lambda: est.similar_items("3", 2),
        "user_ids ": lambda: est.similar_users(3, 2),
        "user_ids  ": lambda: est.score("1", ["2"]),
        "exclude ": lambda: est.recommend(["1"], 2, exclude="12"),
        "exclude_items[0]": lambda: recommend_for(fitted[1], w, ["12"], 3),
        "items[0] ": lambda: fold_in(fitted[1], ["12"], [[5, 7]]),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=re.escape(f"{name.strip()} must be a list")):
            call()
    # the lists themselves are read as before
    assert list(est.recommend_for(w, 5, exclude=[[12]])) == [0]


# --------------------------------------------------------------- case 13: missing ids refused


@pytest.mark.parametrize(
    "users",
    [
        np.array([0, None, 2], dtype=object),
        np.array([0, np.nan, 2], dtype=object),
        np.array(["a", pd.NA, "c"], dtype=object),
        np.array(["2024-01-01", "NaT", "2024-01-03"], dtype="datetime64[D]"),
        [0, None, 2],
    ],
)
def test_a_missing_id_in_arrays_is_refused_naming_the_row(tmp_path, users):
    """fit((users_with_None, items, values)) made a user 'None', an object array with np.nan a
    user 'nan' (a DataFrame with the same gap is refused)."""
    data = (users, np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(InputError, match=r"input arrays, row 1: user id is missing"):
        ingest_arrays(*data, tmp_path / "s.zarr")
    with pytest.raises(InputError, match=r"row 1: user id is missing"):
        OrdNMF(1, executor="inprocess", n_members=1).fit(data)
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("missing", [None, math.nan, np.datetime64("NaT"), pd.NA, pd.NaT])
def test_a_missing_id_is_no_id_in_lookups(fitted, missing):
    est = OrdNMF.load(fitted[1])
    for call in (
        lambda: est.recommend([1, missing], 2),
        lambda: est.score([missing], [1]),
        lambda: est.fold_in_users([[1, missing]], [[1, 2]]),
        lambda: est.similar_items([missing], 2),
    ):
        with pytest.raises(InputError, match="names no id|is missing"):
            call()


# -------------------------------------------------------- case 14: arguments and complex data


@pytest.mark.parametrize(
    ("setting", "rule"),
    [
        ({"tol": math.nan}, "tol must be a finite number > 0"),
        ({"tol": -1}, "tol must be a finite number > 0"),
        ({"tol": math.inf}, "tol must be a finite number > 0"),
        ({"max_iter": 0}, "max_iter must be an integer >= 1"),
        ({"max_iter": -5}, "max_iter must be an integer >= 1"),
        ({"max_iter": 2.5}, "max_iter must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
    ],
)
def test_fold_in_arguments_are_range_checked(fitted, setting, rule):
    """tol=nan stopped after one step; tol=-1, max_iter=0 and -5 were accepted."""
    est = OrdNMF.load(fitted[1])
    with pytest.raises(InputError, match=rule):
        est.fold_in_users([[1, 2]], [[3, 1]], **setting)
    with pytest.raises(InputError, match=rule):
        est.fold_in_items([[1, 2]], [[3, 1]], **setting)
    with pytest.raises(InputError, match=rule):
        fold_in(fitted[1], [[1, 2]], [[3, 1]], **setting)


def test_a_complex_matrix_is_refused_not_cut_to_its_real_part(tmp_path):
    m = sp.csr_matrix(np.array([[1 + 2j, 0, 2], [0, 3, 1], [2, 0, 1j]]))
    with pytest.raises(InputError, match="input matrix: a complex matrix"):
        OrdNMF(1, executor="inprocess", n_members=1).fit(m)
    with pytest.raises(InputError, match="complex values"):
        ingest_arrays([0, 1], [0, 1], np.array([1 + 1j, 2]), tmp_path / "s.zarr")


# ---------------------------------------------------------------- case 18: clear messages


def test_sparse_matrix_errors_name_the_matrix_row_and_column(tmp_path):
    """The stored-entry index was given as "row 4" (the value is at matrix row 6)."""
    m = sp.lil_matrix((20, 8))
    for r, c in [(1, 1), (2, 2), (3, 4), (4, 5), (5, 0)]:
        m[r, c] = 2
    m[6, 3] = np.nan
    with pytest.raises(InputError, match=r"input matrix, row 6, column 3: value nan"):
        ingest(m.tocsr(), tmp_path / "a.zarr")
    dup = sp.coo_matrix(([1.0, 2, 3, 4], ([0, 1, 19, 19], [0, 1, 2, 2])), shape=(20, 3))
    with pytest.raises(InputError, match=r"duplicate \(user 19, item 2\) at input matrix, row 19"):
        ingest(dup, tmp_path / "b.zarr")


def test_a_dataframe_column_mixing_ints_and_strings_is_one_line(tmp_path):
    frame = pd.DataFrame({"user": [1, "a", 3], "item": [1, 2, 3], "value": [1.0, 2.0, 3.0]})
    with pytest.raises(InputError, match=r"input DataFrame: column 'user' mixes values of"):
        ingest(frame, tmp_path / "s.zarr")
    with pytest.raises(InputError, match=r"column 'user' mixes"):
        OrdNMF(1, executor="inprocess", n_members=1).fit(frame)


def test_an_error_about_data_in_memory_names_the_data_not_a_removed_store():
    with pytest.raises(InputError) as err:
        OrdNMF(2, executor="inprocess", n_members=1).fit(sp.csr_matrix(np.array([[1.0, 2, 0, 3]])))
    assert "of the input matrix (1 users x 3 items)" in str(err.value)
    assert "ordnmf-data-" not in str(err.value) and "store.zarr" not in str(err.value)


def test_a_job_file_with_two_warm_starts_is_named(fitted, tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(
        f'[store]\npath = "{fitted[0]}"\n[model]\ninit = "{tmp_path / "x.npz"}"\n'
        f'init_model = "{fitted[1]}"\n[output]\nmodel = "{tmp_path / "out.zarr"}"\n'
    )
    code, line = one_error_line(capsys, ["fit", "--n-members", "1", "--config", str(job)])
    assert code == 2 and f"{job}: [model] init and init_model" in line


def test_folding_in_a_user_without_history_is_no_convergence_failure(fitted, caplog):
    est = OrdNMF.load(fitted[1])
    with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):
        w = est.fold_in_users([[1, 2], []], [[3, 1], []])
    assert w.shape == (2, K) and np.all(np.isfinite(w))
    text = caplog.text
    assert "did not converge" not in text
    assert "1 new users without any interaction (1)" in text


# ------------------------------------------------------------------------ random id strings

_ID_CHARS = st.sampled_from(list("0123456789-+_.eE xa٠١٢٣") + ["\u00e9", "\u0660"])
_IDS = st.lists(
    st.text(_ID_CHARS, min_size=1, max_size=6)
    .map(str.strip)
    .filter(lambda t: t and not re.match(idmap.INTEGRAL_FLOAT, t)),
    min_size=1,
    max_size=12,
    unique=True,
)


@settings(max_examples=200, deadline=None)
@given(ids=_IDS)
def test_raw_id_to_index_to_raw_id_is_the_identity(ids):
    """Ingest's coding and the lookups agree: every raw text maps to one index and back to
    itself, and distinct texts never merge (``1_0``, ``10``, ``+10`` and ``010`` stay apart)."""
    uniques, codes = encode_ids(np.array(ids, dtype=object), Origin.arrays(len(ids)), "user")
    assert len(uniques) == len(ids)  # none merged
    back = [str(x) for x in uniques[codes].tolist()]
    assert back == ids
    integer = uniques.dtype.kind == "i"
    wanted, bad = idmap.coerce(ids, integer)
    assert bad == []
    pos = np.searchsorted(uniques, wanted)
    assert np.array_equal(pos, codes)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ids=_IDS)
def test_a_store_round_trips_random_ids(tmp_path_factory, ids):
    where: Path = tmp_path_factory.mktemp("ids")
    n = len(ids)
    store = ingest_arrays(ids, list(range(n)), [1.0] * n, where / "s.zarr", test_fraction=0.0)
    users = id_map(store.path, "users")
    index = users.index(ids)
    assert len(set(index.tolist())) == n
    assert [str(x) for x in users.raw(index)] == ids
