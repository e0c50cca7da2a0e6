"""A model used with a store other than the one it was fitted on (another split of the same
ratings: the same shape, other test pairs) is refused by evaluate, recommend and the other
post-fit steps unless allowed (``allow_other_store=True``, ``--allow-other-store``)."""

from __future__ import annotations

import numpy as np
import pytest

from ordnmf_dask import OrdNMF, evaluate, export, fold_in, posterior_predictive, recommend
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore.model import store_fingerprint
from ordnmf_dask.postfit import serving
from ordnmf_dask.store.blocks import open_store, read_ids


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same ratings ingested with split seeds 0 and 1 (one block each, so that only the
    split differs), and a model fitted in-process on the seed-0 store."""
    where = tmp_path_factory.mktemp("o")
    rng = np.random.default_rng(3)
    u, i = np.nonzero(rng.random((30, 20)) < 0.5)
    path = where / "ratings.csv"
    path.write_text(
        "".join(f"{a},{b},{c}\n" for a, b, c in zip(u, i, rng.integers(1, 6, len(u)), strict=True))
    )
    for seed in (0, 1):
        assert (
            main(
                [
                    "ingest",
                    str(path),
                    "--out",
                    str(where / f"s{seed}.zarr"),
                    "--ratings",
                    "integer",
                    "--seed",
                    str(seed),
                    "--grid",
                    "1,1",
                ]
            )
            == 0
        )
    s0, s1 = (open_store(where / f"s{seed}.zarr") for seed in (0, 1))
    model = where / "m.zarr"
    OrdNMF(2, max_iter=3, executor="inprocess", n_members=1).fit(s0, out=model)
    return s0, s1, str(model)


def test_another_split_has_another_fingerprint(stores):
    s0, s1, _ = stores
    assert (s0.n_users, s0.n_items, s0.row_bounds.tolist(), s0.col_bounds.tolist()) == (
        s1.n_users,
        s1.n_items,
        s1.row_bounds.tolist(),
        s1.col_bounds.tolist(),
    )
    assert store_fingerprint(s0.path) != store_fingerprint(s1.path)


def test_the_api_refuses_a_model_of_another_split_unless_allowed(stores, tmp_path):
    s0, s1, model = stores
    users = read_ids(s0.path, "users")[:2].tolist()
    items = read_ids(s0.path, "items")[:2].tolist()
    calls = {
        "evaluate": lambda **kw: evaluate(s1.path, model, **kw),
        "recommend": lambda **kw: recommend(s1.path, model, users=users, n=3, **kw),
        "export": lambda **kw: export(
            model, tmp_path / f"e{len(kw)}", what=["recommendations"], store=s1.path, **kw
        ),
        "fold_in": lambda **kw: fold_in(model, [items], [[3, 1]], store=s1.path, **kw),
        "posterior_predictive": lambda **kw: posterior_predictive(s1.path, model, n_pairs=50, **kw),
        "serving": lambda **kw: serving.server(model, s1.path, **kw).recommend(users, 3),
    }
    for name, call in calls.items():
        with pytest.raises(InputError) as err:
            call()
        msg = str(err.value)
        assert "\n" not in msg and model in msg and s0.path in msg and s1.path in msg, name
        assert "allow_other_store=True" in msg, name
        call(allow_other_store=True)  # runs
    assert not (tmp_path / "e0").exists()
    ok = evaluate(s0.path, model)  # the model's own store
    assert ok["nnz_test"] == s0.nnz_test
    assert recommend(s0.path, model, users=users, n=3).keys() == set(users)


def test_the_command_line_refuses_with_exit_2_naming_the_flag(stores, capsys):
    s0, s1, model = stores
    user = str(read_ids(s0.path, "users")[0])
    for args in (["evaluate", s1.path, model], ["recommend", s1.path, model, "--users", user]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert model in err and s0.path in err and s1.path in err
        assert "--allow-other-store" in err
        assert main([*args, "--allow-other-store"]) == 0
        capsys.readouterr()
    assert main(["evaluate", s0.path, model]) == 0
    assert "NDCG@100" in capsys.readouterr().out
