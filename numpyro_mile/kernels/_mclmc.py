"""MCLMC dynamics adapter: the only module that imports BlackJAX (its integrators and diagnostics).

One MCLMC step is BlackJAX's isokinetic McLachlan integrator (minimal-norm, two gradient
evaluations per step thanks to first-same-as-last) between two half-step partial momentum
refreshes (BlackJAX's ``partially_refresh_momentum``, as in its ``with_isokinetic_maruyama``),
with no preconditioning. The integrator is called directly rather than through BlackJAX's
``mclmc`` kernel: that kernel draws two more random numbers per step for its NaN and
high-energy handling (a fresh momentum after a rejected step, an energy cutoff MILE does not
use); here a step whose result is not finite is rejected with a plain select that keeps the
previous state. SMILE's minibatch step (:func:`minibatch_mclachlan`) is the same McLachlan sequence of
BlackJAX's isokinetic kicks, written out because its two gradients come from a minibatch chosen by the
caller and its first kick reuses the previous step's gradient. NumPyro works with potential energies (negative log
densities); BlackJAX with
log densities: the sign is flipped here, once.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["StepInfo", "init", "step", "ess", "minibatch_mclachlan", "partially_refresh_momentum"]

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


def minibatch_mclachlan(x, momentum, grad, value_grad: Callable, step_size, inverse_mass=1.0):
    """One isokinetic McLachlan step on flat arrays (SMILE's step, two gradient evaluations)::

        kick(b1 eps, grad)  drift(eps/2)  kick((1 - 2 b1) eps)  drift(eps/2)  kick(b1 eps)

    with BlackJAX's minimal-norm ``b1`` and its ESH velocity update (``|u| = 1``), diagonal inverse mass
    ``inverse_mass`` (a scalar or shape ``(d,)``).

    :param x: position, shape ``(d,)``.
    :param momentum: unit velocity ``u``, shape ``(d,)``.
    :param grad: log-density gradient at ``x`` for the first kick (SMILE: the previous step's), shape ``(d,)``.
    :param value_grad: ``position -> (log density, gradient)`` (SMILE: on this step's minibatch).
    :param step_size: step size ``eps``.
    :param inverse_mass: diagonal inverse mass matrix.
    :return: ``(new x, new u, log density at new x, its gradient, kinetic energy change)``.
    """
    integrators = _blackjax("mcmc.integrators")
    b1 = integrators.mclachlan_coefficients[0]  # the outer kicks' share (BlackJAX's module-level b1 is another)
    kick = integrators.esh_dynamics_momentum_update_one_step(inverse_mass)
    u, velocity, kinetic1 = kick(momentum, grad, step_size, b1)
    x1 = x + 0.5 * step_size * velocity
    _, grad1 = value_grad(x1)
    u, velocity, kinetic2 = kick(u, grad1, step_size, 1.0 - 2.0 * b1)
    x2 = x1 + 0.5 * step_size * velocity
    logdensity, grad2 = value_grad(x2)
    u, _, kinetic3 = kick(u, grad2, step_size, b1)
    return x2, u, logdensity, grad2, kinetic1 + kinetic2 + kinetic3
