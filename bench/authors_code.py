"""The authors' published OrdNMF code as a side-by-side reference, from a copy the user supplies.

The project does not ship the authors' code (https://github.com/Oligou/OrdNMF,
``model/OrdNMF/OrdNMF.py``); ``--authors-code PATH`` in ``bench/small_fit.py`` and
``bench/iteration.py`` names a checkout of that repository or the file itself. Its module is
imported unchanged: it is Python 2 code whose only Python 3 obstacle is ``import cPickle``, so
``pickle`` is registered under that name first. Its ``fit`` is called as the authors' training
script calls it (``opt_hyper=['beta']``, the fit's alpha, ``save=False``).

Usage as a process of its own (what the benchmarks run, timed from the process start)::

    python bench/authors_code.py PATH train.npz --k 50 --tol 1e-5       # its whole fit
    python bench/authors_code.py PATH train.npz --k 50 --iters 3        # s per iteration

``train.npz`` holds the training nonzeros as global ``rows``, ``cols``, classes ``y`` and
``shape`` = (U, I, V).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import pickle
import sys
import time
from types import ModuleType

import numpy as np


def load(path: str) -> ModuleType:
    """The authors' ``OrdNMF`` module from ``path`` (the file, or a checkout holding
    ``model/OrdNMF/OrdNMF.py``), imported as it is."""
    if os.path.isdir(path):
        path = os.path.join(path, "model", "OrdNMF", "OrdNMF.py")
    if not os.path.isfile(path):
        raise SystemExit(f"--authors-code: no OrdNMF.py at {path}")
    sys.modules.setdefault("cPickle", pickle)  # the module's only Python 2 import
    spec = importlib.util.spec_from_file_location("authors_ordnmf", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training_matrix(train: str) -> tuple[object, int]:
    """``train.npz`` as the (U, I) CSR matrix of classes the authors' ``fit`` takes, and V."""
    import scipy.sparse as sp

    with np.load(train) as z:
        n_users, n_items, n_classes = (int(x) for x in z["shape"])
        y = sp.csr_matrix(
            (z["y"].astype(np.int64), (z["rows"], z["cols"])), shape=(n_users, n_items)
        )
    return y, n_classes


def fit(
    module: ModuleType,
    y: object,
    n_classes: int,
    k: int,
    alpha: float,
    tol: float,
    max_iter: int,
    seed: int = 0,
) -> object:
    """The authors' fit, as their training script runs it; ``tol = -inf`` runs max_iter."""
    model = module.OrdNMF(K=k, alphaW=alpha, alphaH=alpha)
    model.fit(
        y, T=n_classes, seed=seed, opt_hyper=["beta"], precision=tol, max_iter=max_iter, save=False
    )
    return model


def seconds_per_iteration(
    module: ModuleType, y: object, n_classes: int, k: int, alpha: float, iters: int
) -> tuple[float, list[float]]:
    """Seconds per iteration of the authors' fit: the difference between fits of 1 and
    1 + ``iters`` iterations (what both share, start and first local step, cancels), over
    ``iters``, after an untimed fit of 1 iteration (the process's first calls); and the two
    fits' seconds."""
    fit(module, y, n_classes, k, alpha, -math.inf, 1)
    seconds = []
    for n in (1, 1 + iters):
        start = time.perf_counter()
        fit(module, y, n_classes, k, alpha, -math.inf, n)
        seconds.append(time.perf_counter() - start)
    return (seconds[1] - seconds[0]) / iters, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("code", help="a checkout of the authors' repository, or its OrdNMF.py")
    ap.add_argument("train", help="train.npz (rows, cols, y, shape = U, I, V)")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--tol", type=float, default=1e-5, help="its stopping rule (precision)")
    ap.add_argument(
        "--iters",
        type=int,
        default=0,
        help="instead: seconds per iteration, from fits of 1 and 1 + ITERS iterations",
    )
    args = ap.parse_args()
    module = load(args.code)
    y, n_classes = training_matrix(args.train)
    if not args.iters:
        model = fit(module, y, n_classes, args.k, args.alpha, args.tol, 10**5)
        print(f"{len(model.Elbo) - 1} iterations, ELBO {model.Elbo[-1]:.10e}")
        return
    per_iter, seconds = seconds_per_iteration(module, y, n_classes, args.k, args.alpha, args.iters)
    print(
        f"{per_iter:.6f} s per iteration "
        f"(fits of 1 and {1 + args.iters} iterations: {seconds[0]:.3f} s, {seconds[1]:.3f} s)"
    )


if __name__ == "__main__":
    main()
