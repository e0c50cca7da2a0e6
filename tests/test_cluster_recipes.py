"""The recipes in cluster/: every YAML/TOML loads, the Dask config uses real keys, the job files
parse, the SLURM/PBS job scripts are generated and checked, the DaskJob manifest is well formed
and validates against the operator's DaskJob CRD schema (a copy in tests/data)."""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import dask
import pytest
import yaml

from ordnmf_dask.app.config import resolve

CLUSTER = Path(__file__).resolve().parents[1] / "cluster"
YAMLS = sorted(CLUSTER.rglob("*.yaml")) + sorted(CLUSTER.rglob("*.yml"))
TOMLS = sorted(CLUSTER.rglob("*.toml"))
MANIFEST = CLUSTER / "kubernetes" / "daskjob.yaml"
CRD_COPY = Path(__file__).resolve().parent / "data" / "daskjob-crd-2026.3.0.yaml.gz"


def test_every_yaml_and_toml_loads():
    assert len(YAMLS) >= 3 and len(TOMLS) >= 2
    for path in YAMLS:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), path
    for path in TOMLS:
        with open(path, "rb") as fh:
            assert tomllib.load(fh), path


@pytest.mark.parametrize("path", TOMLS, ids=lambda p: str(p.relative_to(CLUSTER)))
def test_job_files_parse_with_ordnmf_config(path):
    cfg = resolve(str(path))
    assert cfg.model.n_components and cfg.store.path and cfg.output.model
    assert cfg.checkpoint.every or cfg.checkpoint.minutes  # a preempted job resumes


def _known_keys(node: dict[str, Any], ref: dict[str, Any], where: str) -> None:
    for key, value in node.items():
        assert key in ref, f"{where}.{key}: not a Dask config key"
        if isinstance(value, dict) and isinstance(ref[key], dict) and ref[key]:
            _known_keys(value, ref[key], f"{where}.{key}")


@pytest.mark.parametrize("name", ["dask.yaml", "tls/dask-tls.yaml"])
def test_dask_configs_use_real_keys(name):
    doc = yaml.safe_load((CLUSTER / name).read_text())
    _known_keys(doc, dask.config.config, name)  # distributed's defaults are loaded by now


def test_memory_thresholds_are_ordered():
    mem = yaml.safe_load((CLUSTER / "dask.yaml").read_text())["distributed"]["worker"]["memory"]
    assert 0 < mem["target"] < mem["spill"] < mem["pause"] < mem["terminate"] < 1


def _launcher() -> Any:
    spec = importlib.util.spec_from_file_location("jobqueue_launch", CLUSTER / "jobqueue_launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_jobqueue_job_scripts(kind):
    jobqueue = pytest.importorskip("dask_jobqueue")
    cls = {"slurm": jobqueue.SLURMCluster, "pbs": jobqueue.PBSCluster}[kind]
    prefix = f"ORDNMF_{kind.upper()}_"
    env = {
        prefix + "CORES": "4",
        prefix + "MEMORY": "16GB",
        prefix + "WALLTIME": "02:00:00",
        prefix + "ACCOUNT": "proj42",
        prefix + "QUEUE": "batch",
        prefix + "DASHBOARD": "127.0.0.1:0",
    }
    settings = _launcher().cluster_settings(kind, env)
    with cls(**settings) as cluster:
        script = cluster.job_script()
        address = cluster.scheduler_address
    lines = script.splitlines()
    worker = next(line for line in lines if "distributed.cli.dask_worker" in line)
    assert address in worker
    assert "--nthreads 4" in worker and "--nworkers" not in worker and "--nanny" in worker
    assert "--memory-limit 14.90GiB" in worker  # the job's 16 GB, one worker
    assert "--death-timeout 120" in worker
    assert any(
        line.startswith("export DASK_CONFIG=") and line.endswith("cluster/dask.yaml")
        for line in lines
    )
    if kind == "slurm":
        for directive in [
            "#SBATCH --cpus-per-task=4",
            "#SBATCH --mem=15G",
            "#SBATCH -t 02:00:00",
            "#SBATCH -A proj42",
            "#SBATCH -p batch",
            "#SBATCH -J ordnmf-worker",
            "#SBATCH --signal=SIGTERM@60",
        ]:
            assert directive in lines, (directive, script)
    else:
        for directive in [
            "#PBS -l select=1:ncpus=4:mem=15GB",
            "#PBS -l walltime=02:00:00",
            "#PBS -A proj42",
            "#PBS -q batch",
            "#PBS -N ordnmf-worker",
        ]:
            assert directive in lines, (directive, script)


@pytest.mark.parametrize(
    ("script", "system"), [("slurm/train.sbatch", "slurm"), ("pbs/train.pbs", "pbs")]
)
def test_batch_scripts_run_their_launcher(script, system):
    text = (CLUSTER / script).read_text()
    assert subprocess.run(["bash", "-n", str(CLUSTER / script)]).returncode == 0
    assert f"python cluster/jobqueue_launch.py --system {system} --config" in text
    directive = "#SBATCH" if script.startswith("slurm") else "#PBS"
    assert sum(line.startswith(directive) for line in text.splitlines()) >= 3


def test_daskjob_manifest_structure():
    doc = yaml.safe_load(MANIFEST.read_text())
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskJob"
    assert doc["metadata"]["name"]
    job = doc["spec"]["job"]["spec"]["containers"][0]
    assert job["image"] and job["args"][:3] == ["ordnmf-dask", "fit", "--config"]
    mounts = {m["name"]: m["mountPath"] for m in job["volumeMounts"]}
    assert job["args"][3].startswith(mounts["job"])
    cluster = doc["spec"]["cluster"]["spec"]
    assert isinstance(cluster["worker"]["replicas"], int) and cluster["worker"]["replicas"] >= 1
    worker = cluster["worker"]["spec"]["containers"][0]
    assert worker["image"] == job["image"] and worker["args"][:2] == ["dask", "worker"]
    # one process per pod, a thread per requested core (the threads share the factor chunks)
    args = worker["args"]
    threads = args[args.index("--nthreads") + 1]
    assert args[args.index("--nworkers") + 1] == "1" and int(threads) > 1
    assert worker["resources"]["requests"]["cpu"] == threads
    scheduler = cluster["scheduler"]["spec"]["containers"][0]
    assert scheduler["image"] == job["image"]
    container_ports = {p["name"]: p["containerPort"] for p in scheduler["ports"]}
    service = cluster["scheduler"]["service"]
    assert service["type"] == "ClusterIP"
    assert service["selector"]["dask.org/cluster-name"] == doc["metadata"]["name"]
    for port in service["ports"]:
        assert isinstance(port["port"], int) and port["targetPort"] in container_ports
    assert {p["port"] for p in service["ports"]} == {8786, 8787}


def _daskjob_crd() -> str:
    """The DaskJob CRD: the file named by ORDNMF_DASKJOB_CRD (another operator version's
    crds/daskjob.yaml), else the copy of dask-kubernetes 2026.3.0's in tests/data (so that the
    test extras need not install dask-kubernetes and the kubernetes clients it pulls in)."""
    if os.environ.get("ORDNMF_DASKJOB_CRD"):
        return Path(os.environ["ORDNMF_DASKJOB_CRD"]).read_text()
    return gzip.decompress(CRD_COPY.read_bytes()).decode()


def _strict(schema: Any) -> Any:
    """Reject unknown fields where the CRD lists the properties (the API server would prune
    them silently, so a typo would be lost rather than reported)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def test_daskjob_manifest_validates_against_operator_crd():
    import jsonschema

    # libyaml's loader where PyYAML has it: the CRD is 470 kB of YAML (4.7 s against 0.8 s)
    crd = yaml.load(_daskjob_crd(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == "DaskJob"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    doc = yaml.safe_load(MANIFEST.read_text())
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(body), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])
    assert crd["spec"]["group"] == doc["apiVersion"].split("/")[0]


def test_dockerfile_copies_existing_files():
    text = (CLUSTER / "kubernetes" / "Dockerfile").read_text()
    root = CLUSTER.parent
    for line in text.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (root / src).exists(), src
    assert "pip install ." in text and "USER 1000" in text


def _job_file(path: Path, store: str, seed: int, overwrite: bool) -> str:
    path.write_text(f"""
[store]
path = "{store}"
[model]
n_components = 3
n_members = 1
max_iter = 4
tol = 1e-12
seed = {seed}
[checkpoint]
dir = "{path.parent / "ck"}"
every = 2
[output]
model = "{path.parent / "m.zarr"}"
overwrite = {str(overwrite).lower()}
[logging]
level = "WARNING"
""")
    return str(path)


@pytest.mark.cluster
def test_the_launcher_checks_every_conflict_before_submitting_a_worker_job(
    tmp_path, client, monkeypatch, capsys
):
    """The same job again passes every check (it will resume) and gets as far as submitting;
    an existing model without overwrite, or checkpoints of a changed job, stop it first with
    exit 2 naming the setting or --restart, and nothing is removed."""
    from conftest import dense_split, store_from_dense, synthetic_ordinal

    from ordnmf_dask.app.config import resolve
    from ordnmf_dask.app.jobs import plan_job, run_job

    y = synthetic_ordinal(60, 40, 3, density=0.3, seed=1)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 1)).path
    job = _job_file(tmp_path / "job.toml", store, 0, False)
    run_job(plan_job(resolve(job)), client)  # last run: its model and its checkpoints
    kept = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert kept
    monkeypatch.setenv("PATH", str(tmp_path / "no-batch-system"))
    launch = _launcher().main

    def refused(*extra: str) -> str:
        assert launch(["--system", "slurm", "--config", job, *extra]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == kept
        return line

    assert "m.zarr already exists; pass [output] overwrite = true in the job file" in refused()
    job = _job_file(tmp_path / "job.toml", store, 0, True)
    assert "sbatch not found on the PATH" in refused()  # the same job: every check passed
    job = _job_file(tmp_path / "job.toml", store, 1, True)
    assert re.search(
        r"holds checkpoints of another store or configuration .* pass --restart", refused()
    )
    assert "sbatch not found on the PATH" in refused("--restart")  # removed only once running
