"""The processes and threads of the LocalCluster the package starts when given no client."""

from __future__ import annotations

import pytest
from dask.system import CPU_COUNT

from ordnmf_dask.runtime.cluster import local_layout, resolve_client


@pytest.mark.parametrize(
    ("workers", "threads", "cores", "expected"),
    [
        (None, None, 16, (1, 16)),  # default: one process, a thread per core
        (4, None, 16, (4, 4)),  # processes given: the cores shared among them
        (3, None, 16, (3, 5)),
        (3, None, 2, (3, 1)),  # more processes than cores: one thread each
        (2, 3, 16, (2, 3)),  # both given: as given
        (None, 2, 16, (1, 2)),
    ],
)
def test_local_layout(workers, threads, cores, expected):
    assert local_layout(workers, threads, cores) == expected


@pytest.mark.cluster
def test_own_local_cluster_is_one_process_with_a_thread_per_core():
    with resolve_client(None, memory_limit="1GB") as c:
        workers = c.scheduler_info(n_workers=-1)["workers"].values()
        assert [w["nthreads"] for w in workers] == [CPU_COUNT]
