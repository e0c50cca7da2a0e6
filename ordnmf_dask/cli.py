"""The ``ordnmf-dask`` command: ingest, info, fit, evaluate.

Exit codes: 0 success; 1 internal error (a bug: please report it with ``--debug`` output);
2 bad input or configuration; 3 cluster failure (scheduler unreachable, workers lost);
4 numerical failure (ELBO decreased or became non-finite); 130 interrupted (Ctrl-C / SIGINT).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from . import __version__
from .engine.cavi import ELBODecreaseError
from .io.errors import InputError

log = logging.getLogger("ordnmf_dask")

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_CLUSTER, EXIT_NUMERIC = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130


class UsageError(InputError):
    """A command-line value that parses but makes no sense."""


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers joined by commas: {text!r}") from None


def _counts(text: str) -> str | list[float]:
    if text == "paper":
        return text
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--counts takes 'paper' or increasing numbers T1,T2,...: {text!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ordnmf-dask",
        description="Ordinal NMF (IG-OrdNMF) with exact CAVI on Dask, out of core on zarr.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad input/config, 3 cluster failure, "
        "4 numerical failure, 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    common.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    common.add_argument("--log-file", help="also write logs to this file")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = lambda name, **kw: sub.add_parser(name, parents=[common], **kw)  # noqa: E731

    ing = add("ingest", help="text files of (user, item, value) -> zarr block store")
    ing.add_argument("inputs", nargs="+", help="CSV / TSV / .dat files (concatenated)")
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
    split.add_argument("--test-fraction", type=float, default=0.2)
    ing.add_argument("--seed", type=int, default=0, help="seed of the random split")
    ing.add_argument("--nnz-per-block", type=int, default=2**21)
    ing.add_argument("--grid", type=_int_list, help="explicit block grid R,C")
    ing.add_argument("--delimiter", help="field delimiter (default: detected)")
    hdr = ing.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_true", default=None)
    hdr.add_argument("--no-header", dest="header", action="store_false")
    ing.add_argument("--columns", type=_int_list, default=[0, 1, 2],
                     help="0-based user,item,value columns (default 0,1,2)")
    ing.add_argument("--overwrite", action="store_true")

    inf = add("info", help="summary of a store (exit 2 if incomplete or unreadable)")
    inf.add_argument("store")
    inf.add_argument("--json", action="store_true", help="print the summary as JSON")

    fit = add("fit", help="fit IG-OrdNMF on a store")
    fit.add_argument("store")
    fit.add_argument("--out", required=True, help="model directory to write")
    fit.add_argument("-k", "--n-components", type=int, required=True, help="latent factors K")
    fit.add_argument("--alpha-w", type=float, default=0.3)
    fit.add_argument("--alpha-h", type=float, default=0.3)
    fit.add_argument("--tol", type=float, default=1e-5)
    fit.add_argument("--max-iter", type=int, default=1000)
    fit.add_argument("--min-iter", type=int, default=0)
    fit.add_argument("--seed", type=int, default=0, help="seed of the random initialization")
    fit.add_argument("--approx", action="store_true", help="q(n) = delta_1 (PF on binary data)")
    fit.add_argument("--init", help=".npz with arrays W (U, K) and H (I, K): warm start")
    fit.add_argument("--cache", choices=["auto", "on", "off"], default="auto",
                     help="keep training blocks in worker memory (auto: if they fit)")
    fit.add_argument("--lineage-every", type=int, default=10)
    fit.add_argument("--work-dir", help="scratch directory visible to every worker")
    fit.add_argument("--overwrite", action="store_true")
    _cluster_args(fit)

    ev = add("evaluate", help="NDCG@k and test log-likelihood of a model")
    ev.add_argument("store")
    ev.add_argument("model")
    ev.add_argument("--k", type=int, default=100)
    ev.add_argument("--levels", type=_int_list, help="relevance thresholds s (default 1..V)")
    ev.add_argument("--json", dest="json_out", metavar="FILE", help="also write results as JSON")
    _cluster_args(ev)
    return p


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="tcp://host:port of a running scheduler (default: start a LocalCluster)")
    p.add_argument("--workers", type=int, default=2,
                   help="worker processes of the LocalCluster (default 2)")


@contextlib.contextmanager
def _client(args: argparse.Namespace) -> Iterator[Any]:
    """A client on ``--scheduler``, or None (the API then starts and closes a LocalCluster)."""
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if not args.scheduler:
        yield None
        return
    from distributed import Client

    with Client(args.scheduler, timeout="30s") as client:
        log.info("connected to %s, dashboard %s", args.scheduler, client.dashboard_link)
        yield client


def cmd_ingest(args: argparse.Namespace) -> int:
    from .io import ingest

    if args.grid is not None and len(args.grid) != 2:
        raise UsageError(f"--grid takes R,C, got {args.grid}")
    if args.columns is not None and len(args.columns) != 3:
        raise UsageError(f"--columns takes user,item,value, got {args.columns}")
    info = ingest(
        args.inputs, args.out, ratings=args.ratings, counts=args.counts, binarize=args.binarize,
        scale_max=args.scale_max, min_count=args.min_count, filter_mode=args.filter_mode,
        duplicates=args.duplicates, test=args.test, test_fraction=args.test_fraction,
        seed=args.seed, nnz_per_block=args.nnz_per_block,
        grid=tuple(args.grid) if args.grid else None, overwrite=args.overwrite,
        delimiter=args.delimiter, header=args.header, columns=tuple(args.columns),
    )
    print(_summary_text(info))
    return EXIT_OK


def _summary(info: Any) -> dict[str, Any]:
    a = info.attrs
    return {
        "path": info.path, "n_users": info.n_users, "n_items": info.n_items,
        "n_classes": info.n_classes, "nnz_train": info.nnz_train, "nnz_test": info.nnz_test,
        "grid": list(info.grid), "value_kind": a.get("value_kind"),
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
        f"nonzeros   train {s['nnz_train']}  test {s['nnz_test']}  (train density {density:.2e})",
        f"grid       {s['grid'][0]} x {s['grid'][1]} blocks",
        f"split      {s['split']} (seed {s['seed']})",
        "classes    " + "  ".join(f"{v}:{n}" for v, n in enumerate(s["hist_train"]) if v > 0),
    ]
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from .io import open_store

    info = open_store(args.store)
    print(json.dumps(_summary(info), indent=2) if args.json else _summary_text(info))
    return EXIT_OK


def cmd_fit(args: argparse.Namespace) -> int:
    from .estimator import OrdNMF

    if os.path.exists(args.out) and not args.overwrite:
        raise UsageError(f"{args.out} exists; pass --overwrite to replace it")
    model = OrdNMF(
        args.n_components, alpha_W=args.alpha_w, alpha_H=args.alpha_h, tol=args.tol,
        max_iter=args.max_iter, min_iter=args.min_iter, random_state=args.seed,
        approx=args.approx, cache_blocks={"auto": "auto", "on": True, "off": False}[args.cache],
        lineage_every=args.lineage_every, work_dir=args.work_dir, n_workers=args.workers,
    )
    with _client(args) as client:
        model.fit(args.store, client, init=args.init, out=args.out, overwrite=args.overwrite)
    status = "converged" if model.converged_ else "stopped at max_iter"
    log.info("%s after %d iterations, ELBO %.10e; model in %s",
             status, model.n_iter_, model.elbo_[-1], model.model_path_)
    print(f"{status}: {model.n_iter_} iterations, ELBO {model.elbo_[-1]:.10e}, "
          f"model {model.model_path_}")
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate

    with _client(args) as client:
        res = evaluate(args.store, args.model, client, k=args.k, levels=args.levels,
                       n_workers=args.workers)
    print(format_results(res))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(res, fh, indent=2)
    return EXIT_OK


def format_results(res: dict[str, Any]) -> str:
    """The evaluation results as a plain-text table."""
    lines = [f"NDCG@{res['k']} (relevance: y_test >= s)", "   s    NDCG    users"]
    for s, v in res["ndcg"].items():
        lines.append(f"{s:>4}  {v:.4f}  {res['n_users'][s]:>7}")
    lines.append(
        f"test log-likelihood: {res['test_loglik']:.6g} "
        f"({res['test_loglik_mean']:.4f} per rating, {res['nnz_test']} ratings)"
    )
    return "\n".join(lines)


COMMANDS = {"ingest": cmd_ingest, "info": cmd_info, "fit": cmd_fit, "evaluate": cmd_evaluate}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    handlers: list[logging.Handler] = [_StderrHandler()]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file))
    for h in handlers:
        h.setFormatter(fmt)
    log.handlers[:] = handlers
    log.setLevel(level)
    log.propagate = False
    if not args.debug:
        logging.getLogger("distributed").setLevel(logging.ERROR)


def _exit_code(exc: BaseException) -> tuple[int, str]:
    from distributed.comm.core import CommClosedError

    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, InputError | FileExistsError | FileNotFoundError):
        return EXIT_INPUT, str(exc)
    if isinstance(exc, ELBODecreaseError | FloatingPointError):
        return EXIT_NUMERIC, str(exc)
    if isinstance(exc, CommClosedError | TimeoutError | OSError):
        return EXIT_CLUSTER, f"cluster failure: {exc}"
    if type(exc).__module__.startswith("distributed"):
        return EXIT_CLUSTER, f"cluster failure: {type(exc).__name__}: {exc}"
    return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ordnmf-dask``; returns the exit code."""
    args = _parser().parse_args(argv)
    _setup_logging(args)
    try:
        return COMMANDS[args.command](args)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one message + exit code
        if isinstance(exc, SystemExit):
            raise
        code, message = _exit_code(exc)
        if args.debug:
            log.exception("failed")
        print(f"ordnmf-dask {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
