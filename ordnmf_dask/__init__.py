"""Ordinal NMF (Gouvert, Oberlin & Fevotte, ICML 2020) with exact CAVI on Dask and zarr.

The package follows the data flow: ``sources`` (text, Parquet, arrays) and ``datasets`` (public
data sets, synthetic stores) -> ``store`` (the zarr block store) -> ``engine`` (the CAVI fit;
numerics in ``model``, Dask helpers in ``runtime``) -> ``modelstore`` (the saved model) ->
``postfit`` (evaluate, recommend, fold-in, posterior predictive checks); ``app`` holds the
command line and job files.

The public names are imported on first use (``ordnmf_dask._lazy``), so that importing the
package, and ``ordnmf-dask --help``, does not load dask, distributed, scipy, numba or zarr.
"""

from typing import TYPE_CHECKING

from ._lazy import install
from .errors import InputError, StoreError

__version__ = "0.1.0"

_EXPORTS = {
    "PF": ".estimator",
    "BePoF": ".estimator",
    "DcPF": ".estimator",
    "OrdNMF": ".estimator",
    "StoreInfo": ".store.blocks",
    "open_store": ".store.blocks",
    "read_block": ".store.blocks",
    "evaluate": ".postfit.evaluate",
    "export": ".postfit.export",
    "fold_in": ".postfit.foldin",
    "recommend_for": ".postfit.foldin",
    "ingest": ".sources.ingest",
    "ingest_arrays": ".sources.ingest",
    "ingest_distributed": ".sources.ingest",
    "posterior_predictive": ".postfit.ppc",
    "predict_pairs": ".postfit.pairs",
    "recommend": ".postfit.recommend",
    "tune": ".tuning.search",
    "LogUniform": ".tuning.schedule",
}

__all__ = [
    "PF",
    "BePoF",
    "DcPF",
    "InputError",
    "LogUniform",
    "OrdNMF",
    "StoreError",
    "StoreInfo",
    "evaluate",
    "export",
    "fold_in",
    "ingest",
    "ingest_arrays",
    "ingest_distributed",
    "open_store",
    "posterior_predictive",
    "predict_pairs",
    "read_block",
    "recommend",
    "recommend_for",
    "tune",
]

if TYPE_CHECKING:  # static analysis and IDEs see the real names
    from .estimator import PF, BePoF, DcPF, OrdNMF
    from .postfit.evaluate import evaluate
    from .postfit.export import export
    from .postfit.foldin import fold_in, recommend_for
    from .postfit.pairs import predict_pairs
    from .postfit.ppc import posterior_predictive
    from .postfit.recommend import recommend
    from .sources.ingest import ingest, ingest_arrays, ingest_distributed
    from .store.blocks import StoreInfo, open_store, read_block
    from .tuning.schedule import LogUniform
    from .tuning.search import tune
else:
    install(__name__, _EXPORTS)
