"""Train/test/validation split: random over nonzeros by a seeded hash of each pair's RAW ids,
or a user-supplied test set; the validation set is always carved from the training pairs by the
same hash.

A pair's subset depends only on its raw (user, item) ids, the seed and the fractions: never on
the other pairs, the input order, the files, the contiguous indices or how the work was chunked.
A pair present in two periods of growing data therefore lands in the same subset in both (a
model warm-started on the later period is not scored on its own training pairs). The price is
that the test set holds about, not exactly, ``test_fraction`` of the nonzeros (binomially).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.store.idmap import int_id

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SPAN = 2**64  # hashes are uniform on [0, 2^64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer, a bijection of uint64 (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))  # a new array: the rest is in place
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
        return x


def id_hashes(ids: np.ndarray) -> np.ndarray:
    """Hash of each raw id: FNV-1a (64 bit) of the UTF-8 bytes of its text, then SplitMix64.

    The text of an integer id is its canonical decimal form, so an id hashes the same whether
    the store keeps its axis as int64 or as strings (``id_kind``), from text, Parquet or memory.

    Parameters
    ----------
    ids : np.ndarray, shape (m,)
        int64 ids, or strings (``<U``, or ASCII bytes ``S`` padded with NULs, as staged).

    Returns
    -------
    np.ndarray of uint64, shape (m,)
    """
    ids = np.asarray(ids)
    if ids.dtype.kind in "SU" and len(ids) and ids.dtype.itemsize:
        matrix = np.ascontiguousarray(ids).view(np.uint8 if ids.dtype.kind == "S" else np.uint32)
        matrix = matrix.reshape(len(ids), -1)
        if ids.dtype.kind == "S" or int(matrix.max()) < 128:  # ASCII: code points are the bytes
            return _mix64(_fnv_padded(matrix))
    return _mix64(_fnv_text(ids))


def _fnv_padded(matrix: np.ndarray) -> np.ndarray:
    """FNV-1a of each row of ``matrix`` (n, w): bytes padded with NULs, which ids never hold
    (refused when read), so each id's length is its count of nonzero entries."""
    lengths = np.count_nonzero(matrix, axis=1)
    h = np.full(len(matrix), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max(initial=0))):
            h = np.where(lengths > j, (h ^ matrix[:, j].astype(np.uint64)) * _FNV_PRIME, h)
    return h


def _fnv_text(ids: np.ndarray) -> np.ndarray:
    """FNV-1a of the UTF-8 text of each id (int64 in decimal, or str), via pyarrow's strings."""
    if ids.dtype.kind in "iu":
        text = pc.cast(pa.array(ids.astype(np.int64, copy=False)), pa.large_string())
    else:
        # numpy text converts to pyarrow's string type (to large_string directly only from
        # pyarrow 17 on), then is cast
        text = pc.cast(pa.array(ids.astype(str, copy=False)), pa.large_string())
    offsets = np.frombuffer(text.buffers()[1], np.int64, len(text) + 1, text.offset * 8)
    body = text.buffers()[2]
    data = np.frombuffer(body, np.uint8) if body is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")  # longest first: position j's ids are a prefix
    starts, lengths = offsets[:-1][order], lengths[order]
    hashed = np.full(len(ids), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max(initial=0))):
            n = int(np.searchsorted(-lengths, -j, side="left"))  # ids longer than j bytes
            hashed[:n] = (hashed[:n] ^ data[starts[:n] + j]) * _FNV_PRIME
    h = np.empty_like(hashed)
    h[order] = hashed
    return h


def pair_hash(user_hash: np.ndarray, item_hash: np.ndarray, seed: int) -> np.ndarray:
    """Seeded hash of (user, item) pairs from their ids' hashes (``id_hashes``):
    ``mix64(mix64(hu ^ mix64(seed + GAMMA)) ^ hi)``, uniform on [0, 2^64).

    Parameters
    ----------
    user_hash, item_hash : np.ndarray of uint64, shape (n,)
    seed : int

    Returns
    -------
    np.ndarray of uint64, shape (n,)
    """
    with np.errstate(over="ignore"):
        offset = _mix64(np.asarray([seed], dtype=np.uint64) + _GAMMA)[0]
    u = np.asarray(user_hash, np.uint64)
    i = np.asarray(item_hash, np.uint64)
    return _mix64(_mix64(u ^ offset) ^ i)


@dataclass(frozen=True)
class SplitRule:
    """Which subset a pair hash ``h`` falls in: test if ``h < test_below``, validation if
    ``test_below <= h < validation_below``, else train (bounds in [0, 2^64))."""

    test_below: int
    validation_below: int

    def masks(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(is_test, is_validation) of pair hashes ``h`` (uint64)."""
        is_test = h < np.uint64(self.test_below)
        return is_test, (h < np.uint64(self.validation_below)) & ~is_test


def split_rule(test_fraction: float | None, validation_fraction: float) -> SplitRule:
    """The hash ranges of a split: test ``[0, f 2^64)`` (``test_fraction`` f; None: a test file,
    no random test pairs), validation the next ``g`` of the rest (``validation_fraction`` g of
    the training pairs, in expectation)."""
    test_below = 0
    if test_fraction is not None:
        check_test_fraction(test_fraction)
        test_below = int(float(test_fraction) * _SPAN)
    check_validation_fraction(validation_fraction)
    rest = _SPAN - test_below
    val = min(int(float(validation_fraction) * rest), rest - 1)
    return SplitRule(test_below, test_below + val)


def check_train_left(
    label: str, n: int, n_train: int, test_fraction: float | None, validation_fraction: float
) -> None:
    """Raise InputError if the split of ``n`` nonzeros left none (``n_train``) for training."""
    if n_train:
        return
    fractions = ([] if test_fraction is None else [f"test_fraction={test_fraction:g}"]) + (
        [f"validation_fraction={validation_fraction:g}"] if validation_fraction else []
    )
    raise InputError(
        f"{label}: the random split leaves no training data: all {n} nonzeros go to the test "
        f"or validation set ({', '.join(fractions)}); give more data or smaller fractions"
    )


def check_validation_left(
    label: str, n_validation: int, n_train: int, validation_fraction: float, seed: int
) -> None:
    """Raise InputError if ``validation_fraction`` > 0 put none of the ``n_train`` training
    pairs of ``label`` in the validation subset (a fit would then validate on nothing)."""
    if validation_fraction <= 0 or n_validation:
        return
    raise InputError(
        f"{label}: validation_fraction={validation_fraction:g} put none of its {n_train} "
        f"training pairs in the validation subset (seed {seed}); if they are the training "
        "pairs of a store split with the same seed, that split sent every pair of the "
        "validation range to its test set: give another seed (--seed)"
    )


def check_test_fraction(test_fraction: float) -> None:
    """Raise InputError unless 0 <= test_fraction < 1."""
    if not 0.0 <= float(test_fraction) < 1.0:
        raise InputError(f"test_fraction must be in [0, 1), got {shown(test_fraction)}")


def check_validation_fraction(validation_fraction: float) -> None:
    """Raise InputError unless 0 <= validation_fraction < 1."""
    if isinstance(validation_fraction, bool) or not 0.0 <= float(validation_fraction) < 1.0:
        raise InputError(f"validation_fraction must be in [0, 1), got {shown(validation_fraction)}")


def lookup(known: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each query id in the sorted array ``known``, or -1 if absent.

    Parameters
    ----------
    known : np.ndarray of int64 or str, shape (m,), sorted and distinct
    query : np.ndarray of int64 or str, shape (n,)
        Converted to the kind of ``known`` first (strings that are not the canonical decimal
        form of an integer are absent from integer ids).

    Returns
    -------
    np.ndarray of int64, shape (n,)
    """
    query, ok = _as_kind(query, known)
    out = np.full(len(query), -1, dtype=np.int64)
    if known.size == 0 or query.size == 0:
        return out
    pos = np.minimum(np.searchsorted(known, query), known.size - 1)
    found = ok & (known[pos] == query)
    out[found] = pos[found]
    return out


def _as_kind(query: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.ones(len(query), dtype=bool)
    if known.dtype.kind != "i":
        return query.astype(str), ok
    if query.dtype.kind == "i":
        return query.astype(np.int64), ok
    out = np.zeros(len(query), dtype=np.int64)
    for k, tok in enumerate(query.astype(str)):
        number = int_id(tok)  # the canonical decimal form only
        ok[k] = number is not None
        out[k] = number or 0
    return out, ok
