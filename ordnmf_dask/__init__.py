"""Ordinal NMF (Gouvert, Oberlin & Fevotte, ICML 2020) with exact CAVI on Dask and zarr.

The public names are imported on first use (``ordnmf_dask._lazy``), so that importing the
package, and ``ordnmf-dask --help``, does not load dask, distributed, scipy, numba or zarr.
"""

from typing import TYPE_CHECKING

from ._lazy import install

__version__ = "0.1.0"

_EXPORTS = {
    "PF": ".estimator",
    "BePoF": ".estimator",
    "DcPF": ".estimator",
    "OrdNMF": ".estimator",
    "StoreInfo": ".io.store",
    "evaluate": ".evaluate",
    "fold_in": ".foldin",
    "recommend_for": ".foldin",
    "ingest": ".io",
    "ingest_arrays": ".io",
    "open_store": ".io",
    "posterior_predictive": ".ppc",
    "recommend": ".recommendations",
}

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

if TYPE_CHECKING:  # static analysis and IDEs see the real names
    from .estimator import PF, BePoF, DcPF, OrdNMF
    from .evaluate import evaluate
    from .foldin import fold_in, recommend_for
    from .io import ingest, ingest_arrays, open_store
    from .io.store import StoreInfo
    from .ppc import posterior_predictive
    from .recommendations import recommend
else:
    install(__name__, _EXPORTS)
