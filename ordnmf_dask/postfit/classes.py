"""What a saved model's law of the classes is, per model family, and the store scale its
classes map back to (docs/design.md, "Class probabilities"); the numerics are
:mod:`ordnmf_dask.model.classlaw`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import zarr

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.model import classlaw
from ordnmf_dask.model.ensemble import member_view
from ordnmf_dask.model.thresholds import theta_from_delta
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.modelstore.modelheader import MemberLaw

SCALES = ("store", "class")


@dataclass(frozen=True)
class ClassLaw:
    """The law of the classes 0..V a model gives a pair, from its rate.

    ``family`` "ordinal" (``theta``: P(y <= v) = exp(-lambda theta_v)) or "counts" (dcPF on a
    count store: the count law's mass on each class's counts, ``p``, ``t``, ``edges``).
    ``value_kind`` and ``edges`` describe the store's scale (docs/store-format.md);
    ``binarized``: the model's classes are {0, 1} (class 1: "class >= S", or a binary store),
    so it predicts no rating given an interaction.
    """

    family: str
    n_classes: int
    value_kind: str
    binarized: bool
    theta: np.ndarray | None = None
    p: float = 0.0
    t: float = 1.0
    edges: np.ndarray | None = None
    members: tuple[ClassLaw, ...] = ()  # an ensemble's: its law is their mixture
    k: int = 0  # an ensemble's components per member

    @property
    def limit(self) -> np.ndarray:
        """The law given an interaction as the rate tends to 0 (an ensemble's: the mean of
        its members')."""
        if self.members:
            return np.mean([law.limit for law in self.members], axis=0)
        if self.family == "ordinal":
            assert self.theta is not None  # every ordinal law has its thresholds
            return classlaw.ordinal_limit(self.theta)
        assert self.edges is not None  # every count law has its class edges
        return classlaw.count_limit(self.p, self.edges)

    def pair_hazards(
        self,
        users: np.ndarray,
        items: np.ndarray,
        mean_w: np.ndarray,
        var_w: np.ndarray | None,
        mean_h: np.ndarray,
        var_h: np.ndarray | None,
    ) -> np.ndarray:
        """Cumulative hazards (n, V + 1) of the pairs (row ``users[j]`` of the W arrays, row
        ``items[j]`` of the H arrays): the posterior's Gamma law from the factors' means and
        variances, or without variances (None) the plug-in law (dcPF's law is always that)."""
        users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
        theta, edges = self.theta, self.edges
        if theta is not None and var_w is not None and var_h is not None:  # ordinal
            return classlaw.gamma_hazards(users, items, mean_w, var_w, mean_h, var_h, theta)
        lam = np.einsum("ij,ij->i", mean_w[users], mean_h[items])
        if theta is not None:
            return classlaw.plugin_hazards(lam, theta)
        assert edges is not None  # a count law
        return classlaw.count_hazards(lam, self.p, self.t, edges)

    def pair_probs(
        self,
        users: np.ndarray,
        items: np.ndarray,
        mean_w: np.ndarray,
        var_w: np.ndarray | None,
        mean_h: np.ndarray,
        var_h: np.ndarray | None,
        given_interaction: bool,
    ) -> np.ndarray:
        """P(y = v) (n, V + 1) of the pairs, as :meth:`pair_hazards` takes them (given an
        interaction: P(y = v | y > 0)); an ensemble's is the mean of its members' laws."""
        if not self.members:
            hz = self.pair_hazards(users, items, mean_w, var_w, mean_h, var_h)
            return classlaw.class_law(hz, self.limit, given_interaction)
        reach, given = self._member_laws(users, items, mean_w, var_w, mean_h, var_h)
        if given_interaction:
            return _weighted(given, reach)
        out = np.einsum("mn,mnv->nv", reach, given) / len(self.members)
        out[:, 0] = 1.0 - reach.mean(axis=0)
        return out

    def pair_at_least(
        self,
        users: np.ndarray,
        items: np.ndarray,
        mean_w: np.ndarray,
        var_w: np.ndarray | None,
        mean_h: np.ndarray,
        var_h: np.ndarray | None,
        s: int,
    ) -> np.ndarray:
        """P(y >= s | y > 0) (n,) of the pairs."""
        if not self.members:
            hz = self.pair_hazards(users, items, mean_w, var_w, mean_h, var_h)
            return classlaw.at_least(hz, s, self.limit)
        probs = self.pair_probs(users, items, mean_w, var_w, mean_h, var_h, True)
        return np.minimum(probs[:, s:].sum(axis=1), 1.0)

    def pair_log_prob(
        self,
        users: np.ndarray,
        items: np.ndarray,
        mean_w: np.ndarray,
        var_w: np.ndarray | None,
        mean_h: np.ndarray,
        var_h: np.ndarray | None,
        y: np.ndarray,
    ) -> np.ndarray:
        """log P(y = y_j | y > 0) (n,) of observed classes ``y`` in 1..V."""
        if not self.members:
            hz = self.pair_hazards(users, items, mean_w, var_w, mean_h, var_h)
            return classlaw.log_class_prob(hz, y)
        logs, reach = [], []
        for m, law in enumerate(self.members):
            hz = law.pair_hazards(users, items, *self._view(m, mean_w, var_w, mean_h, var_h))
            r = -np.expm1(-hz[:, 0])
            with np.errstate(divide="ignore"):
                logs.append(np.log(r) + classlaw.log_class_prob(hz, y))
            reach.append(r)
        with np.errstate(divide="ignore"):
            return np.logaddexp.reduce(np.array(logs), axis=0) - np.log(np.sum(reach, axis=0))

    def _view(
        self,
        m: int,
        mean_w: np.ndarray,
        var_w: np.ndarray | None,
        mean_h: np.ndarray,
        var_h: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
        """Member ``m``'s E[w], Var[w], E[h], Var[h] from the ensemble's arrays."""
        n = len(self.members)
        return (
            *member_view(mean_w, var_w, self.k, m, n, True),
            *member_view(mean_h, var_h, self.k, m, n, False),
        )

    def _member_laws(
        self,
        users: np.ndarray,
        items: np.ndarray,
        mean_w: np.ndarray,
        var_w: np.ndarray | None,
        mean_h: np.ndarray,
        var_h: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each member's P(y > 0) (M, n) and law given an interaction (M, n, V + 1)."""
        reach, given = [], []
        for m, law in enumerate(self.members):
            hz = law.pair_hazards(users, items, *self._view(m, mean_w, var_w, mean_h, var_h))
            reach.append(-np.expm1(-hz[:, 0]))
            given.append(classlaw.class_law(hz, law.limit, True))
        return np.array(reach), np.array(given)

    def check_level(self, s: int) -> int:
        """``s`` as a class 1..V of this law, else InputError."""
        if (
            isinstance(s, bool)
            or not isinstance(s, int | np.integer)
            or not 1 <= s <= self.n_classes
        ):
            raise InputError(f"proba_at must be a class in 1..{self.n_classes}, got {s!r}")
        if self.binarized:
            raise InputError(
                "proba_at needs a model of the ordered classes: this model sees binarized data "
                "({0, 1}), so P(y >= s | y > 0) is 1 for every pair"
            )
        return int(s)


def store_scale(model: ModelInfo) -> tuple[str, list[float] | None]:
    """The ``value_kind`` and count ``thresholds`` of the store a model was fitted on: recorded
    in the model (``attrs["store"]``), else read from that store's header."""
    recorded = model.attrs.get("store") or {}
    if "value_kind" in recorded:
        return recorded["value_kind"], recorded.get("thresholds")
    path = recorded.get("path")
    try:
        attrs = zarr.open_group(path, mode="r").attrs.asdict()
    except Exception as exc:  # noqa: BLE001 - any failure to read the header says the same
        raise StoreError(
            f"{model.path}: the model does not record its store's value scale, and its "
            f"training store {path} cannot be read ({type(exc).__name__})"
        ) from None
    return cast(str, attrs["value_kind"]), cast("list[float] | None", attrs.get("thresholds"))


def _weighted(given: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """The mixture of the members' laws given an interaction (M, n, V + 1), each weighted by
    its P(y > 0) (M, n): P(y = v | y > 0) of the ensemble; where every member's P(y > 0) is 0,
    the mean of their laws (their limits)."""
    total = reach.sum(axis=0)
    out = np.einsum("mn,mnv->nv", reach, given)
    zero = total == 0
    out[~zero] /= total[~zero, None]
    out[zero] = given[:, zero].mean(axis=0)
    return out


def law_of(model: ModelInfo) -> ClassLaw:
    """The :class:`ClassLaw` of a saved model; InputError for a model without one.

    OrdNMF, BePoF, PF: the ordinal law with the learned thresholds (V + 1 = 2 classes for the
    binarized ones). dcPF: on a count store, the count law's mass on each count class; dcPF at
    p = 1 (binary data) and dcPF on a store of classes (it models the class numbers as counts,
    whose law runs past class V) have no law of the classes.
    """
    header = model.header
    laws = [_member_law(model, header.family, law) for law in header.laws]
    if len(laws) == 1:
        return laws[0]
    first = laws[0]
    return ClassLaw(
        first.family,
        first.n_classes,
        first.value_kind,
        first.binarized,
        edges=first.edges,
        members=tuple(laws),
        k=header.n_components,
    )


def _member_law(model: ModelInfo, family: str, member: MemberLaw) -> ClassLaw:
    """The :class:`ClassLaw` of one fit (a model's, or an ensemble member's)."""
    a = model.attrs
    n_store = int(a["store"]["n_classes"])
    value_kind, thresholds = store_scale(model)
    if family == "dcpf":
        assert member.p is not None and member.t is not None  # a dcPF fit records them
        p = float(member.p)
        if p == 1.0:
            raise InputError(
                f"{model.path}: dcPF at p = 1 models binary data (PF on binarized counts): it "
                "has no law of the classes"
            )
        if value_kind != "counts":
            raise InputError(
                f"{model.path}: dcPF on a store of {value_kind} treats the class numbers as "
                "counts, whose law runs past the top class: it has no law of the classes (fit "
                "OrdNMF for class probabilities)"
            )
        edges = np.asarray(thresholds, dtype=np.float64)
        return ClassLaw("counts", n_store, value_kind, False, p=p, t=float(member.t), edges=edges)
    delta = np.asarray(member.delta, dtype=np.float64)
    v = len(delta) - 1
    binarized = v != n_store or value_kind in ("binary", "raw")
    bins = None if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    return ClassLaw("ordinal", v, value_kind, binarized, theta=theta_from_delta(delta), edges=bins)


def to_scale(law: ClassLaw, probs: np.ndarray, kind: str, scale: str) -> np.ndarray:
    """The rating of ``kind`` (:data:`~ordnmf_dask.model.classlaw.KINDS`) that laws given an
    interaction ``probs`` predict, on the store's scale (``scale="store"``: stars, the integer
    rating, or for counts the (n, 2) least and greatest count of the class) or as a class
    (``scale="class"``)."""
    if kind not in classlaw.KINDS:
        raise InputError(f"kind must be one of {', '.join(classlaw.KINDS)}, got {kind!r}")
    if scale not in SCALES:
        raise InputError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if law.binarized:
        raise InputError(
            "this model sees binarized data ({0, 1}): given an interaction its class is 1, so "
            "it predicts no rating (predict_proba gives P(y = 1))"
        )
    classes = classlaw.class_rating(probs, kind)
    if scale == "class":
        return classes
    if law.value_kind == "counts":
        if kind == "expected":
            raise InputError(
                "the top count class has no upper bound, so the counts have no expected value "
                "under the class law: use kind='median' or 'mode' (a count range), or "
                "scale='class'"
            )
        assert law.edges is not None  # a law of count classes has their edges
        return classlaw.count_range(classes, law.edges)
    try:
        values = classlaw.class_values(law.value_kind, law.n_classes)
    except ValueError as err:  # e.g. a synthetic store's classes: no points of a scale
        raise InputError(f"{err}: use scale='class'") from None
    return probs @ values if kind == "expected" else values[classes]


def factor_moments(model: str, name: str, index: int, gamma: bool) -> tuple[np.ndarray, Any]:
    """E[x] of chunk ``index`` of factor ``name`` and, with ``gamma``, Var[x] = E[x]^2 /
    shape (else None); on a worker."""
    mean = chunkstore.read_field(model, name, index, "mean")
    if not gamma:
        return mean, None
    return mean, mean * mean / chunkstore.read_field(model, name, index, "shape")


def top_at_least(
    top: tuple[np.ndarray, np.ndarray],
    model: str,
    law: ClassLaw,
    s: int,
    r: int,
    col_bounds: list[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-n ``(scores, items)`` of user-block r with P(y >= s | y > 0) of each listed
    pair under the plug-in law (NaN in the empty slots); on a worker, reading one item-block's
    factors at a time."""
    scores, items = top
    proba = np.full(scores.shape, np.nan)
    listed = np.isfinite(scores)
    rows = np.nonzero(listed)[0]
    cols = items[listed].astype(np.int64)
    w = factor_moments(model, "W", r, False)
    found = np.empty(len(cols))
    block = np.searchsorted(np.asarray(col_bounds), cols, side="right") - 1
    for c in np.unique(block).tolist():
        sel = block == c
        h = factor_moments(model, "H", c, False)
        found[sel] = law.pair_at_least(rows[sel], cols[sel] - col_bounds[c], *w, *h, s)
    proba[listed] = found
    return scores, items, proba
