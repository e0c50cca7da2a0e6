"""What the default checkpoint schedule costs a CLI fit: ``ordnmf-dask fit STORE --out MODEL``
(which checkpoints in ``MODEL.checkpoints`` beside the model) with the defaults (by time:
``checkpoint_minutes``, ``checkpoint_every`` 0), with the former default (every 10
iterations), and with no checkpoint at all, each a new process, the three interleaved in every
round; medians of the wall seconds and their ratios to the run without checkpoints.

    python bench/checkpoint_default.py [--store out/movielens_small/store.zarr] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {
    "default (by time)": [],
    "every 10 iterations": ["--checkpoint-every", "10"],
    "none": ["--checkpoint-every", "0", "--checkpoint-minutes", "1e9"],
}


def one(store: str, out: str, extra: list[str]) -> float:
    cmd = [
        sys.executable,
        "-m",
        "ordnmf_dask",
        "-q",
        "fit",
        "--n-members",
        "1",
        store,
        "--out",
        out,
        "--overwrite",
    ]
    t = time.perf_counter()
    subprocess.run([*cmd, *extra], check=True, capture_output=True, timeout=1800)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="out/movielens_small/store.zarr")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        out = os.path.join(tmp, "model.zarr")
        one(args.store, out, SETTINGS["none"])  # numba's cache and the page cache, untimed
        for _ in range(args.rounds):
            for name, extra in SETTINGS.items():
                times[name].append(one(args.store, out, extra))
                shutil.rmtree(out)
    base = statistics.median(times["none"])
    print(f"ordnmf-dask fit {args.store} (medians of {args.rounds} rounds, interleaved)")
    print(f"{'checkpoints':<22}{'wall s':>8}{'/ none':>8}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<22}{med:>8.2f}{med / base:>8.3f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
