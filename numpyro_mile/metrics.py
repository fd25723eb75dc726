"""Predictive metrics for Bayesian neural networks.

Every function takes posterior predictive quantities stacked over samples ``S`` (all chains
times draws, flattened) and observations ``N``; classification functions also accept
already-averaged probabilities of shape ``(N, C)``. Sample ``weights`` (shape ``(S,)``,
e.g. self-normalised importance weights) are optional everywhere; the default is uniform.
Weights must be non-negative with a positive sum and are normalised to sum to one here.

All computations run in NumPy on concrete values (JAX arrays are converted), after a
jit-compiled predictive has produced them; they are meant for evaluation, not inside ``jit``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

__all__ = [
    "CalibrationCurve",
    "accuracy",
    "apply_temperature",
    "brier",
    "calibration_curve",
    "coverage",
    "ece",
    "ece_all_classes",
    "fit_temperature",
    "gaussian_log_likelihood",
    "lppd",
    "mce",
    "mce_all_classes",
    "nll",
    "predictive_mean_probs",
    "rmse",
]

_PROB_SUM_ATOL = 1e-3


# --------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------


def _as_float(name: str, array) -> np.ndarray:
    values = np.asarray(array)
    if values.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real-valued array, got dtype {values.dtype}.")
    return values.astype(np.float64, copy=False)


def _normalised_weights(weights, num_samples: int) -> np.ndarray | None:
    """Check ``weights`` against the number of samples and normalise them to sum to one.

    :param weights: ``None`` or non-negative weights, shape ``(S,)``.
    :param num_samples: ``S``.
    :returns: normalised weights, shape ``(S,)``, or ``None`` for uniform weights.
    """
    if weights is None:
        return None
    w = _as_float("weights", weights)
    if w.ndim != 1 or w.shape[0] != num_samples:
        raise ValueError(f"weights must have shape (S,) = ({num_samples},) to match the samples, got shape {w.shape}.")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative.")
    total = w.sum()
    if total <= 0:
        raise ValueError("weights must have a positive sum.")
    return w / total


def _labels(y, num_obs: int, num_classes: int) -> np.ndarray:
    """Integer class labels of shape ``(N,)`` in ``[0, C)``."""
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise ValueError(f"y must be a 1-D array of class labels, shape (N,), got {labels.shape}.")
    if labels.shape[0] != num_obs:
        raise ValueError(f"probs/logits and y have different numbers of observations: {num_obs} vs {labels.shape[0]}.")
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
            raise ValueError("y must hold integer class labels.")
    elif labels.dtype.kind not in "biu":
        raise ValueError(f"y must hold integer class labels, got dtype {labels.dtype}.")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"class labels must lie in [0, {num_classes}) for {num_classes} classes, "
            f"got values in [{labels.min()}, {labels.max()}]."
        )
    return labels


def _class_probs(probs, y, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean probabilities ``(N, C)`` and checked labels ``(N,)``."""
    p = predictive_mean_probs(probs, weights)
    labels = _labels(y, p.shape[0], p.shape[1])
    return p, labels


def _log_sum_exp(a: np.ndarray, axis: int = 0) -> np.ndarray:
    """Numerically stable ``log(sum(exp(a), axis))``; ``-inf`` entries are allowed."""
    a_max = np.max(a, axis=axis, keepdims=True)
    a_max = np.where(np.isfinite(a_max), a_max, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - a_max), axis=axis, keepdims=True)) + a_max
    return np.squeeze(out, axis=axis)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - _log_sum_exp(logits, axis=-1)[..., None]


# --------------------------------------------------------------------------------------
# regression
# --------------------------------------------------------------------------------------


def gaussian_log_likelihood(y, mu, sigma) -> np.ndarray:
    """Pointwise Gaussian log density ``log N(y | mu, sigma)``.

    :param y: observations, shape ``(N,)``.
    :param mu: predictive means, shape ``(S, N)`` (or ``(N,)``).
    :param sigma: predictive standard deviations (> 0), broadcastable to ``mu`` — shape
        ``(S, N)``, ``(S, 1)`` or a scalar.
    :returns: log densities, shape ``(S, N)`` (the broadcast shape of the inputs).
    """
    y = _as_float("y", y)
    mu = _as_float("mu", mu)
    sigma = _as_float("sigma", sigma)
    if y.ndim != 1:
        raise ValueError(f"y must have shape (N,), got {y.shape}.")
    if mu.ndim == 0 or mu.shape[-1] != y.shape[0]:
        raise ValueError(f"mu must have shape (S, N) with N = {y.shape[0]} to match y, got {mu.shape}.")
    try:
        shape = np.broadcast_shapes(y.shape, mu.shape, sigma.shape)
    except ValueError:
        raise ValueError(f"sigma of shape {sigma.shape} does not broadcast against mu of shape {mu.shape}.") from None
    if np.any(sigma <= 0):
        raise ValueError("sigma must be strictly positive.")
    z = (y - mu) / sigma
    out = -0.5 * z**2 - np.log(sigma) - 0.5 * math.log(2.0 * math.pi)
    return np.broadcast_to(out, shape)


def lppd(log_lik, weights=None, pointwise: bool = False):
    """Log pointwise predictive density, averaged over observations.

    ``lppd = 1/N sum_n log sum_s w_s exp(log_lik[s, n])``; with uniform weights the inner
    term is ``log mean_s exp(log_lik[s, n])``. Computed with log-sum-exp.

    :param log_lik: pointwise log likelihoods, shape ``(S, N)``; a ``(chains, draws, N)``
        array is flattened to ``(chains * draws, N)`` first.
    :param weights: optional sample weights, shape ``(S,)``.
    :param pointwise: also return the per-observation values.
    :returns: the mean lppd (float); with ``pointwise=True`` the tuple
        ``(mean, pointwise)`` where ``pointwise`` has shape ``(N,)``.
    """
    ll = _as_float("log_lik", log_lik)
    if ll.ndim == 3:
        ll = ll.reshape(-1, ll.shape[-1])
    if ll.ndim != 2:
        raise ValueError(f"log_lik must have shape (S, N) or (chains, draws, N), got {np.shape(log_lik)}.")
    if ll.shape[0] == 0 or ll.shape[1] == 0:
        raise ValueError(f"log_lik must have at least one sample and observation, got {ll.shape}.")
    w = _normalised_weights(weights, ll.shape[0])
    if w is None:
        per_obs = _log_sum_exp(ll, axis=0) - math.log(ll.shape[0])
    else:
        with np.errstate(divide="ignore"):
            log_w = np.log(w)
        per_obs = _log_sum_exp(ll + log_w[:, None], axis=0)
    mean = float(np.mean(per_obs))
    return (mean, per_obs) if pointwise else mean


def rmse(y, mu, weights=None) -> float:
    """Root mean squared error of the posterior predictive mean.

    :param y: observations, shape ``(N,)``.
    :param mu: predictive means per sample, shape ``(S, N)``, or the already averaged
        predictive mean, shape ``(N,)``.
    :param weights: optional sample weights, shape ``(S,)`` (only with ``mu`` of shape
        ``(S, N)``).
    :returns: ``sqrt(mean_n (y_n - sum_s w_s mu[s, n])^2)``.
    """
    y = _as_float("y", y)
    mu = _as_float("mu", mu)
    if y.ndim != 1:
        raise ValueError(f"y must have shape (N,), got {y.shape}.")
    if mu.ndim == 1:
        if weights is not None:
            raise ValueError("weights need per-sample predictions mu of shape (S, N).")
        mean = mu
    elif mu.ndim == 2:
        w = _normalised_weights(weights, mu.shape[0])
        mean = mu.mean(axis=0) if w is None else w @ mu
    else:
        raise ValueError(f"mu must have shape (S, N) or (N,), got {mu.shape}.")
    if mean.shape[0] != y.shape[0]:
        raise ValueError(f"mu and y have different numbers of observations: {mean.shape[0]} vs {y.shape[0]}.")
    return float(np.sqrt(np.mean((y - mean) ** 2)))


def _weighted_quantiles(draws: np.ndarray, qs: Sequence[float], w: np.ndarray) -> np.ndarray:
    """Weighted quantiles along axis 0, generalising NumPy's default ``"linear"`` method.

    Sorted draw ``k`` sits at cumulative position ``(W_k - w_k) / (1 - w_last)``, which is
    ``k / (S - 1)`` for uniform weights, and quantiles interpolate linearly between positions.

    :param draws: shape ``(S, N)``.
    :param qs: probabilities in ``[0, 1]``, length ``Q``.
    :param w: normalised weights, shape ``(S,)``.
    :returns: shape ``(Q, N)``.
    """
    keep = w > 0
    draws, w = draws[keep], w[keep] / w[keep].sum()
    if draws.shape[0] == 1:
        return np.broadcast_to(draws[0], (len(qs), draws.shape[1])).copy()
    order = np.argsort(draws, axis=0)
    sorted_draws = np.take_along_axis(draws, order, axis=0)
    w_sorted = w[order]  # (S, N)
    cum = np.cumsum(w_sorted, axis=0)
    pos = (cum - w_sorted) / (1.0 - w_sorted[-1])  # (S, N), from 0 up to 1
    cols = np.arange(draws.shape[1])
    out = np.empty((len(qs), draws.shape[1]))
    for i, q in enumerate(qs):
        idx = np.clip(np.sum(pos <= q, axis=0) - 1, 0, draws.shape[0] - 2)
        lo_pos, hi_pos = pos[idx, cols], pos[idx + 1, cols]
        width = hi_pos - lo_pos
        frac = np.where(width > 0, (q - lo_pos) / np.where(width > 0, width, 1.0), 0.0)
        frac = np.clip(frac, 0.0, 1.0)
        lo, hi = sorted_draws[idx, cols], sorted_draws[idx + 1, cols]
        out[i] = lo + frac * (hi - lo)
    return out


def coverage(y, samples, levels: Sequence[float] = (0.5, 0.75, 0.9, 0.95), weights=None) -> dict[float, float]:
    """Empirical coverage of central posterior predictive intervals.

    The central interval at level ``a`` runs from the ``(1 - a) / 2`` to the
    ``(1 + a) / 2`` quantile of the predictive draws of each observation (weighted
    quantiles when ``weights`` are given); endpoints count as inside.

    :param y: observations, shape ``(N,)``.
    :param samples: posterior predictive draws, shape ``(S, N)``.
    :param levels: interval levels in ``(0, 1)``.
    :param weights: optional sample weights, shape ``(S,)``.
    :returns: ``{level: fraction of y inside the interval}``; well calibrated when close
        to ``level``.
    """
    y = _as_float("y", y)
    draws = _as_float("samples", samples)
    if y.ndim != 1:
        raise ValueError(f"y must have shape (N,), got {y.shape}.")
    if draws.ndim != 2:
        raise ValueError(f"samples must have shape (S, N), got {draws.shape}.")
    if draws.shape[1] != y.shape[0]:
        raise ValueError(f"samples and y have different numbers of observations: {draws.shape[1]} vs {y.shape[0]}.")
    levels = [float(a) for a in levels]
    if any(not 0.0 < a < 1.0 for a in levels):
        raise ValueError(f"levels must lie strictly between 0 and 1, got {levels}.")
    qs = [q for a in levels for q in ((1.0 - a) / 2.0, (1.0 + a) / 2.0)]
    w = _normalised_weights(weights, draws.shape[0])
    if w is None:
        bounds = np.quantile(draws, qs, axis=0)
    else:
        bounds = _weighted_quantiles(draws, qs, w)
    result = {}
    for i, a in enumerate(levels):
        lo, hi = bounds[2 * i], bounds[2 * i + 1]
        result[a] = float(np.mean((y >= lo) & (y <= hi)))
    return result


# --------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------


def predictive_mean_probs(probs, weights=None) -> np.ndarray:
    """Posterior predictive class probabilities ``sum_s w_s probs[s]``.

    :param probs: class probabilities per sample, shape ``(S, N, C)``, or already averaged,
        shape ``(N, C)`` (returned as is after checks).
    :param weights: optional sample weights, shape ``(S,)`` (only with 3-D ``probs``).
    :returns: shape ``(N, C)``.
    """
    p = _as_float("probs", probs)
    if p.ndim == 3:
        w = _normalised_weights(weights, p.shape[0])
        p = p.mean(axis=0) if w is None else np.tensordot(w, p, axes=1)
    elif p.ndim == 2:
        if weights is not None:
            raise ValueError("weights need per-sample probabilities of shape (S, N, C).")
    else:
        raise ValueError(f"probs must have shape (S, N, C) or (N, C), got {p.shape}.")
    if p.shape[1] < 1:
        raise ValueError("probs must have at least one class.")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(
            "probs must be finite and non-negative; pass softmax probabilities, not logits "
            "(e.g. jax.nn.softmax(logits, axis=-1))."
        )
    sums = p.sum(axis=1)
    if p.shape[0] and not np.allclose(sums, 1.0, atol=_PROB_SUM_ATOL):
        raise ValueError(
            "probs must sum to 1 over classes (last axis); max deviation "
            f"{np.max(np.abs(sums - 1.0)):.3g}. Pass softmax probabilities, not logits "
            "(e.g. jax.nn.softmax(logits, axis=-1))."
        )
    return p


def accuracy(probs, y, weights=None) -> float:
    """Accuracy of the argmax of the predictive mean probabilities.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``, in ``[0, C)``.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    p, labels = _class_probs(probs, y, weights)
    return float(np.mean(np.argmax(p, axis=1) == labels))


def nll(probs, y, weights=None) -> float:
    """Mean negative log likelihood ``-1/N sum_n log pbar[n, y_n]`` of the predictive mean.

    Probabilities are floored at the smallest positive float, so a zero probability on the
    true class gives a large finite value rather than ``inf``.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    p, labels = _class_probs(probs, y, weights)
    p_true = p[np.arange(p.shape[0]), labels]
    return float(-np.mean(np.log(np.maximum(p_true, np.finfo(np.float64).tiny))))


def brier(probs, y, weights=None) -> float:
    """Brier score ``1/N sum_n sum_c (pbar[n, c] - 1[y_n = c])^2`` of the predictive mean.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    p, labels = _class_probs(probs, y, weights)
    onehot = np.eye(p.shape[1])[labels]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


class CalibrationCurve(NamedTuple):
    """Binned reliability statistics.

    :ivar bin_edges: shape ``(B + 1,)``, equal-width edges on ``[0, 1]``.
    :ivar confidence: mean predicted probability per bin, shape ``(B,)``; NaN when empty.
    :ivar accuracy: fraction correct per bin, shape ``(B,)``; NaN when empty.
    :ivar counts: number of predictions per bin, shape ``(B,)``.
    """

    bin_edges: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    counts: np.ndarray


def _binned(conf: np.ndarray, correct: np.ndarray, num_bins: int) -> CalibrationCurve:
    """Bin predictions on confidence into ``num_bins`` right-closed bins ``(lo, hi]``.

    The first bin also holds confidence exactly 0.
    """
    if int(num_bins) != num_bins or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins}.")
    num_bins = int(num_bins)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    idx = np.clip(np.searchsorted(edges[1:-1], conf, side="left"), 0, num_bins - 1)
    counts = np.bincount(idx, minlength=num_bins)
    conf_sum = np.bincount(idx, weights=conf, minlength=num_bins)
    acc_sum = np.bincount(idx, weights=correct.astype(np.float64), minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.where(counts > 0, conf_sum / counts, np.nan)
        acc = np.where(counts > 0, acc_sum / counts, np.nan)
    return CalibrationCurve(edges, confidence, acc, counts)


def _top_label(probs, y, weights) -> tuple[np.ndarray, np.ndarray]:
    p, labels = _class_probs(probs, y, weights)
    return np.max(p, axis=1), np.argmax(p, axis=1) == labels


def _all_classes(probs, y, weights) -> tuple[np.ndarray, np.ndarray]:
    p, labels = _class_probs(probs, y, weights)
    onehot = np.eye(p.shape[1], dtype=bool)[labels]
    return p.ravel(), onehot.ravel()


def calibration_curve(probs, y, num_bins: int = 15, weights=None, all_classes: bool = False) -> CalibrationCurve:
    """Reliability-diagram statistics of the predictive mean probabilities.

    Top-label binning by default: each observation contributes its maximum probability
    (confidence) and whether the argmax is correct. With ``all_classes=True`` every class
    probability ``p[n, c]`` is a prediction with correctness ``1[y_n = c]``.
    Bins are equal-width and right-closed, ``(lo, hi]``, the first including 0.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of bins ``B``.
    :param weights: optional sample weights, shape ``(S,)``.
    :param all_classes: bin all class probabilities instead of the top label.
    :returns: :class:`CalibrationCurve` with arrays of shape ``(B + 1,)`` and ``(B,)``.
    """
    conf, correct = (_all_classes if all_classes else _top_label)(probs, y, weights)
    return _binned(conf, correct, num_bins)


def _ece_mce(curve: CalibrationCurve) -> tuple[float, float]:
    total = curve.counts.sum()
    filled = curve.counts > 0
    if total == 0:
        return float("nan"), float("nan")
    gaps = np.abs(curve.accuracy[filled] - curve.confidence[filled])
    return float(np.sum(curve.counts[filled] / total * gaps)), float(np.max(gaps))


def ece(probs, y, num_bins: int = 15, weights=None) -> float:
    """Expected calibration error with top-label binning.

    ``ECE = sum_b (n_b / N) |acc_b - conf_b|`` over equal-width confidence bins on [0, 1].

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of bins.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    return _ece_mce(calibration_curve(probs, y, num_bins, weights))[0]


def mce(probs, y, num_bins: int = 15, weights=None) -> float:
    """Maximum calibration error: ``max_b |acc_b - conf_b|`` over non-empty top-label bins.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of bins.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    return _ece_mce(calibration_curve(probs, y, num_bins, weights))[1]


def ece_all_classes(probs, y, num_bins: int = 15, weights=None) -> float:
    """ECE over all class probabilities (BayesDLL style).

    Every ``p[n, c]`` is a prediction with correctness ``1[y_n = c]``; all ``N * C`` of them
    are binned together and ``ECE = sum_b (n_b / (N C)) |acc_b - conf_b|``.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of bins.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    return _ece_mce(calibration_curve(probs, y, num_bins, weights, all_classes=True))[0]


def mce_all_classes(probs, y, num_bins: int = 15, weights=None) -> float:
    """MCE over all class probabilities: the largest bin gap of :func:`ece_all_classes`.

    :param probs: shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of bins.
    :param weights: optional sample weights, shape ``(S,)``.
    """
    return _ece_mce(calibration_curve(probs, y, num_bins, weights, all_classes=True))[1]


# --------------------------------------------------------------------------------------
# temperature scaling
# --------------------------------------------------------------------------------------


def _check_logits(logits) -> np.ndarray:
    z = _as_float("logits", logits)
    if z.ndim != 2:
        raise ValueError(f"logits must have shape (N, C), got {z.shape}.")
    if not np.all(np.isfinite(z)):
        raise ValueError("logits must be finite.")
    return z


def apply_temperature(logits, temperature: float) -> np.ndarray:
    """Temperature-scaled probabilities ``softmax(logits / T)``.

    :param logits: shape ``(..., C)``.
    :param temperature: ``T > 0``.
    :returns: probabilities, same shape as ``logits``.
    """
    z = _as_float("logits", logits)
    if z.ndim < 1:
        raise ValueError("logits must have a class axis (last axis).")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    return np.exp(_log_softmax(z / float(temperature)))


def _temperature_nll(z: np.ndarray, labels: np.ndarray, log_t: float) -> float:
    log_p = _log_softmax(z * math.exp(-log_t))
    return float(-np.mean(log_p[np.arange(z.shape[0]), labels]))


def fit_temperature(
    logits,
    y,
    bounds: tuple[float, float] = (1e-2, 1e2),
    num_grid: int = 41,
    tol: float = 1e-6,
) -> float:
    """Temperature ``T`` minimising the NLL of ``softmax(logits / T)`` on validation data.

    Searches ``log T`` on a uniform grid over ``bounds``, then refines the bracket around the
    best grid point by golden-section search (the NLL is convex in ``1 / T``, hence unimodal
    in ``log T``).

    :param logits: validation logits, shape ``(N, C)``.
    :param y: validation labels, shape ``(N,)``.
    :param bounds: search interval ``(T_min, T_max)``, ``0 < T_min < T_max``.
    :param num_grid: number of grid points for the coarse search (>= 3).
    :param tol: tolerance on ``log T`` for the golden-section refinement.
    :returns: the fitted temperature (float > 0); ``T > 1`` softens over-confident logits.
    """
    z = _check_logits(logits)
    labels = _labels(y, z.shape[0], z.shape[1])
    if z.shape[0] == 0:
        raise ValueError("fit_temperature needs at least one observation.")
    t_min, t_max = float(bounds[0]), float(bounds[1])
    if not 0 < t_min < t_max:
        raise ValueError(f"bounds must satisfy 0 < T_min < T_max, got {bounds}.")
    if num_grid < 3:
        raise ValueError(f"num_grid must be at least 3, got {num_grid}.")
    grid = np.linspace(math.log(t_min), math.log(t_max), int(num_grid))
    losses = [_temperature_nll(z, labels, g) for g in grid]
    best = int(np.argmin(losses))
    a = grid[max(best - 1, 0)]
    b = grid[min(best + 1, len(grid) - 1)]
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
    fc, fd = _temperature_nll(z, labels, c), _temperature_nll(z, labels, d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - inv_phi * (b - a)
            fc = _temperature_nll(z, labels, c)
        else:
            a, c, fc = c, d, fd
            d = a + inv_phi * (b - a)
            fd = _temperature_nll(z, labels, d)
    log_t = 0.5 * (a + b)
    # The refined optimum can only be worse than the grid point for a non-unimodal loss.
    if _temperature_nll(z, labels, log_t) > losses[best]:
        log_t = grid[best]
    return float(math.exp(log_t))
