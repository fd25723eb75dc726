"""SMILE's step-size tuner and reset guardrail as pure per-chain functions.

SMILE has no target energy variance: with minibatch log densities the energy error of a step is
dominated by minibatch noise, so the tuner works with quantiles of the chain's own recent
absolute energy errors ``x = |dE|``. Per chain it keeps exponential moving averages (rate
``beta``) of the mean ``m`` and variance ``v`` of ``x``, bias-corrected as Adam does
(``m / (1 - (1 - beta)^t)``), and models ``x`` by the Gamma distribution with that mean and
variance (shape ``k = m^2 / v``, clipped to ``[min_shape, max_shape]``). With the statistics from *before*
the step, a step whose ``x``

- exceeds the ``reset_quantile`` quantile is **reset**: the position, log density and gradient
  go back to their values before the step and the velocity is set to zero (the step counts);
- exceeds the ``1 - 2 adapt_prob / 3`` quantile shrinks the step size by ``(1 - adapt_strength)``;
- is below the ``adapt_prob / 3`` quantile grows it by ``(1 + adapt_strength)`` (the reference's split).

The step size is clipped to ``[1e-8, 10]``; nothing changes during the first
``MIN_STEPS_BEFORE_TUNING`` steps, while the averages settle.

Where this departs from the released reference code, each choice pinned by a test (the reasons and
measurements: the table in ``docs/methods/smile.md``, "Step size: the tuner and the reset guardrail"):

- **exact Gamma tails**: a step is compared with the quantiles through the Gamma CDF at its ``|dE|``
  (one regularised incomplete gamma function per step: ``x > q_p`` exactly when ``CDF(x) > p``), and the one
  quantile that is needed as a value, the reset threshold at which outliers are clipped, is solved to float
  precision (Halley's method); not the Wilson-Hilferty approximation, which turns negative for small shapes;
- **shape bounds** ``[0.3, 100]``, so a near-constant or a tiny ``|dE|`` cannot put every threshold onto
  the mean or onto 0;
- the reference's **asymmetric tails** kept (``adapt_prob / 3`` grows, ``2 adapt_prob / 3`` shrinks): a
  symmetric split over-dispersed an exact posterior;
- **bias-corrected averages** from the first step;
- **outliers enter the averages clipped** at the reset threshold, so one huge ``|dE|`` cannot lift the
  mean until the step size runs away;
- **a reset reverts the log density and gradient too**, so the next energy error compares the same positions.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import gammainc, gammaln, ndtri

__all__ = ["EnergyStats", "TunerSettings", "gamma_quantile", "init_stats", "tune", "update_stats"]

#: steps before the step size may change or a reset may happen (the averages settle first)
MIN_STEPS_BEFORE_TUNING = 10
STEP_SIZE_MIN, STEP_SIZE_MAX = 1e-8, 10.0
#: share of the tail mass ``adapt_prob`` above (shrink); the rest, below, grows (the reference's 2/3 and 1/3)
SHRINK_SHARE = 2.0 / 3.0
#: where ``|dE|`` is clipped before it is averaged when resets are off (with resets: the reset threshold)
OUTLIER_QUANTILE_WITHOUT_RESETS = 0.999


class TunerSettings(NamedTuple):
    """Static settings of the tuner (Python numbers).

    :ivar reset_quantile: ``r``; a step whose ``|dE|`` exceeds this quantile is reset (1: never).
    :ivar adapt_prob: ``a``; the tail mass, split evenly, that changes the step size (0: fixed).
    :ivar adapt_strength: ``d``; the relative change of the step size.
    :ivar beta: rate of the moving averages of ``|dE|``.
    :ivar min_shape: floor of the Gamma shape.
    :ivar max_shape: ceiling of the Gamma shape (a coefficient of variation of at least ``1 / sqrt(max_shape)``).
    """

    reset_quantile: float = 0.98
    adapt_prob: float = 0.1
    adapt_strength: float = 0.02
    beta: float = 0.01
    min_shape: float = 0.3
    max_shape: float = 100.0


class EnergyStats(NamedTuple):
    """Per-chain moving averages of ``|dE|`` (raw, before bias correction; scalars).

    :ivar mean: average of ``|dE|``.
    :ivar var: average of squared deviations from the running mean.
    :ivar count: steps averaged.
    """

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_stats(dtype=jnp.float32) -> EnergyStats:
    return EnergyStats(jnp.zeros((), dtype), jnp.zeros((), dtype), jnp.zeros((), jnp.int32))


def corrected(stats: EnergyStats, beta: float) -> tuple[jax.Array, jax.Array]:
    """Bias-corrected mean and variance of ``|dE|`` (``nan`` before the first step)."""
    correction = 1.0 - jnp.power(1.0 - beta, stats.count.astype(stats.mean.dtype))
    return stats.mean / correction, stats.var / correction


def update_stats(stats: EnergyStats, x, beta: float) -> EnergyStats:
    """Add one absolute energy error ``x`` to the averages."""
    mean = (1.0 - beta) * stats.mean + beta * x
    count = stats.count + 1
    corrected_mean = mean / (1.0 - jnp.power(1.0 - beta, count.astype(mean.dtype)))
    var = (1.0 - beta) * stats.var + beta * jnp.square(x - corrected_mean)
    return EnergyStats(mean, var, count)


def gamma_quantile(p, shape, scale, num_iterations: int = 4) -> jax.Array:
    """The ``p`` quantile of a Gamma(``shape``, ``scale``) distribution.

    Halley's method on ``P(shape, x) = p`` (``P`` the regularised lower incomplete gamma function) from the
    usual starting points: the Wilson-Hilferty approximation for ``shape >= 1``, the small-``x`` power law
    ``(p / t)^(1 / shape)`` below ``t = 1 - shape (0.253 + 0.12 shape)`` and an exponential tail above it for
    ``shape < 1``. Three iterations reach float32's own accuracy of ``P`` (relative error below 2e-5 for shapes
    from 0.05 to 300 and ``p`` from 0.01 to 0.999, against SciPy); the default four leave a margin. Each costs one
    ``gammainc``, most of the price of this function.
    """
    shape = jnp.asarray(shape)
    gaussian = ndtri(p)
    wilson_hilferty = shape * jnp.power(1.0 - 1.0 / (9.0 * shape) + gaussian / (3.0 * jnp.sqrt(shape)), 3)
    t = 1.0 - shape * (0.253 + 0.12 * shape)
    below_one = jnp.where(p < t, jnp.power(p / t, 1.0 / shape), 1.0 - jnp.log1p(-(p - t) / (1.0 - t)))
    x = jnp.where(shape >= 1.0, jnp.maximum(wilson_hilferty, 1e-3 * shape), below_one)
    log_gamma = gammaln(shape)

    def halley(_, x):
        ratio = (gammainc(shape, x) - p) / jnp.exp((shape - 1.0) * jnp.log(x) - x - log_gamma)  # (P - p) / P'
        curvature = ratio * ((shape - 1.0) / x - 1.0)  # ratio * P'' / P'
        new = x - ratio / (1.0 - 0.5 * jnp.minimum(curvature, 1.0))  # Halley's step, damped to at most 2x Newton's
        return jnp.where(new > 0, new, 0.5 * x)

    return scale * jax.lax.fori_loop(0, num_iterations, halley, x)


def tune(stats: EnergyStats, x, step_size, settings: TunerSettings) -> tuple[jax.Array, jax.Array, EnergyStats]:
    """The step-size change and reset decision for a step with ``|dE| = x``, from the statistics
    *before* the step, and the statistics with ``x`` added.

    Returns ``(new step size, reset, new statistics)``. A non-finite ``x`` always resets and is not
    averaged; a reset step enters the averages clipped at the reset threshold (at the 0.999
    quantile when resets are off), so one outlier moves the mean by a few per cent at most.
    """
    mean, var = corrected(stats, settings.beta)
    mean = jnp.maximum(mean, 1e-12)
    shape = jnp.clip(jnp.square(mean) / jnp.maximum(var, 1e-30), settings.min_shape, settings.max_shape)
    scale = mean / shape
    active = stats.count >= MIN_STEPS_BEFORE_TUNING
    finite = jnp.isfinite(x)
    # x against the Gamma's quantiles q_p through its CDF: x > q_p exactly when cdf > p (one gammainc per step)
    cdf = gammainc(shape, x / scale)
    outlier_prob = min(settings.reset_quantile, OUTLIER_QUANTILE_WITHOUT_RESETS)
    outlier = active & (cdf > outlier_prob)
    reset = (outlier if settings.reset_quantile < 1.0 else jnp.zeros((), bool)) | ~finite
    factor = jnp.ones_like(step_size)
    if settings.adapt_prob > 0 and settings.adapt_strength > 0:
        shrink = ~finite | (cdf > 1.0 - SHRINK_SHARE * settings.adapt_prob)
        grow = finite & (cdf < (1.0 - SHRINK_SHARE) * settings.adapt_prob)
        factor = jnp.where(shrink, 1.0 - settings.adapt_strength, jnp.where(grow, 1.0 + settings.adapt_strength, 1.0))
        factor = jnp.where(active, factor, 1.0)
    new_step_size = jnp.clip(step_size * factor, STEP_SIZE_MIN, STEP_SIZE_MAX)
    outlier_at = gamma_quantile(outlier_prob, shape, scale)  # the value an outlier enters the averages with
    averaged = update_stats(stats, jnp.where(outlier, outlier_at, x).astype(stats.mean.dtype), settings.beta)
    new_stats = jax.tree.map(lambda new, old: jnp.where(finite, new, old), averaged, stats)
    return new_step_size.astype(jnp.result_type(step_size)), reset, new_stats
