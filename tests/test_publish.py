"""Publishing over an existing output: a writer killed between moving the old version aside and
moving the new one in loses nothing; the next write to the same path puts the old one back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
from conftest import CHECKOUT, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask.store.blocks import open_store, read_block, remove_leftovers

# the child writes a second store over the first with overwrite=True and is killed (SIGKILL: no
# handler runs) the moment publish moves its new version in, after the old one went aside
CHILD = textwrap.dedent(
    """
    import functools, os, signal, sys
    sys.path.insert(0, {tests!r})
    import conftest
    from conftest import dense_split, store_from_dense, synthetic_ordinal

    conftest.write_store = functools.partial(conftest.write_store, overwrite=True)

    path = {path!r}
    rename = os.rename

    def killed_between(src, dst):
        if os.fspath(dst) == path:
            os.kill(os.getpid(), signal.SIGKILL)
        rename(src, dst)

    os.rename = killed_between
    train, test = dense_split(synthetic_ordinal(12, 9, 3, seed=7))
    store_from_dense(path, train, test, 3, (1, 1))
    """
)


def _train_of(path: str) -> np.ndarray:
    return read_block(path, "train", 0, 0).y.copy()


def test_a_writer_killed_between_its_renames_leaves_the_old_version_to_put_back(tmp_path):
    train, test = dense_split(synthetic_ordinal(10, 8, 3, seed=1))
    first = store_from_dense(tmp_path / "s.zarr", train, test, 3, (1, 1))
    before = _train_of(first.path)
    code = CHILD.format(tests=str(CHECKOUT / "tests"), path=first.path)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    # killed half way: the path is gone, the old version waits in the writer's directory
    assert not os.path.lexists(first.path)
    (scratch,) = tmp_path.glob("s.zarr.tmp-*")
    assert (scratch / "old").is_dir() and (scratch / "out").is_dir()
    # the next write to the path (here its first step alone) puts it back, the new one goes
    assert remove_leftovers(first.path) == [str(scratch)]
    assert not scratch.exists()
    np.testing.assert_array_equal(_train_of(open_store(first.path).path), before)
    assert open_store(first.path).n_users == 10
