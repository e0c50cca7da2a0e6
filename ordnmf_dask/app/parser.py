"""The ``ordnmf-dask`` argument parser: every command's flags, one flag per estimator parameter
of :mod:`ordnmf_dask.params`, and one-line usage errors (exit code 2)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
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


_FROM_HELP = (
    "a text file of raw {noun} ids, one per line ('-': standard input): the whole batch in one "
    "process and one table"
)


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


_Add = Callable[..., argparse.ArgumentParser]  # a subcommand's parser, made by build_parser


def build_parser() -> argparse.ArgumentParser:
    """The command line: the options every command takes, then one subcommand per entry of
    :data:`_COMMANDS`, each of which adds its parser and its flags."""
    p = _Parser(
        prog="ordnmf-dask",
        description="Ordinal NMF (IG-OrdNMF) with exact CAVI on Dask, out of core on zarr.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad input/config/local I/O, "
        "3 cluster failure, 4 numerical failure, 130 interrupted, 143 terminated.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _logging_args(p)
    common = _Parser(add_help=False)
    _logging_args(common, default=argparse.SUPPRESS)  # given after the command, or before it
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    for command in _COMMANDS:
        command(add)
    return p


def _ingest(add: _Add) -> None:
    """The subcommand ingest: text or Parquet files -> a block store."""
    ing = add("ingest", help="text or Parquet files of (user, item, value) -> zarr block store")
    ing.add_argument(
        "inputs",
        nargs="+",
        help="CSV / TSV / .dat / .parquet files (.gz, .bz2, .zst by suffix), "
        "directories of Parquet files, globs, or s3:// gs:// http(s):// URLs "
        "(concatenated)",
    )
    ing.add_argument("--out", required=True, help="store directory to create")
    rows = COMMAND_PARAMS["ingest"]
    split = ing.add_mutually_exclusive_group()
    split.add_argument("--test", nargs="+", help="test file(s) instead of a random split")
    _command_args(split, rows, ("test_fraction",))
    _command_args(ing, rows, [name for name in rows if name != "test_fraction"])
    _parsing_args(ing, _TRIPLES)
    ing.add_argument(
        "--distributed",
        action="store_true",
        help="out-of-core ingest on a cluster (bounded memory per task)",
    )
    _cluster_args(ing)


def _synth(add: _Add) -> None:
    """The subcommand synth: a synthetic store."""
    syn = add("synth", help="sample a synthetic IG-OrdNMF dataset into a store")
    syn.add_argument("--out", required=True, help="store directory to create")
    _command_args(syn, COMMAND_PARAMS["synth"])
    _cluster_args(syn)


def _info(add: _Add) -> None:
    """The subcommand info: a store's or a model's summary."""
    inf = add(
        "info",
        help="summary of a store, or of a model (its active components and thresholds as "
        "class probabilities); exit 2 if incomplete or unreadable",
    )
    inf.add_argument("store", metavar="STORE_OR_MODEL")
    inf.add_argument("--json", action="store_true", help="print the summary as JSON")
    inf.add_argument(
        "--verify",
        action="store_true",
        help="also check every chunk file's checksum (reads the whole store)",
    )


def _fit(add: _Add) -> None:
    """The subcommand fit: the estimator parameters' flags, then the job's."""
    # One flag per parameter of ordnmf_dask.params (default None = not given, so that a flag
    # overrides the --config file only when the user gave it); the job-only flags after them.
    fit = add("fit", help="fit IG-OrdNMF on a store (flags override --config FILE)")
    fit.add_argument("store", nargs="?", help="store directory (or [store] path in --config)")
    fit.add_argument("--out", help="model directory to write (or [output] model)")
    fit.add_argument(
        "--model",
        dest="model_kind",
        choices=list(MODELS),
        help="ordnmf (default) | bepof, pf (on classes >= --threshold) | dcpf",
    )
    _param_args(fit)
    fit.add_argument("--init", help=".npz with arrays W (U, K) and H (I, K): warm start")
    fit.add_argument(
        "--init-model",
        metavar="MODEL",
        help="warm start from a saved model of the same kind and K, on this store "
        "or one that grew (users and items matched by raw id)",
    )
    fit.add_argument(
        "--resume",
        action="store_true",
        help="require resuming: fail unless --checkpoint-dir holds a usable "
        "checkpoint of this fit (without it, a fit resumes when it finds one "
        "and starts afresh otherwise)",
    )
    fit.add_argument(
        "--restart",
        action="store_true",
        help="remove the checkpoints ordnmf-dask wrote in --checkpoint-dir "
        "(of any fit; they are logged) and start afresh",
    )
    fit.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace --out if it is a model (nothing else is ever replaced)",
    )
    _cluster_args(fit)


def _evaluate(add: _Add) -> None:
    """The subcommand evaluate: test metrics of a model."""
    ev = add(
        "evaluate",
        help="NDCG@k, test log-likelihood, calibration and rating error of a model",
    )
    ev.add_argument("store")
    ev.add_argument("model")
    _command_args(ev, COMMAND_PARAMS["evaluate"])
    ev.add_argument("--json", dest="json_out", metavar="FILE", help="also write results as JSON")
    ev.add_argument(
        "--reliability",
        metavar="PNG",
        help="also draw a reliability diagram per level (needs matplotlib)",
    )
    _other_store_arg(ev)
    _cluster_args(ev)


def _recommend(add: _Add) -> None:
    """The subcommand recommend: top-N items per user."""
    rec = add(
        "recommend",
        help="top-N items per user in raw ids, training items excluded",
        description="Top-N items per user, training items excluded (the model's own index of "
        "them; STORE only for a model saved without one).",
    )
    rec.add_argument(
        "store", nargs="?", help="training store (optional: the model carries its id maps)"
    )
    rec.add_argument("model")
    who = rec.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--out",
        help="directory or URL for all users: an export of "
        "recommendations (OUT/recommendations/part-<r>.parquet)",
    )
    who.add_argument("--users", type=_name_list, help="raw user ids joined by commas")
    who.add_argument("--users-from", metavar="FILE", help=_FROM_HELP.format(noun="user"))
    _command_args(rec, COMMAND_PARAMS["recommend"])
    _other_store_arg(rec)
    _cluster_args(rec)


def _similar(add: _Add) -> None:
    """The subcommand similar-items, similar-users."""
    for axis in ("items", "users"):
        sim = add(
            f"similar-{axis}",
            help=f"the {axis} most similar to given ones (cosine of their factors)",
        )
        sim.add_argument("model")
        which = sim.add_mutually_exclusive_group(required=True)
        which.add_argument(f"--{axis}", type=_name_list, help=f"raw {axis[:-1]} ids, commas")
        which.add_argument(f"--{axis}-from", metavar="FILE", help=_FROM_HELP.format(noun=axis[:-1]))
        _command_args(sim, COMMAND_PARAMS[f"similar-{axis}"])


def _fold_in(add: _Add) -> None:
    """The subcommand fold-in: new users' recommendations."""
    fold = add(
        "fold-in",
        help="recommendations (or factors) for NEW users from a ratings file",
        description="Fold in new users from their ratings (user, item, value rows; values on "
        "the scale the store was ingested from), the model fixed; print their top-N items, "
        "their rated items excluded, or with --factors their E[w].",
    )
    fold.add_argument("model")
    fold.add_argument("ratings", help="CSV / TSV / Parquet file of the new users' ratings")
    _parsing_args(fold, _TRIPLES)
    _command_args(fold, COMMAND_PARAMS["fold-in"])


def _score(add: _Add) -> None:
    """The subcommand score: rates of given pairs."""
    sco = add("score", help="E[w_u] . E[h_i] of given (user, item) pairs")
    sco.add_argument("model")
    pairs = sco.add_mutually_exclusive_group(required=True)
    pairs.add_argument(
        "--pairs",
        metavar="FILE",
        help="CSV / TSV / Parquet of user, item rows (columns 0 and 1, or --columns)",
    )
    pairs.add_argument(
        "--users", type=_name_list, help="raw user ids, commas (with --items, pairwise)"
    )
    sco.add_argument("--items", type=_name_list, help="raw item ids, commas, one per user")
    _parsing_args(
        sco,
        "with --pairs: user,item columns, positions or names (default 0,1)",
        "with --pairs: ",
    )
    _command_args(sco, COMMAND_PARAMS["score"])


def _export(add: _Add) -> None:
    """The subcommand export: factors and top-N lists as Parquet."""
    exp = add("export", help="factors with raw ids and top-N lists as partitioned Parquet")
    exp.add_argument("model")
    exp.add_argument(
        "--out", required=True, help="directory or URL (s3://bucket/prefix, ...) of the export"
    )
    exp.add_argument(
        "--what",
        type=_name_list,
        default=["factors", "recommendations"],
        help="comma-separated subset of factors,recommendations (default both)",
    )
    _command_args(exp, COMMAND_PARAMS["export"])
    exp.add_argument(
        "--store",
        help="training store for the recommendations (default: the store the model records)",
    )
    _other_store_arg(exp)
    _cluster_args(exp)


def _predict(add: _Add) -> None:
    """The subcommand predict: class probabilities of pairs."""
    pre = add("predict", help="class probabilities of the (user, item) pairs of Parquet files")
    pre.add_argument("store", help="the training store (its id maps and compatibility)")
    pre.add_argument("model")
    pre.add_argument(
        "--pairs",
        nargs="+",
        required=True,
        help="Parquet files, directories of them, globs or URLs with columns user and item",
    )
    pre.add_argument(
        "--out", required=True, help="directory or URL: OUT/predictions/part-<j>.parquet"
    )
    _command_args(pre, COMMAND_PARAMS["predict"])
    _other_store_arg(pre)
    _cluster_args(pre)


def _reproduce(add: _Add) -> None:
    """The subcommand reproduce: the paper's comparison."""
    rep = add("reproduce", help="the paper's comparison (OrdNMF vs BePoF, PF, dcPF) on datasets")
    rep.add_argument("--out", required=True, help="directory for stores, models, tables, figures")
    rep.add_argument(
        "--data",
        help="directory holding the shared datasets "
        "(default ../shared/data from the working directory)",
    )
    rep.add_argument(
        "--datasets",
        default="movielens,tasteprofile,lastfm",
        help="comma-separated subset of movielens,tasteprofile,lastfm",
    )
    rep.add_argument("--k-grid", type=_int_list, default=[25, 50], help="K values (default 25,50)")
    rep.add_argument("--seeds", type=_int_list, default=[0, 1, 2, 3, 4])
    rep.add_argument("--max-iter", type=int, default=1000)
    rep.add_argument("--jobs", type=int, default=3, help="fits run concurrently (default 3)")
    _cluster_args(rep)


def _tune(add: _Add) -> None:
    """The subcommand tune: a search of K, alpha_W, alpha_H by successive halving."""
    tun = add(
        "tune",
        help="search K, alpha_W, alpha_H by successive halving on validation "
        "(flags and [model] of --config fix the other parameters)",
    )
    tun.add_argument("store", help="store directory (with a validation subset)")
    tun.add_argument(
        "--out",
        required=True,
        help="directory of the results table, trials and best model (DIR/best)",
    )
    tun.add_argument(
        "--model",
        dest="model_kind",
        choices=list(MODELS),
        help="ordnmf (default) | bepof, pf (on classes >= --threshold) | dcpf",
    )
    for name, flags in SEARCH_FLAGS.items():
        tun.add_argument(
            *flags,
            dest=f"space_{name}",
            metavar="V1,V2,...|LOW:HIGH",
            help=f"{PARAMS[name].doc}: values to search, or a range sampled "
            "log-uniformly (needs --n-trials)",
        )
    _command_args(tun, COMMAND_PARAMS["tune"])
    _param_args(
        tun,
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
        ),
    )  # tune's own
    _cluster_args(tun)


#: the subcommands, in the order --help lists them: each adds its parser with ``add``
_COMMANDS: tuple[Callable[[_Add], None], ...] = (
    _ingest,
    _synth,
    _info,
    _fit,
    _evaluate,
    _recommend,
    _similar,
    _fold_in,
    _score,
    _export,
    _predict,
    _reproduce,
    _tune,
)


SHORT_FLAGS = {"n_components": "-k"}


SEARCH_FLAGS = {
    "n_components": ("-k", "--n-components"),
    "alpha_W": ("--alpha-w",),
    "alpha_H": ("--alpha-h",),
}  # the parameters `tune` searches, and their flags


#: --cache-blocks spelling -> value
CACHE_BLOCKS: dict[str, bool | str] = {"auto": "auto", "on": True, "off": False}


def _auto_bool(text: str) -> bool | str:
    if text not in CACHE_BLOCKS:
        raise argparse.ArgumentTypeError(f"expected one of auto, on, off, got {text!r}")
    return CACHE_BLOCKS[text]


def _param_args(p: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
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
            kw["help"] = row.doc if row.default is None else f"{row.doc} (default {row.default})"
        p.add_argument(*row.options, **kw)


def _logging_args(p: argparse.ArgumentParser, **default: Any) -> None:
    """--debug, -q and --log-file; on the subcommands with a SUPPRESS default, so that a flag
    given before the command is not reset by the subcommand's own default."""
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs", **default)
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="only warnings and errors on stderr (--log-file still gets INFO)",
        **default,
    )
    p.add_argument("--log-file", help="also write logs to this file", **default)


def _parsing_args(p: argparse.ArgumentParser, columns: str, when: str = "") -> None:
    """``--columns`` (``columns``: its help), ``--delimiter`` and ``--header`` /
    ``--no-header`` of the commands that read files of rows (``when``: the flag they apply
    with)."""
    default = None if columns.startswith("user,item,value") else [0, 1]
    p.add_argument("--columns", type=_columns, default=default, help=columns)
    p.add_argument("--delimiter", help=f"{when}field delimiter (default: detected)")
    hdr = p.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_true", default=None)
    hdr.add_argument("--no-header", dest="header", action="store_false")


#: --columns of the files of (user, item, value) rows
_TRIPLES = (
    "user,item,value columns: 0-based positions or names (default: the names of a header "
    "line or a Parquet schema where they tell all three, else 0,1,2)"
)


def _other_store_arg(p: argparse.ArgumentParser) -> None:
    """``--allow-other-store``: use a store other than the one the model was fitted on (by
    default refused, ``postfit.evaluate.check_compatible``)."""
    p.add_argument(
        "--allow-other-store",
        action="store_true",
        help="use STORE even if the model was fitted on another store (e.g. another "
        "split of the same ratings: its test pairs may be the model's training pairs)",
    )


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="job file (TOML); flags given override it")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="tcp://host:port of a running scheduler (default: start a LocalCluster)",
    )
    p.add_argument(
        "--scheduler-file",
        metavar="FILE",
        help="scheduler file written by `dask scheduler --scheduler-file`",
    )
    p.add_argument("--workers", type=int, help="worker processes of the LocalCluster (default 1)")
    p.add_argument(
        "--threads-per-worker",
        type=int,
        help="threads of each LocalCluster worker (default: the cores shared among the workers)",
    )
    p.add_argument("--memory-limit", help="per LocalCluster worker, e.g. 4GB (default auto)")
    p.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate: TLS to the scheduler")
    p.add_argument("--tls-cert", metavar="PEM", help="our certificate (signed by the CA)")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]
