"""One parameter vocabulary: the API, the job file and the command line take their names,
defaults and rules from ordnmf_dask.params, and the checkpoint fingerprint its model parameters."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import operator
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ordnmf_dask import params
from ordnmf_dask.app import config
from ordnmf_dask.app.parser import build_parser, job_keys, subcommand
from ordnmf_dask.errors import ConfigError, InputError
from ordnmf_dask.estimator import ESTIMATORS, CaviEstimator
from ordnmf_dask.fitting import fit_settings

# flags of `fit` that set no job value: the job file itself, resume / restart, logging
CLI_ONLY = {"help", "config", "resume", "restart", "debug", "quiet"}


def api_defaults(klass: type[CaviEstimator]) -> dict[str, Any]:
    """The defaults of the keyword arguments of ``klass`` and of the classes it passes them to."""
    out: dict[str, Any] = {}
    for k in reversed(klass.__mro__):
        if "__init__" in vars(k) and issubclass(k, CaviEstimator):
            for p in inspect.signature(k.__init__).parameters.values():
                if p.default is not p.empty:
                    out[p.name] = p.default
    return {name: out[name] for name in klass().get_params()}


def toml_defaults(name: str) -> dict[str, Any]:
    return config.estimator_kwargs(config.resolve(None), name)[0]


def cli_defaults(name: str, *flags: str) -> dict[str, Any]:
    args = build_parser().parse_args(["fit", *flags])
    return config.estimator_kwargs(config.resolve(None, config.flag_overrides(vars(args))), name)[0]


def test_the_registry_names_every_estimator():
    assert set(params.MODELS.values()) == set(ESTIMATORS)
    assert config.resolve(None).model.kind in params.MODELS
    fit = subcommand(build_parser(), "fit")
    (kind,) = [a for a in fit._actions if a.dest == "model_kind"]
    assert list(kind.choices) == list(params.MODELS)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_api_toml_and_cli_defaults_are_the_tables(name):
    table = {p: params.DEFAULTS[p] for p in params.accepted(name)}
    assert api_defaults(ESTIMATORS[name]) == table
    assert ESTIMATORS[name]().get_params() == table
    assert toml_defaults(name) == table
    assert cli_defaults(name) == table


# the type hint of a parameter of each kind in the estimators' signatures
HINTS = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "auto": "bool | str",
    "str": "str",
    "path": "str | os.PathLike[str]",
    "ints": "Sequence[int]",
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_constructor_lists_its_parameters_of_the_table(name):
    """No ``**kwargs``: the signature users, help() and the docs see is the table's rows of the
    model, in the table's order, K positional, each with the table's default and the hint of
    its kind. A row added to the table and not to a signature (or the reverse) fails here."""
    first, *rest = list(inspect.signature(ESTIMATORS[name]).parameters.values())
    assert [p.name for p in (first, *rest)] == params.accepted(name)
    assert first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest)
    for p in (first, *rest):
        row = params.PARAMS[p.name]
        assert (type(p.default), p.default) == (type(row.default), row.default), p.name
        assert p.annotation == HINTS[row.kind] + (" | None" if row.optional else ""), p.name


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_parameter_is_declared_as_an_attribute_of_its_type(name):
    """The attributes the constructor keeps are declared on the classes (what a type checker
    reads), each with the hint of its kind; a model's class declares only table rows."""
    declared: dict[str, str] = {}
    for k in reversed(ESTIMATORS[name].__mro__):
        declared.update(vars(k).get("__annotations__", {}))
    assert set(params.accepted(name)) <= set(declared) <= set(params.PARAMS)
    for n in params.accepted(name):
        row = params.PARAMS[n]
        assert declared[n] == HINTS[row.kind] + (" | None" if row.optional else ""), n


def test_each_section_of_settings_has_the_keys_of_its_rows():
    for section, klass in params.SECTION_CLASSES.items():
        rows = [p.key for p in params.PARAMS.values() if p.section == section]
        assert [f.name for f in dataclasses.fields(klass)] == rows, section
    assert list(params.SECTION_CLASSES) == list(params.SECTIONS)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_settings_hold_the_checked_values_by_section(name):
    given = {**ESTIMATORS[name]().get_params(), "work_dir": Path("/w"), "select_components": [3]}
    values = params.validate(given)
    settings = params.settings(name, values)
    assert settings.values() == values and list(settings.values()) == params.accepted(name)
    assert settings.engine.work_dir == "/w" and settings.model.select_components == (3,)
    assert settings.checkpoint.every == values["checkpoint_every"]
    for p in params.PARAMS.values():  # a parameter the model does not take is None
        assert (settings.value(p.name) is None) == (p.name not in values or values[p.name] is None)
    model = {k for k in values if params.PARAMS[k].model}
    assert settings.fingerprinted() == {k: values[k] for k in model}


def test_the_job_sections_are_the_typed_settings_of_the_table():
    cfg = config.resolve(None)
    for section in params.SECTIONS:
        got = getattr(cfg, section)
        assert isinstance(got, params.SECTION_CLASSES[section]), section
        assert {k: getattr(got, k) for k in params.section_defaults(section)} == (
            params.section_defaults(section)
        )
    choice = [f.name for f in dataclasses.fields(config.ModelChoice)]
    keys = [f.name for f in dataclasses.fields(config.ModelSection)]
    assert keys == choice + [f.name for f in dataclasses.fields(params.ModelSettings)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.tol = 1.0  # type: ignore[misc]


def test_a_changed_default_reaches_every_surface(monkeypatch):
    changed = {"alpha_W": 0.7, "checkpoint_every": 3, "cache_blocks": False, "update_p": False}
    # the estimators' signatures read the table when their module is imported: a fresh process
    code = (
        "import json\nfrom dataclasses import replace\nfrom ordnmf_dask import params\n"
        f"for name, value in {changed!r}.items():\n"
        "    params.PARAMS[name] = replace(params.PARAMS[name], default=value)\n"
        "from ordnmf_dask.estimator import DcPF\n"
        "print(json.dumps(DcPF(n_members=1).get_params()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    api = json.loads(done.stdout)
    for name, value in changed.items():
        monkeypatch.setitem(params.PARAMS, name, replace(params.PARAMS[name], default=value))
    for surface in (api, toml_defaults("DcPF"), cli_defaults("DcPF")):
        assert {name: surface[name] for name in changed} == changed
    helps = {a.dest: a.help for a in subcommand(build_parser(), "fit")._actions}
    assert "(default 0.7)" in helps["alpha_W"] and "(default off)" in helps["cache_blocks"]


def test_every_fit_flag_and_job_key_is_a_parameter_or_a_job_setting():
    keys = config.param_keys()
    fit = subcommand(build_parser(), "fit")
    for action in fit._actions:
        if action.dest in params.PARAMS:
            p = params.PARAMS[action.dest]
            assert p.flag in action.option_strings and action.default is None
            assert p.flag == "--" + p.name.lower().replace("_", "-")
        else:
            assert action.dest in config.flag_keys() or action.dest in CLI_ONLY, action.dest
    assert set(params.PARAMS) <= {a.dest for a in fit._actions}
    assert "-k" in next(a for a in fit._actions if a.dest == "n_components").option_strings
    job_only = {f"model.{f.name}" for f in dataclasses.fields(config.ModelChoice)}
    resolved = config.resolve(None).to_dict()
    with_local = config.resolve(None, {"cluster.local.workers": 1}).to_dict()
    for dest, key in job_keys("fit").items():  # each declared key is a setting of the job
        *path, leaf = key.split(".")
        assert leaf in functools.reduce(operator.getitem, path, with_local), key
        assert dest not in params.PARAMS, dest
    for section in params.SECTIONS:
        for key in resolved[section]:
            assert f"{section}.{key}" in set(keys.values()) | job_only, (section, key)
    for name, key in keys.items():
        section, leaf = key.split(".")
        assert params.PARAMS[name].section == section and name.removeprefix(f"{section}_") == leaf
    assert (keys["checkpoint_every"], keys["cache_blocks"]) == (
        "checkpoint.every",
        "engine.cache_blocks",
    )


def test_flags_set_the_parameters_under_their_own_names():
    got = cli_defaults(
        "DcPF",
        "-k",
        "7",
        "--alpha-w",
        "0.5",
        "--cache-blocks",
        "off",
        "--no-update-p",
        "--checkpoint-every",
        "0",
        "--checkpoint-minutes",
        "2",
    )
    assert (got["n_components"], got["alpha_W"], got["cache_blocks"]) == (7, 0.5, False)
    assert (got["update_p"], got["checkpoint_every"], got["checkpoint_minutes"]) == (False, 0, 2)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fit", "--n-members", "1", "--cache-blocks", "yes"])


BAD = [
    ("OrdNMF", "n_components", 0),
    ("OrdNMF", "select_components", [3, 3]),
    ("OrdNMF", "n_components", 2.5),
    ("OrdNMF", "alpha_W", -1.0),
    ("OrdNMF", "alpha_H", float("inf")),
    ("OrdNMF", "tol", 0),
    ("OrdNMF", "max_iter", 0),
    ("OrdNMF", "min_iter", -1),
    ("OrdNMF", "seed", -1),
    ("OrdNMF", "n_init", 0),
    ("OrdNMF", "approx", 1),
    ("BePoF", "threshold", 0),
    ("BePoF", "learn_threshold", "no"),
    ("DcPF", "p", 1.5),
    ("DcPF", "t", 0.0),
    ("DcPF", "update_p", 0),
    ("OrdNMF", "cache_blocks", "on"),
    ("OrdNMF", "work_dir", 3),
    ("OrdNMF", "checkpoint_dir", 3),
    ("OrdNMF", "checkpoint_every", -1),
    ("OrdNMF", "checkpoint_minutes", 0.0),
]


@pytest.mark.parametrize(("estimator", "name", "value"), BAD)
def test_a_bad_value_breaks_the_same_rule_in_the_api_and_the_job_file(
    tmp_path, estimator, name, value
):
    est = ESTIMATORS[estimator](**{name: value})
    with pytest.raises(InputError) as api:
        est.fit(tmp_path / "no-store.zarr")  # refused before the store is opened
    assert str(api.value).startswith(f"{name} must be ")
    section, key = config.param_keys()[name].split(".")
    with pytest.raises(ConfigError) as toml:
        config.build({section: {key: value}}, {}, "job.toml")
    assert str(toml.value) == f"job.toml: key '{key}' in [{section}] " + str(
        api.value
    ).removeprefix(f"{name} ")


RULES = [  # a rule, its text, values it takes, values it refuses
    (params.Integer(1), "an integer >= 1", [1, 7, 10**20], [0, -3, 2.0, True, "1", None]),
    (params.Real(), "a finite number > 0", [1e-300, 2, 0.5], [0, -1.0, float("inf"), False]),
    (params.Real(0.0, 1.0), "a number in [0, 1]", [0, 1, 0.5], [1.5, -0.1, float("nan"), True]),
    (params.Options(("a", "b", "c")), "'a', 'b' or 'c'", ["a", "c"], ["d", "", None, 1]),
    (params.Options(("a",)), "'a'", ["a"], ["b"]),
    (params.Boolean(), "a boolean", [True, False], [0, 1, "yes", None]),
    (params.AutoBoolean(), "True, False or 'auto'", [True, False, "auto"], [1, 0, "on", None]),
    (params.Path(), "a path", ["/x", Path("x")], [3, None, b"x"]),
    (params.Ranks(), "a non-empty list of distinct integers >= 1", [[1, 3], (2,)], [[], [2, 2]]),
    (
        params.Levels(),
        "a non-empty list of distinct integers",
        [[0, 11], (2,)],
        [[], [2, 2], [1.5]],
    ),
]


@pytest.mark.parametrize(("rule", "text", "good", "bad"), RULES)
def test_a_rule_checks_values_and_writes_its_message(rule, text, good, bad):
    assert str(rule) == text
    assert all(rule.ok(v) for v in good) and not any(rule.ok(v) for v in bad)


def test_every_row_says_its_rule_in_the_message():
    for name, p in params.PARAMS.items():
        none = " (or None)" if p.optional else ""
        assert params.problem(name, {}) == f"must be {p.rule}{none}, got {{}}"


def _other(p: params.Param) -> Any:
    """A valid value of ``p`` other than its default."""
    return {
        "int": lambda d: d + 2,
        "float": lambda d: 0.25 if d is None else d / 2,
        "bool": lambda d: not d,
        "auto": lambda d: False,
        "str": lambda d: next(
            w for w in ("inprocess", "loglik", "cavi", "squarem", "svd") if p.rule.ok(w) and w != d
        ),
        "path": lambda d: "/elsewhere",
        "ints": lambda d: (2, 4),
    }[p.kind](p.default)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_the_fingerprint_covers_exactly_the_model_parameters(name):
    klass = ESTIMATORS[name]

    def settings(**kw: Any) -> dict[str, Any]:
        values = params.settings(name, params.validate(klass(**kw).get_params()))
        return fit_settings(values, None, values.model.seed)

    base = settings()
    model = {n for n in params.accepted(name) if params.PARAMS[n].model}
    assert set(base) == model | {"model", "warm_start"}
    for n in params.accepted(name):
        p = params.PARAMS[n]
        changed = settings(**{n: _other(p)})
        assert (changed != base) == p.model, n
    assert {p.name for p in params.PARAMS.values() if not p.model} == {
        "max_iter",
        "n_init",
        "n_members",
        "select_components",
        "cache_blocks",
        "executor",
        "work_dir",
        "checkpoint_dir",
        "checkpoint_every",
        "checkpoint_minutes",
        "validation_every",
        "validation_patience",
        "validation_window",
        "validation_metric",
        "validation_k",
        "validation_s",
    }


def _command_functions(command: str) -> tuple[list[Any], set[str]]:
    """The API functions that take the arguments of ``command``'s table, and the rows that the
    command line alone takes (how it prints its table, what it prints)."""
    from ordnmf_dask.datasets.synth import plan_synth, synth
    from ordnmf_dask.postfit.evaluate import evaluate
    from ordnmf_dask.postfit.export import export
    from ordnmf_dask.postfit.pairs import predict_pairs
    from ordnmf_dask.postfit.recommend import recommend
    from ordnmf_dask.sources.ingest import ingest
    from ordnmf_dask.sources.options import plan_ingest
    from ordnmf_dask.tuning.search import tune

    cli = {"format", "factors"}
    return {
        "synth": ([synth, plan_synth], cli),
        "evaluate": ([evaluate], cli),
        "ingest": ([ingest, plan_ingest], cli),
        "tune": ([tune], cli),
        "recommend": ([recommend], cli),
        "export": ([export], cli),
        "predict": ([predict_pairs], cli),
    }.get(command, ([], cli))


def _signature_defaults(function: Any) -> dict[str, Any]:
    """Keyword -> default of ``function``, its ``**options: Unpack[IngestOptions]`` as
    ``INGEST_DEFAULTS`` (what ingest completes them with)."""
    from ordnmf_dask.sources.options import INGEST_DEFAULTS

    signature = inspect.signature(function).parameters
    defaults = {name: p.default for name, p in signature.items() if p.kind != p.VAR_KEYWORD}
    if any(p.kind == p.VAR_KEYWORD for p in signature.values()):
        defaults.update(INGEST_DEFAULTS)
    return defaults


@pytest.mark.parametrize("command", sorted(params.COMMAND_PARAMS))
def test_a_commands_signatures_and_flags_are_its_table(command):
    """The API functions of a command take the rows of its table with their defaults (but
    those of the command line alone), and the command's flags are the rows that have flags
    (and its own I/O and cluster flags)."""
    table = params.COMMAND_PARAMS[command]
    functions, cli_only = _command_functions(command)
    for function in functions:
        signature = _signature_defaults(function)
        assert set(table) - cli_only <= set(signature), function.__name__
        for name, row in table.items():
            if name in cli_only:
                continue
            want = inspect.Parameter.empty if row.default is params.REQUIRED else row.default
            assert signature[name] == want, (function.__name__, name)
    flags = {a.dest: a for a in subcommand(build_parser(), command)._actions}
    for name, row in table.items():
        if not row.options:
            # an API-only row (synth's rate_w, rate_h), or one whose flag is the estimator
            # parameter's (tune's max_iter: --max-iter, and [model] max_iter of --config)
            given = flags.get(name)
            assert given is None or tuple(given.option_strings) == params.PARAMS[name].options
            continue
        action = flags[name]
        assert tuple(action.option_strings) == row.options and action.help.startswith(row.doc)
        assert action.required == (row.default is params.REQUIRED), name
        if row.default is not params.REQUIRED:
            assert action.default == row.default, name
        if isinstance(row.rule, params.Options):
            assert tuple(action.choices) == row.rule.words, name


@pytest.mark.parametrize("command", ["ingest", "synth", "tune", "fit", "evaluate"])
def test_a_commands_docstring_lists_its_table(command):
    from ordnmf_dask.datasets.synth import synth
    from ordnmf_dask.postfit.evaluate import evaluate
    from ordnmf_dask.sources.ingest import ingest
    from ordnmf_dask.tuning.search import tune

    function = {
        "ingest": ingest,
        "synth": synth,
        "tune": tune,
        "fit": CaviEstimator.fit,
        "evaluate": evaluate,
    }[command]
    text = " ".join((function.__doc__ or "").split())
    for name, row in params.COMMAND_PARAMS[command].items():
        assert f"{name} : {' '.join(row.doc.split())}" in text, name
    assert "<the rows" not in text


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"min_count": -1}, "ingest: min_count must be an integer >= 0, got -1"),
        ({"min_count": 2.0}, "ingest: min_count must be an integer >= 0, got 2.0"),
        ({"seed": True}, "ingest: seed must be an integer >= 0, got True"),
        ({"binarize": float("nan")}, "ingest: binarize must be a finite number (or None), got nan"),
        ({"grid": (2, 0)}, "ingest: grid must be a pair of integers >= 1 (or None), got (2, 0)"),
        ({"overwrite": "yes"}, "ingest: overwrite must be a boolean, got 'yes'"),
        ({"chunk_bytes": 1.5}, "ingest: chunk_bytes must be an integer >= 1, got 1.5"),
    ],
)
def test_ingest_options_are_checked_by_their_rows_before_any_input_is_read(tmp_path, change, said):
    from ordnmf_dask.sources.options import plan_ingest

    with pytest.raises(InputError) as caught:  # the input does not exist: the rows come first
        plan_ingest(tmp_path / "r.csv", tmp_path / "s.zarr", **change)
    assert str(caught.value) == said
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"n_users": 0}, "synth: n_users must be an integer >= 1, got 0"),
        ({"n_classes": 300}, "synth: n_classes must be an integer in [1, 255], got 300"),
        ({"rate_h": 0.0}, "synth: rate_h must be a finite number > 0, got 0.0"),
        ({"test_fraction": 1.0}, "synth: test_fraction must be a number in [0, 1), got 1.0"),
    ],
)
def test_synth_arguments_are_checked_by_their_rows(tmp_path, change, said):
    from ordnmf_dask.datasets.synth import plan_synth

    given = {"n_users": 50, "n_items": 40, "nnz": 500, "n_components": 2, **change}
    with pytest.raises(InputError) as caught:
        plan_synth(tmp_path / "s.zarr", **given)
    assert str(caught.value) == said
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"k": 0}, "evaluate: k must be an integer >= 1, got 0"),
        ({"user_fraction": 0.0}, "evaluate: user_fraction must be a number in (0, 1], got 0.0"),
        ({"levels": []}, "evaluate: levels must be a non-empty list of distinct integers "),
        ({"levels": [2, 2]}, "evaluate: levels must be a non-empty list of distinct integers "),
        ({"posterior": "mode"}, "evaluate: posterior must be 'mean' or 'gamma', got 'mode'"),
    ],
)
def test_evaluate_arguments_are_checked_by_their_rows_before_any_store_is_read(
    tmp_path, change, said
):
    from ordnmf_dask.postfit.evaluate import evaluate

    with pytest.raises(InputError) as caught:  # neither path exists: the rows come first
        evaluate(tmp_path / "s.zarr", tmp_path / "m.zarr", **change)
    assert str(caught.value).startswith(said.rstrip())
