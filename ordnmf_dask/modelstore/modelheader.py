"""A model's header: its root attributes as one typed, checked record (docs/model-format.md).

:class:`ModelHeader` is the one reader of a saved model's attributes and the form its writer
checks them in: every field the readers use has a type and a range and is checked against the
others (thresholds against the classes, block bounds against the store's shape, the priors and K
through the parameter table :mod:`ordnmf_dask.params`) before any array is read or allocated, so
that a damaged or hostile header is a :class:`StoreError` naming the model and the field, never a
NaN answer, a negative factor, an allocation or ids cut short. The attributes kept for the record
(the fit's trajectory, validation history, versions, resolved job) stay in
:attr:`ModelHeader.record`.

It is also the one writer of a model's attributes: :meth:`ModelHeader.from_fit` assembles them
from a fit (its kept state, or its members), :meth:`ModelHeader.written` adds the keys that mark
a published model, each checked by :meth:`ModelHeader.from_attrs`, and :meth:`ModelHeader.to_attrs`
is what ``save_model`` writes.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ordnmf_dask import params as table
from ordnmf_dask.errors import StoreError
from ordnmf_dask.model.thresholds import theta_from_delta
from ordnmf_dask.store.header import MAX_CLASSES, HeaderFields, is_number, value_rule
from ordnmf_dask.store.kinds import MODEL_KIND

if TYPE_CHECKING:
    from ordnmf_dask.model.families import Family
    from ordnmf_dask.store.blocks import StoreInfo

FAMILIES = ("ordinal", "dcpf")
MAX_MEMBERS = 1024  # members of an ensemble a header may claim (each costs K factor columns)
# 2: every factor array records its chunk inventory; 3: ensembles (n_members, members)
# (docs/model-format.md)
MODEL_FORMAT = 3
PROVENANCE = ("ordnmf-dask", "numpy", "scipy", "dask", "distributed", "zarr", "numba")
#: the attributes of the training store a model keeps: how the store made classes of raw
#: values (fold-in takes values on that scale)
STORE_RULE = ("value_kind", "thresholds", "binarize", "binarize_on")


def versions() -> dict[str, str]:
    """Versions of this package and of the libraries a fit's numbers depend on: an imported
    module's ``__version__`` (what ran; reading it costs nothing), else the installed
    distribution's (a metadata lookup, for those the fit did not import)."""
    out = {}
    for name in PROVENANCE:
        module = sys.modules.get(name.replace("-", "_"))
        version = getattr(module, "__version__", None)
        out[name] = version if isinstance(version, str) else importlib.metadata.version(name)
    return out


class FitState(Protocol):
    """What a model's header records of one fit of the engine (a kept restart or a member):
    the family's global parameters and the trajectory (``engine.cavi.CaviState`` is one)."""

    @property
    def params(self) -> Any: ...
    @property
    def elbo(self) -> Sequence[float]: ...
    @property
    def n_iter(self) -> int: ...
    @property
    def passes(self) -> int: ...
    @property
    def extrapolations(self) -> Sequence[int]: ...
    @property
    def converged(self) -> bool: ...
    @property
    def stop_reason(self) -> str: ...
    @property
    def best_iteration(self) -> int: ...
    @property
    def validation(self) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class MemberLaw:
    """The global parameters of one member of a model: ``delta`` (ordinal models) or dcPF's
    ``p`` and ``t``."""

    delta: tuple[float, ...] | None = None
    p: float | None = None
    t: float | None = None

    @property
    def theta(self) -> np.ndarray | None:
        """The thresholds of an ordinal member (``theta_from_delta``), else None."""
        return None if self.delta is None else theta_from_delta(np.asarray(self.delta))


@dataclass(frozen=True)
class StoreRecord:
    """What a model records of its training store (attribute ``store``)."""

    path: str | None
    n_users: int
    n_items: int
    n_classes: int
    nnz_train: int
    fingerprint: str | None


@dataclass(frozen=True)
class ModelHeader:
    """The root attributes of a saved model, checked (docs/model-format.md, "Group attributes").

    ``row_bounds`` / ``col_bounds`` run from 0 to the store's U / I; an ensemble of
    ``n_members`` > 1 fits records each member's global parameters in ``members`` (its factor
    chunks hold the members' K columns side by side, E[w] divided by n_members), a single fit
    at the top level: ``delta`` (ordinal models) has V + 1 entries (2 for the binary models
    BePoF and PF), ``delta[0] = 0``, the others finite and >= 0 with a positive sum, and
    ``theta`` is the one it gives; dcPF's ``p`` is in [0, 1] and ``t`` > 0; ``params`` obey
    the parameter table.
    """

    format_version: int
    model: str | None
    family: str
    params: Mapping[str, Any]
    store: StoreRecord
    row_bounds: tuple[int, ...]
    col_bounds: tuple[int, ...]
    ids: bool
    seen: bool
    elbo: tuple[float, ...] = ()
    n_iter: int = 0
    passes: int = 0
    converged: bool = False
    runs: tuple[Mapping[str, Any], ...] = ()
    delta: tuple[float, ...] | None = None
    p: float | None = None
    t: float | None = None
    n_members: int = 1
    members: tuple[MemberLaw, ...] = ()
    record: Mapping[str, Any] = field(default_factory=dict)
    where: str = ""

    @property
    def n_components(self) -> int:
        """K."""
        return int(self.params["n_components"])

    @property
    def theta(self) -> np.ndarray | None:
        """The thresholds of an ordinal model (``theta_from_delta``), else None."""
        return None if self.delta is None else theta_from_delta(np.asarray(self.delta))

    @property
    def laws(self) -> tuple[MemberLaw, ...]:
        """The global parameters of each member (one for a single fit)."""
        return self.members or (MemberLaw(self.delta, self.p, self.t),)

    @property
    def width(self) -> int:
        """Columns of a factor chunk: K per member."""
        return self.n_components * self.n_members

    @property
    def n_blocks(self) -> tuple[int, int]:
        """(user-blocks, item-blocks): the chunking of W and H."""
        return len(self.row_bounds) - 1, len(self.col_bounds) - 1

    def chunk_shape(self, name: str, index: int) -> tuple[int, int]:
        """(rows, K) of chunk ``index`` of factor ``name`` ("W" or "H")."""
        b = self.row_bounds if name == "W" else self.col_bounds
        return b[index + 1] - b[index], self.width

    def alpha(self, axis: str) -> float:
        """The Gamma prior shape of the factor of ``axis`` ("users": alpha_W, "items": alpha_H);
        StoreError when the model does not record it."""
        name = "alpha_W" if axis == "users" else "alpha_H"
        if name not in self.params:
            raise StoreError(f"{self.where}: model attribute params.{name} is missing")
        return float(self.params[name])

    def to_attrs(self) -> dict[str, Any]:
        """The attributes as written (and read back): every key, in the writer's order."""
        return dict(self.record)

    @classmethod
    def written(cls, attrs: Mapping[str, Any], where: str) -> ModelHeader:
        """The header of a model published at ``where`` with the attributes ``attrs``: they,
        then the model's kind, format, the versions that wrote it, whether it holds the id maps
        and seen items of a training store, and its completeness; checked as
        :meth:`from_attrs` reads them (written only as its readers will accept it)."""
        with_store = attrs.get("store", {}).get("path") is not None
        final = {
            **attrs,
            "kind": MODEL_KIND,
            "format_version": MODEL_FORMAT,
            "versions": versions(),
            "ids": with_store,
            "seen": with_store,
            "complete": True,
        }
        return cls.from_attrs(final, where)

    @classmethod
    def from_fit(
        cls,
        *,
        model: str,
        family: Family,
        params: Mapping[str, Any],
        info: StoreInfo,
        fingerprint: str,
        states: Sequence[FitState],
        validation: Mapping[str, Any] | None,
        runs: Sequence[Mapping[str, Any]],
        warm_start: bool,
        init_model: Mapping[str, Any] | None,
        cache_blocks: bool,
        selection: Mapping[str, Any] | None,
        where: str,
    ) -> ModelHeader:
        """The header of the model a fit of ``model`` (a class of the parameter table, with
        the checked ``params``) on the store ``info`` (content ``fingerprint``) saves at
        ``where`` (docs/model-format.md): of its one kept state, or of the ensemble of
        ``states`` (each member's trajectory in ``runs``, its global parameters in
        ``members``); ``validation`` holds the validation settings when the fit scored its
        states, else None."""
        fitted: dict[str, Any]
        if len(states) == 1:
            state = states[0]
            fitted = {
                **family.describe(state.params),
                "elbo": state.elbo,
                "n_iter": state.n_iter,
                "passes": state.passes,
                "extrapolations": {
                    "kept": state.extrapolations[0],
                    "refused": state.extrapolations[1],
                },
                "converged": state.converged,
                "stop_reason": state.stop_reason,
                "best_iteration": state.best_iteration,
                "validation": None
                if validation is None
                else {**validation, "history": state.validation},
            }
        else:  # no one trajectory: each member's is in runs
            fitted = {
                "n_members": len(states),
                "members": [family.describe(r.params) for r in states],
                "elbo": [],
                "n_iter": max(r.n_iter for r in states),
                "passes": sum(r.passes for r in states),
                "converged": all(r.converged for r in states),
                "validation": None
                if validation is None
                else {**validation, "history": [r.validation for r in states]},
            }
        attrs = {
            "model": model,
            "family": family.name,
            "params": dict(params),
            **fitted,
            "warm_start": warm_start,
            "init_model": init_model,
            "store": {
                "path": info.path,
                "fingerprint": fingerprint,
                "n_users": info.n_users,
                "n_items": info.n_items,
                "n_classes": info.n_classes,
                "nnz_train": info.nnz_train,
                **{k: info.attrs.get(k) for k in STORE_RULE},
            },
            "row_bounds": info.row_bounds.tolist(),
            "col_bounds": info.col_bounds.tolist(),
            "cache_blocks": cache_blocks,
            "runs": list(runs),
            **({} if selection is None else {"selection": selection}),
        }
        return cls.written(attrs, where)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], where: str) -> ModelHeader:
        """The header of the model at ``where``; StoreError naming the first field that is
        missing, of the wrong type or range, or contradicts another."""
        f = HeaderFields(attrs, where, "model")
        model = f.get("model", None)
        if model is not None and (not isinstance(model, str) or model not in table.ALL):
            raise f.fail("model", f"one of {sorted(table.ALL)}", model)
        family = f.get("family", "ordinal")
        if not isinstance(family, str) or family not in FAMILIES:
            raise f.fail("family", f"one of {FAMILIES}", family)
        params = _params(f, model)
        store = _store(f)
        n_members = f.integer("n_members", 1, MAX_MEMBERS, f.get("n_members", 1))
        members: tuple[MemberLaw, ...] = ()
        if n_members == 1:
            top = _law(f, family, model, store.n_classes)
        else:
            top, members = MemberLaw(), _members(f, family, model, store.n_classes, n_members)
        return cls(
            format_version=f.integer("format_version", 1),
            model=model,
            family=family,
            params=params,
            store=store,
            row_bounds=f.bounds("row_bounds", store.n_users),
            col_bounds=f.bounds("col_bounds", store.n_items),
            ids=_flag(f, "ids"),
            seen=_flag(f, "seen"),
            elbo=_elbo(f),
            n_iter=f.integer("n_iter", value=f.get("n_iter", 0)),
            passes=f.integer("passes", value=f.get("passes", 0)),
            converged=_flag(f, "converged"),
            runs=_runs(f),
            delta=top.delta,
            p=top.p,
            t=top.t,
            n_members=n_members,
            members=members,
            record=dict(attrs),
            where=where,
        )


def _law(f: HeaderFields, family: str, model: str | None, n_classes: int) -> MemberLaw:
    """The global parameters of a single fit, or of one member (``f`` its table)."""
    if family == "ordinal":
        return MemberLaw(delta=_delta(f, model, n_classes))
    p = f.number("p")
    if p > 1.0 or p < 0.0:
        raise f.fail("p", "a number in [0, 1]", p)
    return MemberLaw(p=p, t=f.number("t", low=0.0, above=True))


def _members(
    f: HeaderFields, family: str, model: str | None, n_classes: int, n: int
) -> tuple[MemberLaw, ...]:
    """The ``members`` of an ensemble: ``n`` tables, each holding a member's parameters."""
    raw = f.get("members")
    if not isinstance(raw, list | tuple) or len(raw) != n:
        raise f.fail("members", f"a list of n_members = {n} tables", None, False)
    laws = []
    for m, member in enumerate(raw):
        if not isinstance(member, dict):
            raise f.fail(f"members[{m}]", "a table of the member's parameters", member)
        laws.append(
            _law(HeaderFields(member, f.where, "model", f"members[{m}]"), family, model, n_classes)
        )
    return tuple(laws)


def _flag(f: HeaderFields, name: str) -> bool:
    value = f.get(name, False)
    if not isinstance(value, bool):
        raise f.fail(name, "true or false", value)
    return value


def _elbo(f: HeaderFields) -> tuple[float, ...]:
    """The bound after each iteration: a list of finite numbers."""
    value = f.get("elbo", [])
    if not isinstance(value, list | tuple):
        raise f.fail("elbo", "a list of finite numbers", value)
    return tuple(f.number("elbo", x) for x in value)


def _runs(f: HeaderFields) -> tuple[Mapping[str, Any], ...]:
    value = f.get("runs", [])
    if not isinstance(value, list | tuple) or not all(isinstance(r, dict) for r in value):
        raise f.fail("runs", "a list of tables, one per restart", value)
    return tuple(value)


def _params(f: HeaderFields, model: str | None) -> dict[str, Any]:
    """The estimator parameters (``params``), each held to its row of the parameter table."""
    raw = f.get("params")
    if not isinstance(raw, dict):
        raise f.fail("params", "a table of the estimator's parameters", raw)
    out = {}
    for key, value in raw.items():
        name = table.RENAMED.get(key, key)
        if name is None:
            continue
        row = table.PARAMS.get(name)
        if row is not None and row.model and (model is None or model in row.estimators):
            wrong = table.problem(name, value)
            if wrong is not None:
                raise f.fail(f"params.{name}", wrong.removeprefix("must be "), None, False)
        out[name] = value
    if "n_components" not in out:
        raise f.fail("params.n_components", "given", None, False)
    return out


def _store(f: HeaderFields) -> StoreRecord:
    raw = f.get("store")
    if not isinstance(raw, dict):
        raise f.fail("store", "a table describing the training store", raw)
    s = HeaderFields(raw, f.where, "model", "store")
    path, fingerprint = raw.get("path"), raw.get("fingerprint")
    if not isinstance(path, str | None) or not isinstance(fingerprint, str | None):
        raise f.fail("store.path", "a string (and store.fingerprint a string)", path)
    n_classes = s.integer("n_classes", 1, MAX_CLASSES, raw.get("n_classes"))
    if "value_kind" in raw:  # absent in models saved before they recorded their store's rule
        value_rule(s, n_classes)
    return StoreRecord(
        path=path,
        n_users=s.integer("n_users", value=raw.get("n_users")),
        n_items=s.integer("n_items", value=raw.get("n_items")),
        n_classes=n_classes,
        nnz_train=s.integer("nnz_train", value=raw.get("nnz_train", 0)),
        fingerprint=fingerprint,
    )


def _delta(f: HeaderFields, model: str | None, n_classes: int) -> tuple[float, ...]:
    """Delta of an ordinal model, held to the store's classes and to the recorded theta."""
    raw = f.get("delta")
    lengths = {n_classes + 1} if model == "OrdNMF" else {2, n_classes + 1}
    if not isinstance(raw, list | tuple) or len(raw) not in lengths:
        rule = " or ".join(str(n) for n in sorted(lengths))
        raise f.fail("delta", f"a list of {rule} thresholds decrements (V = {n_classes})", raw)
    delta = np.array([f.number("delta", x, low=0.0) for x in raw])
    if delta[0] != 0.0 or not delta.sum() > 0.0:
        raise f.fail("delta", "decrements with delta[0] = 0 and a positive sum", raw)
    theta = f.get("theta", None)
    if theta is not None:
        want = theta_from_delta(delta)
        ok = (
            isinstance(theta, list | tuple)
            and len(theta) == len(want)
            and all(is_number(t) for t in theta)
        )
        if not ok or not np.allclose(np.asarray(theta, dtype=float), want, rtol=1e-9, atol=0):
            rule = "the thresholds delta gives (theta_v = sum of delta_l, l > v)"
            raise f.fail("theta", rule, theta)
    return tuple(float(x) for x in delta)


def check_ids(
    header: ModelHeader, shapes: Mapping[str, tuple[int, ...] | None], where: str
) -> None:
    """StoreError unless the id maps hold one id per row of W and of H (``shapes``: axis ->
    the recorded shape of its id array)."""
    for axis, n in (("users", header.store.n_users), ("items", header.store.n_items)):
        got = shapes.get(axis)
        if got is not None and tuple(got) != (n,):
            raise StoreError(
                f"{where}: {axis}/ids holds {got[0] if got else 0} ids for the model's {n} "
                f"{axis} (the model is damaged)"
            )
