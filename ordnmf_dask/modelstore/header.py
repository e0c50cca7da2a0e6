"""A model's header: its root attributes as one typed, checked record (docs/model-format.md).

:class:`ModelHeader` is the one reader of a saved model's attributes and the form its writer
checks them in: every field the readers use has a type and a range and is checked against the
others (thresholds against the classes, block bounds against the store's shape, the priors and K
through the parameter table :mod:`ordnmf_dask.params`) before any array is read or allocated, so
that a damaged or hostile header is a :class:`StoreError` naming the model and the field, never a
NaN answer, a negative factor, an allocation or ids cut short. The attributes kept for the record
(the fit's trajectory, validation history, versions, resolved job) stay in
:attr:`ModelHeader.record`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ordnmf_dask import params as table
from ordnmf_dask.errors import StoreError
from ordnmf_dask.model.thresholds import theta_from_delta
from ordnmf_dask.store.header import MAX_CLASSES, HeaderFields, is_number, value_rule

FAMILIES = ("ordinal", "dcpf")
MAX_MEMBERS = 1024  # members of an ensemble a header may claim (each costs K factor columns)


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


def check_ids(header: ModelHeader, shapes: Mapping[str, tuple[int, ...]], where: str) -> None:
    """StoreError unless the id maps hold one id per row of W and of H (``shapes``: axis ->
    the recorded shape of its id array)."""
    for axis, n in (("users", header.store.n_users), ("items", header.store.n_items)):
        got = shapes.get(axis)
        if got is not None and tuple(got) != (n,):
            raise StoreError(
                f"{where}: {axis}/ids holds {got[0] if got else 0} ids for the model's {n} "
                f"{axis} (the model is damaged)"
            )
