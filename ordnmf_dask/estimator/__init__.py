"""Scikit-learn style estimators for IG-OrdNMF on a Dask cluster: parameters in, model out
(the fit itself is :mod:`ordnmf_dask.fitting`)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from ordnmf_dask.engine.cavi import CaviConfig, IterationCallback
from ordnmf_dask.errors import InputError
from ordnmf_dask.estimator.fitdata import accepts_data_in_memory
from ordnmf_dask.fitting import InitArg, family, plan_fit, resolve_params
from ordnmf_dask.model.families import Family
from ordnmf_dask.modelstore.model import ModelInfo, copy_model, open_model
from ordnmf_dask.modelstore.modelheader import ModelHeader
from ordnmf_dask.params import DEFAULTS, PARAMS, Settings, accepted, parameters_doc, rows_doc
from ordnmf_dask.runtime.progress import shows_progress
from ordnmf_dask.store.blocks import StoreInfo
from ordnmf_dask.tuning.select import run_selected

if TYPE_CHECKING:  # distributed and dask.array are imported where they are used
    import dask.array as da
    from distributed import Client

    from ordnmf_dask.postfit.serving import Server

_FACTORS = (("W", "mean"), ("H", "mean"), ("W", "log_mean"), ("H", "log_mean"))  # W_ .. log_H_


def _params_doc(estimator: str) -> str:
    """The Parameters section of an estimator's docstring, from the table."""
    return parameters_doc(PARAMS[name] for name in accepted(estimator))


# the Notes section of the estimators' docstrings: validation, then checkpoints
_NOTES_DOC = """
    Notes
    -----
    With a validation subset in the store (``ingest --validation-fraction``), the fit scores
    it every ``validation_every`` iterations, stops after ``validation_patience`` scores
    without improvement of their mean over the last ``validation_window``, and saves the state
    that rule keeps (attributes ``best_iteration``, ``stop_reason`` and ``validation`` of the
    model: docs/model-format.md).

    Checkpoints are written by the workers and read back, which also cuts the task lineage;
    none after the last iteration, whose state is the saved model. A fit that finds checkpoints
    of the same store and model parameters in ``checkpoint_dir`` resumes from them; one that
    finds another fit's refuses to start (see :meth:`fit`'s ``restart``). ``checkpoint_dir``
    inside the default ``work_dir`` is removed after the fit.
"""


_SHARED_ATTRS_DOC = """
    user_factors, item_factors : numpy arrays (U, K), (I, K): E[W], E[H] in memory, rows in
        the order of the model's user and item ids. A component the prior switched off has
        E[w_uk] at about each user's prior mean (E[h_ik] at each item's): columns equal up to
        a row's scale, that carry no signal (leave them out of a nearest-neighbour index).
    W_, H_ : dask arrays (U, K), (I, K): posterior means E[W], E[H], chunked by block (made
        when first used: a fit alone imports no dask).
    log_W_, log_H_ : dask arrays: E[log W], E[log H].
    elbo_ : list of ELBO values, one per iteration (empty for an ensemble: see ``runs_``).
    n_iter_ : the number of iterations, ``len(elbo_)``.
    converged_ : bool, whether the fit stopped on ``tol``.
    passes_ : full passes over the training blocks the fit made (refused extrapolations
        included).
    model_path_ : the zarr directory holding the fitted factors.
    n_active_components_ : the components in use (the others the prior switched off).
    selection_ : with ``select_components``, how K was chosen: ``chosen`` (the K of the
        model), ``metric``, ``rungs`` (the search's iteration budgets) and ``candidates``, one
        ``{"n_components", "scores"}`` per candidate, a validation score per rung it reached
        (docs/guide/fitting.md); else None.
    n_members_ : the fits the model averages (``n_members``); its factors hold their
        columns side by side (n_members * K), E[W] divided by n_members, so that
        ``W_ @ H_.T`` is the mean of the members' rates.
    runs_ : one dict per restart (or member): seed, the ELBO of its kept state, n_iter,
        best_iteration, converged, stop_reason, validation (the kept state's validation
        metric, or None), kept (restarts are chosen by the validation metric when the store
        has a validation subset, else by the ELBO; every member is kept).
"""


def _keep_arguments(estimator: CaviEstimator, arguments: dict[str, Any]) -> None:
    """Keep each constructor argument (of ``arguments``, the constructor's ``locals()``) as the
    attribute of its name, unchanged and unchecked (scikit-learn's rule: :meth:`fit` checks,
    and a clone built from :meth:`~CaviEstimator.get_params` is equal)."""
    for name in estimator._param_names():
        setattr(estimator, name, arguments[name])


class CaviEstimator:
    """Shared fit / save / load of the models that run on the CAVI engine. Each model's
    constructor lists its parameters: those the parameter table (:mod:`ordnmf_dask.params`)
    gives it, in the table's order, with the table's defaults, and keeps each as the attribute
    of its name, declared below with its type (tests/test_params.py checks them all)."""

    n_components: int
    select_components: Sequence[int] | None
    alpha_W: float
    alpha_H: float
    tol: float
    max_iter: int
    min_iter: int
    seed: int
    optimizer: str
    anneal: int
    n_init: int
    n_members: int
    start: str
    cache_blocks: bool | str
    executor: str
    work_dir: str | os.PathLike[str] | None
    checkpoint_dir: str | os.PathLike[str] | None
    checkpoint_every: int
    checkpoint_minutes: float | None
    validation_every: int
    validation_patience: int
    validation_window: int
    validation_metric: str
    validation_k: int
    validation_s: int

    def _set_family_attrs(self, header: ModelHeader) -> None:
        raise NotImplementedError

    # -- scikit-learn protocol -----------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        """The constructor's parameters, in its order (scikit-learn's ``_get_param_names``)."""
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's parameters and their values (scikit-learn's protocol; ``deep`` is
        accepted for it and has no effect: no parameter is an estimator).

        Examples
        --------
        >>> model.get_params()["n_components"]
        3
        """
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Self:
        """Set constructor parameters by keyword and return the estimator (scikit-learn's
        protocol); an unknown name is a ValueError naming the valid ones. Values are checked
        by :meth:`fit`, as scikit-learn's are.

        Examples
        --------
        >>> model.set_params(max_iter=50).max_iter
        50
        """
        names = self._param_names()
        for name in params:
            if name not in names:
                raise ValueError(
                    f"invalid parameter {name!r} for {type(self).__name__}; valid parameters: "
                    + ", ".join(names)
                )
        vars(self).update(params)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _validate(self) -> tuple[CaviConfig, Settings]:
        """The engine's settings and every parameter, checked against the table's rules."""
        return resolve_params(type(self).__name__, self.get_params())

    def _family(self, store: StoreInfo) -> Family:
        """The model family of these parameters on ``store``."""
        return family(type(self).__name__, self._validate()[1].model, store)

    # -- fitting -------------------------------------------------------------------------
    @shows_progress
    @accepts_data_in_memory
    @rows_doc("fit")
    def fit(
        self,
        store: str | os.PathLike[str] | StoreInfo,
        client: Client | None = None,
        *,
        init: InitArg = None,
        init_model: str | os.PathLike[str] | CaviEstimator | None = None,
        out: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        callback: IterationCallback | None = None,
        resume: bool = False,
        restart: bool = False,
        check: bool = False,
    ) -> Self:
        """Fit on the training blocks of a store written by :func:`ordnmf_dask.ingest`, or on
        data in memory, ingested as ``ingest`` does (docs/guide/fitting.md, "The arguments of
        fit", says more of each argument).

        Parameters
        ----------
        store : path of the zarr store (or an opened :class:`StoreInfo`), or data in memory: a
            scipy.sparse matrix, a pandas or dask DataFrame or a pyarrow Table (columns told by
            name), or a ``(users, items, values)`` tuple of 1-D arrays; all of it trains.
        ingest_options : for data in memory, keyword arguments of :func:`ordnmf_dask.ingest`.
        store_out : for data in memory, where to write its store and keep it (default: a
            temporary directory, kept while the estimator reads it).
        client : a ``distributed.Client``; default the current one, else as ``executor`` says.
        init : warm start: ``(W0, H0)`` arrays of shape (U, K), (I, K), or an ``.npz`` file with
            arrays ``W`` and ``H``.
        init_model : warm start from a saved model (its directory, or a fitted estimator) of the
            same class, K and classes, on this store or one that grew (users and items matched
            by raw id).
        out : directory of the saved model (default: a temporary directory, removed when the
            process exits; :meth:`save` keeps it).
        callback : called after each iteration with an
            :class:`~ordnmf_dask.engine.cavi.IterationInfo`; returning True stops the fit.
        <the rows of params.COMMAND_PARAMS["fit"]>
        check : only check the store, the warm start, the output and the checkpoints as the fit
            would find them, and return: no cluster, nothing written or removed.

        Notes
        -----
        Every conflict (store, warm-start model, output path, checkpoints) is checked before
        the cluster is used, and so are K and the factors' memory.

        Examples
        --------
        >>> model = OrdNMF(n_components=3, n_members=2, max_iter=30).fit(store)
        >>> model.n_iter_ <= 30
        True
        """
        plan = plan_fit(
            store,
            type(self).__name__,
            self.get_params(),
            init=init,
            init_model=init_model,
            out=out,
            overwrite=overwrite,
            resume=resume,
            restart=restart,
        )
        if not check:
            self._set_fitted(run_selected(plan, client, callback))
        return self

    def _set_fitted(self, model: ModelInfo) -> None:
        h = model.header
        self.model_path_ = model.path
        self._set_family_attrs(h)
        self.elbo_ = list(h.elbo)
        self.n_iter_ = h.n_iter
        self.passes_ = h.passes  # 0: a model saved before passes were counted
        self.runs_ = [dict(r) for r in h.runs]
        self.n_members_ = h.n_members
        self.selection_ = h.record.get("selection")
        self.converged_ = h.converged
        for name, field in _FACTORS:  # a damaged model is an error now, not at first use
            model.factor_chunks(name, field)
        self._model = model
        self._factors: dict[tuple[str, str], da.Array] = {}
        self._n_active: int | None = None

    def _fitted_model(self) -> ModelInfo:
        """The model this estimator was fitted on or loaded from, at the version it was opened
        (its readers check that the directory still holds it: :meth:`ModelInfo.reading`)."""
        if "_model" not in vars(self):
            raise AttributeError(f"{type(self).__name__} is not fitted: call fit() or load()")
        return self._model

    def _factor(self, name: str, field: str) -> da.Array:
        """A factor of the fitted model as a dask array, made on first use (a command that
        only fits imports no dask.array) and kept."""
        if "_factors" not in vars(self):
            raise AttributeError(f"{type(self).__name__} is not fitted: call fit() or load()")
        if (name, field) not in self._factors:
            self._factors[name, field] = self._model.factor(name, field)
        return self._factors[name, field]

    @property
    def W_(self) -> da.Array:
        """E[W] (U, K): the users' factors as a dask array read lazily from the saved model
        (chunked as its blocks), for models larger than memory; ``user_factors`` in memory.

        Examples
        --------
        >>> model.W_.shape
        (200, 6)
        """
        return self._factor("W", "mean")

    @property
    def H_(self) -> da.Array:
        """E[H] (I, K): the items' factors as a dask array read lazily from the saved model;
        ``item_factors`` in memory.

        Examples
        --------
        >>> model.H_.shape
        (100, 6)
        """
        return self._factor("H", "mean")

    @property
    def user_factors(self) -> np.ndarray:
        """(U, K) numpy array of E[W], the users' factors in the order of the model's user ids
        (as ``implicit`` and scikit-learn users hold them; read on first use and kept).

        Examples
        --------
        >>> model.user_factors.shape  # 200 users x (2 members x 3 components)
        (200, 6)
        """
        return self._served().W

    @property
    def item_factors(self) -> np.ndarray:
        """(I, K) numpy array of E[H], the items' factors in the order of the model's item
        ids.

        Examples
        --------
        >>> model.item_factors.shape
        (100, 6)
        """
        return self._served().H

    @property
    def log_W_(self) -> da.Array:
        """E[log W] (U, K) as a dask array read lazily from the saved model (the geometric
        mean of q(W), below E[W]).

        Examples
        --------
        >>> import numpy as np
        >>> bool((np.exp(model.log_W_.compute()) < model.W_.compute()).all())
        True
        """
        return self._factor("W", "log_mean")

    @property
    def log_H_(self) -> da.Array:
        """E[log H] (I, K) as a dask array read lazily from the saved model.

        Examples
        --------
        >>> model.log_H_.shape
        (100, 6)
        """
        return self._factor("H", "log_mean")

    @property
    def n_active_components_(self) -> int:
        """Components in use: those on which some user puts at least 1% of its expected latent
        counts (posterior shape minus alpha_W); a component the prior switched off carries none
        (docs/design.md, "Class probabilities"). Read from the posterior shapes on first use.

        Examples
        --------
        >>> 1 <= model.n_active_components_ <= 6
        True
        """
        if "_factors" not in vars(self):
            raise AttributeError(f"{type(self).__name__} is not fitted: call fit() or load()")
        if self._n_active is None:
            from ordnmf_dask.postfit.summary import active_components

            self._n_active = int(active_components(self._model).sum())
        return self._n_active

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the parameters and, once fitted, the model directory's path instead of the
        factors: unpickling reopens that model, so it must still exist (:meth:`save` keeps one)."""
        state = {
            k: v for k, v in vars(self).items() if not k.endswith("_") and not k.startswith("_")
        }
        if hasattr(self, "model_path_"):
            state["model_path_"] = self.model_path_
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = state.pop("model_path_", None)
        vars(self).update(state)
        if path is not None:
            self._set_fitted(open_model(path))

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> str:
        """Copy the fitted model directory to ``path`` (a directory or a URL: zarr arrays and
        JSON attributes); an existing ``path`` is replaced only with ``overwrite`` and only if
        it is a model.

        Examples
        --------
        >>> path = model.save("model.zarr", overwrite=True)  # OrdNMF.load(path) serves it
        >>> path.endswith("model.zarr")
        True
        """
        return copy_model(self._fitted_model(), path, overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CaviEstimator:
        """The estimator (of the saved model's class) with its parameters and fitted state.

        Examples
        --------
        >>> _ = model.save("model.zarr")
        >>> OrdNMF.load("model.zarr").user_factors.shape
        (200, 6)
        """
        model = open_model(os.fspath(path))
        klass = ESTIMATORS.get(model.header.model or "")
        if klass is None or not issubclass(klass, cls):
            raise InputError(
                f"{model.path}: holds a {model.header.model!r} model, not a {cls.__name__}"
            )
        est = klass(**dict(model.header.params))
        est._set_fitted(model)
        return est

    # -- serving in memory, no cluster (ordnmf_dask.postfit.serving) ---------------------
    def _server(self, store: str | os.PathLike[str] | None = None) -> Server:
        from ordnmf_dask.postfit.serving import server

        return server(self._fitted_model(), store)

    def _served(self) -> Server:
        """The server of the fitted model (AttributeError when not fitted)."""
        if "_factors" not in vars(self):
            raise AttributeError(f"{type(self).__name__} is not fitted: call fit() or load()")
        return self._server()

    def recommend(
        self,
        user_ids: Any,
        n: int = 10,
        *,
        filter_already_seen: bool = True,
        items: Sequence[Any] | None = None,
        exclude: Sequence[Any] | None = None,
        store: str | os.PathLike[str] | None = None,
        proba_at: int | None = None,
    ) -> dict[Any, list[tuple[Any, ...]]]:
        """Top-``n`` items per user by E[w_u] . E[h_i], in memory:
        ``{user id as given: [(raw item id, score), ...]}``, best first, ties to the lower item
        index. A score is the Poisson rate E[w_u] . E[h_i] of the pair under the posterior
        means: nonnegative and unbounded, not a probability nor a predicted rating; it orders
        the items of a user (every P(y_ui >= s) increases with it), and is not comparable
        across models. ``filter_already_seen`` leaves out the user's training items (from the
        model's own index of them, or from ``store``, needed only by models saved without that
        index); ``items`` restricts the candidates to these raw ids; ``exclude`` removes
        these. ``proba_at`` s (a class 1..V): ``(raw item id, score, P(y >= s | y > 0))``
        triples (:meth:`predict_proba`'s plug-in law, which rises with the score).

        Examples
        --------
        >>> top = model.recommend([0, 1], n=3)  # (item, score) pairs, training items left out
        >>> sorted(top), [len(v) for v in top.values()]
        ([0, 1], [3, 3])
        """
        srv = self._server(store)
        recs = srv.recommend(user_ids, n, filter_already_seen, items, exclude)
        if proba_at is None:
            return recs
        from ordnmf_dask.postfit.predict import recommend_with_proba

        return recommend_with_proba(srv, recs, proba_at)

    def recommend_for(
        self,
        w: np.ndarray,
        n: int = 10,
        *,
        exclude: Sequence[Sequence[Any]] | None = None,
        items: Sequence[Any] | None = None,
        proba_at: int | None = None,
    ) -> dict[int, list[tuple[Any, ...]]]:
        """Top-``n`` items for users given by their factors (from :meth:`fold_in_users`),
        row j without the raw items ``exclude[j]``: ``{j: [(raw item id, score), ...]}``, as
        :meth:`recommend` keyed by the row of ``w``.

        Examples
        --------
        >>> w = model.fold_in_users([[1, 2, 3]], [[10, 8, 9]])
        >>> top = model.recommend_for(w, n=2, exclude=[[1, 2, 3]])
        >>> len(top[0])
        2
        """
        srv = self._server()
        recs = srv.recommend_for(w, n, exclude, items)
        if proba_at is None:
            return recs
        from ordnmf_dask.postfit.predict import recommend_for_with_proba

        return recommend_for_with_proba(srv, recs, w, proba_at)

    def similar_items(self, item_ids: Any, n: int = 10) -> dict[Any, list[tuple[Any, float]]]:
        """The ``n`` items most similar to each given one (cosine of E[h]), itself excluded.

        Examples
        --------
        >>> near = model.similar_items([1], n=4)  # (item, cosine) pairs
        >>> len(near[1]), 1 in {item for item, _ in near[1]}
        (4, False)
        """
        return self._server().similar("items", item_ids, n)

    def similar_users(self, user_ids: Any, n: int = 10) -> dict[Any, list[tuple[Any, float]]]:
        """The ``n`` users most similar to each given one (cosine of E[w]), itself excluded.

        Examples
        --------
        >>> near = model.similar_users([0], n=4)  # (user, cosine) pairs
        >>> len(near[0]), 0 in {user for user, _ in near[0]}
        (4, False)
        """
        return self._server().similar("users", user_ids, n)

    def score(self, user_ids: Sequence[Any], item_ids: Sequence[Any]) -> np.ndarray:
        """E[w_u] . E[h_i] for the pairs (user_ids[j], item_ids[j]): the ranking score, a
        Poisson rate (nonnegative, unbounded; an order, not a rating: see :meth:`recommend`).

        Examples
        --------
        >>> model.score([0, 0], [1, 2]).shape  # E[w_u] . E[h_i], the ranking score
        (2,)
        """
        return self._server().score(user_ids, item_ids)

    def predict_proba(
        self,
        user_ids: Sequence[Any],
        item_ids: Sequence[Any],
        *,
        given_interaction: bool = False,
        posterior: str = "mean",
    ) -> np.ndarray:
        """P(y = v) for v = 0..V (class 0: no interaction) of the pairs (user_ids[j],
        item_ids[j]), shape (n, V + 1); ``given_interaction``: P(y = v | y > 0). ``posterior``
        "mean" is the model's law at lambda = E[w] . E[h] (the law of the test log-likelihood,
        rising with the ranking score); "gamma" averages it over q(W) q(H), lambda taken Gamma
        with its posterior mean and variance (closer to the posterior predictive for pairs of
        uncertain rate: docs/design.md, "Class probabilities"; dcPF: always "mean").
        InputError for a model without a law of the classes (dcPF on classes or at p = 1) and
        for unknown ids.

        Examples
        --------
        >>> p = model.predict_proba([0, 0], [1, 2])  # P(y = v), v = 0 .. 10
        >>> p.shape, bool(abs(p.sum(axis=1) - 1).max() < 1e-9)
        ((2, 11), True)
        """
        from ordnmf_dask.postfit.predict import predictor

        return predictor(self._server()).proba(user_ids, item_ids, given_interaction, posterior)

    def predict(
        self,
        user_ids: Sequence[Any],
        item_ids: Sequence[Any],
        *,
        kind: str = "expected",
        posterior: str = "mean",
        scale: str = "store",
    ) -> np.ndarray:
        """The rating of each pair given an interaction: the ``kind`` "expected", "mode" or
        "median" of P(y = v | y > 0), on the store's scale (stars for half-star ratings, the
        rating for integer ratings, for count classes the (n, 2) least and greatest count of
        the class; counts have no expected value) or, with ``scale="class"``, as a class.

        Examples
        --------
        >>> ratings = model.predict([0, 0], [1, 2], scale="class")  # expected class, given a rating
        >>> ratings.shape, bool(((ratings >= 1) & (ratings <= 10)).all())
        ((2,), True)
        """
        from ordnmf_dask.postfit.predict import predictor

        return predictor(self._server()).predict(user_ids, item_ids, kind, posterior, scale)

    def fold_in_users(
        self,
        items: Sequence[Sequence[Any]],
        values: Sequence[Sequence[float]],
        *,
        max_iter: int = 500,
        tol: float = 1e-6,
        seed: int | None = None,
    ) -> np.ndarray:
        """E[w] (n_new, K) of NEW users from their (raw item id, value) interactions, with
        q(H) and the thresholds fixed (see :func:`ordnmf_dask.fold_in`), in memory. Values are
        on the scale the store was ingested from (half-star ratings, integer ratings or counts,
        as ``fit(X)`` takes them); a value of no class is an InputError saying what to pass.

        Examples
        --------
        >>> w = model.fold_in_users([[1, 2, 3]], [[10, 8, 9]])  # a new user who rated items 1, 2, 3
        >>> w.shape  # 2 members of 3 components
        (1, 6)
        """
        return self._server().fold_in("users", items, values, max_iter, tol, seed)

    def fold_in_items(
        self,
        users: Sequence[Sequence[Any]],
        values: Sequence[Sequence[float]],
        *,
        max_iter: int = 500,
        tol: float = 1e-6,
        seed: int | None = None,
    ) -> np.ndarray:
        """E[h] (n_new, K) of NEW items from their (raw user id, value) interactions, with
        q(W) and the thresholds fixed, in memory.

        Examples
        --------
        >>> h = model.fold_in_items([[0, 1, 2]], [[9, 10, 8]])  # a new item rated by users 0, 1, 2
        >>> h.shape  # 2 members of 3 components
        (1, 6)
        """
        return self._server().fold_in("items", users, values, max_iter, tol, seed)


class OrdNMF(CaviEstimator):
    __doc__ = (
        """Ordinal NMF with inverse-gamma thresholds (IG-OrdNMF), fitted by exact CAVI on Dask.

    Implements Gouvert, Oberlin & Fevotte, "Ordinal Non-negative Matrix Factorization for
    Recommendation", ICML 2020, in the variant the published numbers were computed with
    (docs/design.md §2): empirical-Bayes prior rates, closed-form Delta (VBEM), W then H
    updated in turn so that the ELBO never decreases. ``approx=True`` fixes q(n) = delta_1
    ("PF on binarized data" when V = 1); Delta is still learned and the reported bound is still
    the local ELBO with E[n] = 1, as in the published code.

    Parameters
    ----------
"""
        + _params_doc("OrdNMF")
        + """
    Attributes
    ----------"""
        + _SHARED_ATTRS_DOC
        + """    delta_ : (V + 1,) threshold decrements (delta_[0] = 0); an ensemble's
        (n_members, V + 1), one row per member.
    theta_ : (V + 1,) thresholds theta_v = sum_{l > v} Delta_l (theta_V = 0); an ensemble's
        (n_members, V + 1).
"""
        + _NOTES_DOC
        + """
    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import OrdNMF
    >>> model = OrdNMF(n_components=3, n_members=2, max_iter=30).fit(store)
    >>> model.user_factors.shape  # 200 users x 2 members of 3 components
    (200, 6)
    >>> top = model.recommend([0], n=5)  # raw user id 0: five (item, score) pairs
    >>> len(top[0])
    5
    >>> model.predict_proba([0], [1]).shape  # P(y = v), v = 0 .. 10
    (1, 11)
"""
    )

    approx: bool

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        select_components: Sequence[int] | None = DEFAULTS["select_components"],
        alpha_W: float = DEFAULTS["alpha_W"],
        alpha_H: float = DEFAULTS["alpha_H"],
        tol: float = DEFAULTS["tol"],
        max_iter: int = DEFAULTS["max_iter"],
        min_iter: int = DEFAULTS["min_iter"],
        seed: int = DEFAULTS["seed"],
        optimizer: str = DEFAULTS["optimizer"],
        anneal: int = DEFAULTS["anneal"],
        n_init: int = DEFAULTS["n_init"],
        n_members: int = DEFAULTS["n_members"],
        start: str = DEFAULTS["start"],
        approx: bool = DEFAULTS["approx"],
        cache_blocks: bool | str = DEFAULTS["cache_blocks"],
        executor: str = DEFAULTS["executor"],
        work_dir: str | os.PathLike[str] | None = DEFAULTS["work_dir"],
        checkpoint_dir: str | os.PathLike[str] | None = DEFAULTS["checkpoint_dir"],
        checkpoint_every: int = DEFAULTS["checkpoint_every"],
        checkpoint_minutes: float | None = DEFAULTS["checkpoint_minutes"],
        validation_every: int = DEFAULTS["validation_every"],
        validation_patience: int = DEFAULTS["validation_patience"],
        validation_window: int = DEFAULTS["validation_window"],
        validation_metric: str = DEFAULTS["validation_metric"],
        validation_k: int = DEFAULTS["validation_k"],
        validation_s: int = DEFAULTS["validation_s"],
    ) -> None:
        _keep_arguments(self, locals())

    def _set_family_attrs(self, header: ModelHeader) -> None:
        if header.n_members == 1:
            self.delta_ = np.asarray(header.delta)
            self.theta_ = header.theta
        else:
            self.delta_ = np.array([law.delta for law in header.laws])
            self.theta_ = np.array([law.theta for law in header.laws])


class BePoF(OrdNMF):
    """Bernoulli-Poisson factorization: OrdNMF with V = 1 on data binarized at ``threshold``.

    Blocks of the store are binarized when read (class >= ``threshold`` -> 1, others dropped),
    so one ingested ordinal store serves every threshold. theta_0 = Delta_1 is learned, or fixed
    at 1 with ``learn_threshold=False`` (the paper's BePoF). ``approx=True`` is PF on the
    binarized data (see :class:`PF`). Other parameters and attributes as :class:`OrdNMF`.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import BePoF
    >>> model = BePoF(n_components=3, threshold=6, n_members=1, max_iter=20).fit(store)
    >>> model.item_factors.shape
    (100, 3)
    """

    threshold: int
    learn_threshold: bool

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        select_components: Sequence[int] | None = DEFAULTS["select_components"],
        alpha_W: float = DEFAULTS["alpha_W"],
        alpha_H: float = DEFAULTS["alpha_H"],
        tol: float = DEFAULTS["tol"],
        max_iter: int = DEFAULTS["max_iter"],
        min_iter: int = DEFAULTS["min_iter"],
        seed: int = DEFAULTS["seed"],
        optimizer: str = DEFAULTS["optimizer"],
        anneal: int = DEFAULTS["anneal"],
        n_init: int = DEFAULTS["n_init"],
        n_members: int = DEFAULTS["n_members"],
        start: str = DEFAULTS["start"],
        approx: bool = DEFAULTS["approx"],
        threshold: int = DEFAULTS["threshold"],
        learn_threshold: bool = DEFAULTS["learn_threshold"],
        cache_blocks: bool | str = DEFAULTS["cache_blocks"],
        executor: str = DEFAULTS["executor"],
        work_dir: str | os.PathLike[str] | None = DEFAULTS["work_dir"],
        checkpoint_dir: str | os.PathLike[str] | None = DEFAULTS["checkpoint_dir"],
        checkpoint_every: int = DEFAULTS["checkpoint_every"],
        checkpoint_minutes: float | None = DEFAULTS["checkpoint_minutes"],
        validation_every: int = DEFAULTS["validation_every"],
        validation_patience: int = DEFAULTS["validation_patience"],
        validation_window: int = DEFAULTS["validation_window"],
        validation_metric: str = DEFAULTS["validation_metric"],
        validation_k: int = DEFAULTS["validation_k"],
        validation_s: int = DEFAULTS["validation_s"],
    ) -> None:
        _keep_arguments(self, locals())


class PF(BePoF):
    """Poisson factorization on data binarized at ``threshold``: BePoF with q(n) = delta_1.

    As in the published code, Delta_1 is still learned and the reported bound keeps the
    log(expm1(.)) local term. Parameters and attributes as :class:`BePoF` (``approx`` is True).

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import PF
    >>> model = PF(n_components=3, threshold=6, n_members=1, max_iter=20).fit(store)
    >>> model.item_factors.shape
    (100, 3)
    """

    approx = True  # not a parameter: q(n) = delta_1 always

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        select_components: Sequence[int] | None = DEFAULTS["select_components"],
        alpha_W: float = DEFAULTS["alpha_W"],
        alpha_H: float = DEFAULTS["alpha_H"],
        tol: float = DEFAULTS["tol"],
        max_iter: int = DEFAULTS["max_iter"],
        min_iter: int = DEFAULTS["min_iter"],
        seed: int = DEFAULTS["seed"],
        optimizer: str = DEFAULTS["optimizer"],
        anneal: int = DEFAULTS["anneal"],
        n_init: int = DEFAULTS["n_init"],
        n_members: int = DEFAULTS["n_members"],
        start: str = DEFAULTS["start"],
        threshold: int = DEFAULTS["threshold"],
        learn_threshold: bool = DEFAULTS["learn_threshold"],
        cache_blocks: bool | str = DEFAULTS["cache_blocks"],
        executor: str = DEFAULTS["executor"],
        work_dir: str | os.PathLike[str] | None = DEFAULTS["work_dir"],
        checkpoint_dir: str | os.PathLike[str] | None = DEFAULTS["checkpoint_dir"],
        checkpoint_every: int = DEFAULTS["checkpoint_every"],
        checkpoint_minutes: float | None = DEFAULTS["checkpoint_minutes"],
        validation_every: int = DEFAULTS["validation_every"],
        validation_patience: int = DEFAULTS["validation_patience"],
        validation_window: int = DEFAULTS["validation_window"],
        validation_metric: str = DEFAULTS["validation_metric"],
        validation_k: int = DEFAULTS["validation_k"],
        validation_s: int = DEFAULTS["validation_s"],
    ) -> None:
        _keep_arguments(self, locals())


class DcPF(CaviEstimator):
    __doc__ = (
        """dcPF with the logarithmic element distribution (Gouvert et al., UAI 2019), on raw counts.

    The baseline of the paper for play counts (docs/design.md §5): counts are sums of
    Log(p) elements whose number is Poisson(t Lambda). Iteration order: prior rates, p (10
    Newton steps, kept only if they improve), W, H, local step. Counts are the store's raw
    values when it holds counts (``value_kind == "counts"``), its classes otherwise.
    ``p = 0`` (fixed) is PF on the raw counts, ``p = 1`` (fixed) PF on binary data.

    A learned p becomes 0, and stays there, once sum E[n] reaches sum y (no overdispersion
    left: the bound rises all the way to the Poisson limit).

    Parameters
    ----------
"""
        + _params_doc("DcPF")
        + """
    Attributes
    ----------"""
        + _SHARED_ATTRS_DOC
        + """    p_ : the learned element parameter.
"""
        + _NOTES_DOC
        + """
    Examples
    --------
    >>> import numpy as np
    >>> import scipy.sparse as sp
    >>> from ordnmf_dask import DcPF
    >>> rng = np.random.default_rng(0)  # play counts of 60 users x 40 items
    >>> X = sp.csr_matrix(rng.poisson(3, (60, 40)) * (rng.random((60, 40)) < 0.2))
    >>> model = DcPF(n_components=3, n_members=1, max_iter=20)
    >>> model = model.fit(X, ingest_options={"counts": "paper"})  # keeps the raw counts
    >>> model.user_factors.shape
    (60, 3)
"""
    )

    p: float
    t: float
    update_p: bool

    def __init__(
        self,
        n_components: int = DEFAULTS["n_components"],
        *,
        select_components: Sequence[int] | None = DEFAULTS["select_components"],
        alpha_W: float = DEFAULTS["alpha_W"],
        alpha_H: float = DEFAULTS["alpha_H"],
        tol: float = DEFAULTS["tol"],
        max_iter: int = DEFAULTS["max_iter"],
        min_iter: int = DEFAULTS["min_iter"],
        seed: int = DEFAULTS["seed"],
        optimizer: str = DEFAULTS["optimizer"],
        anneal: int = DEFAULTS["anneal"],
        n_init: int = DEFAULTS["n_init"],
        n_members: int = DEFAULTS["n_members"],
        start: str = DEFAULTS["start"],
        p: float = DEFAULTS["p"],
        t: float = DEFAULTS["t"],
        update_p: bool = DEFAULTS["update_p"],
        cache_blocks: bool | str = DEFAULTS["cache_blocks"],
        executor: str = DEFAULTS["executor"],
        work_dir: str | os.PathLike[str] | None = DEFAULTS["work_dir"],
        checkpoint_dir: str | os.PathLike[str] | None = DEFAULTS["checkpoint_dir"],
        checkpoint_every: int = DEFAULTS["checkpoint_every"],
        checkpoint_minutes: float | None = DEFAULTS["checkpoint_minutes"],
        validation_every: int = DEFAULTS["validation_every"],
        validation_patience: int = DEFAULTS["validation_patience"],
        validation_window: int = DEFAULTS["validation_window"],
        validation_metric: str = DEFAULTS["validation_metric"],
        validation_k: int = DEFAULTS["validation_k"],
        validation_s: int = DEFAULTS["validation_s"],
    ) -> None:
        _keep_arguments(self, locals())

    def _set_family_attrs(self, header: ModelHeader) -> None:
        p = [float(law.p) for law in header.laws if law.p is not None]  # a DcPF model's
        self.p_ = p[0] if header.n_members == 1 else np.array(p)


ESTIMATORS: dict[str, type[CaviEstimator]] = {k.__name__: k for k in (OrdNMF, BePoF, PF, DcPF)}
