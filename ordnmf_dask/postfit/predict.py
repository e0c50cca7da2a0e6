"""Class probabilities and ratings of (user, item) pairs from a saved model, in memory
(docs/design.md, "Class probabilities"): the pairs' laws from the factors a
:class:`~ordnmf_dask.postfit.serving.Server` holds and their posterior variances. What each
family's law is: :mod:`.classes`; the numerics: :mod:`ordnmf_dask.model.classlaw`.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.model import classlaw
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.postfit.classes import law_of, to_scale
from ordnmf_dask.postfit.serving import Server

#: users, items, E[w], Var[w] (or None), E[h], Var[h] (or None): what the law's pair methods take
Pairs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]


class Predictor:
    """The class law of pairs of one model served in memory: the server's factors, and their
    posterior variances (``E[x]^2 / shape``, read once)."""

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.law = law_of(srv.model)
        self._var: dict[str, np.ndarray] = {}

    def variance(self, name: str) -> np.ndarray:
        """Var[x] = E[x]^2 / shape of factor ``name`` ("W" or "H") under q."""
        if name not in self._var:
            model = self.srv.model
            n = model.n_blocks[0 if name == "W" else 1]
            try:
                shape = np.concatenate(
                    [chunkstore.read_field(model.path, name, j, "shape") for j in range(n)]
                )
            except StoreError as exc:
                raise StoreError(
                    f"{exc}; posterior='gamma' needs the posterior shapes (posterior='mean' "
                    "does not)"
                ) from None
            mean = self.srv.W if name == "W" else self.srv.H
            self._var[name] = mean * mean / shape
        return self._var[name]

    def pairs(
        self,
        w: np.ndarray,
        w_var: np.ndarray | None,
        users: np.ndarray,
        items: np.ndarray,
        posterior: str,
    ) -> Pairs:
        """The arguments of the law's pair methods (:class:`ClassLaw`) for the pairs (row
        ``users[j]`` of ``w``, item index ``items[j]``) under ``posterior``; ``w_var``: the
        variances of ``w`` (None: ``w`` known exactly)."""
        if posterior not in classlaw.POSTERIORS:
            raise InputError(
                f"posterior must be one of {', '.join(classlaw.POSTERIORS)}, got {posterior!r}"
            )
        if posterior == "mean" or self.law.family != "ordinal":
            return users, items, w, None, self.srv.H, None
        var_w = np.zeros_like(w) if w_var is None else w_var
        return users, items, w, var_w, self.srv.H, self.variance("H")

    def pair_args(self, users: np.ndarray, items: np.ndarray, posterior: str) -> Pairs:
        """:meth:`pairs` of pairs of user and item indices."""
        need_var = posterior == "gamma" and self.law.family == "ordinal"
        w_var = self.variance("W") if need_var else None
        return self.pairs(self.srv.W, w_var, users, items, posterior)

    def indices(self, users: Any, items: Any) -> tuple[np.ndarray, np.ndarray]:
        """Indices of pairs given by raw ids; InputError for unknown ids or unequal lengths."""
        if any(isinstance(x, str | bytes | int | np.integer) for x in (users, items)):
            raise InputError("give the pairs' users and items as sequences of raw ids")
        users, items = (x if isinstance(x, np.ndarray) else list(x) for x in (users, items))
        for name, ids in (("user_ids", users), ("item_ids", items)):
            if np.ndim(ids) != 1 and not (isinstance(ids, list) and not ids):
                raise InputError(f"{name} must be one-dimensional, got shape {np.shape(ids)}")
        if len(users) != len(items):
            raise InputError(f"need as many users as items, got {len(users)} and {len(items)}")
        return self.srv.users.index(users), self.srv.items.index(items)

    def proba(self, users: Any, items: Any, given_interaction: bool, posterior: str) -> np.ndarray:
        """P(y = v) (n, V + 1) of pairs of raw ids (given an interaction: P(y = v | y > 0))."""
        u, i = self.indices(users, items)
        return self.law.pair_probs(*self.pair_args(u, i, posterior), given_interaction)

    def predict(self, users: Any, items: Any, kind: str, posterior: str, scale: str) -> np.ndarray:
        """Ratings of pairs of raw ids given an interaction (:func:`to_scale`)."""
        if self.law.binarized:
            to_scale(self.law, np.zeros((0, 2)), kind, scale)  # raises
        return to_scale(self.law, self.proba(users, items, True, posterior), kind, scale)

    def with_proba(
        self, recs: dict[Any, list[tuple[Any, float]]], rows: dict[Any, np.ndarray], s: int
    ) -> dict[Any, list[tuple[Any, float, float]]]:
        """``recs`` ({key: [(raw item, score), ...]}) with P(y >= s | y > 0) beside each item,
        under the plug-in law (which rises with the score, so the column falls down each list);
        ``rows[key]``: the (K,) E[w] of the key's user."""
        s = self.law.check_level(s)
        out: dict[Any, list[tuple[Any, float, float]]] = {}
        for key, items in recs.items():
            idx = self.srv.items.index([i for i, _ in items])
            w = rows[key][None]
            pairs = self.pairs(w, None, np.zeros(len(idx), np.int64), idx, "mean")
            up = self.law.pair_at_least(*pairs, s)
            out[key] = [(i, score, float(x)) for (i, score), x in zip(items, up, strict=True)]
        return out


_PREDICTORS: weakref.WeakKeyDictionary[Server, Predictor] = weakref.WeakKeyDictionary()


def predictor(srv: Server) -> Predictor:
    """The :class:`Predictor` of a server, made once per server."""
    if srv not in _PREDICTORS:
        _PREDICTORS[srv] = Predictor(srv)
    return _PREDICTORS[srv]


def recommend_with_proba(
    srv: Server, recs: dict[Any, list[tuple[Any, float]]], s: int
) -> dict[Any, list[tuple[Any, float, float]]]:
    """:meth:`Server.recommend`'s lists with P(y >= s | y > 0) beside each item."""
    keys = list(recs)
    users = srv.users.index(keys) if keys else np.empty(0, np.int64)
    rows = {key: srv.W[u] for key, u in zip(keys, users, strict=True)}
    return predictor(srv).with_proba(recs, rows, s)


def recommend_for_with_proba(
    srv: Server, recs: dict[int, list[tuple[Any, float]]], w: np.ndarray, s: int
) -> dict[int, list[tuple[Any, float, float]]]:
    """:meth:`Server.recommend_for`'s lists with P(y >= s | y > 0) beside each item, for the
    users of E[w] the rows of ``w``."""
    w = np.asarray(w, dtype=np.float64)
    return predictor(srv).with_proba(recs, {j: w[j] for j in recs}, s)
