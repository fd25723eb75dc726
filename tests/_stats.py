"""The Monte Carlo error of sample moments, which every statistical test of the package uses.

A coordinate's sample mean is compared with the true mean in units of ``sqrt(true variance / ESS)``; its mean
squared deviation from the true mean with the true variance, in units of ``std((x - mean)^2) / sqrt(ESS of
(x - mean)^2)``. ESS is ArviZ's rank-normalised one (``numpyro_mile.diagnostics.ess``), over all chains.
"""

from typing import NamedTuple

import numpy as np

from numpyro_mile.diagnostics import ess


class MomentErrors(NamedTuple):
    """Per coordinate ``(d,)``: errors of the mean and of the variance and their Monte Carlo standard errors."""

    mean: np.ndarray  # sample mean - true mean
    se_mean: np.ndarray
    var: np.ndarray  # mean squared deviation from the true mean - true variance
    se_var: np.ndarray

    @property
    def z_mean(self) -> np.ndarray:
        return self.mean / self.se_mean

    @property
    def z_var(self) -> np.ndarray:
        return self.var / self.se_var


def moment_errors(draws, mean, var, weights=None) -> MomentErrors:
    """Errors of the draws' first two moments. ``draws``: ``(chains, num_draws, d)``; ``mean``, ``var``: ``(d,)``
    (or broadcastable); ``weights`` (optional, ``(chains, num_draws)``, normalised over all draws): importance
    weights, whose Kish effective size ``1 / sum w^2`` over the number of draws scales the ESS down."""
    draws = np.asarray(draws, np.float64)
    d = draws.shape[-1]
    mean, var = np.broadcast_to(np.asarray(mean, np.float64), (d,)), np.broadcast_to(np.asarray(var, np.float64), (d,))
    out = {k: np.empty(d) for k in MomentErrors._fields}
    for j in range(d):
        x, sq = draws[..., j], (draws[..., j] - mean[j]) ** 2
        ess_x, ess_sq = float(ess(x)), float(ess(sq))
        if weights is None:
            m, msq, spread = x.mean(), sq.mean(), sq.std()
        else:
            w = np.asarray(weights, np.float64)
            shrink = 1.0 / (np.sum(w**2) * w.size)
            ess_x, ess_sq = ess_x * shrink, ess_sq * shrink
            m, msq = np.sum(w * x), np.sum(w * sq)
            spread = np.sqrt(np.sum(w * (sq - msq) ** 2))
        out["mean"][j], out["se_mean"][j] = m - mean[j], np.sqrt(var[j] / ess_x)
        out["var"][j], out["se_var"][j] = msq - var[j], spread / np.sqrt(ess_sq)
    return MomentErrors(**out)


def check_moments(samples, true_mean, true_var, z: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Assert every coordinate's mean and variance within ``z`` Monte Carlo standard errors; ``samples``
    ``(chains, draws, *shape)`` (coordinates flattened), ``true_mean`` and ``true_var`` broadcastable to
    ``shape``. Returns the z-scores of the means and of the variances."""
    samples = np.asarray(samples, np.float64)
    shape = samples.shape[2:]
    errors = moment_errors(
        samples.reshape(samples.shape[:2] + (-1,)),
        np.ravel(np.broadcast_to(true_mean, shape)),
        np.ravel(np.broadcast_to(true_var, shape)),
    )
    assert np.all(np.abs(errors.z_mean) < z), f"means off by {np.abs(errors.z_mean).max():.1f} standard errors"
    assert np.all(np.abs(errors.z_var) < z), f"variances off by {np.abs(errors.z_var).max():.1f} standard errors"
    return errors.z_mean, errors.z_var
