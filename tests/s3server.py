"""An S3-compatible server on loopback for tests: moto's standalone server with the real
``s3fs`` client, no mocks.

Use it from a test module with ``pytest_plugins = ["tests.s3server"]`` (or import the fixtures):
``s3`` gives each test its own empty bucket on the session's server, as an :class:`S3Bucket`
holding a ready ``s3fs.S3FileSystem``, the ``storage_options`` that reach the bucket from any
process (the fsspec / pyarrow APIs and Dask workers take them as they are) and the environment
variables that do the same for a command run as a subprocess. Nothing is written to
``os.environ`` of the test process.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import s3fs
from moto.server import ThreadedMotoServer

# dummy credentials: moto accepts any, and explicit ones keep botocore from looking further
KEY, SECRET, REGION = "testing", "testing", "us-east-1"


@dataclass(frozen=True)
class S3Bucket:
    """One empty bucket on the loopback server and the ways to reach it."""

    endpoint_url: str
    bucket: str
    fs: s3fs.S3FileSystem = field(repr=False)

    @property
    def storage_options(self) -> dict:
        """Keyword arguments of ``s3fs.S3FileSystem`` (fsspec's ``storage_options``)."""
        return storage_options(self.endpoint_url)

    @property
    def env(self) -> dict[str, str]:
        """Variables to add to a subprocess's environment so that botocore and fsspec (through
        its ``FSSPEC_S3_*`` configuration) reach this server with the dummy credentials."""
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "FSSPEC_S3_ENDPOINT_URL": self.endpoint_url,
            "FSSPEC_S3_KEY": KEY,
            "FSSPEC_S3_SECRET": SECRET,
        }

    def url(self, path: str = "") -> str:
        """``s3://bucket/path``."""
        return f"s3://{self.bucket}/{path.lstrip('/')}" if path else f"s3://{self.bucket}"


def storage_options(endpoint_url: str) -> dict:
    """The ``s3fs.S3FileSystem`` arguments for the server at ``endpoint_url``."""
    return {
        "key": KEY,
        "secret": SECRET,
        "endpoint_url": endpoint_url,
    }


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in a thread of this process on 127.0.0.1 and a free port, for the
    session; yields its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint: str) -> Iterator[S3Bucket]:
    """A new empty bucket for this test, with a filesystem and the options that reach it."""
    fs = s3fs.S3FileSystem(**storage_options(s3_endpoint))
    bucket = f"test-{uuid.uuid4().hex[:12]}"  # unique across importers
    fs.mkdir(bucket)
    fs.invalidate_cache()
    yield S3Bucket(s3_endpoint, bucket, fs)
    fs.invalidate_cache()
