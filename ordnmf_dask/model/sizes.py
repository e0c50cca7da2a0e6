"""Bytes held by the result objects that live on the workers.

Dask measures a result with ``dask.sizeof``, which falls back to ``sys.getsizeof`` and so to
``__sizeof__``. Without one, a dataclass of arrays counts as ~56 bytes: the workers' managed
memory leaves it out (spilling then reacts to process memory alone, freeing nothing it can
measure) and the scheduler places tasks as if moving it cost nothing. The dataclasses of
arrays that tasks return define ``__sizeof__ = held_bytes``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def held_bytes(obj: object) -> int:
    """The dataclass instance ``obj`` plus the bytes of the numpy arrays in its fields (also
    inside tuples and lists). Arrays shared with other objects are counted in full."""
    arrays = [
        _array_bytes(getattr(obj, f.name))
        for f in dataclasses.fields(obj)  # type: ignore[arg-type]
    ]
    return object.__sizeof__(obj) + sum(arrays)


def _array_bytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, tuple | list):
        return sum(_array_bytes(v) for v in value)
    return 0
