"""The ``ordnmf-dask`` command: ingest, info, fit, evaluate.

Exit codes: 0 success; 1 internal error (a bug: please report it with ``--debug`` output);
2 bad input, configuration or local I/O (a path that cannot be written); 3 cluster failure
(scheduler unreachable, workers lost); 4 numerical failure (ELBO decreased or became
non-finite); 130 interrupted (Ctrl-C / SIGINT); 143 terminated (SIGTERM, e.g. a preempted job).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import gc
import json
import logging
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, NoReturn, TypeGuard

from ordnmf_dask import __version__
from ordnmf_dask.dist import interrupt
from ordnmf_dask.errors import InputError, Terminated, UsageError
from ordnmf_dask.params import MODELS, PARAMS

log = logging.getLogger("ordnmf_dask")

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_CLUSTER, EXIT_NUMERIC = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a job killed by it
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader of standard output went away (`| head`)



def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers joined by commas: {text!r}") from None


def _name_list(text: str) -> list[str]:
    """Names joined by commas."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _columns(text: str) -> list[int | str]:
    """user,item,value columns: 0-based positions (digits) or names."""
    return [int(t) if t.strip().isdigit() else t.strip() for t in text.split(",") if t.strip()]


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


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ordnmf-dask",
        description="Ordinal NMF (IG-OrdNMF) with exact CAVI on Dask, out of core on zarr.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad input/config/local I/O, "
        "3 cluster failure, 4 numerical failure, 130 interrupted, 143 terminated.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _logging_args(p)
    common = argparse.ArgumentParser(add_help=False)
    _logging_args(common, default=argparse.SUPPRESS)  # given after the command, or before it
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = lambda name, **kw: sub.add_parser(name, parents=[common], **kw)  # noqa: E731

    ing = add("ingest", help="text or Parquet files of (user, item, value) -> zarr block store")
    ing.add_argument("inputs", nargs="+",
                     help="CSV / TSV / .dat / .parquet files (.gz, .bz2, .zst by suffix), "
                          "directories of Parquet files, globs, or s3:// gs:// http(s):// URLs "
                          "(concatenated)")
    ing.add_argument("--out", required=True, help="store directory to create")
    ing.add_argument("--ratings", choices=["halfstar", "integer"],
                     help="ordinal ratings: halfstar (x2 -> 1..10) or integer 1..V")
    ing.add_argument("--scale-max", type=int, help="V for --ratings integer (default: max seen)")
    ing.add_argument("--counts", type=_counts,
                     help="quantize counts: 'paper' (0,1,2,5,10,20,50,100,200,500) or T1,T2,...")
    ing.add_argument("--binarize", type=float, metavar="S", help="class 1 where value >= S")
    ing.add_argument("--min-count", type=int, default=0,
                     help="drop items, then users, with fewer interactions")
    ing.add_argument("--filter", dest="filter_mode", choices=["paper", "stable"], default="paper",
                     help="paper: one pass (items then users); stable: iterate until stable")
    ing.add_argument("--duplicates", choices=["error", "sum", "max", "last"], default="error")
    split = ing.add_mutually_exclusive_group()
    split.add_argument("--test", nargs="+", help="test file(s) instead of a random split")
    split.add_argument("--test-fraction", type=float, default=0.2,
                       help="about this fraction of the nonzeros goes to test, each pair by a "
                            "seeded hash of its raw ids (it keeps its subset as data grow)")
    ing.add_argument("--validation-fraction", type=float, default=0.0, metavar="F",
                     help="keep this fraction of the training nonzeros apart for validation "
                          "during fits (same hashed split; default 0: none)")
    ing.add_argument("--seed", type=int, default=0, help="seed of the random split")
    ing.add_argument("--nnz-per-block", type=int, default=2**21)
    ing.add_argument("--grid", type=_int_list, help="explicit block grid R,C")
    ing.add_argument("--delimiter", help="field delimiter (default: detected)")
    hdr = ing.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_true", default=None)
    hdr.add_argument("--no-header", dest="header", action="store_false")
    ing.add_argument("--columns", type=_columns, default=[0, 1, 2],
                     help="user,item,value columns: 0-based positions or names (default 0,1,2)")
    ing.add_argument("--overwrite", action="store_true")
    ing.add_argument("--distributed", action="store_true",
                     help="out-of-core ingest on a cluster (bounded memory per task)")
    ing.add_argument("--chunk-bytes", type=int, default=2**24,
                     help="with --distributed: bytes of text per parsing task (default 16 MiB)")
    _cluster_args(ing)

    syn = add("synth", help="sample a synthetic IG-OrdNMF dataset into a store")
    syn.add_argument("--out", required=True, help="store directory to create")
    syn.add_argument("--users", type=int, required=True, help="U")
    syn.add_argument("--items", type=int, required=True, help="I")
    syn.add_argument("--nnz", type=float, required=True, help="expected nonzeros (e.g. 1e7)")
    syn.add_argument("-k", "--n-components", type=int, required=True, help="true K")
    syn.add_argument("--classes", type=int, default=10, help="V (default 10)")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--shape", type=float, default=0.3, help="Gamma shape of W and H")
    syn.add_argument("--test-fraction", type=float, default=0.2)
    syn.add_argument("--nnz-per-block", type=int, default=2**21)
    syn.add_argument("--overwrite", action="store_true")
    _cluster_args(syn)

    inf = add("info", help="summary of a store (exit 2 if incomplete or unreadable)")
    inf.add_argument("store")
    inf.add_argument("--json", action="store_true", help="print the summary as JSON")
    inf.add_argument("--verify", action="store_true",
                     help="also check every chunk file's checksum (reads the whole store)")

    # One flag per parameter of ordnmf_dask.params (default None = not given, so that a flag
    # overrides the --config file only when the user gave it); the job-only flags after them.
    fit = add("fit", help="fit IG-OrdNMF on a store (flags override --config FILE)")
    fit.add_argument("store", nargs="?", help="store directory (or [store] path in --config)")
    fit.add_argument("--out", help="model directory to write (or [output] model)")
    fit.add_argument("--model", dest="model_kind", choices=list(MODELS),
                     help="ordnmf (default) | bepof, pf (on classes >= --threshold) | dcpf")
    _param_args(fit)
    fit.add_argument("--init", help=".npz with arrays W (U, K) and H (I, K): warm start")
    fit.add_argument("--init-model", metavar="MODEL",
                     help="warm start from a saved model of the same kind and K, on this store "
                          "or one that grew (users and items matched by raw id)")
    fit.add_argument("--resume", action="store_true",
                     help="require resuming: fail unless --checkpoint-dir holds a usable "
                          "checkpoint of this fit (without it, a fit resumes when it finds one "
                          "and starts afresh otherwise)")
    fit.add_argument("--restart", action="store_true",
                     help="remove the checkpoints ordnmf-dask wrote in --checkpoint-dir "
                          "(of any fit; they are logged) and start afresh")
    fit.add_argument("--overwrite", action="store_true", default=None,
                     help="replace --out if it is a model (nothing else is ever replaced)")
    _cluster_args(fit)

    ev = add("evaluate", help="NDCG@k and test log-likelihood of a model")
    ev.add_argument("store")
    ev.add_argument("model")
    ev.add_argument("--k", type=int, default=100)
    ev.add_argument("--levels", type=_int_list, help="relevance thresholds s (default 1..V)")
    ev.add_argument("--user-fraction", type=float, default=1.0,
                    help="NDCG over this random fraction of the users (default 1: all)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the user sample")
    ev.add_argument("--json", dest="json_out", metavar="FILE", help="also write results as JSON")
    _other_store_arg(ev)
    _cluster_args(ev)

    rec = add("recommend", help="top-N items per user in raw ids, training items excluded")
    rec.add_argument("store")
    rec.add_argument("model")
    who = rec.add_mutually_exclusive_group(required=True)
    who.add_argument("--out", help="directory or URL for all users: an export of "
                     "recommendations (OUT/recommendations/part-<r>.parquet)")
    who.add_argument("--users", help="raw user ids joined by commas: print their lists")
    rec.add_argument("-n", type=int, default=10, help="items per user (default 10)")
    rec.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    _other_store_arg(rec)
    _cluster_args(rec)

    exp = add("export", help="factors with raw ids and top-N lists as partitioned Parquet")
    exp.add_argument("model")
    exp.add_argument("--out", required=True,
                     help="directory or URL (s3://bucket/prefix, ...) of the export")
    exp.add_argument("--what", type=_name_list, default=["factors", "recommendations"],
                     help="comma-separated subset of factors,recommendations (default both)")
    exp.add_argument("-n", type=int, default=10, help="recommendations per user (default 10)")
    exp.add_argument("--store", help="training store for the recommendations (default: the "
                     "store the model records)")
    exp.add_argument("--overwrite", action="store_true",
                     help="replace --out if it is an export (nothing else is ever replaced)")
    _other_store_arg(exp)
    _cluster_args(exp)

    rep = add("reproduce", help="the paper's comparison (OrdNMF vs BePoF, PF, dcPF) on datasets")
    rep.add_argument("--out", required=True, help="directory for stores, models, tables, figures")
    rep.add_argument("--data", help="directory holding the shared datasets "
                     "(default ../shared/data from the working directory)")
    rep.add_argument("--datasets", default="movielens,tasteprofile,lastfm",
                     help="comma-separated subset of movielens,tasteprofile,lastfm")
    rep.add_argument("--k-grid", type=_int_list, default=[25, 50], help="K values (default 25,50)")
    rep.add_argument("--seeds", type=_int_list, default=[0, 1, 2, 3, 4])
    rep.add_argument("--max-iter", type=int, default=1000)
    rep.add_argument("--jobs", type=int, default=3, help="fits run concurrently (default 3)")
    _cluster_args(rep)

    tun = add("tune", help="search K, alpha_W, alpha_H by successive halving on validation "
              "(flags and [model] of --config fix the other parameters)")
    tun.add_argument("store", help="store directory (with a validation subset)")
    tun.add_argument("--out", required=True,
                     help="directory of the results table, trials and best model (DIR/best)")
    tun.add_argument("--model", dest="model_kind", choices=list(MODELS),
                     help="ordnmf (default) | bepof, pf (on classes >= --threshold) | dcpf")
    for name, flags in SEARCH_FLAGS.items():
        tun.add_argument(*flags, dest=f"space_{name}", metavar="V1,V2,...|LOW:HIGH",
                         help=f"{PARAMS[name].doc}: values to search, or a range sampled "
                              "log-uniformly (needs --n-trials)")
    tun.add_argument("--n-trials", dest="n_trials", type=int,
                     help="sample this many trials at random (default: the grid of the values)")
    tun.add_argument("--sample-seed", dest="sample_seed", type=int, default=0,
                     help="seed of the random trials (default 0)")
    tun.add_argument("--min-budget", dest="min_budget", type=int,
                     help="iterations of the first rung (default max_iter // eta^2)")
    tun.add_argument("--eta", type=int, default=3,
                     help="keep the best 1/eta of the trials at each rung (default 3)")
    tun.add_argument("--validation-metric", dest="validation_metric",
                     choices=["ndcg", "loglik"], default="ndcg",
                     help="ndcg: NDCG@--validation-k at relevance >= --validation-s; loglik: "
                          "mean held-out "
                          "log-likelihood (default ndcg)")
    tun.add_argument("--validation-k", dest="validation_k", type=int, default=100,
                     help="k of NDCG@k (default 100)")
    tun.add_argument("--validation-s", dest="validation_s", type=int,
                     help="relevance threshold s (default: --threshold for bepof / pf, else 1)")
    tun.add_argument("--allow-test", dest="allow_test", action="store_true",
                     help="score on the test subset when the store has no validation subset "
                          "(its test figures are then optimistic)")
    tun.add_argument("--user-fraction", dest="user_fraction", type=float, default=1.0,
                     help="when tune scores the models itself (test subset, or "
                          "--validation-every 0): rank this random fraction of the users "
                          "(default 1)")
    tun.add_argument("--jobs", dest="n_jobs", type=int, default=4,
                     help="fits run concurrently (default 4)")
    tun.add_argument("--overwrite", action="store_true", default=None,
                     help="replace the results of an earlier tune in --out")
    _param_args(tun, skip=(*SEARCH_FLAGS, "n_init", "work_dir", "checkpoint_dir", "executor",
                           "validation_metric", "validation_k", "validation_s"))  # tune's own
    _cluster_args(tun)
    return p


SHORT_FLAGS = {"n_components": "-k"}
SEARCH_FLAGS = {"n_components": ("-k", "--n-components"), "alpha_W": ("--alpha-w",),
                "alpha_H": ("--alpha-h",)}  # the parameters `tune` searches, and their flags
CACHE_BLOCKS = {"auto": "auto", "on": True, "off": False}  # --cache-blocks spelling -> value


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
        else:
            kw["type"] = {"int": int, "float": float, "path": str, "str": str}[param.kind]
        p.add_argument(*names, **kw)


def _logging_args(p: argparse.ArgumentParser, **default: Any) -> None:
    """--debug, -q and --log-file; on the subcommands with a SUPPRESS default, so that a flag
    given before the command is not reset by the subcommand's own default."""
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs",
                   **default)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="only warnings and errors on stderr (--log-file still gets INFO)",
                   **default)
    p.add_argument("--log-file", help="also write logs to this file", **default)


def _other_store_arg(p: argparse.ArgumentParser) -> None:
    """``--allow-other-store``: use a store other than the one the model was fitted on (by
    default refused, ``postfit.evaluate.check_compatible``)."""
    p.add_argument("--allow-other-store", action="store_true",
                   help="use STORE even if the model was fitted on another store (e.g. another "
                   "split of the same ratings: its test pairs may be the model's training pairs)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="job file (TOML); flags given override it")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="tcp://host:port of a running scheduler (default: start a LocalCluster)")
    p.add_argument("--scheduler-file", metavar="FILE",
                   help="scheduler file written by `dask scheduler --scheduler-file`")
    p.add_argument("--workers", type=int, help="worker processes of the LocalCluster (default 2)")
    p.add_argument("--threads-per-worker", type=int, help="LocalCluster threads (default 1)")
    p.add_argument("--memory-limit", help="per LocalCluster worker, e.g. 4GB (default auto)")
    p.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate: TLS to the scheduler")
    p.add_argument("--tls-cert", metavar="PEM", help="our certificate (signed by the CA)")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")


def _job(args: argparse.Namespace) -> Any:
    """The resolved job config: --config file, then the flags the user gave."""
    from ordnmf_dask.app.config import flag_overrides, resolve

    cfg = resolve(args.config, flag_overrides(vars(args)))
    if args.config:
        level, path = cfg.logging.level, cfg.logging.file
        log.setLevel(level)
        if path and not any(getattr(h, "baseFilename", None) == os.path.abspath(path)
                            for h in log.handlers):
            handler = logging.FileHandler(path)
            handler.setFormatter(log.handlers[0].formatter)
            log.addHandler(handler)
    return cfg


@contextlib.contextmanager
def _client(cluster: Any) -> Iterator[Any]:
    """A client for the [cluster] section, or None (the API then starts a LocalCluster)."""
    from ordnmf_dask.app.connect import open_client

    with open_client(cluster) as client:
        yield client


def cmd_ingest(args: argparse.Namespace) -> int:
    from ordnmf_dask.sources.inmemory import ingest

    if args.grid is not None and len(args.grid) != 2:
        raise UsageError(f"--grid takes R,C, got {args.grid}")
    if args.columns is not None and len(args.columns) != 3:
        raise UsageError(f"--columns takes user,item,value, got {args.columns}")
    kwargs = dict(
        ratings=args.ratings, counts=args.counts, binarize=args.binarize,
        scale_max=args.scale_max, min_count=args.min_count, filter_mode=args.filter_mode,
        duplicates=args.duplicates, test=args.test, test_fraction=args.test_fraction,
        validation_fraction=args.validation_fraction, seed=args.seed,
        nnz_per_block=args.nnz_per_block,
        grid=tuple(args.grid) if args.grid else None, overwrite=args.overwrite,
        delimiter=args.delimiter, header=args.header, columns=tuple(args.columns),
    )
    if args.distributed:
        from ordnmf_dask.sources.distributed import check_arguments, ingest_distributed

        check_arguments(args.out, chunk_bytes=args.chunk_bytes, **kwargs)  # before any cluster
        with _cluster_client(args) as client:
            info = ingest_distributed(args.inputs, args.out, client=client,
                                      chunk_bytes=args.chunk_bytes, **kwargs)  # fmt: skip
    else:
        info = ingest(args.inputs, args.out, **kwargs)
    print(_summary_text(info))
    return EXIT_OK


_CLUSTER_FLAGS = ("config", "scheduler", "scheduler_file", "workers", "threads_per_worker",
                  "memory_limit", "tls_ca_file", "tls_cert", "tls_key")


@contextlib.contextmanager
def _cluster_client(args: argparse.Namespace) -> Iterator[Any]:
    """A client from the cluster flags (or --config); always a client, never None.

    Used by the I/O commands (``synth``, ``ingest --distributed``): when the cluster section
    says "default local", a LocalCluster of ``--workers`` processes is started and closed here.
    """
    from ordnmf_dask.app.config import flag_overrides, resolve
    from ordnmf_dask.dist.cluster import resolve_client

    flags = {k: getattr(args, k, None) for k in _CLUSTER_FLAGS}
    spec = resolve(args.config, flag_overrides(flags)).cluster
    with _client(spec) as client:
        if client is not None:
            yield client
            return
    local = spec.local_spec
    with resolve_client(None, local.workers, threads_per_worker=local.threads_per_worker,
                        memory_limit=local.memory_limit) as client:  # fmt: skip
        yield client


def cmd_synth(args: argparse.Namespace) -> int:
    from ordnmf_dask.sources.synth import synth

    shape = (args.out, args.users, args.items, int(args.nnz), args.n_components, args.classes)
    options = dict(seed=args.seed, shape=args.shape, test_fraction=args.test_fraction,
                   nnz_per_block=args.nnz_per_block, overwrite=args.overwrite)  # fmt: skip
    synth(*shape, **options, check=True)  # before any cluster
    with _cluster_client(args) as client:
        info = synth(*shape, **options, client=client)
    assert info is not None
    print(_summary_text(info))
    return EXIT_OK


def _summary(info: Any) -> dict[str, Any]:
    a = info.attrs
    return {
        "path": info.path, "n_users": info.n_users, "n_items": info.n_items,
        "n_classes": info.n_classes, "nnz_train": info.nnz_train, "nnz_test": info.nnz_test,
        "nnz_validation": info.nnz_validation, "grid": list(info.grid),
        "value_kind": a.get("value_kind"),
        "thresholds": a.get("thresholds"), "binarize": a.get("binarize"),
        "min_count": a.get("min_count"), "split": a.get("split"), "seed": a.get("seed"),
        "hist_train": info.hist_train.tolist(), "hist_test": info.hist_test.tolist(),
        "format_version": a.get("format_version"),
    }


def _summary_text(info: Any) -> str:
    s = _summary(info)
    density = s["nnz_train"] / max(1, s["n_users"] * s["n_items"])
    lines = [
        f"store      {s['path']}",
        f"shape      {s['n_users']} users x {s['n_items']} items, V = {s['n_classes']} classes "
        f"({s['value_kind']})",
        f"nonzeros   train {s['nnz_train']}  test {s['nnz_test']}"
        + (f"  validation {s['nnz_validation']}" if "validation" in info.splits else "")
        + f"  (train density {density:.2e})",
        f"grid       {s['grid'][0]} x {s['grid'][1]} blocks",
        f"split      {s['split']} (seed {s['seed']})",
        "classes    " + "  ".join(f"{v}:{n}" for v, n in enumerate(s["hist_train"]) if v > 0),
    ]
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from ordnmf_dask.store.blocks import open_store, verify_store

    info = verify_store(args.store) if args.verify else open_store(args.store)
    print(json.dumps(_summary(info), indent=2) if args.json else _summary_text(info))
    return EXIT_OK


def cmd_fit(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.connect import starts_client
    from ordnmf_dask.app.jobs import check_required, fit_job

    cfg = _job(args)
    check_required(cfg, f" (or set it in {args.config})" if args.config
                   else " (or give --config FILE)")
    if starts_client(cfg.cluster):  # else the fit checks everything before it chooses a client
        fit_job(cfg, None, resume=args.resume, restart=args.restart, check=True)
    with _client(cfg.cluster) as client:
        model = fit_job(cfg, client, resume=args.resume, restart=args.restart)
    status = "converged" if model.converged_ else "stopped at max_iter"
    log.info("%s after %d iterations, ELBO %.10e; model in %s",
             status, model.n_iter_, model.elbo_[-1], model.model_path_)
    print(f"{status}: {model.n_iter_} iterations, ELBO {model.elbo_[-1]:.10e}, "
          f"model {model.model_path_}")
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ordnmf_dask.postfit.evaluate import evaluate

    cluster = _job(args).cluster
    with _client(cluster) as client:
        res = evaluate(args.store, args.model, client, k=args.k, levels=args.levels,
                       n_workers=cluster.local_spec.workers, user_fraction=args.user_fraction,
                       seed=args.seed, allow_other_store=args.allow_other_store)
    print(format_results(res))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(res, fh, indent=2)
    return EXIT_OK


def format_results(res: dict[str, Any]) -> str:
    """The evaluation results as a plain-text table."""
    k = res["k"]
    columns = {"ndcg": f"NDCG@{k}", "precision": f"P@{k}", "recall": f"R@{k}",
               "map": f"MAP@{k}", "auc": "AUC"}  # fmt: skip
    lines = [
        f"ranking metrics at k = {k} (relevance: y_test >= s)",
        "   s" + "".join(f"{name:>10}" for name in columns.values()) + "    users",
    ]
    for s in res["ndcg"]:
        values = "".join(f"{res[key][s]:>10.4f}" for key in columns)
        lines.append(f"{s:>4}{values}  {res['n_users'][s]:>7}")
    if res["test_loglik"] is None:
        lines.append("test log-likelihood: n/a (the model sees binarized data, not the classes)")
    else:
        lines.append(
            f"test log-likelihood: {res['test_loglik']:.6g} "
            f"({res['test_loglik_mean']:.4f} per rating, {res['nnz_test']} ratings)"
        )
    return "\n".join(lines)


COMMANDS = {"ingest": cmd_ingest, "info": cmd_info, "fit": cmd_fit, "evaluate": cmd_evaluate}
COMMANDS["synth"] = cmd_synth


def cmd_recommend(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.config import flag_overrides, resolve
    from ordnmf_dask.postfit import serving
    from ordnmf_dask.postfit.recommend import recommend

    # only the cluster flags: --out here is a directory of recommendations, not a model
    flags = {k: getattr(args, k, None) for k in _CLUSTER_FLAGS}
    cluster = resolve(args.config, flag_overrides(flags)).cluster
    users = None if args.users is None else [u.strip() for u in args.users.split(",") if u.strip()]
    if users is not None and not users:
        raise UsageError("--users needs at least one id")
    if users is not None and serving.fits_in_memory(args.model):  # no cluster needed
        res = serving.server(args.model, args.store,
                             args.allow_other_store).recommend(users, args.n)
    else:
        with _client(cluster) as client:
            res = recommend(args.store, args.model, client, n=args.n, users=users, out=args.out,
                            overwrite=args.overwrite, n_workers=cluster.local_spec.workers,
                            allow_other_store=args.allow_other_store)
    if users is None:
        print(f"recommendations written to {res}")
        return EXIT_OK
    print("user\trank\titem\tscore")
    for user, recs in res.items():
        for rank, (item, score) in enumerate(recs, start=1):
            print(f"{user}\t{rank}\t{item}\t{score:.6g}")
    return EXIT_OK


COMMANDS["recommend"] = cmd_recommend


def cmd_export(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.config import flag_overrides, resolve
    from ordnmf_dask.postfit.export import export

    # only the cluster flags: --out here is the export, not a model
    flags = {k: getattr(args, k, None) for k in _CLUSTER_FLAGS}
    cluster = resolve(args.config, flag_overrides(flags)).cluster
    with _client(cluster) as client:
        out = export(args.model, args.out, what=args.what, n=args.n, store=args.store,
                     client=client, overwrite=args.overwrite,
                     n_workers=cluster.local_spec.workers,
                     allow_other_store=args.allow_other_store)
    print(f"export written to {out}")
    return EXIT_OK


COMMANDS["export"] = cmd_export


def cmd_reproduce(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.config import flag_overrides, resolve
    from ordnmf_dask.app.reproduce import Protocol, reproduce, shared_datasets

    data = args.data or os.path.join(os.getcwd(), "..", "shared", "data")
    known = shared_datasets(data)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--datasets: unknown {unknown}; choose from {', '.join(known)}")
    missing = [known[n].path for n in names if not os.path.isfile(known[n].path)]
    if missing:
        raise UsageError(f"dataset file not found: {missing[0]} (set --data)")
    if args.jobs < 1 or not args.k_grid or not args.seeds:
        raise UsageError("--jobs must be >= 1 and --k-grid / --seeds non-empty")
    flags = {k: getattr(args, k, None) for k in _CLUSTER_FLAGS}
    cluster = resolve(args.config, flag_overrides(flags)).cluster
    proto = Protocol(k_grid=tuple(args.k_grid), seeds=tuple(args.seeds),
                     max_iter=args.max_iter, n_jobs=args.jobs)
    with _client(cluster) as client:
        text = reproduce([known[n] for n in names], args.out, client, proto,
                         n_workers=cluster.local_spec.workers)
    print(text)
    return EXIT_OK


COMMANDS["reproduce"] = cmd_reproduce


def cmd_tune(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.config import estimator_kwargs
    from ordnmf_dask.app.tune import tune
    from ordnmf_dask.app.tuning import parse_values

    cfg = _job(args)
    name = MODELS[cfg.model.kind]
    fixed, unused = estimator_kwargs(cfg, name)
    if unused:
        log.warning("not used by %s: %s", name, ", ".join(unused))
    space = {}
    for param, flags in SEARCH_FLAGS.items():
        text = getattr(args, f"space_{param}")
        if text is not None:
            space[param] = parse_values(param, text, flags[-1])
            fixed.pop(param)
    max_iter = fixed.pop("max_iter")
    with _client(cfg.cluster) as client:
        res = tune(args.store, space, client, out=args.out, model=name, params=fixed,
                   n_trials=args.n_trials, sample_seed=args.sample_seed, max_iter=max_iter,
                   min_budget=args.min_budget, eta=args.eta,
                   validation_metric=args.validation_metric,
                   validation_k=args.validation_k, validation_s=args.validation_s,
                   allow_test=args.allow_test, user_fraction=args.user_fraction,
                   n_jobs=args.n_jobs, n_workers=cfg.cluster.local_spec.workers,
                   overwrite=bool(args.overwrite))
    best = res.best
    searched = " ".join(f"{p}={best[p]:.4g}" for p in SEARCH_FLAGS)
    print(f"best: trial {best['trial']} ({searched}): {res.metric} {best['value']:.6g} after "
          f"{best['n_iter']} iterations")
    print(f"model {res.best_model}")
    print(f"table {res.csv} ({len(res.rows)} rows), {res.parquet}")
    return EXIT_OK


COMMANDS["tune"] = cmd_tune


def _dask_loggers() -> list[logging.Logger]:
    """The ``distributed`` and ``asyncio`` loggers and their children that exist now."""
    names = dict.fromkeys(["distributed", "asyncio", *logging.root.manager.loggerDict])
    return [logging.getLogger(n) for n in names if n.split(".")[0] in ("distributed", "asyncio")]


class _OnImport:
    """While in ``sys.meta_path``, runs ``then()`` right after module ``name`` is first
    imported (the import itself is left to the other finders and the module's own loader)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then
        self.loader: Any = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.loader is not None:
            return None
        sys.meta_path.remove(self)
        spec = next(filter(None, (f.find_spec(fullname, path, target) for f in sys.meta_path
                                  if hasattr(f, "find_spec"))), None)  # fmt: skip
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: Any) -> ModuleType | None:
        assert self.loader is not None
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self.loader is not None and module.__spec__ is not None
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then()


@contextlib.contextmanager
def _logging_kept(quiet: bool) -> Iterator[None]:
    """Restore on exit what a command changes in logging: the ``ordnmf_dask`` logger's handlers,
    level and propagation and the levels of the Dask loggers (main() also runs in-process, in
    tests and notebooks); handlers added meanwhile are closed.

    distributed, imported only by commands that use a cluster, configures its loggers when
    first imported: their levels then are restored on exit, and a ``quiet`` command (no
    --debug) silences them again (:func:`_silence_dask`)."""
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    levels = [(logger, logger.level) for logger in _dask_loggers()]
    hook = None
    if "distributed" not in sys.modules:

        def configured() -> None:
            levels.extend((logger, logger.level) for logger in _dask_loggers()
                          if logger.name.split(".")[0] == "distributed")  # fmt: skip
            if quiet:
                _silence_dask()

        hook = _OnImport("distributed", configured)
        sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        for h in log.handlers:
            if h not in handlers:
                h.close()
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate
        for logger, old in levels:
            logger.setLevel(old)


def _setup_logging(args: argparse.Namespace) -> None:
    """INFO (DEBUG with --debug) to stderr and --log-file; -q raises only stderr to WARNING."""
    from ordnmf_dask.dist.progress import FORMATTER as fmt
    from ordnmf_dask.dist.progress import StderrHandler

    stderr = StderrHandler()
    if args.quiet and not args.debug:
        stderr.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stderr]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file))
    for h in handlers:
        h.setFormatter(fmt)
    log.handlers[:] = handlers
    log.setLevel(logging.DEBUG if args.debug else logging.INFO)
    log.propagate = False
    if not args.debug:  # failures reach main() and become one line; --debug shows the rest
        _silence_dask()


def _silence_dask() -> None:
    """Silence the Dask loggers that exist: Dask's logging config gives some their own level
    (distributed.client: warning), and asyncio reports the client's tasks left behind by an
    interrupted gather. The worker processes of a LocalCluster we start take this level too
    (dist.cluster)."""
    for logger in _dask_loggers():  # silent: the scheduler logs even a closed client at
        logger.setLevel(logging.CRITICAL + 1)  # CRITICAL, with a traceback


# OSErrors of the local file system rather than of the network: a path that cannot be written
# (read-only, full, over quota) or is of the wrong kind
_LOCAL_IO_ERRORS = (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError,
                    FileNotFoundError)
_LOCAL_IO_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EIO,
                              errno.ENAMETOOLONG, errno.ELOOP})
_OUTPUTS = {"out": "--out", "json_out": "--json", "checkpoint_dir": "--checkpoint-dir",
            "work_dir": "--work-dir"}  # argparse destination -> flag of the paths a command writes


def _local_io_error(exc: BaseException) -> TypeGuard[OSError]:
    if not isinstance(exc, OSError) or isinstance(exc, ConnectionError | TimeoutError):
        return False
    return (isinstance(exc, _LOCAL_IO_ERRORS) or exc.errno in _LOCAL_IO_ERRNOS
            or exc.filename is not None)


def _io_message(exc: OSError, args: argparse.Namespace) -> str:
    """The path and the reason; a failed write names no file (ENOSPC): then the outputs."""
    if exc.filename is not None:
        path = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        return f"{path}: {exc.strerror or exc}"
    outputs = [f"{flag} {getattr(args, dest)}" for dest, flag in _OUTPUTS.items()
               if getattr(args, dest, None)]
    if exc.errno is None or not outputs:
        return str(exc)
    return f"{exc.strerror} (writing {', '.join(outputs)})"


def _exit_code(exc: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    if isinstance(exc, Terminated):
        return EXIT_TERMINATED, "terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, InputError):
        return EXIT_INPUT, str(exc)
    if _local_io_error(exc):
        return EXIT_INPUT, _io_message(exc, args)
    from ordnmf_dask.errors import ELBODecreaseError

    if isinstance(exc, ELBODecreaseError | FloatingPointError):
        return EXIT_NUMERIC, str(exc)
    if isinstance(exc, OSError):  # distributed's CommClosedError, timeouts, refused connections
        return EXIT_CLUSTER, f"cluster failure: {exc}"
    if type(exc).__module__.startswith("distributed"):
        return EXIT_CLUSTER, f"cluster failure: {type(exc).__name__}: {exc}"
    return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def _flag_spelling(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with the API's keyword words spelled as the command's flags:
    ``overwrite=True`` -> ``--overwrite``, ``min_count=20`` -> ``--min-count 20``,
    ``test_fraction`` -> ``--test-fraction``, ``k must`` -> ``--k must``."""
    edge = r"(?<![\w/.-])"  # not inside a path or a flag
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag, dest = max(action.option_strings, key=len), re.escape(action.dest)

        def spell(m: re.Match[str], flag: str = flag) -> str:
            value = m.group(2)
            return flag if value in (None, "", "True") else f"{flag} {value}"

        message = re.sub(rf"{edge}{dest}=(['\"]?)([^\s,;()'\"]*)\1", spell, message)
        word = rf"{edge}{dest}(?![\w/.-])" if "_" in action.dest else rf"{edge}{dest}(?= must\b)"
        message = re.sub(word, flag, message)
    return message


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ordnmf-dask``; returns the exit code.

    Logging and the SIGINT / SIGTERM handlers are left as they were found, so that calling it
    in-process changes no global state."""
    parser = _parser()
    args = parser.parse_args(argv)
    if argv is None:  # the process runs this one command and ends: the OS frees its memory,
        atexit.register(gc.freeze)  # without the interpreter's final collection of every object
    handlers = {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS}
    try:
        with _logging_kept(quiet=not args.debug), warnings.catch_warnings():
            warnings.showwarning = _warning_line
            return _run(args, parser)
    finally:
        interrupt.clear()
        if threading.current_thread() is threading.main_thread():
            for signum, handler in handlers.items():
                if handler is not None:
                    signal.signal(signum, handler)


def _warning_line(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Show a Python warning of a command as one log line, like its other messages (not the
    file, line and source text of the code that raised it)."""
    log.warning("%s: %s", category.__name__, message)


_INPUTS = {"inputs": "input", "test": "test input", "store": "training store", "model": "model",
           "init": "warm start", "init_model": "warm-start model", "config": "job file"}


def _check_outputs(args: argparse.Namespace) -> None:
    """Every path the command writes given as a flag obeys the rule of
    :mod:`ordnmf_dask.store.outputs` (checked before anything, the log file included)."""
    from ordnmf_dask.store import kinds, outputs

    # what each command's --out is (the kind of directory it writes); the other outputs are
    # --checkpoint-dir (a checkpoint directory), --json and --log-file (files)
    out_kinds = {"ingest": kinds.STORE_MARK, "synth": kinds.STORE_MARK, "fit": kinds.MODEL_KIND,
                 "export": kinds.EXPORT, "recommend": kinds.EXPORT}

    flags = {**_OUTPUTS, "log_file": "--log-file"}
    given = {flag: getattr(args, dest, None) for dest, flag in flags.items()}
    inputs: dict[str, str] = {}
    for dest, label in _INPUTS.items():
        value = getattr(args, dest, None)
        paths = value if isinstance(value, list) else [value]
        for j, path in enumerate(paths):
            if isinstance(path, str) and not any(c in path for c in "*?["):  # not a glob
                inputs[f"{label} {j + 1}" if len(paths) > 1 else label] = path
    writes = {"--out": out_kinds.get(args.command), "--checkpoint-dir": kinds.CHECKPOINT_DIRECTORY}
    outputs.check_outputs(given, inputs, writes)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        _check_outputs(args)
    except InputError as exc:
        message = _flag_spelling(str(exc), _subcommand(parser, args.command))
        print(f"ordnmf-dask {args.command}: error: {message}", file=sys.stderr)
        return EXIT_INPUT
    try:
        _setup_logging(args)
    except OSError as exc:
        print(f"ordnmf-dask {args.command}: error: cannot write --log-file: {exc}",
              file=sys.stderr)
        return EXIT_INPUT
    interrupt.install()
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader gone is seen here, not at the interpreter's exit
        return code
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one message + exit code
        if isinstance(exc, SystemExit):
            raise
        if isinstance(exc, BrokenPipeError):  # not an error of ours: stop writing, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_PIPE
        code, message = _exit_code(exc, args)
        from ordnmf_dask.errors import ConfigError

        if code == EXIT_INPUT and not isinstance(exc, ConfigError):  # those name config keys
            message = _flag_spelling(message, _subcommand(parser, args.command))
        message = " ".join(message.split())  # one line, even for multi-line exception texts
        if args.debug:
            log.exception("failed")
        print(f"ordnmf-dask {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
