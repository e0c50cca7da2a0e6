"""Every estimator parameter, declared once: name, type, default, rule, doc and where it lives.

The API, the job file and the command line all read this table (:data:`PARAMS`):

- API: the keyword of the estimators (``OrdNMF(alpha_W=0.5)``), whose defaults are
  ``DEFAULTS[name]``; :func:`validate` checks the values of a fit.
- TOML: the key is the API name without its section prefix, in the row's section
  (``checkpoint_every`` -> ``[checkpoint] every``, ``alpha_W`` -> ``[model] alpha_W``); a bad
  value is refused with the same rule (:func:`problem`), naming the file and the key.
- CLI: ``--`` + the API name, ``_`` -> ``-``, lower case (``alpha_W`` -> ``--alpha-w``).

A *model* parameter changes the fitted result and enters the checkpoint fingerprint; the others
are runtime settings (where and how the fit runs, when it checkpoints, how long it may run), with
which a fit resumes from its own checkpoints.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ordnmf_dask.errors import InputError, shown

#: the model registry: job-file / CLI kind -> estimator class name
MODELS = {"ordnmf": "OrdNMF", "bepof": "BePoF", "pf": "PF", "dcpf": "DcPF"}
ALL = frozenset(MODELS.values())
ORDINAL = frozenset({"OrdNMF", "BePoF"})  # the models with a choice of q(n)
BINARY = frozenset({"BePoF", "PF"})
COUNTS = frozenset({"DcPF"})

#: sections of the job file that hold parameters of the table
SECTIONS = ("model", "engine", "checkpoint", "validation")
#: parameters of earlier versions, as saved with their models: new name, or None if dropped
RENAMED: dict[str, str | None] = {"random_state": "seed", "n_workers": None}


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Param:
    """One row of the table. ``kind`` is the value's type: int, float, bool, path (a string or
    os.PathLike, or None), str (one of the words ``rule`` names), or auto (True, False or
    "auto"); ``ok`` the rule, ``rule`` its text
    (after "must be"); ``optional``: None is also accepted (and disables the setting)."""

    name: str
    kind: str
    default: Any
    ok: Callable[[Any], bool]
    rule: str
    doc: str
    section: str
    model: bool
    estimators: frozenset[str] = ALL
    optional: bool = False

    @property
    def key(self) -> str:
        """The job-file key: the name without its section prefix."""
        return self.name.removeprefix(f"{self.section}_")

    @property
    def flag(self) -> str:
        return "--" + self.name.lower().replace("_", "-")


def int_ge(low: int) -> Callable[[Any], bool]:
    """The rule "an integer >= low"."""
    return lambda v: _integer(v) and v >= low


def _ranks(value: Any) -> bool:
    """The rule "a non-empty list of distinct integers >= 1" (candidate values of K)."""
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(_integer(v) and v >= 1 for v in value)
        and len(set(value)) == len(value)
    )


def positive(value: Any) -> bool:
    """The rule "a finite number > 0"."""
    return _number(value) and value > 0


def _rows() -> Iterator[Param]:
    is_bool = lambda v: isinstance(v, bool)  # noqa: E731
    path = lambda v: isinstance(v, str | os.PathLike)  # noqa: E731
    model, engine, checkpoint, validation = SECTIONS
    yield Param(
        "n_components",
        "int",
        50,
        int_ge(1),
        "an integer >= 1",
        "K, the number of latent factors",
        model,
        True,
    )
    yield Param(
        "select_components",
        "ints",
        None,
        _ranks,
        "a non-empty list of distinct integers >= 1",
        "choose K among these candidates by the validation metric (a successive-halving "
        "search on the store's validation subset, then the fit at the chosen K, which replaces "
        "n_components; docs/guide/fitting.md); None: K = n_components",
        model,
        False,
        optional=True,
    )
    yield Param(
        "alpha_W",
        "float",
        0.3,
        positive,
        "a finite number > 0",
        "Gamma prior shape of W (prior rates: empirical Bayes per row)",
        model,
        True,
    )
    yield Param(
        "alpha_H",
        "float",
        0.3,
        positive,
        "a finite number > 0",
        "Gamma prior shape of H (prior rates: empirical Bayes per row)",
        model,
        True,
    )
    yield Param(
        "tol",
        "float",
        1e-5,
        positive,
        "a finite number > 0",
        "stop when the relative ELBO gain per iteration falls below tol (after min_iter; "
        "with optimizer='squarem', the gain averaged over its cycle of 3 iterations)",
        model,
        True,
    )
    yield Param(
        "max_iter",
        "int",
        1000,
        int_ge(1),
        "an integer >= 1",
        "at most this many iterations (ELBO evaluations)",
        model,
        False,
    )
    yield Param(
        "min_iter",
        "int",
        0,
        int_ge(0),
        "an integer >= 0",
        "at least this many iterations before the tol rule may stop the fit",
        model,
        True,
    )
    yield Param(
        "seed",
        "int",
        0,
        int_ge(0),
        "an integer >= 0",
        "seed of the initialization of E[W], E[H] (the Gamma(1, 1) draws, the random "
        "projection of the SVD start, or the subsample and its fit's draws)",
        model,
        True,
    )
    yield Param(
        "optimizer",
        "str",
        "squarem",
        lambda v: v in ("cavi", "squarem"),
        "'cavi' or 'squarem'",
        "'cavi': the paper's coordinate ascent, one iteration after the other; 'squarem': "
        "the same iterations with a safeguarded SQUAREM extrapolation every third one, kept "
        "only when the ELBO does not decrease (same fixed points, fewer passes)",
        model,
        True,
    )
    yield Param(
        "anneal",
        "int",
        0,
        int_ge(0),
        "an integer >= 0",
        "iterations of the annealing schedule: the prior shapes start at 10 x alpha_W, "
        "alpha_H and fall geometrically to them over this many iterations; the bound never "
        "decreases after it. It reaches higher ELBO optima in fewer iterations, which rank "
        "better or worse depending on the data (docs/design.md, 'Better optima'); 0: none, "
        "the paper's path",
        model,
        True,
    )
    yield Param(
        "n_init",
        "int",
        1,
        int_ge(1),
        "an integer >= 1",
        "random restarts (seeds seed, seed + 1, ...): the run with the highest final ELBO is "
        "kept (with start='svd' the restarts differ only by the random projection, with "
        "start='subsample' by the subsample and its fit's draws)",
        model,
        False,
    )
    yield Param(
        "n_members",
        "int",
        4,
        int_ge(1),
        "an integer >= 1",
        "fits averaged into one model (seeds seed, seed + 1, ...), side by side on the "
        "cluster: the model's law of a pair is the mixture of its members' laws (each member "
        "weighted 1/n_members), its ranking score the mean of theirs; 1 is the single fit of "
        'the paper (docs/design.md, "Ensembles")',
        model,
        False,
    )
    yield Param(
        "start",
        "str",
        "random",
        lambda v: v in ("random", "svd", "subsample"),
        "'random', 'svd' or 'subsample'",
        "initial E[W], E[H]: Gamma(1, 1) draws from the seed ('random'), or a nonnegative "
        "start (NNDSVDa) from a rank-K randomized SVD of the training matrix, whose random "
        "projection comes from the seed ('svd'), or a fit of a subsample of the users and "
        "items drawn from the seed, extended to all of them by fold-in, with its Delta (or p) "
        "('subsample')",
        model,
        True,
    )
    yield Param(
        "approx",
        "bool",
        False,
        is_bool,
        "a boolean",
        "q(n) = delta_1 instead of the zero-truncated Poisson",
        model,
        True,
        ORDINAL,
    )
    yield Param(
        "threshold",
        "int",
        1,
        int_ge(1),
        "an integer >= 1",
        "binarize: classes >= threshold become 1",
        model,
        True,
        BINARY,
    )
    yield Param(
        "learn_threshold",
        "bool",
        True,
        is_bool,
        "a boolean",
        "learn theta_0 = Delta_1 (false: fixed at 1, the paper's BePoF)",
        model,
        True,
        BINARY,
    )
    yield Param(
        "p",
        "float",
        0.5,
        lambda v: _number(v) and 0 <= v <= 1,
        "a number in [0, 1]",
        "starting value of the element parameter",
        model,
        True,
        COUNTS,
    )
    yield Param(
        "t",
        "float",
        1.0,
        positive,
        "a finite number > 0",
        "fixed scale of the Poisson rate",
        model,
        True,
        COUNTS,
    )
    yield Param(
        "update_p",
        "bool",
        True,
        is_bool,
        "a boolean",
        "learn p (ignored at the limits 0 and 1)",
        model,
        True,
        COUNTS,
    )
    yield Param(
        "cache_blocks",
        "auto",
        "auto",
        lambda v: v in ("auto", True, False) and (type(v) in (bool, str)),
        "True, False or 'auto'",
        "keep training blocks in worker memory (True), stream them from zarr in every "
        "pass (False), or decide from the workers' memory limits ('auto')",
        engine,
        False,
    )
    yield Param(
        "executor",
        "str",
        "auto",
        lambda v: v in ("auto", "inprocess", "cluster"),
        "'auto', 'inprocess' or 'cluster'",
        "run without a client in this process ('inprocess', threads), on the current "
        "client or a LocalCluster ('cluster'), or in-process when there is no current "
        "client and the data are small ('auto')",
        engine,
        False,
    )
    yield Param(
        "work_dir",
        "path",
        None,
        path,
        "a path",
        "scratch directory visible to all workers (default: a temporary directory)",
        engine,
        False,
        optional=True,
    )
    yield Param(
        "checkpoint_dir",
        "path",
        None,
        path,
        "a path",
        "where checkpoints go, visible to all workers (default: inside work_dir)",
        checkpoint,
        False,
        optional=True,
    )
    yield Param(
        "checkpoint_every",
        "int",
        0,
        int_ge(0),
        "an integer >= 0",
        "also checkpoint after every this many iterations (0: by time alone, checkpoint_minutes)",
        checkpoint,
        False,
    )
    yield Param(
        "checkpoint_minutes",
        "float",
        5.0,
        positive,
        "a finite number > 0",
        "checkpoint when this many minutes have passed since the last one (or the start): "
        "a fit of seconds writes none (None: by count alone, checkpoint_every)",
        checkpoint,
        False,
        optional=True,
    )
    yield Param(
        "validation_every",
        "int",
        5,
        int_ge(0),
        "an integer >= 0",
        "score the store's validation subset every this many iterations and at the "
        "last; the saved state is the best scored one (0: no validation; none without "
        "a validation subset)",
        validation,
        False,
    )
    yield Param(
        "validation_patience",
        "int",
        5,
        int_ge(0),
        "an integer >= 0",
        "stop after this many validation scores in a row without improvement (0: never early)",
        validation,
        False,
    )
    yield Param(
        "validation_window",
        "int",
        1,
        int_ge(1),
        "an integer >= 1",
        "early stopping follows the mean of the last this many validation scores and "
        "keeps the newest state of the best such stretch (1: each score alone)",
        validation,
        False,
    )
    yield Param(
        "validation_metric",
        "str",
        "ndcg",
        lambda v: v in ("ndcg", "loglik"),
        "'ndcg' or 'loglik'",
        "what validation maximizes: NDCG@validation_k at relevance validation_s, or "
        "the mean log-likelihood of the validation nonzeros",
        validation,
        False,
    )
    yield Param(
        "validation_k",
        "int",
        100,
        int_ge(1),
        "an integer >= 1",
        "cut-off k of the validation NDCG@k",
        validation,
        False,
    )
    yield Param(
        "validation_s",
        "int",
        1,
        int_ge(1),
        "an integer >= 1",
        "relevance threshold s of the validation NDCG (class >= s is relevant)",
        validation,
        False,
    )


PARAMS: dict[str, Param] = {p.name: p for p in _rows()}


def _call_rows() -> Iterator[tuple[str, Param]]:
    """The numeric arguments of calls on a fitted model, declared as the estimator's are."""
    for call in ("fold_in",):
        yield (
            call,
            Param(
                "max_iter",
                "int",
                500,
                int_ge(1),
                "an integer >= 1",
                "at most this many updates of each new row",
                call,
                False,
            ),
        )
        yield (
            call,
            Param(
                "tol",
                "float",
                1e-6,
                positive,
                "a finite number > 0",
                "a new row stops when the relative change of its factors falls below tol",
                call,
                False,
            ),
        )
        yield (
            call,
            Param(
                "seed",
                "int",
                None,
                int_ge(0),
                "an integer >= 0",
                "None starts from E[w] = 1, an integer from Gamma(1, 1) draws",
                call,
                False,
                optional=True,
            ),
        )


#: call -> its arguments' rows (``fold_in``: ``fold_in``, ``fold_in_users``, ``fold_in_items``)
def _call_table() -> dict[str, dict[str, Param]]:
    table: dict[str, dict[str, Param]] = {}
    for call, row in _call_rows():
        table.setdefault(call, {})[row.name] = row
    return table


CALL_PARAMS = _call_table()


class _Defaults(Mapping[str, Any]):
    """name -> default, read from :data:`PARAMS` at each lookup."""

    def __getitem__(self, name: str) -> Any:
        return PARAMS[name].default

    def __iter__(self) -> Iterator[str]:
        return iter(PARAMS)

    def __len__(self) -> int:
        return len(PARAMS)


DEFAULTS: Mapping[str, Any] = _Defaults()


def accepted(estimator: str) -> list[str]:
    """The parameters the estimator class named ``estimator`` takes, in table order."""
    return [p.name for p in PARAMS.values() if estimator in p.estimators]


def problem(name: str, value: Any, table: Mapping[str, Param] = PARAMS) -> str | None:
    """What is wrong with ``value`` for parameter ``name`` of ``table`` (default the estimator
    parameters) ("must be ..., got ..."), or None."""
    p = table[name]
    if (value is None and p.optional) or p.ok(value):
        return None
    rule = f"{p.rule} (or None)" if p.optional else p.rule
    return f"must be {rule}, got {shown(value)}"


def convert(name: str, value: Any, table: Mapping[str, Param] = PARAMS) -> Any:
    """A valid ``value`` as the engine takes it: a plain int, float or str."""
    kind = table[name].kind
    if value is None or kind in ("bool", "auto", "str"):
        return value
    if kind == "ints":
        return tuple(int(v) for v in value)
    return {"int": int, "float": float, "path": os.fspath}[kind](value)


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (parameter name -> value) checked and converted; InputError naming the first
    parameter that breaks its rule."""
    for name, value in values.items():
        wrong = problem(name, value)
        if wrong is not None:
            raise InputError(f"{name} {wrong}")
    return {name: convert(name, value) for name, value in values.items()}


def validate_call(call: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``values`` of ``call`` (a key of :data:`CALL_PARAMS`) checked and
    converted; InputError naming the first that breaks its rule."""
    table = CALL_PARAMS[call]
    for name, value in values.items():
        wrong = problem(name, value, table)
        if wrong is not None:
            raise InputError(f"{call}: {name} {wrong}")
    return {name: convert(name, value, table) for name, value in values.items()}
