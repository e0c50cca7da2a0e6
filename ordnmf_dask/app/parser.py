"""The ``ordnmf-dask`` argument parser: every command's flags, one flag per estimator parameter
of :mod:`ordnmf_dask.params`, and one-line usage errors (exit code 2)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ordnmf_dask import __version__
from ordnmf_dask.app.exits import EXIT_INPUT
from ordnmf_dask.params import COMMAND_PARAMS, MODELS, PARAMS, REQUIRED, Options, Param

_DECIMAL = re.compile(r"-?[0-9]+")  # ASCII digits only: int() also reads "1_0" and other scripts


def _parts(text: str) -> list[str]:
    """The values of a flag's comma-separated list (ids, names, integers), the spaces around
    each dropped: an empty one (``u1,,u2``, a trailing comma) is refused naming its position,
    never dropped, and so is a list of none (``,``)."""
    parts = [t.strip() for t in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"no value in {text!r} (values joined by commas)")
    empty = parts.index("") if "" in parts else None
    if empty is not None:
        raise argparse.ArgumentTypeError(
            f"empty value at position {empty + 1} of {text!r} (values joined by commas)"
        )
    return parts


def _int_list(text: str) -> list[int]:
    """Integers joined by commas, each in its canonical decimal form (``1_0`` is refused)."""
    parts = _parts(text)
    if not all(_DECIMAL.fullmatch(t) for t in parts):
        raise argparse.ArgumentTypeError(f"expected integers joined by commas: {text!r}")
    return [int(t) for t in parts]


def _name_list(text: str) -> list[str]:
    """Names (raw ids) joined by commas (:func:`_parts`)."""
    return _parts(text)


def _columns(text: str) -> list[int | str]:
    """user,item,value columns: 0-based positions (digits) or names."""
    return [int(n) if n.isascii() and n.isdigit() else n for n in _parts(text)]


def _counts(text: str) -> str | list[float]:
    if text == "paper":
        return text
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--counts takes 'paper' or increasing numbers T1,T2,...: {text!r}"
        ) from None


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line, like every other error of the command (the
    usage is what ``--help`` shows); exit code 2. Subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line: the options every command takes, then one subcommand per entry of
    :data:`COMMANDS`, whose parts add their flags."""
    p = _Parser(
        prog="ordnmf-dask",
        description="Ordinal NMF (IG-OrdNMF) with exact CAVI on Dask, out of core on zarr.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad input/config/local I/O, "
        "3 cluster failure, 4 numerical failure, 130 interrupted, 143 terminated.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = _Parser(add_help=False)  # the logging flags given after the command, or before it:
    for log_flag in LOGGING:  # a SUPPRESS default there, so that the subcommand does not reset
        log_flag.add(p)  # them
        Flag(log_flag.names, {**log_flag.kw, "default": argparse.SUPPRESS}).add(common)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        parser = sub.add_parser(
            name, parents=[common], help=command.help, description=command.description
        )
        for part in command.parts:
            part.add(parser)
    return p


# -- the parts of a command: flags of no table, groups, rows of a table -------------------------
@dataclass(frozen=True)
class Flag:
    """One argument that no table of :mod:`ordnmf_dask.params` holds (a file, a cluster
    setting): its names, its ``add_argument`` keywords and the dotted job-file key it
    overrides (``job``; None: a flag of the command line alone), declared once."""

    names: tuple[str, ...]
    kw: Mapping[str, Any]
    job: str | None = None

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments that holds its value."""
        if "dest" in self.kw:
            return str(self.kw["dest"])
        long = [n for n in self.names if n.startswith("--")]
        return (long or list(self.names))[0].lstrip("-").replace("-", "_")

    def add(self, p: argparse._ActionsContainer) -> None:
        p.add_argument(*self.names, **self.kw)


def flag(*names: str, job: str | None = None, **kw: Any) -> Flag:
    """The :class:`Flag` of ``names`` setting the job-file key ``job``, ``kw`` as
    ``add_argument`` takes them."""
    return Flag(names, kw, job)


@dataclass(frozen=True)
class Group:
    """Mutually exclusive parts, one of which must be given when ``required``."""

    parts: tuple[Part, ...]
    required: bool = False

    def add(self, p: argparse._ActionsContainer) -> None:
        group = p.add_mutually_exclusive_group(required=self.required)
        for part in self.parts:
            part.add(group)


@dataclass(frozen=True)
class Rows:
    """The flags of the rows of ``command``'s table (:data:`~ordnmf_dask.params.COMMAND_PARAMS`)
    named ``only`` (default all) but those of ``skip``."""

    command: str
    only: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    jobs: tuple[tuple[str, str], ...] = ()  # (row, the dotted job-file key its flag overrides)

    def add(self, p: argparse._ActionsContainer) -> None:
        table = COMMAND_PARAMS[self.command]
        names = [n for n in (table if self.only is None else self.only) if n not in self.skip]
        _command_args(p, table, names)


@dataclass(frozen=True)
class Estimator:
    """One flag per estimator parameter (:data:`~ordnmf_dask.params.PARAMS`) but ``skip``."""

    skip: tuple[str, ...] = ()

    def add(self, p: argparse._ActionsContainer) -> None:
        _param_args(p, self.skip)


Part = Flag | Group | Rows | Estimator


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, the description of its --help, and its parts in the
    order --help lists them."""

    help: str
    parts: tuple[Part, ...]
    description: str | None = None


def _files(columns: str, when: str = "") -> tuple[Part, ...]:
    """``--columns`` (``columns``: its help), ``--delimiter`` and ``--header`` /
    ``--no-header`` of the commands that read files of rows (``when``: the flag they apply
    with)."""
    default = None if columns.startswith("user,item,value") else [0, 1]
    return (
        flag("--columns", type=_columns, default=default, help=columns),
        flag("--delimiter", help=f"{when}field delimiter (default: detected)"),
        Group(
            (
                flag("--header", dest="header", action="store_true", default=None),
                flag("--no-header", dest="header", action="store_false"),
            )
        ),
    )


#: --columns of the files of (user, item, value) rows
_TRIPLES = _files(
    "user,item,value columns: 0-based positions or names (default: the names of a header "
    "line or a Parquet schema where they tell all three, else 0,1,2)"
)

LOGGING = (
    flag("--debug", action="store_true", help="show tracebacks and debug logs"),
    flag(
        "-q",
        "--quiet",
        action="store_true",
        help="only warnings and errors on stderr (--log-file still gets INFO)",
    ),
    flag("--log-file", job="logging.file", help="also write logs to this file"),
)  # --debug, -q and --log-file, before the command or after it

CLUSTER = (
    flag("--config", metavar="FILE", help="job file (TOML); flags given override it"),
    flag(
        "--scheduler",
        job="cluster.scheduler",
        metavar="ADDRESS",
        help="tcp://host:port of a running scheduler (default: start a LocalCluster)",
    ),
    flag(
        "--scheduler-file",
        job="cluster.scheduler_file",
        metavar="FILE",
        help="scheduler file written by `dask scheduler --scheduler-file`",
    ),
    flag(
        "--workers",
        job="cluster.local.workers",
        type=int,
        help="worker processes of the LocalCluster (default 1)",
    ),
    flag(
        "--threads-per-worker",
        job="cluster.local.threads_per_worker",
        type=int,
        help="threads of each LocalCluster worker (default: the cores shared among the workers)",
    ),
    flag(
        "--memory-limit",
        job="cluster.local.memory_limit",
        help="per LocalCluster worker, e.g. 4GB (default auto)",
    ),
    flag(
        "--tls-ca-file",
        job="cluster.ca_file",
        metavar="PEM",
        help="CA certificate: TLS to the scheduler",
    ),
    flag(
        "--tls-cert", job="cluster.cert", metavar="PEM", help="our certificate (signed by the CA)"
    ),
    flag("--tls-key", job="cluster.key", metavar="PEM", help="private key of --tls-cert"),
)  # the --config file and the cluster, of every command that runs on one

#: the destinations of :data:`CLUSTER`: what the [cluster] section is resolved from
CLUSTER_DESTS = tuple(f.dest for f in CLUSTER)

# ``--allow-other-store``: use a store other than the one the model was fitted on (by default
# refused, ``postfit.evaluate.check_compatible``)
_OTHER_STORE = flag(
    "--allow-other-store",
    action="store_true",
    help="use STORE even if the model was fitted on another store (e.g. another "
    "split of the same ratings: its test pairs may be the model's training pairs)",
)

_MODEL_KIND = flag(
    "--model",
    job="model.kind",
    dest="model_kind",
    choices=list(MODELS),
    help="ordnmf (default) | bepof, pf (on classes >= --threshold) | dcpf",
)

_FROM_HELP = (
    "a text file of raw {noun} ids, one per line ('-': standard input): the whole batch in one "
    "process and one table"
)


def _out(help: str, required: bool = True) -> Flag:
    """``--out``: where the command writes (``help``; the job file's ``[output] model``)."""
    return flag("--out", job="output.model", help=help, **({"required": True} if required else {}))


def _ids(axis: str, help: str) -> tuple[Flag, Flag]:
    """``--<axis>`` (raw ids joined by commas, ``help``) and ``--<axis>-from FILE``."""
    return (
        flag(f"--{axis}", type=_name_list, help=help),
        flag(f"--{axis}-from", metavar="FILE", help=_FROM_HELP.format(noun=axis[:-1])),
    )


def _similar(axis: str) -> Command:
    return Command(
        f"the {axis} most similar to given ones (cosine of their factors)",
        (
            flag("model"),
            Group(_ids(axis, f"raw {axis[:-1]} ids, commas"), required=True),
            Rows(f"similar-{axis}"),
        ),
    )


def _search_flags() -> tuple[Flag, ...]:
    """The flags of the parameters ``tune`` searches (:data:`SEARCH_FLAGS`)."""
    return tuple(
        flag(
            *flags,
            dest=f"space_{name}",
            metavar="V1,V2,...|LOW:HIGH",
            help=f"{PARAMS[name].doc}: values to search, or a range sampled "
            "log-uniformly (needs --n-trials)",
        )
        for name, flags in SEARCH_FLAGS.items()
    )


SHORT_FLAGS = {"n_components": "-k"}


SEARCH_FLAGS = {
    "n_components": ("-k", "--n-components"),
    "alpha_W": ("--alpha-w",),
    "alpha_H": ("--alpha-h",),
}  # the parameters `tune` searches, and their flags

#: the subcommands, in the order --help lists them
COMMANDS: dict[str, Command] = {
    "ingest": Command(
        "text or Parquet files of (user, item, value) -> zarr block store",
        (
            flag(
                "inputs",
                nargs="+",
                help="CSV / TSV / .dat / .parquet files (.gz, .bz2, .zst by suffix), "
                "directories of Parquet files, globs, or s3:// gs:// http(s):// URLs "
                "(concatenated)",
            ),
            _out("store directory to create"),
            Group(
                (
                    flag("--test", nargs="+", help="test file(s) instead of a random split"),
                    Rows("ingest", only=("test_fraction",)),
                )
            ),
            Rows("ingest", skip=("test_fraction",)),
            *_TRIPLES,
            flag(
                "--distributed",
                action="store_true",
                help="out-of-core ingest on a cluster (bounded memory per task)",
            ),
            *CLUSTER,
        ),
    ),
    "synth": Command(
        "sample a synthetic IG-OrdNMF dataset into a store",
        (_out("store directory to create"), Rows("synth"), *CLUSTER),
    ),
    "info": Command(
        "summary of a store, or of a model (its active components and thresholds as "
        "class probabilities); exit 2 if incomplete or unreadable",
        (flag("store", metavar="STORE_OR_MODEL"), Rows("info")),
    ),
    # One flag per parameter of ordnmf_dask.params (default None = not given, so that a flag
    # overrides the --config file only when the user gave it); the job-only flags after them.
    "fit": Command(
        "fit IG-OrdNMF on a store (flags override --config FILE)",
        (
            flag(
                "store",
                job="store.path",
                nargs="?",
                help="store directory (or [store] path in --config)",
            ),
            _out("model directory to write (or [output] model)", required=False),
            _MODEL_KIND,
            Estimator(),
            flag(
                "--init",
                job="model.init",
                help=".npz with arrays W (U, K) and H (I, K): warm start",
            ),
            flag(
                "--init-model",
                job="model.init_model",
                metavar="MODEL",
                help="warm start from a saved model of the same kind and K, on this store "
                "or one that grew (users and items matched by raw id)",
            ),
            Rows("fit", jobs=(("overwrite", "output.overwrite"),)),
            *CLUSTER,
        ),
    ),
    "evaluate": Command(
        "NDCG@k, test log-likelihood, calibration and rating error of a model",
        (
            flag("store"),
            flag("model"),
            Rows("evaluate"),
            flag("--json", dest="json_out", metavar="FILE", help="also write results as JSON"),
            flag(
                "--reliability",
                metavar="PNG",
                help="also draw a reliability diagram per level (needs matplotlib)",
            ),
            _OTHER_STORE,
            *CLUSTER,
        ),
    ),
    "recommend": Command(
        "top-N items per user in raw ids, training items excluded",
        (
            flag(
                "store",
                nargs="?",
                help="training store (optional: the model carries its id maps)",
            ),
            flag("model"),
            Group(
                (
                    _out(
                        "directory or URL for all users: an export of "
                        "recommendations (OUT/recommendations/part-<r>.parquet)",
                        required=False,
                    ),
                    *_ids("users", "raw user ids joined by commas"),
                ),
                required=True,
            ),
            Rows("recommend"),
            _OTHER_STORE,
            *CLUSTER,
        ),
        description="Top-N items per user, training items excluded (the model's own index of "
        "them; STORE only for a model saved without one).",
    ),
    "similar-items": _similar("items"),
    "similar-users": _similar("users"),
    "fold-in": Command(
        "recommendations (or factors) for NEW users from a ratings file",
        (
            flag("model"),
            flag("ratings", help="CSV / TSV / Parquet file of the new users' ratings"),
            *_TRIPLES,
            Rows("fold-in"),
        ),
        description="Fold in new users from their ratings (user, item, value rows; values on "
        "the scale the store was ingested from), the model fixed; print their top-N items, "
        "their rated items excluded, or with --factors their E[w].",
    ),
    "score": Command(
        "E[w_u] . E[h_i] of given (user, item) pairs",
        (
            flag("model"),
            Group(
                (
                    flag(
                        "--pairs",
                        metavar="FILE",
                        help="CSV / TSV / Parquet of user, item rows (columns 0 and 1, or "
                        "--columns)",
                    ),
                    flag(
                        "--users",
                        type=_name_list,
                        help="raw user ids, commas (with --items, pairwise)",
                    ),
                ),
                required=True,
            ),
            flag("--items", type=_name_list, help="raw item ids, commas, one per user"),
            *_files(
                "with --pairs: user,item columns, positions or names (default 0,1)",
                "with --pairs: ",
            ),
            Rows("score"),
        ),
    ),
    "export": Command(
        "factors with raw ids and top-N lists as partitioned Parquet",
        (
            flag("model"),
            _out("directory or URL (s3://bucket/prefix, ...) of the export"),
            flag(
                "--what",
                type=_name_list,
                default=["factors", "recommendations"],
                help="comma-separated subset of factors,recommendations (default both)",
            ),
            Rows("export"),
            flag(
                "--store",
                help="training store for the recommendations (default: the store the model "
                "records)",
            ),
            _OTHER_STORE,
            *CLUSTER,
        ),
    ),
    "predict": Command(
        "class probabilities of the (user, item) pairs of Parquet files",
        (
            flag("store", help="the training store (its id maps and compatibility)"),
            flag("model"),
            flag(
                "--pairs",
                nargs="+",
                required=True,
                help="Parquet files, directories of them, globs or URLs with columns user and item",
            ),
            _out("directory or URL: OUT/predictions/part-<j>.parquet"),
            Rows("predict"),
            _OTHER_STORE,
            *CLUSTER,
        ),
    ),
    "reproduce": Command(
        "the paper's comparison (OrdNMF vs BePoF, PF, dcPF) on datasets",
        (
            _out("directory for stores, models, tables, figures"),
            flag(
                "--data",
                help="directory holding the shared datasets "
                "(default ../shared/data from the working directory)",
            ),
            Rows("reproduce"),
            *CLUSTER,
        ),
    ),
    "tune": Command(
        "search K, alpha_W, alpha_H by successive halving on validation "
        "(flags and [model] of --config fix the other parameters)",
        (
            flag("store", help="store directory (with a validation subset)"),
            _out("directory of the results table, trials and best model (DIR/best)"),
            _MODEL_KIND,
            *_search_flags(),
            Rows("tune"),
            Estimator(
                skip=(
                    *SEARCH_FLAGS,
                    "n_init",
                    "n_members",
                    "work_dir",
                    "checkpoint_dir",
                    "executor",
                    "validation_metric",
                    "validation_k",
                    "validation_s",
                )  # tune's own
            ),
            *CLUSTER,
        ),
    ),
}


#: --cache-blocks spelling -> value
CACHE_BLOCKS: dict[str, bool | str] = {"auto": "auto", "on": True, "off": False}


def _auto_bool(text: str) -> bool | str:
    if text not in CACHE_BLOCKS:
        raise argparse.ArgumentTypeError(f"expected one of auto, on, off, got {text!r}")
    return CACHE_BLOCKS[text]


def _param_args(p: argparse._ActionsContainer, skip: Sequence[str] = ()) -> None:
    """One flag per estimator parameter (but those in ``skip``): ``--`` + its name in lower case
    with ``-`` for ``_``, its name as destination, default None (not given); booleans also take
    ``--no-...``."""
    for param in PARAMS.values():
        if param.name in skip:
            continue
        names = [*([SHORT_FLAGS[param.name]] if param.name in SHORT_FLAGS else []), param.flag]
        default = param.default
        if param.kind in ("bool", "auto"):
            default = next(k for k, v in CACHE_BLOCKS.items() if v is default)
        help = param.doc if default is None else f"{param.doc} (default {default})"
        kw: dict[str, Any] = {"dest": param.name, "default": None, "help": help}
        if param.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif param.kind == "auto":
            kw.update(type=_auto_bool, metavar="auto|on|off")
        elif param.kind == "ints":
            kw.update(type=_int_list, metavar="K1,K2,...")
        else:
            kw["type"] = {"int": int, "float": float, "path": str, "str": str}[param.kind]
        p.add_argument(*names, **kw)


def _command_args(
    p: argparse._ActionsContainer,
    table: Mapping[str, Param],
    names: Sequence[str] | None = None,
) -> None:
    """One flag per row of a command's ``table`` (those of ``names``, default all) that has
    flags (:attr:`Param.options`), its name as destination: the row's default (a
    :data:`REQUIRED` row: a required flag), type (a list of integers joined by commas, count
    thresholds; the choices of an :class:`Options` rule), metavar and doc; a boolean is a
    switch (``--overwrite``)."""
    for row in table.values() if names is None else (table[name] for name in names):
        if not row.options:
            continue
        kw: dict[str, Any] = {"dest": row.name, "help": row.doc}
        if row.kind == "bool":
            kw.update(action="store_true", default=row.default)
            p.add_argument(*row.options, **kw)
            continue
        kind = {"int": int, "float": float, "str": str, "ints": _int_list, "counts": _counts}
        metavar = "S1,S2,..." if row.kind == "ints" else None
        kw.update(type=kind[row.kind], metavar=row.metavar or metavar)
        if isinstance(row.rule, Options):
            kw.update(choices=row.rule.words, metavar=None)
        if row.default is REQUIRED:
            kw["required"] = True
        else:
            kw["default"] = row.default
            kw["help"] = row.doc if row.default is None else f"{row.doc} (default {_shown(row)})"
        p.add_argument(*row.options, **kw)


def _shown(row: Param) -> str:
    """The default of ``row`` as its flag is spelt (a list of integers joined by commas)."""
    if row.kind == "ints":
        return ",".join(str(v) for v in row.default)
    return str(row.default)


def job_keys(command: str) -> dict[str, str]:
    """argparse destination -> the dotted job-file key it overrides, for the flags of
    ``command`` (and the logging flags every command takes) that set a job value: what their
    declarations say (:attr:`Flag.job`, :attr:`Rows.jobs`)."""
    keys: dict[str, str] = {}

    def walk(parts: Sequence[Part]) -> None:
        for part in parts:
            if isinstance(part, Flag) and part.job is not None:
                keys[part.dest] = part.job
            elif isinstance(part, Group):
                walk(part.parts)
            elif isinstance(part, Rows):
                keys.update(part.jobs)

    walk((*LOGGING, *COMMANDS[command].parts))
    return keys


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]
