"""MCLMC dynamics adapter: the only module that imports ``blackjax.mcmc``.

One MCLMC step is BlackJAX's isokinetic McLachlan integrator (minimal-norm, two gradient
evaluations per step thanks to first-same-as-last) wrapped in a partial momentum refresh
(``with_isokinetic_maruyama``), with no preconditioning. NumPyro works with potential energies
(negative log densities); BlackJAX with log densities: the sign is flipped here, once.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from blackjax.diagnostics import effective_sample_size
from blackjax.mcmc import integrators
from blackjax.mcmc import mclmc as _mclmc
from blackjax.mcmc.integrators import IntegratorState

__all__ = ["IntegratorState", "StepInfo", "init", "step", "ess"]

_kernel = _mclmc.build_kernel(integrator=integrators.isokinetic_mclachlan)

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
    return _mclmc.init(position, _logdensity(potential_fn), rng_key)


def step(rng_key, state: IntegratorState, potential_fn: Callable, L, step_size) -> tuple[IntegratorState, StepInfo]:
    """One MCLMC step with momentum decoherence length ``L`` and step size ``step_size``.

    A step whose new position, momentum, density or energy is not finite is rejected by BlackJAX
    (the previous position is kept, the momentum redrawn): ``finite`` is then ``False``.
    """
    new_state, info = _kernel(rng_key, state, _logdensity(potential_fn), 1.0, L, step_size)
    return new_state, StepInfo(info.energy_change, jnp.asarray(info.nonans, dtype=bool))


def ess(samples: jax.Array) -> jax.Array:
    """Effective sample size of each column of one chain's ``samples`` (shape ``(n, d)``), by FFT."""
    return effective_sample_size(samples[None], chain_axis=0, sample_axis=1)
