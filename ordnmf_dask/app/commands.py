"""The ``ordnmf-dask`` commands (ingest, synth, info, fit, evaluate, recommend, similar-items,
similar-users, fold-in, score, export, reproduce, tune): each turns its parsed arguments into
calls of the library, prints its result and returns the exit code (:data:`COMMANDS`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ordnmf_dask.app.exits import EXIT_OK
from ordnmf_dask.app.parser import CLUSTER_DESTS, SEARCH_FLAGS
from ordnmf_dask.engine.stops import stop_words
from ordnmf_dask.errors import InputError, UsageError, shown
from ordnmf_dask.params import COMMAND_PARAMS, MODELS

log = logging.getLogger("ordnmf_dask")


def _job(args: argparse.Namespace) -> Any:
    """The resolved job config: --config file, then the flags the user gave."""
    from ordnmf_dask.app.config import flag_overrides, resolve

    cfg = resolve(args.config, flag_overrides(vars(args)))
    if args.config:
        from ordnmf_dask.app.logs import LogFile
        from ordnmf_dask.store import locations

        level, path = cfg.logging.level, cfg.logging.file
        log.setLevel(level)
        if path and not any(
            getattr(h, "baseFilename", None) == locations.location(path) for h in log.handlers
        ):  # checked with the other outputs (cli._check_outputs)
            handler = LogFile(path)
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
    from ordnmf_dask.sources.ingest import run_plan
    from ordnmf_dask.sources.options import plan_ingest

    if args.grid is not None and len(args.grid) != 2:
        raise UsageError(f"--grid takes R,C, got {args.grid}")
    if args.columns is not None and len(args.columns) != 3:
        raise UsageError(f"--columns takes user,item,value, got {args.columns}")
    given = {name: getattr(args, name) for name, p in COMMAND_PARAMS["ingest"].items() if p.options}
    plan = plan_ingest(
        args.inputs,
        args.out,
        test=args.test,
        delimiter=args.delimiter,
        header=args.header,
        columns=None if args.columns is None else tuple(args.columns),
        **{**given, "grid": tuple(args.grid) if args.grid else None},
    )
    if args.distributed:
        with _cluster_client(args) as client:  # after the plan's checks
            info = run_plan(plan, client)
    else:
        info = run_plan(plan)
    print(_summary_text(info))
    return EXIT_OK


@contextlib.contextmanager
def _cluster_client(args: argparse.Namespace) -> Iterator[Any]:
    """A client from the cluster flags (or --config); always a client, never None.

    Used by the I/O commands (``synth``, ``ingest --distributed``): when the cluster section
    says "default local", a LocalCluster of ``--workers`` processes is started and closed here.
    """
    from ordnmf_dask.runtime.cluster import resolve_client

    spec = _cluster_of(args)
    with _client(spec) as client:
        if client is not None:
            yield client
            return
    local = spec.local_spec
    with resolve_client(
        None,
        local.workers,
        threads_per_worker=local.threads_per_worker,
        memory_limit=local.memory_limit,
    ) as client:
        yield client


def cmd_synth(args: argparse.Namespace) -> int:
    from ordnmf_dask.datasets.synth import plan_synth, write_synth

    given = {name: getattr(args, name) for name, p in COMMAND_PARAMS["synth"].items() if p.options}
    plan = plan_synth(args.out, **{**given, "nnz": int(args.nnz)})  # before any cluster
    spec = _cluster_of(args)
    if plan.grid == (1, 1) and spec.mode == "local" and spec.local is None:
        info = write_synth(plan, None)  # one block, no cluster asked for: nothing to spread
    else:
        with _cluster_client(args) as client:
            info = write_synth(plan, client)
    print(_summary_text(info))
    return EXIT_OK


def _summary(info: Any) -> dict[str, Any]:
    a = info.attrs
    return {
        "path": info.path,
        "n_users": info.n_users,
        "n_items": info.n_items,
        "n_classes": info.n_classes,
        "nnz_train": info.nnz_train,
        "nnz_test": info.nnz_test,
        "nnz_validation": info.nnz_validation,
        "grid": list(info.grid),
        "value_kind": a.get("value_kind"),
        "thresholds": a.get("thresholds"),
        "binarize": a.get("binarize"),
        "min_count": a.get("min_count"),
        "split": a.get("split"),
        "seed": a.get("seed"),
        "hist_train": info.hist_train.tolist(),
        "hist_test": info.hist_test.tolist(),
        "format_version": a.get("format_version"),
    }


def _split_text(s: dict[str, Any]) -> str:
    """The store's split as ``info --json`` names it (random, or from test files), with the
    share held out and the seed of a random one."""
    total = s["nnz_train"] + s["nnz_test"] + (s["nnz_validation"] or 0)
    if not s["nnz_test"]:
        return f"{s['split']}, none held out: every nonzero trains (no test pairs)"
    share = f"{100 * s['nnz_test'] / max(1, total):.1f}% of the nonzeros held out for test"
    if s["split"] == "random":
        return f"random, {share} (seed {s['seed']})"
    return f"{s['split']}, {share}"


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
        f"split      {_split_text(s)}",
        "classes    " + "  ".join(f"{v}:{n}" for v, n in enumerate(s["hist_train"]) if v > 0),
    ]
    return "\n".join(lines)


def _model_text(s: dict[str, Any]) -> str:
    """``info MODEL``'s text from :func:`ordnmf_dask.postfit.summary.summary`."""
    fit = (
        f"ELBO {s['elbo']:.10e}"
        if s["n_members"] == 1
        else f"an ensemble of {s['n_members']} members of K = {s['n_components']}"
    )
    lines = [
        f"model      {s['path']} ({s['model']}, {s['n_iter']} iterations, "
        f"{'converged' if s['converged'] else 'not converged'}, {fit})",
        f"shape      {s['n_users']} users x {s['n_items']} items, V = {s['n_classes']} classes; "
        f"store {s['store']}",
        f"components {s['n_active_components']} active of {s['n_components'] * s['n_members']}",
    ]
    table = s["thresholds_as_classes"]
    if table is None:
        lines.append("thresholds n/a (no ordinal law of the store's classes)")
        return "\n".join(lines)
    v = len(table[0]["probs"])
    lines.append("thresholds as P(y = v | y > 0) at the rates where P(y > 0) is:")
    lines.append(" P(y>0)     rate" + "".join(f"{c:>7}" for c in range(1, v + 1)) + "  E[class]")
    for row in table:
        probs = "".join(f"{p:>7.3f}" for p in row["probs"])
        lines.append(
            f"{row['reach']:>7.2f} {row['rate']:>8.3g}{probs}  {row['expected_class']:>8.2f}"
        )
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from ordnmf_dask.store.blocks import open_store, verify_store
    from ordnmf_dask.store.kinds import is_model

    if is_model(args.store):
        from ordnmf_dask.modelstore.model import open_model
        from ordnmf_dask.postfit.summary import summary

        s = summary(open_model(args.store))
        print(json.dumps(s, indent=2) if args.json else _model_text(s))
        return EXIT_OK
    info = verify_store(args.store) if args.verify else open_store(args.store)
    print(json.dumps(_summary(info), indent=2) if args.json else _summary_text(info))
    return EXIT_OK


def cmd_fit(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.jobs import check_required, plan_job, run_job

    cfg = _job(args)
    check_required(
        cfg, f" (or set it in {args.config})" if args.config else " (or give --config FILE)"
    )
    plan = plan_job(cfg, resume=args.resume, restart=args.restart)  # before any cluster
    with _client(cfg.cluster) as client:
        model = run_job(plan, client)
    h = model.header
    status = stop_words(h.record.get("stop_reason"), h.converged)
    if h.n_members > 1:
        runs = "/".join(str(r.get("n_iter")) for r in h.runs)
        print(f"{status}: {h.n_members} members after {runs} iterations, model {model.path}")
    else:
        print(f"{status}: {h.n_iter} iterations, ELBO {h.elbo[-1]:.10e}, model {model.path}")
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ordnmf_dask.postfit.evaluate import evaluate

    cluster = _job(args).cluster
    with _client(cluster) as client:
        res = evaluate(
            args.store,
            args.model,
            client,
            **{name: getattr(args, name) for name in COMMAND_PARAMS["evaluate"]},
            n_workers=cluster.local_spec.workers,
            allow_other_store=args.allow_other_store,
        )
    print(format_results(res))
    if args.reliability and res["calibration"] is not None:
        from ordnmf_dask.app.plots import plot_reliability

        plot_reliability(res["calibration"]["reliability"], args.reliability)
    if args.json_out:
        from ordnmf_dask.store.outputs import write_file

        text = json.dumps(res, indent=2).encode()
        write_file(args.json_out, lambda fh: fh.write(text), "--json")
    return EXIT_OK


def format_results(res: dict[str, Any]) -> str:
    """The evaluation results as a plain-text table."""
    k = res["k"]
    columns = {
        "ndcg": f"NDCG@{k}",
        "precision": f"P@{k}",
        "recall": f"R@{k}",
        "map": f"MAP@{k}",
        "auc": "AUC",
    }
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
    return "\n".join(lines + format_calibration(res.get("calibration")))


def format_calibration(cal: dict[str, Any] | None) -> list[str]:
    """The lines of ``evaluate``'s calibration results (none without them)."""
    if cal is None:
        return ["class probabilities: n/a (the model has no law of the store's classes)"]
    return [
        f"class probabilities ({cal['posterior']} posterior, {cal['n']} test ratings): "
        f"log-loss {cal['log_loss']:.4f}  Brier {cal['brier']:.4f}  "
        f"expected rating RMSE {cal['rmse']:.4f}  MAE {cal['mae']:.4f}",
        "calibration error of P(y >= s | y > 0): "
        + "  ".join(f"{s}:{e:.4f}" for s, e in cal["ece"].items()),
    ]


def _cluster_of(args: argparse.Namespace) -> Any:
    """The [cluster] section from the cluster flags (and --config) alone, for the commands whose
    --out is not a model (a directory of recommendations, an export, predictions)."""
    from ordnmf_dask.app.config import flag_overrides, resolve

    flags = {k: getattr(args, k, None) for k in CLUSTER_DESTS}
    return resolve(args.config, flag_overrides(flags)).cluster


def cmd_recommend(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.tables import ranked_rows, write_table
    from ordnmf_dask.postfit import serving

    cluster = _cluster_of(args)
    if args.out is not None:  # every user: the recommendations dataset of an export
        from ordnmf_dask.postfit.export import export

        with _client(cluster) as client:
            out = export(
                args.model,
                args.out,
                what=["recommendations"],
                n=args.n,
                store=args.store,
                client=client,
                overwrite=args.overwrite,
                n_workers=cluster.local_spec.workers,
                allow_other_store=args.allow_other_store,
                proba_at=args.proba_at,
            )
        print(f"recommendations written to {out}")
        return EXIT_OK
    users, where = _requested(args, "users")
    if serving.fits_in_memory(args.model):  # no cluster needed
        from ordnmf_dask.app.pairsfile import check_known

        srv = serving.server(args.model, args.store, args.allow_other_store)
        check_known(srv.users, users, where)
        res: dict[Any, list[tuple[Any, ...]]] = srv.recommend(users, args.n)
        if args.proba_at is not None:
            from ordnmf_dask.postfit.predict import recommend_with_proba

            res = recommend_with_proba(srv, res, args.proba_at)
    else:  # imported here: a model served in memory loads no pyarrow, no cluster machinery
        from ordnmf_dask.modelstore.model import open_model
        from ordnmf_dask.postfit.recommend import recommend

        store = args.store or open_model(args.model).attrs["store"]["path"]
        with _client(cluster) as client:
            lists = recommend(
                store,
                args.model,
                client,
                n=args.n,
                users=users,
                n_workers=cluster.local_spec.workers,
                allow_other_store=args.allow_other_store,
                proba_at=args.proba_at,
            )
        assert not isinstance(lists, str)  # without out, the lists themselves
        res = lists
    proba = [] if args.proba_at is None else [f"P(y>={args.proba_at}|y>0)"]
    write_table(["user", "rank", "item", "score", *proba], ranked_rows(res), args.format)
    return EXIT_OK


def _similar(axis: str) -> Any:
    def cmd_similar(args: argparse.Namespace) -> int:
        from ordnmf_dask.app.pairsfile import check_known
        from ordnmf_dask.app.tables import ranked_rows, write_table
        from ordnmf_dask.postfit import serving

        ids, where = _requested(args, axis)
        srv = serving.server(args.model)
        check_known(getattr(srv, axis), ids, where)
        res = srv.similar(axis, ids, args.n)
        noun = axis[:-1]
        write_table([noun, "rank", f"similar_{noun}", "cosine"], ranked_rows(res), args.format)
        return EXIT_OK

    cmd_similar.__doc__ = f"``similar-{axis}``: the most similar {axis} of given ones."
    return cmd_similar


def _requested(
    args: argparse.Namespace, axis: str
) -> tuple[list[str], Callable[[int], str] | None]:
    """The raw ids a serving command is asked about (``--users`` / ``--items``, or one per line
    of ``--users-from`` / ``--items-from`` FILE, ``-`` for standard input, at most
    :data:`~ordnmf_dask.sources.infile.ID_FILE` bytes; blank lines skipped), and where each
    was read ("FILE, line N"; None for the flag's list). InputError when the file holds none."""
    path = getattr(args, f"{axis}_from", None)
    if path is None:
        return getattr(args, axis), None  # never empty (parser._parts)
    from ordnmf_dask.sources.infile import ID_FILE, read_input_bytes, too_big

    what = f"{axis[:-1]} id file"
    if path == "-":  # read as a file is, and bounded as one (`< /dev/zero` ends)
        name, stream = "standard input", getattr(sys.stdin, "buffer", sys.stdin)
        raw = stream.read(ID_FILE + 1)
        raw = raw.encode("utf-8") if isinstance(raw, str) else raw
        if len(raw) > ID_FILE:
            raise too_big(name, what, None, ID_FILE)
    else:
        name, raw = path, read_input_bytes(path, what, ID_FILE)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{name}, line {line}: not UTF-8 text") from None
    ids, lines = [], []
    text = text.removeprefix("\ufeff")  # a byte-order mark, as the ratings readers drop it
    for number, line in enumerate(text.split("\n"), start=1):  # lines as the readers count
        if line.strip():
            ids.append(line.strip())
            lines.append(number)
    if not ids:
        raise InputError(f"{name}: no {axis[:-1]} ids (one per line)")
    return ids, lambda j: f"{name}, line {lines[j]}"


def cmd_fold_in(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.pairsfile import check_known, raw_ids
    from ordnmf_dask.app.tables import ranked_rows, write_table
    from ordnmf_dask.postfit import serving
    from ordnmf_dask.sources.filtering import distinct_ids
    from ordnmf_dask.sources.readers import read_triples

    if args.columns is not None and len(args.columns) != 3:
        raise UsageError(f"--columns takes user,item,value, got {args.columns}")
    rows = read_triples(
        args.ratings,
        delimiter=args.delimiter,
        header=args.header,
        columns=None if args.columns is None else tuple(args.columns),
    )
    server = serving.server(args.model)
    user_ids, item_ids = raw_ids(rows.users), raw_ids(rows.items)
    _check_fold_in_values(server, rows, user_ids, item_ids)
    users: dict[Any, tuple[list[Any], list[float]]] = {}
    seen: set[tuple[Any, Any]] = set()
    for k, (user, item, value) in enumerate(
        zip(user_ids, item_ids, rows.values.tolist(), strict=True)
    ):
        if user is None or user == "":
            raise InputError(f"{rows.origin.where(k)}: no user id (item {shown(item)})")
        if (user, item) in seen:
            raise InputError(
                f"{rows.origin.where(k)}: user {shown(user)} rates item {shown(item)} twice"
            )
        seen.add((user, item))
        items, values = users.setdefault(user, ([], []))
        items.append(item)
        values.append(value)
    if not users:  # an empty history: nothing to fold in, said rather than an empty table
        raise InputError(f"{args.ratings}: no ratings (user, item, value rows) to fold in")
    distinct_ids(rows.users, rows.origin, "user")  # new ids obey ingest's rule: printable text
    check_known(server.items, item_ids, rows.origin.where)
    items = [v[0] for v in users.values()]
    w = server.fold_in("users", items, [v[1] for v in users.values()], new_ids=list(users))
    if args.factors:
        columns = ["user", *(f"f{k}" for k in range(w.shape[1]))]
        write_table(
            columns, [(u, *row) for u, row in zip(users, w.tolist(), strict=True)], args.format
        )
        return EXIT_OK
    recs = server.recommend_for(w, args.n, exclude=items)
    named = dict(zip(users, (recs[j] for j in range(len(users))), strict=True))
    write_table(["user", "rank", "item", "score"], ranked_rows(named), args.format)
    return EXIT_OK


def _check_fold_in_values(server: Any, rows: Any, users: list[Any], items: list[Any]) -> None:
    """InputError naming the file, line and ids of the first row of a fold-in ratings file
    whose value the model cannot take (on the scale its store was ingested from)."""
    from ordnmf_dask.postfit import foldin
    from ordnmf_dask.sources.origin import Named

    likelihoods, threshold = foldin.likelihoods_of(server.model)
    foldin.check_values(
        rows.values,
        likelihoods[0],
        server.model.header.store.n_classes,
        threshold,
        foldin.value_spec(server.model),
        Named(rows.origin, lambda k: f"user {shown(users[k])}, item {shown(items[k])}"),
    )


def cmd_score(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.tables import write_table
    from ordnmf_dask.postfit import serving

    columns = ["user", "item", "score"]
    if args.pairs is not None:
        from ordnmf_dask.app.pairsfile import PairsFile

        if args.items is not None:
            raise UsageError("--items goes with --users, not with --pairs")
        pairs = PairsFile.of(args.pairs, args.columns, args.header, args.delimiter)
        server = serving.server(args.model)
        if not pairs.check(server):  # every id checked before a line is written
            raise UsageError(f"{args.pairs}: no pairs")
        write_table(columns, pairs.scored(server), args.format)
        return EXIT_OK
    if args.items is None:
        raise UsageError("--users needs --items (one item per user)")
    users, items = args.users, args.items
    scores = serving.server(args.model).score(users, items)
    write_table(columns, zip(users, items, scores.tolist(), strict=True), args.format)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from ordnmf_dask.postfit.export import export

    cluster = _cluster_of(args)
    with _client(cluster) as client:
        out = export(
            args.model,
            args.out,
            what=args.what,
            n=args.n,
            store=args.store,
            client=client,
            overwrite=args.overwrite,
            n_workers=cluster.local_spec.workers,
            allow_other_store=args.allow_other_store,
            proba_at=args.proba_at,
        )
    print(f"export written to {out}")
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    from ordnmf_dask.postfit.pairs import predict_pairs

    cluster = _cluster_of(args)
    with _client(cluster) as client:
        out = predict_pairs(
            args.model,
            args.pairs,
            args.out,
            store=args.store,
            given_interaction=args.given_interaction,
            posterior=args.posterior,
            client=client,
            overwrite=args.overwrite,
            n_workers=cluster.local_spec.workers,
            allow_other_store=args.allow_other_store,
        )
    print(f"class probabilities written to {out}")
    return EXIT_OK


def cmd_reproduce(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.reproduce import Protocol, reproduce, shared_datasets
    from ordnmf_dask.sources.infile import open_input_file

    data = args.data or os.path.join(os.getcwd(), "..", "shared", "data")
    known = shared_datasets(data)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--datasets: unknown {unknown}; choose from {', '.join(known)}")
    if not os.path.isdir(data):  # named as what it is: absent, a file, a FIFO
        what = "no such directory" if not os.path.exists(data) else "not a directory"
        raise UsageError(f"--data {data}: {what} (the directory of the datasets)")
    for name in names:  # each file by the input rule, before any work (regular files only)
        try:
            open_input_file(known[name].path, f"dataset {name}").close()
        except InputError as exc:
            raise InputError(f"{exc} (--data {data})") from None
    if args.n_jobs < 1 or not args.k_grid or not args.seeds:
        raise UsageError("--jobs must be >= 1 and --k-grid / --seeds non-empty")
    cluster = _cluster_of(args)
    proto = Protocol(
        k_grid=tuple(args.k_grid),
        seeds=tuple(args.seeds),
        max_iter=args.max_iter,
        n_jobs=args.n_jobs,
    )
    with _client(cluster) as client:
        text = reproduce(
            [known[n] for n in names], args.out, client, proto, n_workers=cluster.local_spec.workers
        )
    print(text)
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    from ordnmf_dask.app.config import estimator_kwargs
    from ordnmf_dask.tuning.schedule import parse_values
    from ordnmf_dask.tuning.search import tune

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
        res = tune(
            args.store,
            space,
            client,
            out=args.out,
            model=name,
            params=fixed,
            max_iter=max_iter,
            **{n: getattr(args, n) for n, p in COMMAND_PARAMS["tune"].items() if p.options},
            n_workers=cfg.cluster.local_spec.workers,
        )
    best = res.best
    searched = " ".join(f"{p}={best[p]:.4g}" for p in SEARCH_FLAGS)
    print(
        f"best: trial {best['trial']} ({searched}): {res.metric} {best['value']:.6g} after "
        f"{best['n_iter']} iterations"
    )
    print(f"model {res.best_model}")
    print(f"table {res.csv} ({len(res.rows)} rows), {res.parquet}")
    return EXIT_OK


COMMANDS = {
    "ingest": cmd_ingest,
    "synth": cmd_synth,
    "info": cmd_info,
    "fit": cmd_fit,
    "evaluate": cmd_evaluate,
    "predict": cmd_predict,
    "recommend": cmd_recommend,
    "similar-items": _similar("items"),
    "similar-users": _similar("users"),
    "fold-in": cmd_fold_in,
    "score": cmd_score,
    "export": cmd_export,
    "reproduce": cmd_reproduce,
    "tune": cmd_tune,
}
