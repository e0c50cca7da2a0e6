"""Train ordnmf-dask on SLURM or PBS: a dask-jobqueue cluster of worker jobs, then the API.

Run it from a job (``sbatch cluster/slurm/train.sbatch``, ``qsub cluster/pbs/train.pbs``) or a
login node with ``sbatch`` / ``qsub`` on the PATH; it submits worker jobs, fits, saves the model
and cancels the worker jobs on exit::

    python cluster/jobqueue_launch.py --system slurm --config job.toml [--jobs 4]

Needs ``pip install "ordnmf-dask[jobqueue]"``. Worker-job resources come from the environment
(see :func:`cluster_settings`); the store, model, output and checkpoint settings come from the
job file (its ``[cluster]`` section is used only for TLS files).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

DASK_YAML = os.path.abspath(os.path.join(os.path.dirname(__file__), "dask.yaml"))
SYSTEMS = ("slurm", "pbs")


def cluster_settings(system: str, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``SLURMCluster`` / ``PBSCluster`` keyword arguments: one worker job = ``cores``
    single-threaded workers.

    Environment: ORDNMF_<SLURM|PBS>_{CORES, MEMORY, WALLTIME, QUEUE, ACCOUNT, INTERFACE,
    LOCAL_DIR, LOG_DIR, DASHBOARD}. Memory is per job and is split evenly between its workers.
    """
    prefix = f"ORDNMF_{system.upper()}_"
    get = lambda name, default=None: env.get(prefix + name, default)  # noqa: E731
    cores = int(get("CORES", "8"))
    settings = {
        "cores": cores,
        "processes": cores,                     # 1 thread per worker process
        "memory": get("MEMORY", "32GB"),
        "walltime": get("WALLTIME", "04:00:00"),
        "queue": get("QUEUE"),
        "account": get("ACCOUNT"),              # -A: the project charged
        "interface": get("INTERFACE"),          # e.g. ib0: the network the workers reach us on
        "local_directory": get("LOCAL_DIR", "$TMPDIR"),  # node-local spill space
        "log_directory": get("LOG_DIR", "dask-logs"),
        "job_name": "ordnmf-worker",
        "death_timeout": 120,                   # a worker whose scheduler is gone exits
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
    p.add_argument("--print-job-script", action="store_true", help="print it and exit")
    args = p.parse_args(argv)

    import dask_jobqueue
    from distributed import Client

    from ordnmf_dask.app.config import resolve
    from ordnmf_dask.app.connect import security_from
    from ordnmf_dask.app.jobs import check_required, fit_job

    cluster_class = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster}
    cfg = resolve(args.config)
    check_required(cfg, f" in {args.config}")
    logging.basicConfig(level=cfg.logging.level, filename=cfg.logging.file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    security = security_from(cfg.cluster, local=True)
    settings = cluster_settings(args.system)
    with cluster_class[args.system](**settings, security=security) as cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        cluster.scale(jobs=args.jobs)
        with Client(cluster, security=security) as client:
            logging.getLogger("ordnmf_dask").info("dashboard %s", client.dashboard_link)
            client.wait_for_workers(1, timeout=3600)  # the queue may be slow; others join later
            model = fit_job(cfg, client)
    print(f"{model.n_iter_} iterations, ELBO {model.elbo_[-1]:.10e}, model {model.model_path_}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
