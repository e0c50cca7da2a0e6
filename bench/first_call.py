"""The first fit and the first ``recommend`` on a machine against later ones: each in a new
process, the first with an empty numba cache (``NUMBA_CACHE_DIR``, a fresh temporary
directory: the kernels are compiled), the second with the cache the first one left (loaded).
Prints the seconds of each step side by side, their difference, and the announcement each run
logged on stderr (``model/compiling.py``); then the same for the command line: the wall time of
``ordnmf-dask fit STORE --max-iter 5`` and of ``ordnmf-dask recommend MODEL --users U -n 10``,
each a new process (start-up, imports and loading included), in an empty then a warm cache.

    python bench/first_call.py [--store out/movielens_small/store.zarr] [-k 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, time
t = time.perf_counter()
from ordnmf_dask import OrdNMF
imported = time.perf_counter() - t
t = time.perf_counter()
model = OrdNMF(int(sys.argv[2]), tol=1e-5, seed=0, n_members=1).fit(
    sys.argv[1], show_progress=False
)
fit = time.perf_counter() - t
user = model._server().users.raw([0])[0]
t = time.perf_counter()
model.recommend([user], 10)
first = time.perf_counter() - t
t = time.perf_counter()
model.recommend([user], 10)
second = time.perf_counter() - t
print(json.dumps({"import": imported, "fit": fit, "n_iter": model.n_iter_,
                  "recommend 1st": first, "recommend 2nd": second, "user": user}))
"""


def run(store: str, k: int, cache: str) -> tuple[dict[str, float], list[str]]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, store, str(k)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    said = [line for line in r.stderr.splitlines() if "compiling" in line]
    return json.loads(r.stdout.splitlines()[-1]), said


def cli(args: list[str], cache: str) -> float:
    """Wall seconds of ``ordnmf-dask ARGS`` in a new process with numba's cache at ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ordnmf_dask", "-q", *args],
        env=env,
        capture_output=True,
        timeout=1800,
        check=True,
    )
    return time.perf_counter() - t


def cli_steps(store: str, k: int, user: str, cache: str, out: str) -> dict[str, float]:
    model = os.path.join(out, "model.zarr")
    fit = ["fit", store, "--out", model, "-k", str(k), "--max-iter", "5", "--overwrite"]
    return {
        "CLI fit": cli(fit, cache),
        "CLI recommend": cli(["recommend", model, "--users", user, "-n", "10"], cache),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="out/movielens_small/store.zarr")
    p.add_argument("-k", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        cold, cold_said = run(args.store, args.k, cache)
        warm, warm_said = run(args.store, args.k, cache)
    user = str(cold["user"])
    with (
        tempfile.TemporaryDirectory(prefix="numba-cache-") as cache,
        tempfile.TemporaryDirectory(prefix="first-call-") as out,
    ):
        cold |= cli_steps(args.store, args.k, user, cache, out)
        warm |= cli_steps(args.store, args.k, user, cache, out)
    print(f"store {args.store}, K = {args.k}, in-process fit ({cold['n_iter']} iterations)")
    print(f"{'seconds':<16}{'empty cache':>12}{'warm cache':>12}{'difference':>12}")
    for key in ("import", "fit", "recommend 1st", "recommend 2nd", "CLI fit", "CLI recommend"):
        print(f"{key:<16}{cold[key]:>12.3f}{warm[key]:>12.3f}{cold[key] - warm[key]:>12.3f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, said in (("empty cache", cold_said), ("warm cache", warm_said)):
        print(f"{name}: {len(said)} announcement(s)" + "".join(f"\n  {s}" for s in said))


if __name__ == "__main__":
    main()
