"""The law of the ordered classes: P(y = v) for v = 0..V from the rate lambda and the thresholds,
and the ratings it predicts (docs/design.md, "Class probabilities"). Pure functions on arrays.

A law is given by its cumulative hazards ``H_v = -log P(y <= v)`` (H_V = 0), (n, V + 1):
``lambda theta_v`` for a known rate (the model's law, docs/design.md §1, :func:`plugin_hazards`),
or ``alpha log(1 + theta_v / beta)`` for a rate of law Gamma(alpha, beta), the Gamma that matches
the mean and variance of lambda under the variational posterior (:func:`gamma_hazards`). Every
class probability is a difference of two such terms, computed as ``exp(-H_v) (1 - exp(-(H_{v-1}
- H_v)))`` so that no probability is a difference of two numbers close to 1.
"""

from __future__ import annotations

import numpy as np

from ordnmf_dask.model.kernels import jit

POSTERIORS = ("gamma", "mean")  # how the posterior enters: gamma_hazards, plugin_hazards
KINDS = ("expected", "mode", "median")  # the ratings :func:`class_rating` gives


@jit(error_model="numpy")
def gamma_hazards(
    users: np.ndarray,
    items: np.ndarray,
    mean_w: np.ndarray,
    var_w: np.ndarray,
    mean_h: np.ndarray,
    var_h: np.ndarray,
    theta: np.ndarray,
) -> np.ndarray:
    """Cumulative hazards (n, V + 1) of the pairs (row ``users[j]`` of the W arrays, row
    ``items[j]`` of the H arrays) under the posterior: lambda = sum_k w_k h_k taken Gamma with
    its exact mean and variance under independent factors, ``E = sum_k E[w] E[h]``, ``Var =
    sum_k Var[w] E[h^2] + E[w]^2 Var[h]`` (nonnegative terms, no cancellation), for which
    ``E[exp(-lambda theta)] = (1 + theta Var / E)^(-E^2 / Var)`` exactly; a pair of variance 0
    gets the plug-in law ``E theta``. One pass over the pairs, no gathered (n, K) copies."""
    n, k, width = len(users), mean_w.shape[1], len(theta)
    out = np.empty((n, width))
    for j in range(n):
        u, i = users[j], items[j]
        m = 0.0
        v = 0.0
        for c in range(k):
            a, b = mean_w[u, c], mean_h[i, c]
            vb = var_h[i, c]
            m += a * b
            v += var_w[u, c] * (b * b + vb) + a * a * vb
        if v > 0.0 and m > 0.0:
            scale, shape = v / m, m * m / v
            for t in range(width):
                out[j, t] = shape * np.log1p(theta[t] * scale)
        else:
            for t in range(width):
                out[j, t] = m * theta[t]
    return out


def plugin_hazards(lam: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Cumulative hazards (n, V + 1) of the model's law at the rates ``lam`` (n,):
    ``lambda theta_v``."""
    return np.multiply.outer(np.asarray(lam, dtype=np.float64), np.asarray(theta, np.float64))


def ordinal_limit(theta: np.ndarray) -> np.ndarray:
    """The ordinal law given an interaction as lambda -> 0, (V + 1,): ``Delta_v / theta_0``
    (a rate of exactly 0, a zero factor row, has no law given an interaction: it gets this)."""
    theta = np.asarray(theta, dtype=np.float64)
    return np.concatenate([[0.0], (theta[:-1] - theta[1:]) / theta[0]])


def class_law(h: np.ndarray, limit: np.ndarray, given_interaction: bool = False) -> np.ndarray:
    """P(y = v), v = 0..V, (n, V + 1), from the cumulative hazards ``h`` (:func:`hazards`).

    ``given_interaction``: P(y = v | y > 0) (column 0 is then 0); a row with P(y > 0) = 0 gets
    ``limit``, the law given an interaction as the rate tends to 0 (:func:`ordinal_limit`).
    """
    h = np.asarray(h, dtype=np.float64)
    p = np.empty_like(h)
    np.subtract(h[:, :-1], h[:, 1:], out=p[:, 1:])
    np.expm1(np.negative(p[:, 1:], out=p[:, 1:]), out=p[:, 1:])
    p[:, 1:] *= -np.exp(-h[:, 1:])
    p[:, 0] = np.exp(-h[:, 0])
    if not given_interaction:
        return p
    reach = -np.expm1(-h[:, :1])  # P(y > 0)
    zero = reach[:, 0] == 0
    p[:, 0] = 0.0
    p[~zero, 1:] /= reach[~zero]
    p[zero] = limit
    return p


def at_least(h: np.ndarray, s: int, limit: np.ndarray) -> np.ndarray:
    """P(y >= s | y > 0), (n,), for a class s in 1..V, from the cumulative hazards ``h``:
    ``(1 - exp(-H_{s-1})) / (1 - exp(-H_0))`` (``limit``'s where P(y > 0) = 0, as
    :func:`class_law`)."""
    h = np.asarray(h, dtype=np.float64)
    reach = -np.expm1(-h[:, 0])
    above = -np.expm1(-h[:, s - 1])
    zero = reach == 0
    out = np.divide(above, reach, out=np.zeros_like(reach), where=~zero)
    out[zero] = float(np.sum(limit[s:]))
    return np.minimum(out, 1.0)


def class_rating(law: np.ndarray, kind: str) -> np.ndarray:
    """The class a law given an interaction (n, V + 1) predicts: ``"expected"`` (the mean class,
    fractional), ``"mode"`` (the most probable class, ties to the lower) or ``"median"`` (the
    least class v with P(y <= v | y > 0) >= 1/2). Shape (n,), float64 for ``"expected"``, int64
    otherwise."""
    if kind == "expected":
        return law @ np.arange(law.shape[1], dtype=np.float64)
    if kind == "mode":
        return np.argmax(law[:, 1:], axis=1).astype(np.int64) + 1
    if kind == "median":
        cdf = np.cumsum(law[:, 1:], axis=1)
        cdf /= cdf[:, -1:]  # the total is 1 up to rounding: the median of the law as computed
        return np.argmax(cdf >= 0.5, axis=1).astype(np.int64) + 1
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def count_hazards(lam: np.ndarray, p: float, t: float, edges: np.ndarray) -> np.ndarray:
    """Cumulative hazards (n, V + 1) of the classes of counts under dcPF (docs/design.md §5) at
    rates ``lam`` (n,): class v holds the counts in ``(floor(edges[v-1]), floor(edges[v])]``
    (class 0: up to floor(edges[0]); class V: above floor(edges[V-1])), the count law
    NB(t lam / -log(1 - p), 1 - p), Poisson(t lam) at p = 0, as :func:`~.dcpf.count_loglik`."""
    from scipy.stats import nbinom, poisson  # here: scipy.stats is slow to import

    rate = t * np.asarray(lam, dtype=np.float64)[:, None]
    dist = poisson(rate) if p == 0.0 else nbinom(rate / -np.log1p(-p), 1.0 - p)
    bounds = np.floor(np.asarray(edges, dtype=np.float64))[None, :]
    cdf, sf = dist.cdf(bounds), dist.sf(bounds)
    with np.errstate(divide="ignore"):
        h = np.where(cdf > 0.5, -np.log1p(-sf), -np.log(cdf))
    return np.concatenate([h, np.zeros((h.shape[0], 1))], axis=1)


def count_limit(p: float, edges: np.ndarray) -> np.ndarray:
    """dcPF's law of the count classes given an interaction as the rate tends to 0, (V + 1,):
    the logarithmic law Log(p) of one element (a point mass on the least count above
    floor(edges[0]) at p = 0), over the classes 1..V."""
    bounds = np.floor(np.asarray(edges, dtype=np.float64))
    if p == 0.0:
        cdf = (bounds >= bounds[0] + 1).astype(np.float64)
    else:
        from scipy.stats import logser

        cdf = logser(p).cdf(bounds)
    cdf = np.append(cdf, 1.0)
    mass = np.diff(cdf)
    return np.concatenate([[0.0], mass / mass.sum()])


def class_values(value_kind: str, n_classes: int) -> np.ndarray:
    """The rating each class 0..V stands for on a store's scale (its ``value_kind``): half
    stars for ``"ratings-halfstar"`` (class v is v / 2 stars), the class itself for
    ``"ratings-integer"``. ValueError for other kinds, whose classes are no points of a scale."""
    if value_kind == "ratings-halfstar":
        return np.arange(n_classes + 1) / 2.0
    if value_kind == "ratings-integer":
        return np.arange(n_classes + 1, dtype=np.float64)
    raise ValueError(f"classes of value kind {value_kind!r} are not points of a rating scale")


def count_range(classes: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The counts of classes 1..V of a count store with thresholds ``edges`` (V,), (n, 2):
    the least and the greatest count of the class (inf for the top class)."""
    bounds = np.append(np.floor(np.asarray(edges, dtype=np.float64)), np.inf)
    classes = np.asarray(classes, dtype=np.int64)
    return np.stack([bounds[classes - 1] + 1, bounds[classes]], axis=1)


def log_class_prob(h: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log P(y = y_j | y > 0) of observed classes ``y`` (n,) in 1..V, from the cumulative
    hazards ``h``, in log space (no underflow for large rates): ``-H_y + log(1 - exp(-(H_{y-1}
    - H_y))) - log(1 - exp(-H_0))``; as the test log-likelihood of docs/design.md §3 for the
    plug-in law. -inf for a class of probability 0."""
    rows = np.arange(len(y))
    y = np.asarray(y, dtype=np.int64)
    with np.errstate(divide="ignore"):
        return (
            -h[rows, y]
            + np.log(-np.expm1(h[rows, y] - h[rows, y - 1]))
            - np.log(-np.expm1(-h[:, 0]))
        )
