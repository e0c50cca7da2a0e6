"""Class probabilities of many (user, item) pairs read from Parquet, written as Parquet on a
cluster (``ordnmf-dask predict``; docs/design.md, "Class probabilities").

One task per row group of each input file: it reads the group's ``user`` and ``item`` columns
:data:`SLAB` rows at a time, maps the raw ids to indices (the model's id maps, held once per
worker process by :func:`~ordnmf_dask.postfit.serving.server`), gathers the factor rows of the
slab's pairs from the factor chunks they fall in (chunks kept in a per-task cache of at most
:data:`CHUNK_BUDGET` bytes, so a task's memory is bounded whatever the model's size), and writes
``user``, ``item``, ``p0 .. pV`` to its own part file. The output follows the rules of an
export (:mod:`.export`: a temporary directory published whole, or at a URL a pending marker
first; complete or absent, replaced only with ``overwrite`` and only if it is an export); its
one dataset is ``predictions``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.params import validate_call
from ordnmf_dask.postfit.classes import ClassLaw, factor_moments, law_of
from ordnmf_dask.postfit.executor import client_for
from ordnmf_dask.postfit.export import Plan, open_target, part_name, write_export
from ordnmf_dask.postfit.serving import server
from ordnmf_dask.postfit.topn import open_pair
from ordnmf_dask.sources.infile import check_row_groups, open_input_file, open_parquet
from ordnmf_dask.sources.inputs import expand_inputs

if TYPE_CHECKING:
    from distributed import Client, Future

DATASET = "predictions"
COLUMNS = ("user", "item")
SLAB = 1 << 16  # pairs scored at a time
CHUNK_BUDGET = 256 << 20  # bytes of factor chunks a task keeps


def _open_parquet(path: str) -> pq.ParquetFile:
    """The pairs file ``path`` opened by the one opener of inputs (a regular file only)."""
    return open_parquet(open_input_file(path, "pairs file"), path)


def input_groups(paths: Sequence[str]) -> list[tuple[str, int, int]]:
    """(file, row group, rows) of every row group of the input files, in order; InputError
    naming a file that is not Parquet with columns ``user`` and ``item``."""
    groups = []
    for path in expand_inputs(paths):
        try:
            meta = _open_parquet(path).metadata
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
        check_row_groups(meta, path)
        schema = meta.schema.to_arrow_schema()
        names = schema.names
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise InputError(
                f"{path}: no column {', '.join(missing)} (pairs need columns user and item, "
                f"found {', '.join(names)})"
            )
        for c in COLUMNS:
            _check_id_column(path, c, names.count(c), schema.field(names.index(c)).type)
        groups += [(path, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
    return groups


def _check_id_column(path: str, name: str, count: int, kind: pa.DataType) -> None:
    """InputError unless the pairs file ``path`` has one column ``name`` of ids: integers,
    text or (as ingest reads them) integral floats, plain or dictionary-encoded."""
    if count > 1:
        raise InputError(f"{path}: {count} columns named {name!r}; pairs need one of each")
    plain = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (
        pa.types.is_integer(plain)
        or pa.types.is_floating(plain)
        or pa.types.is_string(plain)
        or pa.types.is_large_string(plain)
    ):
        raise InputError(
            f"{path}: column {name!r} is of type {kind}; ids are integer or string columns"
        )


class _Chunks:
    """Factor chunks (mean, variance or None) read on demand and kept up to a byte budget,
    least recently used first out."""

    def __init__(self, model: str, gamma: bool) -> None:
        self.model, self.gamma = model, gamma
        self.kept: OrderedDict[tuple[str, int], tuple[np.ndarray, Any]] = OrderedDict()
        self.size = 0

    def get(self, name: str, index: int) -> tuple[np.ndarray, Any]:
        key = (name, index)
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        found = factor_moments(self.model, name, index, self.gamma)
        self.kept[key] = found
        self.size += sum(x.nbytes for x in found if x is not None)
        while self.size > CHUNK_BUDGET and len(self.kept) > 1:
            _, old = self.kept.popitem(last=False)
            self.size -= sum(x.nbytes for x in old if x is not None)
        return found

    def rows(
        self, name: str, index: np.ndarray, bounds: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """The distinct rows of ``index`` (global) gathered from their chunks: (position of
        each entry of ``index`` among them, their means, their variances or None)."""
        uniq, pos = np.unique(index, return_inverse=True)
        block = np.searchsorted(bounds, uniq, side="right") - 1
        mean, var = None, None
        for b in np.unique(block).tolist():
            sel = np.flatnonzero(block == b)
            m, v = self.get(name, b)
            local = uniq[sel] - bounds[b]
            if mean is None:
                mean = np.empty((len(uniq), m.shape[1]))
                var = None if v is None else np.empty_like(mean)
            mean[sel] = m[local]
            if var is not None:
                var[sel] = v[local]
        if mean is None:
            mean = np.empty((0, 0))
        return pos.astype(np.int64), mean, var


def pairs_part(
    model: str,
    store: str | None,
    allow_other_store: bool,
    law: ClassLaw,
    gamma: bool,
    given_interaction: bool,
    source: tuple[str, int, int],
    schema: pa.Schema,
    fs: fsspec.AbstractFileSystem,
    path: str,
) -> int:
    """Write the class probabilities of the pairs of one row group as the Parquet file
    ``path``; on a worker. Returns the rows written."""
    srv = server(model, store, allow_other_store)
    m = srv.model
    rb = np.asarray(m.attrs["row_bounds"], dtype=np.int64)
    cb = np.asarray(m.attrs["col_bounds"], dtype=np.int64)
    chunks = _Chunks(model, gamma)
    file, group, _ = source
    count = 0
    batches = _open_parquet(file).iter_batches(SLAB, row_groups=[group], columns=list(COLUMNS))
    # no dictionaries for the probabilities: they rarely repeat, and building them costs more
    # than the rest of the slab's work
    with (
        fs.open(path, "wb") as fh,
        pq.ParquetWriter(fh, schema, use_dictionary=list(COLUMNS)) as writer,
    ):
        for batch in batches:
            users = batch.column(0).to_numpy(zero_copy_only=False)
            items = batch.column(1).to_numpy(zero_copy_only=False)
            try:
                u, i = srv.users.index(users), srv.items.index(items)
            except InputError as exc:
                raise InputError(f"{file}, row group {group}: {exc}") from None
            pu, wm, wv = chunks.rows("W", u, rb)
            pi, hm, hv = chunks.rows("H", i, cb)
            probs = law.pair_probs(pu, pi, wm, wv, hm, hv, given_interaction)
            columns = [batch.column(0).cast(schema[0].type), batch.column(1).cast(schema[1].type)]
            columns += [pa.array(probs[:, v]) for v in range(probs.shape[1])]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
            count += len(users)
    return count


def predict_pairs(
    model: Any,
    pairs: str | os.PathLike | Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    store: str | os.PathLike | None = None,
    given_interaction: bool = False,
    posterior: str = "mean",
    client: Client | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    n_workers: int | None = None,
    allow_other_store: bool = False,
) -> str:
    """Class probabilities P(y = v), v = 0..V (``given_interaction``: P(y = v | y > 0)), of the
    (user, item) pairs of Parquet files (columns ``user`` and ``item``, raw ids), written to
    ``out`` as the dataset ``predictions``: ``OUT/predictions/part-<j:05d>.parquet`` (one per
    input row group, in input order), columns ``user``, ``item``, ``p0`` .. ``pV``.

    ``pairs``: files, directories of Parquet files, globs or URLs. ``store``: where the raw
    ids are read for a model saved without its own (default: the model's). ``posterior`` as
    :meth:`~ordnmf_dask.estimator.CaviEstimator.predict_proba`. Unknown ids: InputError naming
    the file, row group and ids, and nothing is written. Returns ``out``.

    Examples
    --------
    >>> import pyarrow as pa
    >>> import pyarrow.parquet as pq
    >>> from ordnmf_dask import OrdNMF, predict_pairs
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> pq.write_table(pa.table({"user": [0, 0, 5], "item": [1, 2, 7]}), "pairs.parquet")
    >>> out = predict_pairs(model, "pairs.parquet", "proba")  # Parquet: user, item, p0 .. p10
    >>> pq.read_table(out).column_names[:4], pq.read_table(out).num_rows
    (['user', 'item', 'p0', 'p1'], 3)
    """
    validate_call(  # its table's rows
        "predict",
        {"given_interaction": given_interaction, "posterior": posterior, "overwrite": overwrite},
    )
    path = os.fspath(getattr(model, "model_path_", model))
    info = None
    if store is not None:
        info, m = open_pair(store, path, allow_other_store)
    else:
        m = open_model(path)
    law = law_of(m)
    gamma = posterior == "gamma" and law.family == "ordinal"
    groups = input_groups(
        [os.fspath(p) for p in ([pairs] if isinstance(pairs, str | os.PathLike) else pairs)]
    )
    if not groups:
        raise InputError(f"{pairs}: no row groups of pairs to predict")
    schema = _schema(groups[0][0], law.n_classes)
    inputs = {"model": m.path, **({"store": info.path} if info is not None else {})}
    inputs.update({f"pairs {j}": f for j, f in enumerate(dict.fromkeys(g[0] for g in groups))})
    target = open_target(out, overwrite, storage_options, inputs)
    plan = Plan(
        target,
        m,
        None,
        0,
        m.ids_path if info is None else info.path,
        [(DATASET, j) for j in range(len(groups))],
        {DATASET: schema},
    )
    store_path = None if info is None else info.path

    def submit(cl: Client, plan: Plan, root: str, part: tuple[str, int]) -> Future:
        where = (m.path, store_path, allow_other_store)
        what = (law, gamma, given_interaction, groups[part[1]], schema)
        return cl.submit(
            pairs_part, *where, *what, plan.target.fs, f"{root}/{part_name(*part)}", pure=False
        )

    with client_for(client, m, n_workers, info) as cl:
        return write_export(cl, plan, submit)


def _schema(first: str, n_classes: int) -> pa.Schema:
    """``user`` and ``item`` (the type of the first input file's columns), ``p0`` .. ``pV``."""
    arrow = _open_parquet(first).schema_arrow
    return pa.schema(
        [pa.field(c, arrow.field(c).type, nullable=False) for c in COLUMNS]
        + [pa.field(f"p{v}", pa.float64(), nullable=False) for v in range(n_classes + 1)]
    )
