"""K chosen by validation (``select_components``): tune's search on the validation subset picks
the best-scored candidate, and the model is the plain fit at that K, bitwise."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import poisson_class_store

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError


def _store(path, validation_fraction: float = 0.1):
    return poisson_class_store(path, 200, 120, validation_fraction)


def test_chosen_k_is_the_best_scored_and_the_model_the_plain_fit(tmp_path):
    info = _store(str(tmp_path / "s.zarr"))
    model = OrdNMF(select_components=(1, 3, 12), max_iter=27, n_members=1).fit(info.path)
    sel = model.selection_
    first = {c["n_components"]: c["scores"][0] for c in sel["candidates"]}
    assert sorted(first) == [1, 3, 12] and sel["rungs"] == [3, 9, 27]
    assert sel["chosen"] == max(first, key=first.get)
    assert model.user_factors.shape[1] == sel["chosen"]
    plain = OrdNMF(sel["chosen"], max_iter=27, n_members=1).fit(info.path)
    assert np.array_equal(model.user_factors, plain.user_factors)
    assert np.array_equal(model.item_factors, plain.item_factors)
    assert model.elbo_ == plain.elbo_
    loaded = OrdNMF.load(model.model_path_)  # the search is recorded with the model
    assert loaded.selection_ == sel


def test_needs_a_validation_subset_and_valid_candidates(tmp_path):
    info = _store(str(tmp_path / "s.zarr"), validation_fraction=0.0)
    with pytest.raises(InputError, match="no validation subset"):
        OrdNMF(select_components=(1, 3), n_members=1).fit(info.path, check=True)
    for bad in ((), (3, 3), (0, 2), 5):
        with pytest.raises(InputError, match="select_components"):
            OrdNMF(select_components=bad, n_members=1).fit(info.path, check=True)
    with pytest.raises(InputError, match="min\\(users, items\\)"):
        OrdNMF(select_components=(2, 500), n_members=1).fit(info.path, check=True)


def test_the_flag_and_the_job_file_key_choose_k(tmp_path, capsys):
    info = _store(str(tmp_path / "s.zarr"))
    job = tmp_path / "job.toml"
    job.write_text("[model]\nselect_components = [1, 3]\nmax_iter = 9\n")
    flag = ["--select-components", "1,3", "--max-iter", "9"]
    for i, extra in enumerate([flag, ["--config", str(job)]]):
        out = tmp_path / f"m{i}.zarr"
        assert main(["fit", "--n-members", "1", info.path, "--out", str(out), *extra]) == 0
        sel = OrdNMF.load(out).selection_
        assert [c["n_components"] for c in sel["candidates"]] == [1, 3]
        assert OrdNMF.load(out).user_factors.shape[1] == sel["chosen"]
    with pytest.raises(SystemExit) as usage:
        main(
            [
                "fit",
                "--n-members",
                "1",
                info.path,
                "--out",
                str(tmp_path / "x"),
                "--select-components",
                "1,a",
            ]
        )
    assert usage.value.code == 2
    assert "expected integers joined by commas" in capsys.readouterr().err
