"""Targets with a closed-form posterior, and the Monte Carlo check the default-path tests of every kernel share.

``conjugate_linear_regression`` is an ordinary NumPyro model with an observation plate (optionally subsampled),
so every kernel runs its default path on it: pretraining (MILE, SMILE), tuners, resets, NumPyro's loop.
"""

import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_mile.diagnostics import ess

REG_N, REG_D, REG_PRIOR, REG_NOISE = 10_000, 4, 10.0, 1.0
REG_WEIGHTS = np.array([1.0, -2.0, 0.5, 0.0])


def conjugate_linear_regression(X, y=None, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, REG_PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
        numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, REG_NOISE),
                       obs=numpyro.subsample(y, event_dim=0))


def conjugate_regression(design: str = "gaussian", n: int = REG_N):
    """``y = X w + N(0, 1)`` with ``w ~ N(0, 10^2 I)``: float32 data ``(X, y)`` and the exact posterior mean
    ``(d,)`` and covariance ``(d, d)`` (float64). ``design``: Gaussian columns of unit scale, or Student-t(3)
    (heavy-tailed) columns of scales 1, 0.3, 0.3, 1 (anisotropic gradient noise for minibatch kernels)."""
    rng = np.random.default_rng(0)
    if design == "gaussian":
        X = rng.normal(size=(n, REG_D))
    else:
        X = rng.standard_t(3, size=(n, REG_D)) * np.array([1.0, 0.3, 0.3, 1.0])
    y = X @ REG_WEIGHTS + REG_NOISE * rng.normal(size=n)
    X, y = X.astype(np.float32), y.astype(np.float32)
    precision = np.eye(REG_D) / REG_PRIOR**2 + X.astype(np.float64).T @ X / REG_NOISE**2
    cov = np.linalg.inv(precision)
    return X, y, cov @ X.astype(np.float64).T @ y / REG_NOISE**2, cov


def check_posterior(draws, mean, cov, *, variance_bias: float, z: float = 5.0, weights=None):
    """Assert every coordinate's mean within ``z`` Monte Carlo standard errors of ``mean`` and its variance
    ratio (draws' mean squared deviation from the true mean over the true variance) within
    ``variance_bias + z`` standard errors of 1. Standard errors use the ESS of the draws and of their squared
    deviations. ``draws``: ``(chains, num_draws, d)``; ``weights`` (optional, ``(chains, num_draws)``,
    normalised over all draws): importance weights, whose effective size ``1 / sum w^2`` scales the ESS down.
    Returns the variance ratios ``(d,)``."""
    draws = np.asarray(draws, np.float64)
    ratios = []
    for j in range(draws.shape[-1]):
        x, sq = draws[..., j], (draws[..., j] - mean[j]) ** 2
        ess_x, ess_sq = float(ess(x)), float(ess(sq))
        if weights is None:
            m, ratio, spread = x.mean(), sq.mean() / cov[j, j], sq.std()
        else:
            w = np.asarray(weights, np.float64)
            shrink = 1.0 / (np.sum(w**2) * w.size)  # Kish's effective size over the number of draws
            ess_x, ess_sq = ess_x * shrink, ess_sq * shrink
            m, ratio = np.sum(w * x), np.sum(w * sq) / cov[j, j]
            spread = np.sqrt(np.sum(w * (sq - np.sum(w * sq)) ** 2))
        assert abs(m - mean[j]) < z * np.sqrt(cov[j, j] / ess_x), (j, m, mean[j], ess_x)
        se_ratio = spread / np.sqrt(ess_sq) / cov[j, j]
        assert abs(ratio - 1.0) < variance_bias + z * se_ratio, (j, ratio, se_ratio)
        ratios.append(ratio)
    return np.array(ratios)
