"""Ordinal NMF (Gouvert, Oberlin & Fevotte, ICML 2020) with exact CAVI on Dask and zarr."""

from .estimator import PF, BePoF, DcPF, OrdNMF
from .evaluate import evaluate
from .foldin import fold_in, recommend_for
from .io import ingest, ingest_arrays, open_store
from .io.store import StoreInfo
from .ppc import posterior_predictive
from .recommendations import recommend

__all__ = [
    "PF",
    "BePoF",
    "DcPF",
    "OrdNMF",
    "StoreInfo",
    "evaluate",
    "fold_in",
    "ingest",
    "ingest_arrays",
    "open_store",
    "posterior_predictive",
    "recommend",
    "recommend_for",
]
__version__ = "0.1.0"
