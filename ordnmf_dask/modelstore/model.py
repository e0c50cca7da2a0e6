"""A fitted model on disk: one zarr group, factors chunked by block, arrays and JSON only.

The layout and attributes are specified in docs/model-format.md. Written to ``MODEL.tmp-<id>``
by the workers (each chunk where it lives), then renamed: a model directory is complete or
absent. At a URL (object stores cannot rename) the workers write it in place between the marks
of :mod:`ordnmf_dask.store.locations`, the root's ``complete`` attribute last. An existing path is
replaced only if it is a model (see :func:`model_target`). A model carries a copy of its
training store's raw id maps, so that it alone can name users and items, and an index of its
users' training items (:mod:`.seen`), so that it alone can leave them out of recommendations.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ordnmf_dask.errors import StoreError
from ordnmf_dask.modelstore import chunkstore, seen
from ordnmf_dask.modelstore.modelheader import MODEL_FORMAT, ModelHeader, check_ids
from ordnmf_dask.runtime.inprocess import wait
from ordnmf_dask.store import idmap, locations, nodes
from ordnmf_dask.store.blocks import (
    AXES,
    check_target,
    discard_temporary,
    open_store,
    publish,
    read_as_one_version,
    temporary_path,
)
from ordnmf_dask.store.decode import INVENTORY, ChunkFiles, chunk_path
from ordnmf_dask.store.kinds import MODEL_KIND, is_model, is_store

if TYPE_CHECKING:  # dask and distributed are imported where they are used
    import dask.array as da
    from distributed import Client, Future


def model_target(
    out: str | os.PathLike, overwrite: bool, store: str | os.PathLike | None = None
) -> str:
    """Absolute path (or URL) to write a model to, after checking it may be (over)written;
    InputError if not. Never the training ``store``, a path inside it or one that contains it;
    an existing path only with ``overwrite`` and only if it is a model."""
    return check_target(
        out,
        overwrite,
        "model written by ordnmf_dask",
        is_model,
        MODEL_KIND,
        {"training store": store},
    )


def store_fingerprint(path: str) -> str:
    """Content fingerprint of a store: a hash of its shape attributes and of the size and
    CRC-32 of every chunk file of every array (their inventories), read from metadata only."""
    group = zarr.open_group(path, mode="r")
    attrs = group.attrs.asdict()
    doc = {k: attrs.get(k) for k in ("n_users", "n_items", "n_classes", "value_kind")}
    arrays = {
        name: array.attrs.get(INVENTORY) for name, array in sorted(group.arrays(), key=_first)
    }
    doc["arrays"] = arrays
    for name, sub in sorted(group.groups(), key=_first):
        arrays.update(
            {
                f"{name}/{inner}": array.attrs.get(INVENTORY)
                for inner, array in sorted(sub.arrays(), key=_first)
            }
        )
    return _digest(doc)


FITTED = (
    "model",
    "family",
    "params",
    "elbo",
    "delta",
    "p",
    "t",
    "store",
    "row_bounds",
    "col_bounds",
    "init_model",
)
ENSEMBLE_FITTED = ("n_members", "members")  # in the fingerprint of ensembles only


def model_fingerprint(attrs: dict[str, Any]) -> str:
    """Fingerprint of a saved model: a hash of the attributes that describe its fit (class,
    parameters, bound after each iteration, thresholds, store with its fingerprint, and the
    model it was warm-started from)."""
    keys = FITTED + (ENSEMBLE_FITTED if attrs.get("n_members", 1) != 1 else ())
    return _digest({k: attrs.get(k) for k in keys})


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def _digest(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def copy_id_chunks(files: ChunkFiles, target: str, indices: list[int]) -> None:
    """Copy chunk files ``indices`` of a store's id array (checked against its inventory) into
    the array directory ``target``, byte for byte; on a worker."""
    for i in indices:
        locations.write_bytes(chunk_path(target, i), files.load(i))


_ID_CHUNKS_PER_TASK = 16  # chunk files of 2^20 ids each


def _copy_ids(client: Client, store: str, root: zarr.Group, tmp: str) -> list[Future]:
    """Start copying the id maps of ``store`` into the model being written at ``tmp``: the
    arrays' metadata (with their chunk inventories) here, the chunk files on the workers, so no
    process holds a whole map."""
    copies = []
    for axis in AXES:
        source = locations.join(store, axis, "ids")
        files = ChunkFiles.of(zarr.open_array(source, mode="r"), source)
        root.create_group(axis)
        target = locations.join(tmp, axis, "ids")
        locations.write_bytes(
            locations.join(target, "zarr.json"),
            locations.read_bytes(locations.join(source, "zarr.json")),
        )
        # an unhashed key: saves of models of one store run at once (tune's trials), and Dask
        # loses a hashed key scattered by two of them at the same time
        shared = client.scatter(files, broadcast=True, hash=False)
        n = len(files.nbytes)
        copies += [
            client.submit(
                copy_id_chunks,
                shared,
                target,
                list(range(lo, min(n, lo + _ID_CHUNKS_PER_TASK))),
                pure=False,
            )
            for lo in range(0, n, _ID_CHUNKS_PER_TASK)
        ]
    return copies


def save_model(
    client: Client,
    w: list[Future],
    h: list[Future],
    path: str,
    attrs: dict[str, Any],
    overwrite: bool = False,
    before_publish: Callable[[], None] | None = None,
) -> str:
    """Write the factor chunks (on the workers) and ``attrs`` to ``path``, atomically; an
    existing ``path`` is replaced only as :func:`model_target` allows. With a training store
    recorded in ``attrs["store"]["path"]``, its raw id maps are copied into the model and the
    index of its users' training items (:mod:`.seen`) is written. ``before_publish`` (the
    store's ``check_unchanged``) runs once everything is written and before the model becomes
    visible: a store replaced meanwhile is an error, and no model mixing two stores is
    published.

    At a URL the model is written in place between the marks of
    :mod:`ordnmf_dask.store.locations` (an existing model there is removed first); a failed write
    removes what it wrote, but keeps the pending marker while a worker may still be writing."""
    path = model_target(path, overwrite)
    store = attrs.get("store", {}).get("path")
    url = locations.is_url(path)
    if url:
        locations.begin(path, MODEL_KIND)
        tmp = path
    else:
        tmp, scratch = temporary_path(path)
    written: list[Future] = []
    try:
        root = zarr.open_group(tmp, mode="a" if url else "w", zarr_format=3)
        root.create_group("W")
        root.create_group("H")
        written = [client.submit(chunkstore.save_chunk, f, tmp, "W", r) for r, f in enumerate(w)]
        written += [client.submit(chunkstore.save_chunk, f, tmp, "H", c) for c, f in enumerate(h)]
        if store is not None:
            written += _copy_ids(client, store, root, tmp)
            written += seen.start_writing(
                client, store, root, tmp, attrs["row_bounds"], attrs["col_bounds"]
            )
        wait(written)
        for f in written:
            f.result()  # re-raise a worker's write error here
        final = ModelHeader.written(attrs, path).to_attrs()  # as its readers will accept it
        if before_publish is not None:
            before_publish()
        root.update_attributes(final)  # one write of zarr.json (attrs.update writes per key)
        if url:
            locations.finish(path)
        else:
            publish(tmp, path, lambda p: model_target(p, overwrite))
    except BaseException:
        if url:
            settled = all(f.done() for f in written)
            client.cancel(written)
            locations.remove(path, keep_pending=not settled)
        raise
    finally:
        if not url:  # a task still running (interrupted) may yet write there
            discard_temporary(scratch, settled=all(f.done() for f in written))
    return path


def copy_model(model: ModelInfo, out: str | os.PathLike, overwrite: bool) -> str:
    """Copy the complete model ``model`` to ``out`` (a directory or a URL) as :func:`save_model`
    would write it; returns where. Only the keys of its zarr hierarchy are copied, each a
    regular file read without following a link (:func:`locations.open_regular`): a link or a
    file a user put in the model directory is never copied."""
    store = model.attrs["store"]["path"]
    target = model_target(out, overwrite, store)
    tmp, scratch = temporary_path(target)
    try:
        with model.reading():  # the version opened, whole, or an error
            if locations.is_url(model.path):
                fs, key = locations.filesystem(model.path)
                for name in locations.zarr_keys(model.path):
                    local = os.path.join(tmp, *name.split("/"))
                    os.makedirs(os.path.dirname(local), exist_ok=True)
                    fs.get_file(f"{key}/{name}", local)
            else:
                for name in locations.hierarchy_keys(locations.local_files(model.path)):
                    parts = name.split("/")
                    locations.copy_regular(
                        os.path.join(model.path, *parts), os.path.join(tmp, *parts)
                    )
        publish(tmp, target, lambda p: model_target(p, overwrite, store), MODEL_KIND)
    finally:
        discard_temporary(scratch)
    return target


def version_of(path: str) -> tuple[Any, ...]:
    """The version of the model at ``path``: the identity of its root ``zarr.json``
    (:func:`locations.identity`), which every publish of a model there changes (a new file,
    renamed in, or at a URL rewritten). StoreError if there is none."""
    try:
        return locations.identity(locations.join(path, locations.META))
    except OSError:
        raise StoreError(f"{path}: the model is gone (no zarr.json)") from None


@dataclass(frozen=True)
class ModelInfo:
    """A complete model directory: its attributes, checked as :attr:`header`, the version they
    were read from (:func:`version_of`), and lazy access to its factors.

    One version per reader: whatever a reader takes from the directory after opening it is
    checked to come from that same version (:meth:`reading`), so that a model published at the
    same path meanwhile (``fit --overwrite``) is an error saying so, never the new factors with
    the old thresholds."""

    path: str
    attrs: dict[str, Any]
    version: tuple[Any, ...] = ()

    def check_unchanged(self) -> None:
        """StoreError if the directory no longer holds the version this was opened from."""
        if self.version and _current(self.path) != self.version:
            raise StoreError(
                f"{self.path}: the model changed while it was read (another write replaced it "
                "since it was opened); open or load it again"
            )

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Within the block, what is read from the directory must be of this version: checked
        on leaving, and an error inside (a chunk that no longer matches its inventory, arrays
        of another rank) is reported as the change it comes from when the version changed."""
        with read_as_one_version(self.check_unchanged):
            yield

    @cached_property
    def header(self) -> ModelHeader:
        """The attributes typed and checked (:mod:`.header`): read fields from here."""
        return ModelHeader.from_attrs(self.attrs, self.path)

    @property
    def n_blocks(self) -> tuple[int, int]:
        return self.header.n_blocks

    def factor_chunks(self, name: str, field: str = "mean") -> list[zarr.Array]:
        """The chunk arrays of ``field`` of factor ``name`` ("W" or "H"), one per block, after
        checking that each has the shape the header gives and its chunk file with its recorded
        size (StoreError naming the one that has not); reading them checks their CRC-32
        (:func:`chunkstore.read_field`)."""
        n = self.n_blocks[0 if name == "W" else 1]
        chunks = []
        with self.reading():
            for j in range(n):
                array = chunkstore.open_checked(self.path, name, j, field)
                want = self.header.chunk_shape(name, j)
                want = (want[0], self.header.n_members) if field == "prior_rate" else want
                if tuple(array.shape) != want:
                    raise StoreError(
                        f"{chunkstore.field_path(self.path, name, j, field)}: shape "
                        f"{tuple(array.shape)}, but the model's header gives {want} (the model "
                        "is damaged)"
                    )
                chunks.append(array)
        return chunks

    def factor(self, name: str, field: str = "mean") -> da.Array:
        """``name`` in {"W", "H"}: a dask array (n, K) chunked by block, read lazily (each read
        checks the chunk file's size and CRC-32, so a model removed or damaged since is an
        error, not zeros or other numbers)."""
        import dask
        import dask.array as da

        parts = []
        for j, meta in enumerate(self.factor_chunks(name, field)):
            read = dask.delayed(read_pinned, pure=True)(self, name, j, field)
            parts.append(da.from_delayed(read, shape=meta.shape, dtype=meta.dtype))
        return da.concatenate(parts, axis=0)

    @property
    def delta(self) -> np.ndarray:
        return np.asarray(self.header.delta, dtype=np.float64)

    @property
    def ids_path(self) -> str:
        """The directory whose ``users/ids`` and ``items/ids`` hold this model's raw ids, for
        the functions of :mod:`ordnmf_dask.store.idmap`: the model itself, or, for a model saved
        without them, its training store (StoreError if that is gone or no longer matches)."""
        if self.header.ids:
            return self.path
        recorded = self.header.store
        if recorded.path is None:
            raise StoreError(f"{self.path}: the model has no id maps and records no store")
        try:
            info = open_store(recorded.path)
        except StoreError as exc:
            raise StoreError(
                f"{self.path}: the model has no id maps of its own, and its "
                f"training store cannot be read: {exc}"
            ) from None
        if (info.n_users, info.n_items) != (recorded.n_users, recorded.n_items):
            raise StoreError(
                f"{self.path}: the model has no id maps of its own, and its training store "
                f"{info.path} no longer matches it ({info.n_users} x {info.n_items}, the model "
                f"{recorded.n_users} x {recorded.n_items})"
            )
        return info.path

    @property
    def has_seen(self) -> bool:
        """Whether the model holds the index of its users' training items (:mod:`.seen`)."""
        return self.header.seen

    def ids_at(self, axis: str, index: np.ndarray) -> list[Any]:
        """Raw ids (int or str) of the given indices of ``axis`` ("users" or "items")."""
        return idmap.ids_at(self.ids_path, axis, index)

    def ids_slice(self, axis: str, start: int, stop: int) -> list[Any]:
        """Raw ids of the indices ``start .. stop - 1`` of ``axis`` ("users" or "items")."""
        return idmap.ids_slice(self.ids_path, axis, start, stop)


def read_pinned(model: ModelInfo, name: str, index: int, field: str) -> np.ndarray:
    """:func:`chunkstore.read_field` of ``model``, checked to come from its version."""
    with model.reading():
        return chunkstore.read_field(model.path, name, index, field)


def _current(path: str) -> tuple[Any, ...] | None:
    try:
        return version_of(path)
    except StoreError:
        return None


_OPEN_TRIES = 5  # attributes read while a write replaced the model: read again


def open_model(path: str) -> ModelInfo:
    """Open a model written by :func:`save_model`; StoreError if absent, incomplete or newer.
    Its attributes are those of the version it records (read again if a write replaced the
    model while they were read)."""
    path = locations.location(path)
    locations.check_tree(path, "model")
    found = nodes.read_nodes(path, "model")  # every node's metadata, before zarr reads any
    for _ in range(_OPEN_TRIES):
        pinned = _current(path)
        try:
            attrs = dict(zarr.open_group(path, mode="r").attrs)
        except Exception as exc:  # noqa: BLE001 - any failure to open is reported the same way
            if _current(path) == pinned:
                raise StoreError(f"{path}: not a readable ordnmf_dask model ({exc})") from exc
            continue
        if pinned is not None and _current(path) == pinned:
            break
    else:
        raise StoreError(f"{path}: the model kept changing while it was opened; try again")
    if not is_model(path) and is_store(path):
        raise StoreError(f"{path}: is an ordnmf_dask store, not a model")
    if attrs.get("complete") is not True:
        raise StoreError(f"{path}: model is incomplete (no completion mark)")
    locations.check_not_pending(path, "model")
    version = attrs.get("format_version")
    if not isinstance(version, int) or version > MODEL_FORMAT:
        raise StoreError(
            f"{path}: written by a newer ordnmf_dask model format {version}; "
            f"this version reads <= {MODEL_FORMAT}"
        )
    info = ModelInfo(path, attrs, pinned)
    header = info.header  # every field checked before anything is read
    if header.ids:
        check_ids(header, {a: _shape(found.get(f"{a}/ids")) for a in AXES}, path)
    nodes.check_layout(path, found, *_layout(header), "model")
    return info


def _shape(node: dict[str, Any] | None) -> tuple[int, ...] | None:
    """The shape an array's metadata records, for :func:`check_ids` (None: it has none, or
    not one of counts, which :func:`nodes.check_layout` then names)."""
    shape = None if node is None else node.get("shape")
    if not isinstance(shape, list) or not all(type(n) is int for n in shape):
        return None
    return tuple(shape)


#: the data types of a model's id maps: a store's integer or text ids
ID_TYPES = frozenset({"int64", "int32", "uint64", "uint32", "string"})


def _layout(h: ModelHeader) -> tuple[set[str], dict[str, nodes.ArraySpec]]:
    """The groups and arrays of a model of header ``h`` (docs/model-format.md): each factor
    chunk's arrays (rows of its block, K per member; ``prior_rate`` one column per member),
    float64, one chunk; its id maps, one id per row; the index of seen items, a row pointer
    per user of a block and at most the store's training nonzeros (where the header records
    them; else the block's rows times the items)."""
    groups = {"", "W", "H"}
    arrays: dict[str, nodes.ArraySpec] = {}
    for name, n in zip(("W", "H"), h.n_blocks, strict=True):
        for j in range(n):
            groups.add(f"{name}/{j}")
            rows, width = h.chunk_shape(name, j)
            for field in chunkstore.SAVED_FIELDS:
                cols = h.n_members if field == "prior_rate" else width
                arrays[f"{name}/{j}/{field}"] = nodes.ArraySpec((rows, cols), {"float64"})
    if h.ids:
        groups |= set(AXES)
        for axis, n in zip(AXES, (h.store.n_users, h.store.n_items), strict=True):
            arrays[f"{axis}/ids"] = nodes.ArraySpec((n,), ID_TYPES, one_chunk=False)
    if h.seen:
        groups |= {"seen", seen.INDPTR, seen.INDICES}
        for r in range(h.n_blocks[0]):
            rows = h.row_bounds[r + 1] - h.row_bounds[r]
            arrays[f"{seen.INDPTR}/{r}"] = nodes.ArraySpec((rows + 1,), {"int64"})
            most = h.store.nnz_train or rows * h.store.n_items  # 0: a header without it
            arrays[f"{seen.INDICES}/{r}"] = nodes.ArraySpec((None,), {"int32"}, most=most)
    return groups, arrays
