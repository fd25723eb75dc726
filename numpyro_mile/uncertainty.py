"""Predictive uncertainty from posterior draws: total, aleatoric and epistemic parts, and predictive quantiles.

Pure NumPy functions of the draws :func:`numpyro_mile.predict` returns, used by the scikit-learn estimators
(:mod:`numpyro_mile.estimators`) and available on the NumPyro path alike::

    out = numpyro_mile.predict(mlp_regression, samples, X_test, return_sites=["mu", "sigma"])
    parts = uncertainty.regression(out["mu"], out["sigma"])          # each (N_test,)
    lo, hi = uncertainty.mixture_quantiles(out["mu"], out["sigma"], (0.05, 0.95))

Regression: the posterior predictive of a heteroscedastic Gaussian network is the equal-weight mixture of
``Normal(mu_s, sigma_s)`` over draws ``s``. Its variance is ``E_s[sigma_s^2]`` (aleatoric, the noise the
network predicts) plus ``Var_s[mu_s]`` (epistemic, the spread of the mean over the posterior); its quantiles
are found on the mixture's CDF, not from one sampled ``y`` per draw, so they carry no extra sampling noise.

Classification: with class probabilities ``p_s`` per draw, the predictive is ``p = E_s[p_s]``; its entropy
``H[p]`` (total) is the expected entropy ``E_s[H[p_s]]`` (aleatoric) plus the mutual information between the
label and the weights (epistemic, the disagreement between draws).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
from scipy.special import ndtr, ndtri

__all__ = ["ClassificationUncertainty", "RegressionUncertainty", "classification", "mixture_quantiles", "regression"]

#: bisection steps of :func:`mixture_quantiles` at most (the bracket shrinks by 2**-60), and the relative width at
#: which it stops earlier
_BISECTION_STEPS, _RELATIVE_TOLERANCE = 60, 1e-10


class RegressionUncertainty(NamedTuple):
    """Moments of the posterior predictive per input, each of shape ``(N,)``, in the draws' units.

    :ivar mean: predictive mean ``E_s[mu_s]``: the point prediction.
    :ivar std: total predictive standard deviation, ``sqrt(aleatoric_std**2 + epistemic_std**2)``.
    :ivar aleatoric_std: ``sqrt(E_s[sigma_s**2])``, the noise the network predicts.
    :ivar epistemic_std: ``sqrt(Var_s[mu_s])``, the posterior spread of the mean.
    """

    mean: np.ndarray
    std: np.ndarray
    aleatoric_std: np.ndarray
    epistemic_std: np.ndarray


class ClassificationUncertainty(NamedTuple):
    """The posterior predictive of a classifier per input, entropies in nats.

    :ivar proba: predictive class probabilities ``E_s[p_s]``, shape ``(N, C)``.
    :ivar entropy: total uncertainty ``H[proba]``, shape ``(N,)``.
    :ivar aleatoric: expected entropy ``E_s[H[p_s]]``, shape ``(N,)``.
    :ivar epistemic: mutual information ``entropy - aleatoric`` (>= 0), shape ``(N,)``.
    """

    proba: np.ndarray
    entropy: np.ndarray
    aleatoric: np.ndarray
    epistemic: np.ndarray


def _draws(name: str, values, ndim: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != ndim or arr.shape[0] == 0:
        layout = "(S, N)" if ndim == 2 else "(S, N, C)"
        raise ValueError(f"{name} must be posterior draws of shape {layout} with S >= 1, got {arr.shape}.")
    return arr


def regression(mu, sigma) -> RegressionUncertainty:
    """Split the predictive standard deviation of a Gaussian-likelihood network into its two parts.

    :param mu: draws of the predictive mean, shape ``(S, N)``.
    :param sigma: draws of the noise scale, shape ``(S, N)``.
    :returns: :class:`RegressionUncertainty`, each field ``(N,)``.

    **Example**

    >>> import numpy as np
    >>> from numpyro_mile import uncertainty
    >>> parts = uncertainty.regression(np.array([[0.0], [2.0]]), np.array([[1.0], [1.0]]))
    >>> float(parts.mean[0]), float(parts.aleatoric_std[0]), float(parts.epistemic_std[0])
    (1.0, 1.0, 1.0)
    >>> round(float(parts.std[0]) ** 2, 12)
    2.0
    """
    mu, sigma = _draws("mu", mu, 2), _draws("sigma", sigma, 2)
    if mu.shape != sigma.shape:
        raise ValueError(f"mu and sigma must have the same shape (S, N), got {mu.shape} and {sigma.shape}.")
    aleatoric_var, epistemic_var = np.mean(sigma**2, axis=0), np.var(mu, axis=0)
    return RegressionUncertainty(
        mu.mean(axis=0), np.sqrt(aleatoric_var + epistemic_var), np.sqrt(aleatoric_var), np.sqrt(epistemic_var)
    )


def mixture_quantiles(mu, sigma, q: Sequence[float] | float) -> np.ndarray:
    """Quantiles of the posterior predictive ``(1/S) sum_s Normal(mu_s, sigma_s)`` per input.

    Each quantile is the root of the mixture's CDF minus ``q``, found by bisection in float64 between the
    smallest and largest component quantile (the mixture's lies between them). Memory ``O(S x N)``.

    :param mu: draws of the predictive mean, shape ``(S, N)``.
    :param sigma: draws of the noise scale, shape ``(S, N)``, positive.
    :param q: probabilities in ``(0, 1)``, a number or a sequence of ``Q``.
    :returns: shape ``(Q, N)`` (``(N,)`` for a number ``q``).

    **Example**: the 5 % and 95 % quantiles of one standard normal draw.

    >>> import numpy as np
    >>> from numpyro_mile import uncertainty
    >>> np.round(uncertainty.mixture_quantiles(np.zeros((1, 1)), np.ones((1, 1)), (0.05, 0.95)), 4).tolist()
    [[-1.6449], [1.6449]]
    """
    mu, sigma = _draws("mu", mu, 2), _draws("sigma", sigma, 2)
    if mu.shape != sigma.shape:
        raise ValueError(f"mu and sigma must have the same shape (S, N), got {mu.shape} and {sigma.shape}.")
    if not np.all(sigma > 0):
        raise ValueError("sigma must be positive.")
    probs = np.atleast_1d(np.asarray(q, dtype=np.float64))
    if probs.ndim != 1 or not np.all((probs > 0) & (probs < 1)):
        raise ValueError(f"q must be probabilities strictly between 0 and 1, got {q!r}.")
    out = np.empty((probs.size, mu.shape[1]))
    for i, p in enumerate(probs):
        z = ndtri(p)
        lo, hi = (mu + z * sigma).min(axis=0), (mu + z * sigma).max(axis=0)
        for _ in range(_BISECTION_STEPS):
            if np.all(hi - lo <= _RELATIVE_TOLERANCE * np.maximum(1.0, np.abs(lo) + np.abs(hi))):
                break
            mid = 0.5 * (lo + hi)
            below = ndtr((mid - mu) / sigma).mean(axis=0) < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out[i] = 0.5 * (lo + hi)
    return out[0] if np.ndim(q) == 0 else out


def classification(proba) -> ClassificationUncertainty:
    """Predictive probabilities and the entropy split of a classifier's posterior draws.

    :param proba: class probabilities per draw, shape ``(S, N, C)`` (e.g. ``softmax`` of the ``logits`` draws).
    :returns: :class:`ClassificationUncertainty`.

    **Example**: two draws that disagree completely.

    >>> import numpy as np
    >>> from numpyro_mile import uncertainty
    >>> u = uncertainty.classification(np.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
    >>> u.proba.tolist(), round(float(u.aleatoric[0]), 6), round(float(u.epistemic[0]), 4)
    ([[0.5, 0.5]], 0.0, 0.6931)
    """
    draws = _draws("proba", proba, 3)
    mean = draws.mean(axis=0)
    entropy = _entropy(mean)
    aleatoric = _entropy(draws).mean(axis=0)
    return ClassificationUncertainty(mean, entropy, aleatoric, np.maximum(entropy - aleatoric, 0.0))


def _entropy(p: np.ndarray) -> np.ndarray:
    """Entropy in nats over the last axis, with ``0 log 0 = 0``."""
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
