"""MCLMC dynamics adapter: the only module that imports ``blackjax.mcmc``.

One MCLMC step is BlackJAX's isokinetic McLachlan integrator (minimal-norm, two gradient
evaluations per step thanks to first-same-as-last) between two half-step partial momentum
refreshes (BlackJAX's ``partially_refresh_momentum``, as in its ``with_isokinetic_maruyama``),
with no preconditioning. The integrator is called directly rather than through BlackJAX's
``mclmc`` kernel: that kernel draws two more random numbers per step for its NaN and
high-energy handling (a fresh momentum after a rejected step, an energy cutoff MILE does not
use); here a step whose result is not finite is rejected with a plain select that keeps the
previous state. NumPyro works with potential energies (negative log densities); BlackJAX with
log densities: the sign is flipped here, once.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["StepInfo", "init", "step", "ess", "esh_kick", "partially_refresh_momentum"]

#: BlackJAX's ``IntegratorState`` (position, momentum, logdensity, logdensity_grad), a NamedTuple
IntegratorState = Any


def _blackjax(module: str):
    """``blackjax.<module>``, imported on first use: importing BlackJAX runs JAX computations, which start
    JAX's backend, and ``import numpyro_mile`` must not, so that ``numpyro.set_host_device_count`` still
    works after it (NumPyro's advice for using every CPU core)."""
    return importlib.import_module(f"blackjax.{module}")

#: gradient evaluations of one MCLMC step with the McLachlan integrator
GRAD_EVALS_PER_STEP = 2


class StepInfo(NamedTuple):
    """What one step reports: the energy change and whether the proposal was finite (accepted)."""

    energy_change: jax.Array
    finite: jax.Array


def _logdensity(potential_fn: Callable) -> Callable:
    return lambda position: -potential_fn(position)


def init(position, potential_fn: Callable, rng_key) -> IntegratorState:
    """Initial MCLMC state at ``position`` (a pytree) with a random unit momentum."""
    return _blackjax("mcmc.mclmc").init(position, _logdensity(potential_fn), rng_key)


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def step(rng_key, state: IntegratorState, potential_fn: Callable, L, step_size) -> tuple[IntegratorState, StepInfo]:
    """One MCLMC step with momentum decoherence length ``L`` and step size ``step_size``.

    Half a partial momentum refresh, one isokinetic McLachlan step (two gradients), half a
    refresh. A step whose new position, momentum, density, gradient or energy change is not
    finite is rejected: the previous state is kept (its momentum is refreshed by the next step),
    ``finite`` is ``False`` and the energy change reported is 0. Uses two random normal vectors.
    """
    key1, key2 = jax.random.split(rng_key)
    integrate = _blackjax("mcmc.integrators").isokinetic_mclachlan(_logdensity(potential_fn))
    half = step_size * 0.5
    moved = state._replace(momentum=partially_refresh_momentum(state.momentum, key1, half, L))
    moved, kinetic_change = integrate(moved, step_size)
    moved = moved._replace(momentum=partially_refresh_momentum(moved.momentum, key2, half, L))
    energy_change = kinetic_change - moved.logdensity + state.logdensity
    finite = _all_finite((moved, energy_change))
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), moved, state)
    return new_state, StepInfo(jnp.where(finite, energy_change, 0.0), finite)


def ess(samples: jax.Array) -> jax.Array:
    """Effective sample size of each column of one chain's ``samples`` (shape ``(n, d)``), by FFT."""
    return _blackjax("diagnostics").effective_sample_size(samples[None], chain_axis=0, sample_axis=1)


def partially_refresh_momentum(momentum, rng_key, step_size, L):
    """BlackJAX's partial momentum refresh (unit-norm momentum, decoherence length ``L``)."""
    return _blackjax("mcmc.integrators").partially_refresh_momentum(momentum, rng_key, step_size, L)


def esh_kick(inverse_mass) -> Callable:
    """BlackJAX's isokinetic (ESH) momentum update with diagonal ``inverse_mass`` (SMILE's minibatch step)."""
    return _blackjax("mcmc.integrators").esh_dynamics_momentum_update_one_step(inverse_mass)
