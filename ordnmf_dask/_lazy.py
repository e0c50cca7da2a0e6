"""Lazy public names for the package ``__init__``s (PEP 562), so ``import ordnmf_dask`` is cheap.

``import ordnmf_dask`` (and so ``ordnmf-dask --help``) no longer imports dask, distributed, scipy,
numba and zarr: each public name is imported from its submodule on first access, then cached as
a plain attribute. ``from ordnmf_dask import OrdNMF`` works as before.

Two public names are functions with the name of their own submodule (``ordnmf_dask.evaluate``,
``ordnmf_dask.io.ingest``). The import system sets a submodule as an attribute of its package
when it first loads it, which would replace the function by the module whenever internal code
imports the submodule first; the package class below keeps the function for those names.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class LazyPackage(types.ModuleType):
    """Module class of a package whose ``_lazy_exports`` ({name: ".submodule"}) load lazily."""

    def __getattr__(self, name: str) -> Any:
        exports = self.__dict__.get("_lazy_exports", {})
        if name not in exports:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], self.__name__), name)
        setattr(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            isinstance(value, types.ModuleType)
            and name in self.__dict__.get("_lazy_exports", {})
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            value = getattr(value, name)  # the submodule was just loaded: keep its function
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_lazy_exports", {})))


def install(module_name: str, exports: dict[str, str]) -> None:
    """Make package ``module_name`` a ``LazyPackage`` exporting ``exports`` lazily."""
    module = sys.modules[module_name]
    module._lazy_exports = dict(exports)  # type: ignore[attr-defined]
    module.__class__ = LazyPackage
