"""Targets with a closed-form posterior, and the Monte Carlo check the default-path tests of every kernel share.

``conjugate_linear_regression`` is an ordinary NumPyro model with an observation plate (optionally subsampled),
so every kernel runs its default path on it: pretraining (MILE, SMILE), tuners, resets, NumPyro's loop.
"""

import numpy as np
import numpyro
import numpyro.distributions as dist

from _stats import moment_errors

REG_N, REG_D, REG_PRIOR, REG_NOISE = 10_000, 4, 10.0, 1.0
REG_WEIGHTS = np.array([1.0, -2.0, 0.5, 0.0])


def conjugate_linear_regression(X, y=None, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, REG_PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
        numpyro.sample(
            "y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, REG_NOISE), obs=numpyro.subsample(y, event_dim=0)
        )


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
    ``variance_bias + z`` standard errors of 1 (:func:`_stats.moment_errors`; ``weights``: importance weights).
    ``draws``: ``(chains, num_draws, d)``. Returns the variance ratios ``(d,)``."""
    var = np.diag(cov)
    errors = moment_errors(draws, mean, var, weights)
    ratios, se_ratios = 1.0 + errors.var / var, errors.se_var / var
    for j in range(len(var)):
        assert abs(errors.mean[j]) < z * errors.se_mean[j], (j, errors.mean[j] + mean[j], mean[j], errors.se_mean[j])
        assert abs(ratios[j] - 1.0) < variance_bias + z * se_ratios[j], (j, ratios[j], se_ratios[j])
    return ratios
