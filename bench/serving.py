"""Latency of serving in memory, no cluster (ordnmf_dask.postfit.serving, the estimator's
``recommend``).

1. A saved model (default: the ml-latest-small model of examples/movielens_small.sh): time to
   load it, the first ``recommend`` (reads the factors and id maps), then ``recommend`` for one
   user at a time, seen items filtered (from the model's own index, read on first use and
   kept), side by side with the same calls unfiltered and with the read of that user's
   user-block of the index that every call made before it was kept.
2. A 1M x 200k, K = 50 model of random Gamma(1, 1) factors written here with its own id maps
   (no store, so no seen filter): ``recommend`` for 1000 random users at once, and for one.

    python bench/serving.py [--model DIR ...] [--users 1000000 --items 200000 -k 50 ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import zarr

from ordnmf_dask.estimator import OrdNMF
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore import chunkstore, seen
from ordnmf_dask.modelstore.model import MODEL_FORMAT
from ordnmf_dask.store.blocks import write_array
from ordnmf_dask.store.kinds import MODEL_KIND

BLOCK = 1 << 17  # rows per factor chunk of the random model


def clock(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def cpu_clock(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``: on a shared machine the ratio
    shows how much of the two cores the call got."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def saved_model(path: str, n_single: int) -> None:
    load, est = clock(lambda: OrdNMF.load(path))
    server = est._server()
    first, _ = clock(lambda: est.recommend([server.users.raw([0])[0]], n=10))
    rng = np.random.default_rng(0)
    users = server.users.raw(rng.integers(0, server.W.shape[0], n_single))
    times = [clock(lambda u=u: est.recommend([u], n=10))[0] for u in users]
    bare = [
        clock(lambda u=u: est.recommend([u], n=10, filter_already_seen=False))[0] for u in users
    ]
    reread = [clock(lambda: seen.load_index(est.model_path_, 0))[0] for _ in users]
    u, i = server.W.shape[0], server.H.shape[0]
    med, med_bare, med_reread = (statistics.median(x) for x in (times, bare, reread))
    print(f"saved model {path} ({u} users x {i} items, K = {server.W.shape[1]})")
    print(f"  load {load * 1e3:.1f} ms; first recommend (reads factors, ids) {first * 1e3:.1f} ms")
    print(
        f"  recommend 1 user, n = 10, over {n_single} users: seen items filtered median "
        f"{med * 1e3:.3f} ms (max {max(times) * 1e3:.3f} ms); unfiltered {med_bare * 1e3:.3f} "
        f"ms (filtered / unfiltered {med / med_bare:.2f}); reading user-block 0 of the seen "
        f"index, as every call did before it was kept, {med_reread * 1e3:.3f} ms "
        f"({med_reread / med:.1f}x a kept-index call)"
    )


def random_model(path: str, n_users: int, n_items: int, k: int) -> None:
    """A model directory of Gamma(1, 1) factors with its own id maps (raw ids 0..n-1)."""
    rng = np.random.default_rng(1)
    root = zarr.open_group(path, mode="w")
    bounds = {}
    for name, n in (("W", n_users), ("H", n_items)):
        root.create_group(name)
        b = list(range(0, n, BLOCK)) + [n]
        for j in range(len(b) - 1):
            mean = rng.gamma(1.0, 1.0, (b[j + 1] - b[j], k))
            chunkstore.save_chunk(FactorChunk.initial(mean), path, name, j)
        bounds[name] = b
    for axis, n in (("users", n_users), ("items", n_items)):
        write_array(root.create_group(axis), "ids", np.arange(n, dtype=np.int64))
    root.attrs.update(
        {
            "model": "OrdNMF",
            "family": "ordinal",
            "params": OrdNMF(k, n_members=1).get_params(),
            "delta": [0.0, 1.0],
            "theta": [1.0, 0.0],
            "elbo": [0.0],
            "n_iter": 0,
            "converged": False,
            "row_bounds": bounds["W"],
            "col_bounds": bounds["H"],
            "store": {"path": None, "n_users": n_users, "n_items": n_items, "n_classes": 1},
            "kind": MODEL_KIND,
            "format_version": MODEL_FORMAT,
            "ids": True,
            "complete": True,
        }
    )


def big_model(n_users: int, n_items: int, k: int, n_batch: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        path = os.path.join(tmp, "model.zarr")
        written, _ = clock(lambda: random_model(path, n_users, n_items, k))
        est = OrdNMF.load(path)
        first, _ = clock(lambda: est.recommend([0], n=10, filter_already_seen=False))
        rng = np.random.default_rng(2)
        batch, cpu, single = [], [], []
        for _ in range(repeat):
            users = rng.choice(n_users, n_batch, replace=False).tolist()
            wall, used = cpu_clock(
                lambda u=users: est.recommend(u, n=10, filter_already_seen=False)
            )
            batch.append(wall)
            cpu.append(used)
            user = int(rng.integers(n_users))
            single.append(
                clock(lambda u=user: est.recommend([u], n=10, filter_already_seen=False))[0]
            )
        print(
            f"random model {n_users} users x {n_items} items, K = {k} (written in "
            f"{written:.1f} s; first recommend, reading it: {first:.2f} s)"
        )
        print(
            f"  recommend {n_batch} users, n = 10: median {statistics.median(batch):.3f} s, "
            f"min {min(batch):.3f} s, max {max(batch):.3f} s over {repeat} batches "
            f"(process CPU: median {statistics.median(cpu):.3f} s); load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        print(f"  recommend 1 user, n = 10: median {statistics.median(single) * 1e3:.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        nargs="+",
        default=["out/movielens_small/model.zarr"],
        help="saved models, timed one after the other (e.g. a single fit and an ensemble)",
    )
    p.add_argument("--single", type=int, default=200, help="one-user calls timed")
    p.add_argument("--users", type=int, default=1_000_000)
    p.add_argument("--items", type=int, default=200_000)
    p.add_argument(
        "-k",
        type=int,
        nargs="+",
        default=[50],
        help="columns of the random model; several: side by side (an ensemble of M members of "
        "K components serves M K columns)",
    )
    p.add_argument("--batch", type=int, default=1000, help="users per batch call")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--saved-only", action="store_true", help="skip the random 1M x 200k model")
    args = p.parse_args()
    for model in args.model:
        saved_model(model, args.single)
    if not args.saved_only:
        for k in args.k:
            big_model(args.users, args.items, k, args.batch, args.repeat)


if __name__ == "__main__":
    main()
