"""The client a command runs on, from the ``[cluster]`` section of a job: TLS, address or file."""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ordnmf_dask.app.config import ClusterSection
from ordnmf_dask.errors import ClusterConnectError, ConfigError, InputError
from ordnmf_dask.runtime.cluster import resolve_client
from ordnmf_dask.sources.infile import read_input_bytes

if TYPE_CHECKING:  # dask and distributed are imported where a cluster is used
    from distributed import Client
    from distributed.security import Security

log = logging.getLogger("ordnmf_dask")

#: Bytes of a TLS file or a scheduler file: far above a real one (a few KiB).
PEM_BYTES = 1 << 20


def security_from(spec: ClusterSection, local: bool = False) -> Security | None:
    """A ``Security`` from the TLS files of ``spec`` (None without TLS settings).

    The same certificate serves the client and, for a LocalCluster we start (``local``), the
    scheduler and workers too.
    """
    if not spec.uses_tls:
        return None
    from distributed.security import Security

    for name in ("ca_file", "cert", "key"):
        path = getattr(spec, name)
        if path:  # the one input rule (a FIFO or a device refused, not read by ssl)
            try:
                read_input_bytes(path, f"TLS {name}", limit=PEM_BYTES)
            except InputError as exc:
                message = str(exc).replace("no such file", f"TLS {name} not found")
                raise ConfigError(message) from None
    _check_pem(spec)
    files = {"tls_ca_file": spec.ca_file, "tls_client_cert": spec.cert, "tls_client_key": spec.key}
    if local:
        files |= {
            "tls_scheduler_cert": spec.cert,
            "tls_scheduler_key": spec.key,
            "tls_worker_cert": spec.cert,
            "tls_worker_key": spec.key,
        }
    require = True if spec.require_encryption is None else spec.require_encryption
    return Security(require_encryption=require, **{k: v for k, v in files.items() if v})


def _check_pem(spec: ClusterSection) -> None:
    """ConfigError naming the TLS file that is no certificate or key ssl can load (bad input,
    exit 2, rather than a cluster failure when the connection is tried)."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if spec.ca_file:
            context.load_verify_locations(cafile=spec.ca_file)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{spec.ca_file}: not a PEM CA certificate ({exc})") from None
    try:
        if spec.cert:
            # no password: an encrypted key is refused, never asked for on the terminal
            context.load_cert_chain(spec.cert, spec.key, password=lambda: b"")
    except (ssl.SSLError, ValueError) as exc:
        named = spec.cert if spec.key is None else f"{spec.cert} (key {spec.key})"
        raise ConfigError(f"{named}: not a PEM certificate and its key ({exc})") from None


def _check_resolvable(path: str) -> None:
    """ConfigError if ``path`` can never appear: a loop of symbolic links (waiting for it
    would only run out the timeout)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"scheduler file {path}: a loop of symbolic links, which no scheduler can write"
            ) from None


def scheduler_address(path: str, timeout: float | None = None) -> str:
    """The address in a scheduler file, waiting up to ``timeout`` s for it to appear
    (default: Dask's ``distributed.comm.timeouts.connect``)."""
    import dask
    from dask.utils import parse_timedelta

    if timeout is None:
        timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        _check_resolvable(path)
        if time.monotonic() > deadline:
            raise ClusterConnectError(f"scheduler file {path} did not appear within {timeout:g}s")
        time.sleep(0.2)
    try:
        data = read_input_bytes(path, "scheduler file", limit=PEM_BYTES)
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return str(json.loads(data)["address"])
    except (RecursionError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a Dask scheduler file ({exc})") from None


def starts_client(spec: ClusterSection) -> bool:
    """Whether :func:`open_client` starts or connects to a cluster for ``spec``: a scheduler,
    a local cluster setting or TLS is given (else it yields None)."""
    return spec.mode != "local" or spec.local is not None or spec.uses_tls


@contextmanager
def open_client(spec: ClusterSection, timeout: str | None = None) -> Iterator[Client | None]:
    """A client on the scheduler of ``spec``; for the local mode a LocalCluster we own, or None.

    ``timeout`` defaults to Dask's ``distributed.comm.timeouts.connect`` (30 s unless set).
    None unless :func:`starts_client`: the API then chooses (in-process for small data, else
    the default LocalCluster: one worker process, a thread per core) after validating its
    inputs, so bad input fails before any process starts.
    """
    if not starts_client(spec):
        yield None
        return
    if spec.mode == "local":
        local = spec.local_spec
        security = security_from(spec, local=True)
        with resolve_client(
            None,
            local.workers,
            threads_per_worker=local.threads_per_worker,
            memory_limit=local.memory_limit,
            security=security,
        ) as client:
            yield client
        return
    import dask
    from distributed import Client

    security = security_from(spec)
    timeout = timeout or dask.config.get("distributed.comm.timeouts.connect")
    address = spec.scheduler or scheduler_address(str(spec.scheduler_file))
    try:
        client = Client(address, timeout=timeout, security=security)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is a cluster failure
        hint = ""
        if address.startswith("tls://") and security is None:
            hint = " (a tls:// scheduler needs --tls-ca-file, --tls-cert and --tls-key)"
        raise ClusterConnectError(f"cannot connect to {address}{hint}: {exc}") from exc
    with client:
        log.info("connected to %s, dashboard %s", address, client.dashboard_link)
        yield client
