"""TLS end to end: certificates made with openssl, a TLS `dask scheduler` + 2 `dask worker`
processes, a CLI fit over TLS equal to a LocalCluster fit, and clients without the right
certificate refused."""

from __future__ import annotations

import gc
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal
from daskprocs import dask_processes
from distributed import Client
from distributed.security import Security

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.app.provenance import read_config

MAKE_CERTS = Path(__file__).resolve().parents[1] / "cluster" / "tls" / "make-certs.sh"


def make_certs(folder: Path, *names: str) -> Path:
    subprocess.run(
        ["bash", str(MAKE_CERTS), str(folder), *names], check=True, capture_output=True, timeout=60
    )
    return folder


def tls(folder: Path, name: str) -> dict[str, str]:
    return {
        "ca": str(folder / "ca.pem"),
        "cert": str(folder / f"{name}.pem"),
        "key": str(folder / f"{name}.key"),
    }


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def assert_refused(
    errors: type[Exception] | tuple[type[Exception], ...], address: str, **kwargs: object
) -> None:
    """``Client(address, **kwargs)`` fails with one of ``errors``; the half-built client is then
    collected at once. Its finalizer stops the loop runner that clients share: left to a later
    collection, it may run inside another client's start, which holds that runner's lock, and
    wait for the lock forever."""
    with pytest.raises(errors):
        Client(address, **kwargs)
    gc.collect()


def test_fit_over_tls_matches_local_and_refuses_clients_without_certificate(tmp_path, client):
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("openssl not installed")
    certs = make_certs(tmp_path / "certs", "scheduler", "worker", "client")
    rogue = make_certs(tmp_path / "rogue", "client")  # another CA: not trusted by the cluster
    y = synthetic_ordinal(25, 20, 3, seed=3)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))
    sched_file = tmp_path / "scheduler.json"
    c = tls(certs, "client")
    with dask_processes(sched_file, 2, tls(certs, "scheduler"), tls(certs, "worker")) as address:
        assert address.startswith("tls://127.0.0.1:")
        sec = Security(
            tls_ca_file=c["ca"],
            tls_client_cert=c["cert"],
            tls_client_key=c["key"],
            require_encryption=True,
        )
        with Client(address, security=sec, timeout="30s") as good:
            good.wait_for_workers(2, timeout=60)

        r = cli(
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "3",
            "--max-iter",
            "8",
            "--seed",
            "5",
            "--scheduler-file",
            str(sched_file),
            "--tls-ca-file",
            c["ca"],
            "--tls-cert",
            c["cert"],
            "--tls-key",
            c["key"],
        )
        assert r.returncode == 0, r.stderr

        # No certificate at all: refused at once (the CLI exits 3, "cluster failure").
        r = cli(
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "x.zarr"),
            "-k",
            "3",
            "--max-iter",
            "2",
            "--scheduler",
            address,
            timeout=120,
        )
        assert r.returncode == 3, r.stderr
        assert "cluster failure" in r.stderr and "Traceback" not in r.stderr
        assert_refused((OSError, TypeError), address, timeout="5s")
        # A certificate from another CA: the handshake fails, the client times out.
        b = tls(rogue, "client")
        bad = Security(
            tls_ca_file=b["ca"],
            tls_client_cert=b["cert"],
            tls_client_key=b["key"],
            require_encryption=True,
        )
        assert_refused(OSError, address, security=bad, timeout="5s")
        r = cli(
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "x.zarr"),
            "-k",
            "3",
            "--max-iter",
            "2",
            "--scheduler",
            address,
            "--tls-ca-file",
            b["ca"],
            "--tls-cert",
            b["cert"],
            "--tls-key",
            b["key"],
            timeout=120,
        )
        assert r.returncode == 3, r.stderr
        assert not (tmp_path / "x.zarr").exists()

    local = OrdNMF(3, max_iter=8, seed=5, n_members=1).fit(store, client)
    remote = OrdNMF.load(tmp_path / "m.zarr")
    assert remote.elbo_ == local.elbo_
    np.testing.assert_array_equal(remote.W_.compute(), local.W_.compute())
    np.testing.assert_array_equal(remote.H_.compute(), local.H_.compute())
    assert read_config(tmp_path / "m.zarr")["cluster"]["ca_file"] == c["ca"]


@pytest.mark.cluster
def test_local_cluster_with_tls_flags(tmp_path, capsys):
    certs = make_certs(tmp_path / "certs", "node")
    y = synthetic_ordinal(12, 10, 3, seed=1)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 1))
    n = tls(certs, "node")
    assert (
        main(
            [
                "fit",
                "--n-members",
                "1",
                store.path,
                "--out",
                str(tmp_path / "m.zarr"),
                "-k",
                "2",
                "--max-iter",
                "3",
                "--workers",
                "1",
                "--tls-ca-file",
                n["ca"],
                "--tls-cert",
                n["cert"],
                "--tls-key",
                n["key"],
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "started LocalCluster" in err and "scheduler tls://127.0.0.1:" in err
    assert "dashboard http://127.0.0.1:" in err
    assert OrdNMF.load(tmp_path / "m.zarr").n_iter_ == 3
