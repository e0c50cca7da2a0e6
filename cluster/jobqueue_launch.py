"""Train ordnmf-dask on SLURM or PBS: a dask-jobqueue cluster of worker jobs, then the API.

Run it from a job (``sbatch cluster/slurm/train.sbatch``, ``qsub cluster/pbs/train.pbs``) or a
login node with ``sbatch`` / ``qsub`` on the PATH; it submits worker jobs, fits, saves the model
and cancels the worker jobs on exit::

    python cluster/jobqueue_launch.py --system slurm --config job.toml [--jobs 4]

Needs ``pip install "ordnmf-dask[jobqueue]"``. Worker-job resources come from the environment
(see :func:`cluster_settings`); the store, model, output and checkpoint settings come from the
job file (its ``[cluster]`` section is used only for TLS files).

Resubmitting the same job continues it: the fit resumes from its own checkpoints in
``[checkpoint] dir``. Before any worker job is submitted, every conflict is checked (the job
file, the store, the warm-start model, the output path, checkpoints of another configuration,
the batch system's submit command); a job whose configuration changed is refused, naming
``--restart`` (which discards the checkpoints ordnmf-dask wrote there). Exit codes as the
``ordnmf-dask`` command: 0 done, 2 bad input or configuration, 3 cluster failure (no worker
joined within ``--worker-timeout``), 4 numerical failure.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

DASK_YAML = os.path.abspath(os.path.join(os.path.dirname(__file__), "dask.yaml"))
SYSTEMS = ("slurm", "pbs")
SUBMIT = {"slurm": "sbatch", "pbs": "qsub"}  # what dask-jobqueue submits worker jobs with


def cluster_settings(system: str, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``SLURMCluster`` / ``PBSCluster`` keyword arguments: one worker job = one worker process
    of ``cores`` threads, which share its factor chunks (nothing moves between them).

    Environment: ORDNMF_<SLURM|PBS>_{CORES, MEMORY, WALLTIME, QUEUE, ACCOUNT, INTERFACE,
    LOCAL_DIR, LOG_DIR, DASHBOARD}. Memory is per job, all of it the worker's limit.
    """
    prefix = f"ORDNMF_{system.upper()}_"
    get = lambda name, default=None: env.get(prefix + name, default)  # noqa: E731
    cores = int(get("CORES", "8"))
    settings = {
        "cores": cores,
        "processes": 1,  # one worker process, a thread per core
        "memory": get("MEMORY", "32GB"),
        "walltime": get("WALLTIME", "04:00:00"),
        "queue": get("QUEUE"),
        "account": get("ACCOUNT"),  # -A: the project charged
        "interface": get("INTERFACE"),  # e.g. ib0: the network the workers reach us on
        "local_directory": get("LOCAL_DIR", "$TMPDIR"),  # node-local spill space
        "log_directory": get("LOG_DIR", "dask-logs"),
        "job_name": "ordnmf-worker",
        "death_timeout": 120,  # a worker whose scheduler is gone exits
        "job_script_prologue": [f"export DASK_CONFIG={DASK_YAML}"],
        "python": sys.executable,
        # the dashboard listens on loopback only: reach it with an ssh tunnel
        "scheduler_options": {"dashboard_address": get("DASHBOARD", "127.0.0.1:8787")},
    }
    if system == "slurm":  # warn workers before the walltime
        settings["job_extra_directives"] = ["--signal=SIGTERM@60"]
    # PBS: resource_spec defaults to "select=1:ncpus=<cores>:mem=<memory>"
    return settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--config", required=True, help="job file (TOML), see cluster/job.toml")
    p.add_argument("--jobs", type=int, default=2, help="worker jobs to submit")
    p.add_argument(
        "--resume",
        action="store_true",
        help="require resuming from this job's checkpoints (default: resume when "
        "there are some, start afresh otherwise)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="discard the checkpoints ordnmf-dask wrote in [checkpoint] dir and "
        "start afresh (needed after the job's configuration changed)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="fail (exit 3) when no worker job has joined by then (default 3600)",
    )
    p.add_argument("--print-job-script", action="store_true", help="print it and exit")
    args = p.parse_args(argv)

    from ordnmf_dask.errors import ELBODecreaseError, InputError

    try:
        return run(args)
    except InputError as exc:
        message = (
            str(exc)
            .replace("restart=True", "--restart")
            .replace("resume=True", "--resume")
            .replace("overwrite=True", "[output] overwrite = true in the job file")
        )
        print(f"jobqueue_launch: error: {' '.join(message.split())}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"jobqueue_launch: error: cluster failure: {exc}", file=sys.stderr)
        return 3
    except (ELBODecreaseError, FloatingPointError) as exc:
        print(f"jobqueue_launch: error: {exc}", file=sys.stderr)
        return 4


def run(args: argparse.Namespace) -> int:
    """Check the job, then start the worker jobs and fit; returns the exit code."""
    from distributed import Client

    from ordnmf_dask.app.config import resolve
    from ordnmf_dask.app.connect import security_from
    from ordnmf_dask.app.jobs import check_required, plan_job, run_job
    from ordnmf_dask.errors import InputError

    cfg = resolve(args.config)
    check_required(cfg, f" in {args.config}")
    if not args.print_job_script:  # every conflict before a worker job is submitted
        if args.resume and args.restart:
            raise InputError("--resume and --restart contradict each other: give one of them")
        plan = plan_job(cfg, resume=args.resume, restart=args.restart)
        if shutil.which(SUBMIT[args.system]) is None:
            raise InputError(
                f"{SUBMIT[args.system]} not found on the PATH: worker jobs cannot be "
                f"submitted to {args.system}"
            )
    import dask_jobqueue

    cluster_class = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster}
    logging.basicConfig(
        level=cfg.logging.level,
        filename=cfg.logging.file,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    security = security_from(cfg.cluster, local=True)
    settings = cluster_settings(args.system)
    with cluster_class[args.system](**settings, security=security) as cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        cluster.scale(jobs=args.jobs)
        with Client(cluster, security=security) as client:
            logging.getLogger("ordnmf_dask").info("dashboard %s", client.dashboard_link)
            try:  # the queue may be slow; others join later
                client.wait_for_workers(1, timeout=args.worker_timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no worker job joined within {args.worker_timeout:g} s "
                    f"(see {settings['log_directory']})"
                ) from None
            model = run_job(plan, client)
    a = model.attrs
    print(f"{a['n_iter']} iterations, ELBO {a['elbo'][-1]:.10e}, model {model.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
