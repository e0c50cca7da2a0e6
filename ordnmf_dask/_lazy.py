"""Lazy public names for the package ``__init__`` (PEP 562), so ``import ordnmf_dask`` is cheap.

``import ordnmf_dask`` (and so ``ordnmf-dask --help``) does not import dask, distributed, scipy,
numba or zarr: each public name is imported from its submodule on first access, then cached as
a plain attribute.
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

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_lazy_exports", {})))


def install(module_name: str, exports: dict[str, str]) -> None:
    """Make package ``module_name`` a ``LazyPackage`` exporting ``exports`` lazily."""
    module = sys.modules[module_name]
    module._lazy_exports = dict(exports)  # type: ignore[attr-defined]
    module.__class__ = LazyPackage
