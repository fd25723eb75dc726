"""Test helpers: MILE's chains stepped up to Phase III by the kernel's own step, and the reference's Phase III
written independently (BlackJAX's stochastic isokinetic integrator, Stan's ESS in float64 NumPy)."""

from __future__ import annotations

import jax
import numpy as np


def run_to_phase3(kernel, num_warmup, num_chains, *model_args, seed=0, **model_kwargs):
    """``kernel``'s vectorized chains stepped by its own compiled step up to the first Phase III step, as NumPyro
    steps them: ``(state, step, potential_fn)`` with ``state.i == n1 + n2`` and ``step`` the jitted
    ``state -> state``."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_chains)
    state = kernel.init(keys, num_warmup, model_args=model_args, model_kwargs=model_kwargs)
    potential_fn = kernel._potential_fn_gen(*model_args, **model_kwargs)
    advance = jax.jit(lambda s, n: jax.lax.fori_loop(0, n, lambda _, x: kernel.step_fn(x, potential_fn), s))
    schedule = kernel._config.schedule
    state = advance(state, schedule.num_phase1 + schedule.num_phase2)
    return state, lambda s: advance(s, 1), potential_fn


def phase3_positions(kernel, state, potential_fn):
    """What :func:`~numpyro_mile.kernels.mile.phase3` stores from ``state`` (at the first Phase III step: the
    positions of :func:`~numpyro_mile.kernels.mile.phase3_positions`), and the state after it."""
    from numpyro_mile.kernels import mile

    move = mile.over_chains(lambda s: mile.chain_move(s, potential_fn), mile._STATE_AXES, True)
    done = jax.jit(lambda s: mile.phase3(s, move, kernel._config))(state)
    _, samples = jax.jit(lambda s: mile.phase3_positions(s, move, kernel._config))(state)
    return done, np.asarray(samples)


def reference_phase3(state, potential_fn, num_steps):
    """The reference's Phase III from ``state`` (vectorized MILE chains at its first step): ``num_steps`` MCLMC
    steps per chain with its step size and L, each BlackJAX's ``with_isokinetic_maruyama(isokinetic_mclachlan)``
    (half a partial refresh, the McLachlan step, half a refresh) on the key split off the chain's key as MILE
    does. Returns every position, flattened in ``ravel_pytree``'s order, shape ``(chains, num_steps, d)``."""
    from blackjax.mcmc.integrators import isokinetic_mclachlan, with_isokinetic_maruyama
    from jax.flatten_util import ravel_pytree

    step = with_isokinetic_maruyama(isokinetic_mclachlan(lambda z: -potential_fn(z)))

    def chain(dynamics, key, step_size, L):
        def one(carry, _):
            dynamics, key = carry
            key, step_key = jax.random.split(key)
            dynamics, _ = step(dynamics, step_size, L, step_key)
            return (dynamics, key), ravel_pytree(dynamics.position)[0]

        return jax.lax.scan(one, (dynamics, key), length=num_steps)[1]

    return np.asarray(jax.jit(jax.vmap(chain))(state.dynamics, state.rng_key, state.step_size, state.L))


def reference_ess(samples) -> np.ndarray:
    """ESS of each column of one chain's ``samples`` (shape ``(n, d)``) in float64, as BlackJAX's
    ``effective_sample_size`` defines it for one chain (Stan's estimator): autocorrelations
    ``rho_t = acov_t / acov_0 - 1 / (n - 1)`` (``rho_0 = 1``), Geyer's initial positive sequence of pair sums
    ``rho_2k + rho_2k+1``, the even lag after it when positive (counted once), the initial monotone sequence
    over both, then ``tau = max(-1 + 2 (sum of the pairs) + the extra lag, 1 / log10(n))`` and ``ESS = n / tau``.
    (Not followed: BlackJAX's edge cases of a column whose pairs are all positive, whose first pair is not, or
    that is constant; for a column that moves the first never occurs, as its lags' autocovariances sum to
    ``-acov_0 / 2``, and the second needs ``rho_1 <= -1``.)"""
    x = np.asarray(samples, np.float64)
    n = x.shape[0]
    centered = x - x.mean(0)
    spectrum = np.fft.rfft(centered, n=2 * n, axis=0)
    acov = np.fft.irfft(spectrum * np.conj(spectrum), n=2 * n, axis=0)[:n] / n
    rho = acov / acov[0] - 1.0 / (n - 1)
    rho[0] = 1.0
    ess = np.empty(x.shape[1])
    for j in range(x.shape[1]):
        even, odd = rho[0 : n - n % 2 : 2, j], rho[1 : n - n % 2 : 2, j]
        pairs = even + odd
        stop = np.flatnonzero(pairs <= 0)
        count = stop[0] if stop.size else len(pairs)  # the pairs of the initial positive sequence
        monotone = np.minimum.accumulate(pairs[:count])
        tail = even[count] if count < len(even) and even[count] > 0 else 0.0
        if count and tail > monotone[-1]:  # the monotone sequence caps the extra lag's pair (even + 0) at the last
            tail = 1.5 * monotone[-1]  # pair's sum, split evenly between its lags; the lag counts 2x - 1x (its even)
        tau = -1.0 + 2.0 * monotone.sum() + tail
        ess[j] = n / max(tau, 1.0 / np.log10(n))
    return ess
