"""The pure core of stochastic-gradient Langevin kernels (SGLD, pSGLD, ICSGLD); their NumPyro plumbing is
:class:`~numpyro_mile.kernels._minibatch_kernel.MinibatchKernel`.

One step of one chain (Welling & Teh 2011), on a fresh minibatch each step::

    x <- x - eps_k * m * G * grad U~(x) + sqrt(2 eps_k tau G) * xi,        xi ~ N(0, I)

``U~`` is NumPyro's potential energy of the model on the minibatch its subsample plate selects
(:mod:`numpyro_mile.minibatch`), ``tau`` the temperature, ``m`` a gradient multiplier (ICSGLD's;
1 for SGLD), ``G`` a diagonal preconditioner (pSGLD's; 1 for SGLD). A chain carries the minibatch
energy and gradient at its position, so a step costs one gradient evaluation
(:func:`sgld_transition`). SGLD and ICSGLD draw their random numbers the same way
(:func:`chain_keys`), which is why ICSGLD with ``zeta=0`` reproduces SGLD bit for bit.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = [
    "RunningMoments",
    "as_schedule",
    "chain_keys",
    "langevin_move",
    "polynomial_schedule",
    "sgld_transition",
    "welford",
]


# ---------------------------------------------------------------------------------------------- running moments
class RunningMoments(NamedTuple):
    """Welford accumulators of the post-warmup iterates of one chain (unconstrained space).

    :ivar count: number of iterates accumulated.
    :ivar mean: running mean, a dict like ``z``.
    :ivar m2: running sum of squared deviations from the mean, a dict like ``z``.
    """

    count: jax.Array
    mean: dict
    m2: dict


# ---------------------------------------------------------------------------------------------- one step
def chain_keys(rng_key):
    """Split a chain's key into ``(next key, minibatch key, noise key)``: the key use of one step."""
    key, batch_key, noise_key = jax.random.split(rng_key, 3)
    return key, batch_key, noise_key


def langevin_move(z, grad, step_size, temperature, noise_key, multiplier=1.0, preconditioner=None):
    """One Euler step of overdamped Langevin dynamics on the potential (NumPyro's sign convention).

    ``z - eps * G * (multiplier * grad) + sqrt(2 eps tau G) * xi``, with ``G = 1`` when
    ``preconditioner`` is ``None`` (else the diagonal ``G`` as a pytree like ``z``).
    ``xi`` is one standard normal vector of the size of the flattened ``z``.
    """
    flat, unravel = ravel_pytree(z)
    g, _ = ravel_pytree(grad)
    noise = jax.random.normal(noise_key, flat.shape, flat.dtype)
    drift = multiplier * g
    if preconditioner is None:
        new = flat - step_size * drift + jnp.sqrt(2 * step_size * temperature) * noise
    else:
        G, _ = ravel_pytree(preconditioner)
        new = flat - step_size * (G * drift) + jnp.sqrt(2 * step_size * temperature * G) * noise
    return unravel(new)


def sgld_transition(
    rng_key,
    z,
    energy,
    grad,
    potential: Callable,
    step_size,
    temperature,
    multiplier=1.0,
    preconditioner=None,
    draw_minibatch: Callable | None = None,
):
    """One (p)SGLD step of one chain, from a position with its minibatch energy and gradient.

    Splits ``rng_key`` with :func:`chain_keys`, moves ``z`` (:func:`langevin_move`, with the
    gradient multiplied by ``multiplier``), and evaluates ``value_and_grad(potential)`` at the
    new position on a fresh minibatch: ``potential(z, draw_minibatch(key))`` (the kernels draw the plates' row
    indices), or ``potential(z, key)`` when ``draw_minibatch`` is ``None``. A non-finite energy, gradient or
    position is rejected:
    the inputs are returned. Works on the flattened position (one select per array instead of
    one per site). Returns ``(next key, z, energy, grad, accepted)``.
    """
    key, batch_key, noise_key = chain_keys(rng_key)
    flat, unravel = ravel_pytree(z)
    g, _ = ravel_pytree(grad)
    G = None if preconditioner is None else ravel_pytree(preconditioner)[0]
    new = langevin_move(flat, g, step_size, temperature, noise_key, multiplier, G)
    minibatch = batch_key if draw_minibatch is None else draw_minibatch(batch_key)
    new_energy, new_grad = jax.value_and_grad(potential)(unravel(new), minibatch)
    new_g, _ = ravel_pytree(new_grad)
    ok = jnp.isfinite(new_energy) & jnp.all(jnp.isfinite(new_g)) & jnp.all(jnp.isfinite(new))
    return (
        key,
        unravel(jnp.where(ok, new, flat)),
        jnp.where(ok, new_energy, energy),
        unravel(jnp.where(ok, new_g, g)),
        ok,
    )


def polynomial_schedule(a: float, b: float, gamma: float) -> Callable:
    """``k -> a * (b + k)^(-gamma)``: the decaying SGLD step size (``k`` counts from 0)."""
    if not a > 0 or not b > 0 or not 0 < gamma <= 1:
        raise ValueError(
            f"a polynomial step-size schedule a * (b + k)^(-gamma) needs a > 0, b > 0 and 0 < gamma <= 1 "
            f"(0.5 < gamma <= 1 for SGLD's convergence theory), got a={a}, b={b}, gamma={gamma}."
        )
    # a partial, not a closure: checkpoint fingerprints describe it with its arguments
    return functools.partial(_polynomial, float(a), float(b), float(gamma))


def _polynomial(a: float, b: float, gamma: float, k):
    return a * (b + k) ** (-gamma)


def as_schedule(step_size, schedule) -> Callable:
    """The step-size schedule ``k -> eps_k`` of a kernel's ``step_size`` / ``schedule`` arguments (validated)."""
    if schedule is None:
        if not (isinstance(step_size, (int, float, np.floating)) and step_size > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        return lambda k: step_size
    if callable(schedule):
        return schedule
    if isinstance(schedule, (tuple, list)) and len(schedule) == 4 and schedule[0] == "polynomial":
        return polynomial_schedule(*schedule[1:])
    raise ValueError(
        "schedule must be None (constant step_size), a callable k -> step size, or "
        f"('polynomial', a, b, gamma) for a * (b + k)^(-gamma); got {schedule!r}."
    )


def welford(moments: RunningMoments, z, active) -> RunningMoments:
    """Add the position ``z`` to the running moments when ``active`` (Welford's update)."""
    count = moments.count + jnp.where(active, 1, 0)
    safe = jnp.maximum(count, 1)
    mean = jax.tree.map(lambda m, x: jnp.where(active, m + (x - m) / safe, m), moments.mean, z)
    m2 = jax.tree.map(
        lambda s, m_old, m_new, x: jnp.where(active, s + (x - m_old) * (x - m_new), s),
        moments.m2,
        moments.mean,
        mean,
        z,
    )
    return RunningMoments(count, mean, m2)
