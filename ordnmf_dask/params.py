"""Every estimator parameter, declared once: name, rule (a :class:`Rule`, which gives the type
and writes the message), default, doc and where it lives.

The API, the job file and the command line all read this table (:data:`PARAMS`):

- API: the keyword of the estimators (``OrdNMF(alpha_W=0.5)``), whose signatures list the rows
  of their model with the defaults ``DEFAULTS[name]`` (tests/test_params.py checks both);
  :func:`validate` checks the values of a fit.
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
import re
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ordnmf_dask.errors import InputError, shown

_F = TypeVar("_F", bound=Callable[..., Any])

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


class Rule(ABC):
    """What the values of a parameter must be: :meth:`ok` checks one, ``str(rule)`` says it
    (after "must be"), and ``kind`` is the type the job file and the command line read (int,
    float, bool, path, str, auto, ints). Each rule writes its own message, in the spirit of
    scikit-learn's ``Interval`` and ``StrOptions``."""

    kind: ClassVar[str]

    @abstractmethod
    def ok(self, value: Any) -> bool: ...


@dataclass(frozen=True)
class Integer(Rule):
    """An integer (not a bool) >= ``low`` (and <= ``high`` unless None)."""

    low: int
    high: int | None = None
    kind: ClassVar[str] = "int"

    def ok(self, value: Any) -> bool:
        return _integer(value) and self.low <= value and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"an integer >= {self.low}"
        return f"an integer in [{self.low}, {self.high}]"


@dataclass(frozen=True)
class Real(Rule):
    """A finite number (not a bool) > ``low`` (``high`` None), or in the interval from ``low`` to
    ``high`` whose ends ``closed`` says belong to it: "both", "left" or "right" (as
    scikit-learn's ``Interval``)."""

    low: float = 0.0
    high: float | None = None
    closed: str = "both"
    kind: ClassVar[str] = "float"

    def ok(self, value: Any) -> bool:
        if not _number(value):
            return False
        if self.high is None:
            return bool(value > self.low)
        left = value >= self.low if self.closed in ("both", "left") else value > self.low
        right = value <= self.high if self.closed in ("both", "right") else value < self.high
        return bool(left and right)

    def __str__(self) -> str:
        if self.high is None:
            return f"a finite number > {self.low:g}"
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        return f"a number in {left}{self.low:g}, {self.high:g}{right}"


@dataclass(frozen=True)
class Number(Rule):
    """A finite number (not a bool), of any sign."""

    kind: ClassVar[str] = "float"

    def ok(self, value: Any) -> bool:
        return _number(value)

    def __str__(self) -> str:
        return "a finite number"


@dataclass(frozen=True)
class Pair(Rule):
    """Two integers >= 1 (a list or a tuple): a block grid R, C."""

    kind: ClassVar[str] = "ints"

    def ok(self, value: Any) -> bool:
        return (
            isinstance(value, list | tuple)
            and len(value) == 2
            and all(_integer(v) and v >= 1 for v in value)
        )

    def __str__(self) -> str:
        return "a pair of integers >= 1"


@dataclass(frozen=True)
class Counts(Rule):
    """``"paper"`` or a sequence (a list, tuple or array) of numbers: count thresholds, whose
    number, order and range the value rule checks (``sources.values.check_thresholds``)."""

    kind: ClassVar[str] = "counts"

    def ok(self, value: Any) -> bool:
        if isinstance(value, str):
            return value == "paper"
        if not (hasattr(value, "__len__") and hasattr(value, "__iter__")):
            return False
        return all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)

    def __str__(self) -> str:
        return "'paper' or a sequence of numbers"


@dataclass(frozen=True)
class Options(Rule):
    """One of the strings ``words``."""

    words: tuple[str, ...]
    kind: ClassVar[str] = "str"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.words

    def __str__(self) -> str:
        quoted = [repr(w) for w in self.words]
        return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(frozen=True)
class Text(Rule):
    """Any string."""

    kind: ClassVar[str] = "str"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str)

    def __str__(self) -> str:
        return "a string"


@dataclass(frozen=True)
class Boolean(Rule):
    """True or False."""

    kind: ClassVar[str] = "bool"

    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)

    def __str__(self) -> str:
        return "a boolean"


@dataclass(frozen=True)
class AutoBoolean(Rule):
    """True, False or the string "auto" (decided when the fit runs)."""

    kind: ClassVar[str] = "auto"

    def ok(self, value: Any) -> bool:
        return type(value) in (bool, str) and value in ("auto", True, False)

    def __str__(self) -> str:
        return "True, False or 'auto'"


@dataclass(frozen=True)
class Path(Rule):
    """A string or an ``os.PathLike``."""

    kind: ClassVar[str] = "path"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str | os.PathLike)

    def __str__(self) -> str:
        return "a path"


@dataclass(frozen=True)
class Levels(Rule):
    """A non-empty list (or tuple) of distinct integers: relevance thresholds, which the store's
    classes bound (checked against the store, which names its range 1..V)."""

    kind: ClassVar[str] = "ints"

    def ok(self, value: Any) -> bool:
        return (
            isinstance(value, list | tuple)
            and bool(value)
            and all(_integer(v) for v in value)
            and len(set(value)) == len(value)
        )

    def __str__(self) -> str:
        return "a non-empty list of distinct integers"


@dataclass(frozen=True)
class Ranks(Levels):
    """A non-empty list (or tuple) of distinct integers >= 1: candidate values of K."""

    def ok(self, value: Any) -> bool:
        return super().ok(value) and all(v >= 1 for v in value)

    def __str__(self) -> str:
        return "a non-empty list of distinct integers >= 1"


@dataclass(frozen=True)
class Param:
    """One row of the table: the name, the rule its values follow, the default, the doc, the
    section of the job file, whether it is a *model* parameter (it changes the fitted result and
    enters the checkpoint fingerprint), the estimators that take it and whether None is also
    accepted (and disables the setting); a command's row may name its ``flags`` (none: the
    API alone takes it) and their ``metavar``, and have the default :data:`REQUIRED`."""

    name: str
    rule: Rule
    default: Any
    doc: str
    section: str
    model: bool
    estimators: frozenset[str] = ALL
    optional: bool = False
    flags: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def kind(self) -> str:
        """The value's type, as the job file and the command line read it (see :class:`Rule`)."""
        return self.rule.kind

    @property
    def key(self) -> str:
        """The job-file key: the name without its section prefix."""
        return self.name.removeprefix(f"{self.section}_")

    @property
    def flag(self) -> str:
        return "--" + self.name.lower().replace("_", "-")

    @property
    def options(self) -> tuple[str, ...]:
        """The command line's flags of the row: its own ``flags``, else :attr:`flag`."""
        return (self.flag,) if self.flags is None else self.flags


_AT_LEAST_1, _AT_LEAST_0, _POSITIVE = Integer(1), Integer(0), Real()


def _model_rows() -> Iterator[Param]:
    """``[model]``: what the fit computes, and how long it may run."""
    model, at_least_1, at_least_0, positive = "model", _AT_LEAST_1, _AT_LEAST_0, _POSITIVE
    yield Param("n_components", at_least_1, 50, "K, the number of latent factors", model, True)
    yield Param(
        "select_components",
        Ranks(),
        None,
        "choose K among these candidates by the validation metric (a successive-halving "
        "search on the store's validation subset, then the fit at the chosen K, which replaces "
        "n_components; docs/guide/fitting.md); None: K = n_components",
        model,
        False,
        optional=True,
    )
    for side in ("W", "H"):
        doc = f"Gamma prior shape of {side} (prior rates: empirical Bayes per row)"
        yield Param(f"alpha_{side}", positive, 0.3, doc, model, True)
    yield Param(
        "tol",
        positive,
        1e-5,
        "stop when the relative ELBO gain per iteration falls below tol (after min_iter; "
        "with optimizer='squarem', the gain averaged over its cycle of 3 iterations)",
        model,
        True,
    )
    doc = "at most this many iterations (ELBO evaluations)"
    yield Param("max_iter", at_least_1, 1000, doc, model, False)
    doc = "at least this many iterations before the tol rule may stop the fit"
    yield Param("min_iter", at_least_0, 0, doc, model, True)
    yield Param(
        "seed",
        at_least_0,
        0,
        "seed of the initialization of E[W], E[H] (the Gamma(1, 1) draws, the random "
        "projection of the SVD start, or the subsample and its fit's draws)",
        model,
        True,
    )
    yield Param(
        "optimizer",
        Options(("cavi", "squarem")),
        "squarem",
        "'cavi': the paper's coordinate ascent, one iteration after the other; 'squarem': "
        "the same iterations with a safeguarded SQUAREM extrapolation every third one, kept "
        "only when the ELBO does not decrease (same fixed points, fewer passes)",
        model,
        True,
    )
    yield Param(
        "anneal",
        at_least_0,
        0,
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
        at_least_1,
        1,
        "random restarts (seeds seed, seed + 1, ...): the run with the highest final ELBO is "
        "kept (with start='svd' the restarts differ only by the random projection, with "
        "start='subsample' by the subsample and its fit's draws)",
        model,
        False,
    )
    yield Param(
        "n_members",
        at_least_1,
        4,
        "fits averaged into one model (seeds seed, seed + 1, ...), side by side on the "
        "cluster: the model's law of a pair is the mixture of its members' laws (each member "
        "weighted 1/n_members), its ranking score the mean of theirs; 1 is the single fit of "
        'the paper (docs/design.md, "Ensembles")',
        model,
        False,
    )
    yield Param(
        "start",
        Options(("random", "svd", "subsample")),
        "random",
        "initial E[W], E[H]: Gamma(1, 1) draws from the seed ('random'), or a nonnegative "
        "start (NNDSVDa) from a rank-K randomized SVD of the training matrix, whose random "
        "projection comes from the seed ('svd'), or a fit of a subsample of the users and "
        "items drawn from the seed, extended to all of them by fold-in, with its Delta (or p) "
        "('subsample')",
        model,
        True,
    )


def _family_rows() -> Iterator[Param]:
    """``[model]``, the parameters of some families alone (:data:`ORDINAL`, :data:`BINARY`,
    :data:`COUNTS`)."""
    model, at_least_1, positive = "model", _AT_LEAST_1, _POSITIVE
    doc = "q(n) = delta_1 instead of the zero-truncated Poisson"
    yield Param("approx", Boolean(), False, doc, model, True, ORDINAL)
    doc = "binarize: classes >= threshold become 1"
    yield Param("threshold", at_least_1, 1, doc, model, True, BINARY)
    doc = "learn theta_0 = Delta_1 (false: fixed at 1, the paper's BePoF)"
    yield Param("learn_threshold", Boolean(), True, doc, model, True, BINARY)
    doc = "starting value of the element parameter"
    yield Param("p", Real(0.0, 1.0), 0.5, doc, model, True, COUNTS)
    yield Param("t", positive, 1.0, "fixed scale of the Poisson rate", model, True, COUNTS)
    doc = "learn p (ignored at the limits 0 and 1)"
    yield Param("update_p", Boolean(), True, doc, model, True, COUNTS)


def _engine_rows() -> Iterator[Param]:
    """``[engine]``: where and how the fit runs."""
    engine = "engine"
    yield Param(
        "cache_blocks",
        AutoBoolean(),
        "auto",
        "keep training blocks in worker memory (True), stream them from zarr in every "
        "pass (False), or decide from the workers' memory limits ('auto')",
        engine,
        False,
    )
    yield Param(
        "executor",
        Options(("auto", "inprocess", "cluster")),
        "auto",
        "run without a client in this process ('inprocess', threads), on the current "
        "client or a LocalCluster ('cluster'), or in-process when there is no current "
        "client and the data are small ('auto')",
        engine,
        False,
    )
    doc = "scratch directory visible to all workers (default: a temporary directory)"
    yield Param("work_dir", Path(), None, doc, engine, False, optional=True)


def _checkpoint_rows() -> Iterator[Param]:
    """``[checkpoint]``: where and when the fit checkpoints."""
    checkpoint, at_least_0, positive = "checkpoint", _AT_LEAST_0, _POSITIVE
    doc = "where checkpoints go, visible to all workers (default: inside work_dir)"
    yield Param("checkpoint_dir", Path(), None, doc, checkpoint, False, optional=True)
    yield Param(
        "checkpoint_every",
        at_least_0,
        0,
        "also checkpoint after every this many iterations (0: by time alone, checkpoint_minutes)",
        checkpoint,
        False,
    )
    yield Param(
        "checkpoint_minutes",
        positive,
        5.0,
        "checkpoint when this many minutes have passed since the last one (or the start): "
        "a fit of seconds writes none (None: by count alone, checkpoint_every)",
        checkpoint,
        False,
        optional=True,
    )


def _validation_rows() -> Iterator[Param]:
    """``[validation]``: how the fit scores the validation subset and stops early."""
    validation, at_least_1, at_least_0 = "validation", _AT_LEAST_1, _AT_LEAST_0
    yield Param(
        "validation_every",
        at_least_0,
        5,
        "score the store's validation subset every this many iterations and at the "
        "last; the saved state is the best scored one (0: no validation; none without "
        "a validation subset)",
        validation,
        False,
    )
    yield Param(
        "validation_patience",
        at_least_0,
        5,
        "stop after this many validation scores in a row without improvement (0: never early)",
        validation,
        False,
    )
    yield Param(
        "validation_window",
        at_least_1,
        1,
        "early stopping follows the mean of the last this many validation scores and "
        "keeps the newest state of the best such stretch (1: each score alone)",
        validation,
        False,
    )
    yield Param(
        "validation_metric",
        Options(("ndcg", "loglik")),
        "ndcg",
        "what validation maximizes: NDCG@validation_k at relevance validation_s, or "
        "the mean log-likelihood of the validation nonzeros",
        validation,
        False,
    )
    doc = "cut-off k of the validation NDCG@k"
    yield Param("validation_k", at_least_1, 100, doc, validation, False)
    doc = "relevance threshold s of the validation NDCG (class >= s is relevant)"
    yield Param("validation_s", at_least_1, 1, doc, validation, False)


def _rows() -> Iterator[Param]:
    """Every estimator parameter, section by section (:data:`SECTIONS`)."""
    for section in (_model_rows, _family_rows, _engine_rows, _checkpoint_rows, _validation_rows):
        yield from section()


PARAMS: dict[str, Param] = {p.name: p for p in _rows()}


def _call_rows() -> Iterator[tuple[str, Param]]:
    """The numeric arguments of calls on a fitted model, declared as the estimator's are."""
    for call in ("fold_in",):
        doc = "at most this many updates of each new row"
        yield call, Param("max_iter", Integer(1), 500, doc, call, False)
        doc = "a new row stops when the relative change of its factors falls below tol"
        yield call, Param("tol", Real(), 1e-6, doc, call, False)
        doc = "None starts from E[w] = 1, an integer from Gamma(1, 1) draws"
        yield call, Param("seed", Integer(0), None, doc, call, False, optional=True)


#: call -> its arguments' rows (``fold_in``: ``fold_in``, ``fold_in_users``, ``fold_in_items``)
def _call_table() -> dict[str, dict[str, Param]]:
    table: dict[str, dict[str, Param]] = {}
    for call, row in _call_rows():
        table.setdefault(call, {})[row.name] = row
    return table


CALL_PARAMS = _call_table()


class _Required:
    """The default of a command's row that has none: the caller must give it."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
MAX_CLASSES = 255  # classes are stored as uint8 (docs/store-format.md)
DEFAULT_NNZ_PER_BLOCK = 2**21  # a store's training nonzeros per block, by default


def _overwrite(command: str, replaces: str, default: bool | None = False) -> Param:
    """The ``overwrite`` switch of ``command``, which replaces what ``replaces`` says (only
    what the package wrote there: docs/design.md, "Safety rules"); ``default`` None: not
    given (fit's flag, which a job file's ``[output] overwrite`` may set)."""
    optional = default is None
    return Param(
        "overwrite", Boolean(), default, f"replace {replaces}", command, False, optional=optional
    )


def _synth_rows() -> Iterator[Param]:
    """The arguments of ``synth`` (:func:`ordnmf_dask.datasets.synth.synth`, the command
    ``ordnmf-dask synth``): the CLI's flags, the API's checks and the docs read them."""
    s, positive = "synth", Real()
    doc = "U, the number of users"
    yield Param("n_users", Integer(1), REQUIRED, doc, s, False, flags=("--users",))
    doc = "I, the number of items"
    yield Param("n_items", Integer(1), REQUIRED, doc, s, False, flags=("--items",))
    doc = "expected nonzeros (train + test) under the prior (e.g. 1e7): theta_0 is fitted to it"
    yield Param("nnz", positive, REQUIRED, doc, s, False)
    k = ("-k", "--n-components")
    doc = "the true K, the number of latent factors"
    yield Param("n_components", Integer(1), REQUIRED, doc, s, False, flags=k)
    doc = f"V, the number of classes (at most {MAX_CLASSES})"
    yield Param("n_classes", Integer(1, MAX_CLASSES), 10, doc, s, False, flags=("--classes",))
    doc = "seeds the factors, the sampling and the split"
    yield Param("seed", Integer(0), 0, doc, s, False)
    doc = "Gamma shape a of W and H: w ~ Gamma(a, rate_w), h ~ Gamma(a, rate_h)"
    yield Param("shape", positive, 0.3, doc, s, False)
    for side in ("w", "h"):
        doc = f"Gamma rate of {side.upper()} (the API's alone)"
        yield Param(f"rate_{side}", positive, 1.0, doc, s, False, flags=())
    doc = "probability that a nonzero goes to the test split"
    yield Param("test_fraction", Real(0.0, 1.0, "left"), 0.2, doc, s, False)
    doc = "target expected train nonzeros per block (regular grid)"
    yield Param("nnz_per_block", Integer(1), DEFAULT_NNZ_PER_BLOCK, doc, s, False)
    yield _overwrite(s, "a store written by ordnmf_dask at the output path")


def _evaluate_rows() -> Iterator[Param]:
    """The numeric arguments of ``evaluate`` (:func:`ordnmf_dask.postfit.evaluate.evaluate`,
    the command ``ordnmf-dask evaluate``)."""
    e = "evaluate"
    doc = "cut-off k of the ranking metrics (NDCG@k, precision@k, recall@k, MAP@k)"
    yield Param("k", Integer(1), 100, doc, e, False, flags=("--k",))
    doc = "relevance thresholds s (default 1..V)"
    yield Param("levels", Levels(), None, doc, e, False, optional=True)
    doc = "the ranking metrics over this random fraction of the users (1: all)"
    yield Param("user_fraction", Real(0.0, 1.0, "right"), 1.0, doc, e, False)
    yield Param("seed", Integer(0), 0, "seed of the user sample", e, False)
    yield Param(
        "posterior",
        Options(("mean", "gamma")),
        "mean",
        "class law scored: at E[lambda] ('mean') or averaged over the posterior ('gamma')",
        e,
        False,
    )


RATING_KINDS = ("halfstar", "integer")  # ingest's ordinal rating scales (sources.values)
DUPLICATE_POLICIES = ("error", "sum", "max", "last")  # what ingest does with a repeated pair
FILTER_MODES = ("paper", "stable")  # ingest's --min-count passes (sources.filtering)
FORMATS = ("tsv", "csv", "json", "parquet")  # the serving commands' output tables (app.tables)
DEFAULT_CHUNK_BYTES = 2**24  # bytes of text per parsing task of an ingest
DEFAULT_ROWS_PER_PARTITION = 2**22  # input rows per merge/filter/route task of an ingest


def _ingest_rows() -> Iterator[Param]:
    """The options of ``ingest`` (:func:`ordnmf_dask.sources.ingest.ingest`, the command
    ``ordnmf-dask ingest``) but its inputs, output and parsing options."""
    i = "ingest"
    doc = "ordinal ratings: halfstar (x2 -> 1..10) or integer 1..V"
    yield Param("ratings", Options(RATING_KINDS), None, doc, i, False, optional=True)
    doc = "quantize counts: 'paper' (0,1,2,5,10,20,50,100,200,500) or increasing T1,T2,... (a list)"
    yield Param("counts", Counts(), None, doc, i, False, optional=True)
    doc = "class 1 where the value (the class, with ratings or counts) >= S; the rest dropped"
    yield Param("binarize", Number(), None, doc, i, False, optional=True, metavar="S")
    doc = (
        "V of integer ratings (default: the largest value seen; with none of ratings, counts "
        "and binarize, data of positive integers are integer ratings)"
    )
    yield Param("scale_max", Integer(1), None, doc, i, False, optional=True)
    doc = "drop items, then users, with fewer interactions"
    yield Param("min_count", Integer(0), 0, doc, i, False)
    doc = "paper: one pass (items then users); stable: iterate until stable"
    filters = ("--filter",)
    yield Param("filter_mode", Options(FILTER_MODES), "paper", doc, i, False, flags=filters)
    doc = "what to do with repeated (user, item) pairs (values are merged before classes)"
    yield Param("duplicates", Options(DUPLICATE_POLICIES), "error", doc, i, False)
    yield Param(
        "test_fraction",
        Real(0.0, 1.0, "left"),
        0.2,
        "about this fraction of the nonzeros goes to test, each pair by a seeded hash of its "
        "raw ids (it keeps its subset as data grow; none with a test input)",
        i,
        False,
    )
    yield Param(
        "validation_fraction",
        Real(0.0, 1.0, "left"),
        0.0,
        "keep this fraction of the training nonzeros apart for validation during fits (same "
        "hashed split; 0: none)",
        i,
        False,
        metavar="F",
    )
    doc = "seed of the random split (the seeded hash of each pair's raw ids: sources.split)"
    yield Param("seed", Integer(0), 0, doc, i, False)
    doc = "target train nonzeros per block when there is no grid"
    yield Param("nnz_per_block", Integer(1), DEFAULT_NNZ_PER_BLOCK, doc, i, False)
    doc = "explicit block grid R,C"
    yield Param("grid", Pair(), None, doc, i, False, optional=True, metavar="R,C")
    yield _overwrite(
        i, "a store written by ordnmf_dask at the output path, once the new one is complete"
    )
    doc = (
        "bytes of text per parsing task (about 20x that in memory while parsing; Parquet files "
        "are parsed a row group per task)"
    )
    yield Param("chunk_bytes", Integer(1), DEFAULT_CHUNK_BYTES, doc, i, False)
    doc = "average input rows per merge/filter/route task (the API's alone)"
    yield Param(
        "rows_per_partition", Integer(1), DEFAULT_ROWS_PER_PARTITION, doc, i, False, flags=()
    )


def _tune_rows() -> Iterator[Param]:
    """The settings of ``tune`` (:func:`ordnmf_dask.tuning.search.tune`, the command
    ``ordnmf-dask tune``) but its store, space, output and fixed parameters."""
    t = "tune"
    doc = "sample this many trials at random, seeded by sample_seed (None: the grid of the values)"
    yield Param("n_trials", Integer(1), None, doc, t, False, optional=True)
    yield Param("sample_seed", Integer(0), 0, "seed of the random trials", t, False)
    doc = "iterations of the last rung (default: a fit's max_iter)"
    yield Param("max_iter", Integer(1), PARAMS["max_iter"].default, doc, t, False, flags=())
    doc = "iterations of the first rung (None: max_iter // eta^2, three rungs)"
    yield Param("min_budget", Integer(1), None, doc, t, False, optional=True)
    doc = "keep the best 1/eta of the trials at each rung"
    yield Param("eta", Integer(2), 3, doc, t, False)
    yield Param(
        "validation_metric",
        Options(("ndcg", "loglik")),
        "ndcg",
        "what scores the trials (higher is better): ndcg, NDCG@validation_k at relevance >= "
        "validation_s; loglik, the mean held-out log-likelihood per nonzero",
        t,
        False,
    )
    yield Param("validation_k", Integer(1), 100, "k of NDCG@k", t, False)
    doc = "relevance threshold s (None: the model's threshold for bepof / pf, else 1)"
    yield Param("validation_s", Integer(1), None, doc, t, False, optional=True)
    doc = (
        "score on the test subset when the store has no validation subset (its test figures "
        "are then optimistic); otherwise that is an error"
    )
    yield Param("allow_test", Boolean(), False, doc, t, False)
    yield Param(
        "user_fraction",
        Real(0.0, 1.0, "right"),
        1.0,
        "when tune scores the models itself (on the test subset, or with validation_every "
        "0): rank this random fraction of the users",
        t,
        False,
    )
    doc = "fits run concurrently (each caches its training blocks unless cache_blocks is off)"
    yield Param("n_jobs", Integer(1), 4, doc, t, False, flags=("--jobs",))
    yield _overwrite(t, "the results and the best model of an earlier tune in the output directory")


def _serving_rows(command: str) -> Iterator[Param]:
    """The options of the serving command ``command`` (``recommend``, ``similar-items``,
    ``similar-users``, ``fold-in``, ``score``, ``export``, ``predict``) but its model, ids and
    files: the count of its lists, the format of its table, its class columns."""
    per = {
        "recommend": "items per user",
        "similar-items": "similar items per item",
        "similar-users": "similar users per user",
        "fold-in": "items per new user",
        "export": "recommendations per user",
    }
    if command in per:
        yield Param("n", Integer(1), 10, per[command], command, False, flags=("-n",))
    if command in ("recommend", "export"):
        doc = "add P(y >= S | y > 0) beside each recommended item (S a class 1..V)"
        yield Param("proba_at", Integer(1), None, doc, command, False, optional=True, metavar="S")
    if command in ("recommend", "similar-items", "similar-users", "fold-in", "score"):
        doc = (
            "output table with a header: tsv, csv, json, or parquet (binary, to a file: > "
            "out.parquet)"
        )
        yield Param("format", Options(FORMATS), "tsv", doc, command, False)
    if command == "fold-in":
        doc = "print E[w] (user, f0 .. f{K-1}) instead"
        yield Param("factors", Boolean(), False, doc, command, False)
    if command == "recommend":
        yield _overwrite(command, "an existing --out")
    if command in ("export", "predict"):
        yield _overwrite(command, "--out if it is an export (nothing else is ever replaced)")
    if command == "predict":
        doc = "P(y = v | y > 0) instead of P(y = v)"
        yield Param("given_interaction", Boolean(), False, doc, command, False)
        doc = "the law at E[lambda] ('mean') or averaged over the posterior ('gamma')"
        yield Param("posterior", Options(("mean", "gamma")), "mean", doc, command, False)


def _info_rows() -> Iterator[Param]:
    """The switches of ``info`` (the command ``ordnmf-dask info``) but its store or model."""
    doc = "print the summary as JSON"
    yield Param("json", Boolean(), False, doc, "info", False)
    doc = "also check every chunk file's checksum (reads the whole store)"
    yield Param("verify", Boolean(), False, doc, "info", False)


def _fit_rows() -> Iterator[Param]:
    """The switches of a fit (``CaviEstimator.fit``, the command ``ordnmf-dask fit``) but its
    store, output, warm starts and the estimator parameters (:data:`PARAMS`); None: not given,
    so that the command's --config file decides."""
    f = "fit"
    doc = (
        "require resuming: fail unless the checkpoint directory holds a usable checkpoint of "
        "this fit (without it, a fit resumes from the newest valid checkpoint of the same "
        "model, settings and store when there is one, and starts afresh otherwise)"
    )
    yield Param("resume", Boolean(), False, doc, f, False)
    doc = (
        "first remove the checkpoints ordnmf-dask wrote in the checkpoint directory (of any "
        "fit; they are logged) and start afresh (without it, a directory holding another "
        "fit's checkpoints is refused, and nothing is removed)"
    )
    yield Param("restart", Boolean(), False, doc, f, False)
    yield _overwrite(
        f, "the output (--out) if it is a model (nothing else, never the store, is replaced)", None
    )


def _reproduce_rows() -> Iterator[Param]:
    """The settings of ``reproduce`` (the command ``ordnmf-dask reproduce``,
    ``app.reproduce.Protocol``) but its output, data and cluster."""
    r = "reproduce"
    doc = "comma-separated subset of the shared datasets"
    yield Param("datasets", Text(), "movielens,tasteprofile,lastfm", doc, r, False)
    doc = "K values"
    yield Param("k_grid", Ranks(), (25, 50), doc, r, False, metavar="K1,K2,...")
    doc = "seeds of the fits of each model and K"
    yield Param("seeds", Levels(), (0, 1, 2, 3, 4), doc, r, False, metavar="SEED1,SEED2,...")
    doc = "at most this many iterations of each fit"
    yield Param("max_iter", Integer(1), 1000, doc, r, False)
    doc = "fits run concurrently"
    yield Param("n_jobs", Integer(1), 3, doc, r, False, flags=("--jobs",))


SERVING = ("recommend", "similar-items", "similar-users", "fold-in", "score", "export", "predict")

#: command -> its arguments' rows, for the commands whose arguments have a table
COMMAND_PARAMS: dict[str, dict[str, Param]] = {
    "ingest": {p.name: p for p in _ingest_rows()},
    "synth": {p.name: p for p in _synth_rows()},
    "evaluate": {p.name: p for p in _evaluate_rows()},
    "tune": {p.name: p for p in _tune_rows()},
    "info": {p.name: p for p in _info_rows()},
    "fit": {p.name: p for p in _fit_rows()},
    "reproduce": {p.name: p for p in _reproduce_rows()},
    **{c: {p.name: p for p in _serving_rows(c)} for c in SERVING},
}


class _Defaults(Mapping[str, Any]):
    """name -> default, read from :data:`PARAMS` at each lookup."""

    def __getitem__(self, name: str) -> Any:
        return PARAMS[name].default

    def __iter__(self) -> Iterator[str]:
        return iter(PARAMS)

    def __len__(self) -> int:
        return len(PARAMS)


DEFAULTS: Mapping[str, Any] = _Defaults()


def parameters_doc(rows: Iterable[Param], indent: str = "    ") -> str:
    """The lines of a numpydoc Parameters section for ``rows``: name, doc and default (none
    for a :data:`REQUIRED` row or a None default), at ``indent`` (a function's docstring)."""
    lines = []
    for row in rows:
        shown = row.default is None or row.default is REQUIRED
        default = "" if shown else f" (default {row.default!r})"
        text = f"{row.name} : {row.doc}{default}."
        more, width = indent + "    ", 92 + len(indent)  # lines of at most 96 in a function
        lines.append(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=more))
    return "\n".join(lines) + "\n"


def rows_doc(command: str) -> Callable[[_F], _F]:
    """A decorator: the function's docstring with the line
    ``<the rows of params.COMMAND_PARAMS["<command>"]>`` replaced by the Parameters of the
    rows of ``command``'s table (:func:`parameters_doc`) at its indentation, as the command's
    --help says them."""

    def put(function: _F) -> _F:
        if function.__doc__ is not None:  # None under python -OO
            line = re.escape(f'<the rows of params.COMMAND_PARAMS["{command}"]>')
            rows = COMMAND_PARAMS[command].values()
            function.__doc__ = re.sub(
                f"^( *){line}\n",
                lambda found: parameters_doc(rows, found[1]),
                function.__doc__,
                flags=re.MULTILINE,
            )
        return function

    return put


def accepted(estimator: str) -> list[str]:
    """The parameters the estimator class named ``estimator`` takes, in table order."""
    return [p.name for p in PARAMS.values() if estimator in p.estimators]


def problem(name: str, value: Any, table: Mapping[str, Param] = PARAMS) -> str | None:
    """What is wrong with ``value`` for parameter ``name`` of ``table`` (default the estimator
    parameters) ("must be ..., got ..."), or None."""
    p = table[name]
    if (value is None and p.optional) or p.rule.ok(value):
        return None
    rule = f"{p.rule} (or None)" if p.optional else str(p.rule)
    return f"must be {rule}, got {shown(value)}"


def convert(name: str, value: Any, table: Mapping[str, Param] = PARAMS) -> Any:
    """A valid ``value`` as the engine takes it: a plain int, float or str."""
    kind = table[name].kind
    if value is None or kind in ("bool", "auto", "str", "counts"):
        return value
    if kind == "ints":
        return tuple(int(v) for v in value)
    as_kind: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "path": os.fspath}
    return as_kind[kind](value)


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (parameter name -> value) checked and converted; InputError naming the first
    parameter that breaks its rule."""
    for name, value in values.items():
        wrong = problem(name, value)
        if wrong is not None:
            raise InputError(f"{name} {wrong}")
    return {name: convert(name, value) for name, value in values.items()}


def validate_call(call: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``values`` of ``call`` (a key of :data:`CALL_PARAMS`, or of
    :data:`COMMAND_PARAMS`) checked and converted; InputError naming the first that breaks its
    rule."""
    table = CALL_PARAMS[call] if call in CALL_PARAMS else COMMAND_PARAMS[call]
    for name, value in values.items():
        wrong = problem(name, value, table)
        if wrong is not None:
            raise InputError(f"{call}: {name} {wrong}")
    return {name: convert(name, value, table) for name, value in values.items()}


# -- the checked parameters of a fit, typed, one frozen section per section of the table --------
@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """``[model]``: what the fit computes (rows with ``model``: the checkpoint fingerprint) and
    how long it may run. A parameter the estimator does not take is None."""

    n_components: int
    select_components: tuple[int, ...] | None
    alpha_W: float
    alpha_H: float
    tol: float
    max_iter: int
    min_iter: int
    seed: int
    optimizer: str
    anneal: int
    n_init: int
    n_members: int
    start: str
    approx: bool | None
    threshold: int | None
    learn_threshold: bool | None
    p: float | None
    t: float | None
    update_p: bool | None


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """``[engine]``: where and how the fit runs."""

    cache_blocks: bool | str
    executor: str
    work_dir: str | None


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    """``[checkpoint]``: where and when the fit checkpoints."""

    dir: str | None
    every: int
    minutes: float | None


@dataclass(frozen=True, kw_only=True)
class ValidationSettings:
    """``[validation]``: how the fit scores the store's validation subset and stops early."""

    every: int
    patience: int
    window: int
    metric: str
    k: int
    s: int


#: section of the table -> its settings class, whose fields are the section's job-file keys
SECTION_CLASSES: dict[str, type] = {
    "model": ModelSettings,
    "engine": EngineSettings,
    "checkpoint": CheckpointSettings,
    "validation": ValidationSettings,
}


def section_defaults(section: str) -> dict[str, Any]:
    """Job-file key -> default of the rows of ``section``, read from :data:`PARAMS` at the call
    (the keyword arguments of its settings class when nothing is given)."""
    return {p.key: p.default for p in PARAMS.values() if p.section == section}


@dataclass(frozen=True)
class Settings:
    """Every parameter of a fit of ``estimator`` (a class name of :data:`MODELS`), checked and
    converted, by section (:func:`settings`)."""

    estimator: str
    model: ModelSettings
    engine: EngineSettings
    checkpoint: CheckpointSettings
    validation: ValidationSettings

    def value(self, name: str) -> Any:
        """The value of parameter ``name`` of the table."""
        p = PARAMS[name]
        return getattr(getattr(self, p.section), p.key)

    def values(self) -> dict[str, Any]:
        """name -> value of the parameters the estimator takes, in table order (what a saved
        model records as its ``params``)."""
        return {name: self.value(name) for name in accepted(self.estimator)}

    def fingerprinted(self) -> dict[str, Any]:
        """The model parameters (rows with ``model``) the estimator takes: what the trajectory
        of its fit depends on, with the seed and the warm start."""
        return {k: v for k, v in self.values().items() if PARAMS[k].model}


def settings(estimator: str, values: Mapping[str, Any]) -> Settings:
    """The :class:`Settings` of ``values``: every parameter ``estimator`` takes, as
    :func:`validate` returns them."""
    taken = set(accepted(estimator))
    sections = {
        section: klass(
            **{
                p.key: values[p.name] if p.name in taken else None
                for p in PARAMS.values()
                if p.section == section
            }
        )
        for section, klass in SECTION_CLASSES.items()
    }
    return Settings(estimator, **sections)
