"""Ordinal NMF (Gouvert, Oberlin & Fevotte, ICML 2020) with exact CAVI on Dask and zarr."""

from .estimator import OrdNMF
from .evaluate import evaluate
from .io.store import StoreInfo, open_store

__all__ = ["OrdNMF", "StoreInfo", "evaluate", "open_store"]
__version__ = "0.1.0"
