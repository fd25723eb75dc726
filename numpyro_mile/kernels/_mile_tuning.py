"""MILE's three-phase MCLMC tuning as pure per-step functions on a NamedTuple state.

Phases over ``num_warmup`` steps (default split 0.8 / 0.1 / 0.1):

I.   adapt the step size from each step's energy change towards a target energy variance per
     dimension that falls (default 0.5 -> 0.1) over Phases I+II: linearly, or exponentially
     ``start e^(-i/tau) + end (1 - e^(-i/tau))`` with ``tau = (n1 + n2 + 1) / 4`` (the MILE
     reference's choice when the start is above 2);
II.  keep adapting; accumulate step-size-weighted means and variances of the position; at the
     end set ``L = sqrt(sum of variances)``;
III. fixed step size and L; store the positions (as the reference code: every coordinate up to 2,000, a
     random subset of 2,000 above; every step up to 10,000, equally spaced ones above); at the end set
     ``L = L_factor * step_size * mean_i(n3 / ESS_i)`` over the coordinates whose ESS is finite and
     positive (the Phase II L stays when there is none). The kernel runs all of Phase III within one
     step (:func:`numpyro_mile.kernels.mile.phase3`), so that the stored positions never enter the
     chain's state.

The step-size predictor is the one of Robnik et al. (MCLMC) used by MILE:
``xi = dE^2 / (d * target) + 1e-8``, ``w = exp(-0.5 * (log xi / (6 * trust))^2)``,
``x <- a x + w xi / eps^6``, ``t <- a t + w`` with ``a = (n_eff - 1) / (n_eff + 1)``, and
``eps = min((x / t)^(-1/6), eps_max)``. A rejected (non-finite) step sets
``eps_max = 0.8 * eps`` and enters the averages with an energy change of 0, as in the reference code
(``xi = 1e-8``, weight ``exp(-0.5 (log 1e-8 / (6 trust))^2)``, 0.12 at ``trust = 1.5``).

The state keeps ``t`` and ``v = log((x / t) eps^6)`` for the current step size ``eps`` (0 when ``eps`` is the
predictor's value, below 0 when the cap holds it lower), and updates them as
``v' = log(a t e^v + w xi) - log(a t + w)``, ``t' = a t + w``, ``eps' = clip(eps e^(-v'/6))``,
``v'' = 6 log(eps' / (eps e^(-v'/6)))``: the same step sizes as the reference's update in exact arithmetic
(``tests/test_mile_reference.py`` checks them step by step against the reference code), but with every
quantity of order 1. In float32 ``x`` itself overflows once ``eps^6`` underflows (``eps`` below ~1e-6: the
step size became 0 and L NaN, which froze a chain whose target energy variance float32 cannot resolve), and a
logarithm of ``x`` (~100 there) rounds the decay factor enough to move the step sizes by 0.1 %. The step size is also
kept at or above ``MIN_STEP_SIZE_FRACTION`` of its starting value; a chain that ends warmup there
is named by ``MILE.run_warnings``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Schedule(NamedTuple):
    """Static settings of the tuning (Python numbers, known before tracing)."""

    num_phase1: int
    num_phase2: int
    num_phase3: int
    num_stored: int
    target_start: float
    target_end: float
    exponential: bool
    n_eff: float
    trust: float
    L_factor: float

    @property
    def num_warmup(self) -> int:
        return self.num_phase1 + self.num_phase2 + self.num_phase3


class AdaptationState(NamedTuple):
    """Per-chain tuning statistics.

    :ivar log_mismatch: ``log((x / t) * eps^6)`` for the current step size ``eps``, where ``x`` is the decaying
        average of ``w * xi / eps_k^6`` (scalar; 0 when ``eps`` is the predictor's value).
    :ivar t: decaying average of the weights ``w`` (scalar; 0 when empty).
    :ivar step_size_max: cap of the step size, lowered after a rejected step (scalar).
    :ivar step_size_min: floor of the step size, ``MIN_STEP_SIZE_FRACTION`` of the starting one (scalar).
    :ivar weight_sum: sum of step sizes over Phase II (scalar).
    :ivar mean: step-size-weighted mean of the position over Phase II, shape ``(d,)``.
    :ivar m2: step-size-weighted sum of squared deviations over Phase II, shape ``(d,)``.
    """

    log_mismatch: jax.Array
    t: jax.Array
    step_size_max: jax.Array
    step_size_min: jax.Array
    weight_sum: jax.Array
    mean: jax.Array
    m2: jax.Array


MIN_PHASE3 = 10

#: the step size stays at or above this fraction of its starting value
MIN_STEP_SIZE_FRACTION = 1e-6

#: ways the target energy variance goes from start to end over Phases I+II
TARGET_SCHEDULES = ("auto", "linear", "exponential")

#: ``target_schedule="auto"`` is exponential above this starting target (the MILE reference's rule)
EXPONENTIAL_ABOVE = 2.0

#: the MILE reference code's limits of Phase III's ESS: coordinates (a random subset above), stored positions
#: (equally spaced ones above)
REFERENCE_ESS_COORDS = 2000
REFERENCE_STORED_SAMPLES = 10_000
#: the fewest Phase III positions ``max_stored_samples`` may ask for
MIN_STORED_SAMPLES = 10


def make_schedule(
    num_warmup: int,
    *,
    phase_split=(0.8, 0.1, 0.1),
    target_energy_variance=(0.5, 0.1),
    target_schedule: str = "auto",
    n_eff: float = 100.0,
    trust: float = 1.5,
    L_factor: float = 0.4,
    max_stored_samples: int = REFERENCE_STORED_SAMPLES,
) -> Schedule:
    """Phase lengths and settings for ``num_warmup`` tuning steps; raises when they are too few.

    ``target_schedule``: ``"linear"``, ``"exponential"`` or ``"auto"`` (exponential when the
    starting target is above :data:`EXPONENTIAL_ABOVE`, as the MILE reference code does).
    """
    if target_schedule not in TARGET_SCHEDULES:
        raise ValueError(f"target_schedule must be one of {TARGET_SCHEDULES}, got {target_schedule!r}.")
    if int(max_stored_samples) < MIN_STORED_SAMPLES:
        raise ValueError(
            f"max_stored_samples must be at least {MIN_STORED_SAMPLES} (the ESS of fewer positions is "
            f"noise, and equally spaced steps need two), got {max_stored_samples}."
        )
    if len(phase_split) != 3 or min(phase_split) < 0 or abs(sum(phase_split) - 1.0) > 1e-6:
        raise ValueError(f"phase_split must be three non-negative fractions summing to 1, got {phase_split}.")
    n1 = int(round(phase_split[0] * num_warmup))
    n2 = int(round(phase_split[1] * num_warmup))
    n3 = num_warmup - n1 - n2
    if n1 < 1 or n2 < 2 or n3 < MIN_PHASE3:
        need = math.ceil(MIN_PHASE3 / max(phase_split[2], 1e-12))
        raise ValueError(
            f"num_warmup={num_warmup} is too small for MILE's three tuning phases {tuple(phase_split)}: "
            f"got {n1}/{n2}/{n3} steps, but Phase I needs >= 1, Phase II >= 2 and Phase III >= "
            f"{MIN_PHASE3} steps. Use num_warmup >= {max(need, 20)} (the MILE paper uses 50,000)."
        )
    num_stored = min(n3, int(max_stored_samples))
    if num_stored < n3 and (n3 - 1) * max(num_stored - 1, 1) >= 2**31:
        raise ValueError(
            f"Phase III of {n3} steps with max_stored_samples={max_stored_samples}: too many to "
            "choose the stored steps in int32 arithmetic; lower max_stored_samples."
        )
    start, end = float(target_energy_variance[0]), float(target_energy_variance[1])
    exponential = target_schedule == "exponential" or (target_schedule == "auto" and start > EXPONENTIAL_ABOVE)
    return Schedule(n1, n2, n3, num_stored, start, end, exponential, float(n_eff), float(trust), float(L_factor))


def init(dim: int, initial_step_size) -> AdaptationState:
    """Empty statistics for a chain with ``dim`` coordinates that starts with step size ``initial_step_size``."""
    zero = jnp.zeros(())
    return AdaptationState(
        zero,
        zero,
        jnp.full((), jnp.inf, zero.dtype),
        MIN_STEP_SIZE_FRACTION * jnp.asarray(initial_step_size, zero.dtype),
        zero,
        jnp.zeros(dim),
        jnp.zeros(dim),
    )


def target_energy_variance(i, schedule: Schedule) -> jax.Array:
    """Target energy variance per dimension at step ``i`` (from 0) of Phases I+II.

    Linear, as the reference code: ``start + (end - start) * min(i / (n1 + n2 + 1), 1)`` (at the last step of
    Phase II it is ``2 / (n1 + n2 + 1)`` of the way short of ``end``).
    Exponential: ``start e^(-i/tau) + end (1 - e^(-i/tau))``, ``tau = (n1 + n2 + 1) / 4``
    (``e^-4``, 2% of the way, is left at the end of Phase II).
    """
    if schedule.exponential:
        tau = (schedule.num_phase1 + schedule.num_phase2 + 1) / 4.0
        decay = jnp.exp(-jnp.asarray(i, jnp.float32) / tau)
        return schedule.target_start * decay + schedule.target_end * (1.0 - decay)
    frac = jnp.minimum(i / (schedule.num_phase1 + schedule.num_phase2 + 1), 1.0)
    return schedule.target_start + (schedule.target_end - schedule.target_start) * frac


def update_step_size(
    adapt: AdaptationState, step_size, energy_change, finite, dim: int, target, schedule: Schedule
) -> tuple[jax.Array, AdaptationState]:
    """One step of the step-size predictor; returns the next step size and statistics.

    ``energy_change`` of a rejected step (``finite`` false) is taken as 0, as the reference code does.
    """
    decay = (schedule.n_eff - 1.0) / (schedule.n_eff + 1.0)
    energy_change = jnp.where(finite, energy_change, 0.0)
    xi = jnp.square(energy_change) / (dim * target) + 1e-8
    weight = jnp.exp(-0.5 * jnp.square(jnp.log(xi) / (6.0 * schedule.trust)))
    kept = decay * adapt.t  # the old average's weight
    t = kept + weight
    nonempty = t > 0
    # log of (x / t) eps^6 after this step's term: an average of e^v (weight `kept`) and xi (weight `weight`)
    new_term = jnp.where(weight > 0, jnp.log(weight) + jnp.log(xi), -jnp.inf)  # xi = inf has weight 0
    mixed = jnp.logaddexp(jnp.log(kept) + adapt.log_mismatch, new_term)
    log_mismatch = jnp.where(nonempty, mixed - jnp.log(jnp.where(nonempty, t, 1.0)), adapt.log_mismatch)
    step_size_max = jnp.where(finite, adapt.step_size_max, 0.8 * step_size)
    predicted = step_size * jnp.exp(-log_mismatch / 6.0)
    new_step_size = jnp.minimum(jnp.maximum(predicted, adapt.step_size_min), step_size_max)
    log_mismatch = 6.0 * jnp.log(new_step_size / predicted)  # 0 unless the cap or the floor holds
    return new_step_size, adapt._replace(log_mismatch=log_mismatch, t=t, step_size_max=step_size_max)


def accumulate_moments(adapt: AdaptationState, position_flat, weight, active) -> AdaptationState:
    """Weighted (West's) running mean and squared deviations of the position, when ``active``."""
    weight = jnp.where(active, weight, 0.0)
    weight_sum = adapt.weight_sum + weight
    delta = position_flat - adapt.mean
    mean = adapt.mean + jnp.where(weight_sum > 0, weight / jnp.where(weight_sum > 0, weight_sum, 1.0), 0.0) * delta
    m2 = adapt.m2 + weight * delta * (position_flat - mean)
    return adapt._replace(weight_sum=weight_sum, mean=mean, m2=m2)


def L_from_moments(adapt: AdaptationState, fallback_L) -> jax.Array:
    """``sqrt(sum of the weighted variances)`` of Phase II; ``fallback_L`` when no step entered them or the
    result is not finite and positive."""
    ok = adapt.weight_sum > 0
    L = jnp.sqrt(jnp.sum(adapt.m2 / jnp.where(ok, adapt.weight_sum, 1.0)))
    return jnp.where(ok & jnp.isfinite(L) & (L > 0), L, fallback_L)


def stored_slot(step_in_phase3, schedule: Schedule) -> tuple[jax.Array, jax.Array]:
    """``(slot, stored)``: whether Phase III step ``step_in_phase3`` (from 0) is stored, and where.

    Every step when Phase III has at most ``num_stored`` steps; otherwise the steps
    ``floor(k (n3 - 1) / (num_stored - 1))``, ``k = 0 .. num_stored - 1``, equally spaced from the first to the
    last, as the reference's ``linspace(0, n3 - 1, 10000)`` (here in exact integer arithmetic).
    """
    n3, m = schedule.num_phase3, schedule.num_stored
    in_phase3 = (step_in_phase3 >= 0) & (step_in_phase3 < n3)
    if m >= n3:
        return jnp.clip(step_in_phase3, 0, m - 1), in_phase3
    j = jnp.clip(step_in_phase3, 0, n3 - 1)
    slot = -((-j * (m - 1)) // (n3 - 1))  # the first k whose equally spaced step is at or after j
    return jnp.clip(slot, 0, m - 1), in_phase3 & (slot * (n3 - 1) // (m - 1) == j)


def stored_steps(schedule: Schedule) -> np.ndarray:
    """The Phase III steps (from 0) whose positions are stored, in slot order (what :func:`stored_slot` picks)."""
    n3, m = schedule.num_phase3, schedule.num_stored
    return np.arange(n3) if m >= n3 else np.arange(m) * (n3 - 1) // (m - 1)


def record_sample(samples, position_sub, step_in_phase3, schedule: Schedule):
    """``samples`` (shape ``(..., num_stored, d_sub)``) with the position written into its slot when Phase III step
    ``step_in_phase3`` is one that is stored (one chain, or all chains at once with leading chain axes on both
    and a shared step); one in-place row update inside a compiled loop."""
    slot, stored = stored_slot(step_in_phase3, schedule)
    old = jax.lax.dynamic_slice_in_dim(samples, slot, 1, axis=samples.ndim - 2)
    row = jnp.where(stored, jnp.expand_dims(position_sub, -2), old)
    return jax.lax.dynamic_update_slice_in_dim(samples, row, slot, axis=samples.ndim - 2)


def L_from_ess(ess, step_size, schedule: Schedule, fallback_L) -> tuple[jax.Array, jax.Array]:
    """``L_factor * step_size * mean_i(n3 / ESS_i)`` from the ESS of each stored Phase III coordinate
    (``ess``, shape ``(d_sub,)``).

    The mean runs over the coordinates whose ESS is finite and positive (a coordinate that did
    not move, for instance, has a NaN or infinite ESS). Returns ``(L, ok)``; when no coordinate
    is usable, ``ok`` is ``False`` and ``L`` is ``fallback_L`` (the Phase II L).
    """
    usable = jnp.isfinite(ess) & (ess > 0)
    count = jnp.sum(usable)
    ratio = jnp.where(usable, schedule.num_phase3 / jnp.where(usable, ess, 1.0), 0.0)
    ok = count > 0
    L = schedule.L_factor * step_size * jnp.sum(ratio) / jnp.maximum(count, 1)
    return jnp.where(ok, L, fallback_L), ok
