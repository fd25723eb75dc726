"""MILE's tuner against the MILE reference code's, step by step, on recorded energy changes.

``tests/golden/mile_tuner.npz`` holds what the authors' own tuning code (their ``src/training/warmup.py``, run in
their environment: jax 0.4.28, blackjax 1.2.2) did on a stand-in kernel: the energy change and position of every
step, the step size it chose after each step, the Phase II L and the Phase III L
(``tests/golden/make_mile_tuner.py`` says how). Here the same energy changes and positions go through
numpyro_mile's tuning bookkeeping (:func:`numpyro_mile.kernels.mile.chain_tune`, the function the kernel's
step calls, and the end-of-warmup :func:`~numpyro_mile.kernels._mile_tuning.L_from_ess`) in float32, and the
step sizes it chooses must be the reference's within float32 rounding, in four regimes: BNN-like step sizes
(reference in float32 and in float64), the exponential target schedule, and step sizes ~1e-7 whose sixth power
underflows float32 (golden values from the reference in float64; its float32 update breaks there).
"""

from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_mile.kernels import _mclmc as mclmc
from numpyro_mile.kernels import _mile_tuning as tuning
from numpyro_mile.kernels.mile import MILEState, chain_tune

GOLDEN = np.load(Path(__file__).parent / "golden" / "mile_tuner.npz")
SCENARIOS = ("bnn", "bnn_x64", "exponential", "tiny")
#: relative difference allowed between our float32 step sizes / L and the reference's
RTOL = 1e-5  # measured: 1.2e-6 at most over the four runs


class Dynamics(NamedTuple):  # the one field of the MCLMC state the bookkeeping reads
    position: jax.Array


def golden(name: str) -> dict:
    return {key.split("/", 1)[1]: GOLDEN[key] for key in GOLDEN.files if key.startswith(name + "/")}


def replay(g: dict, schedule: tuning.Schedule):
    """Our step sizes after each Phase I+II step and our Phase II L, fed the reference's energy changes."""
    n1, n2, _ = (int(n) for n in g["phases"])
    dim = int(g["dim"])
    energy = jnp.asarray(g["energy_changes"][: n1 + n2], jnp.float32)
    finite = jnp.isfinite(energy)
    # accepted positions of Phase II (a rejected step stays where it was); Phase I's do not enter the moments
    proposals = np.asarray(g["positions"], np.float32)  # from the last Phase I step on
    accepted = proposals.copy()
    for k in range(1, len(accepted)):
        if not np.all(np.isfinite(accepted[k])):
            accepted[k] = accepted[k - 1]
    positions = jnp.concatenate([jnp.zeros((n1 - 1, dim)), jnp.asarray(accepted[: n2 + 1])])

    initial_L = max(np.sqrt(dim), 15.0)
    state = MILEState(
        i=jnp.asarray(0, jnp.int32),
        dynamics=Dynamics(jnp.zeros(dim)),
        step_size=jnp.float32(g["step_sizes"][0]),
        L=jnp.float32(initial_L),
        adapt=tuning.init(dim, g["step_sizes"][0]),
        energy_change=jnp.float32(0),
        num_nans=jnp.asarray(0, jnp.int32),
        rng_key=jax.random.PRNGKey(0),
        diverging=jnp.asarray(False),
        ess_fallback=jnp.asarray(False),
    )

    def body(state, xs):
        dE, ok, x = xs
        moved = state._replace(i=state.i + 1, dynamics=Dynamics(x), energy_change=jnp.where(ok, dE, 0.0), diverging=~ok)
        new = chain_tune(state, moved, schedule)
        return new, new.step_size

    state, step_sizes = jax.jit(lambda s: jax.lax.scan(body, s, (energy, finite, positions)))(state)
    return np.asarray(step_sizes, np.float64), float(state.L), accepted[n2 + 1 :]


@pytest.mark.parametrize("name", SCENARIOS)
def test_step_size_trajectory_and_L_match_the_reference(name):
    g = golden(name)
    n1, n2, n3 = (int(n) for n in g["phases"])
    schedule = tuning.make_schedule(int(g["num_warmup"]), target_energy_variance=tuple(g["target"]))
    assert (schedule.num_phase1, schedule.num_phase2, schedule.num_phase3) == (n1, n2, n3)
    assert schedule.exponential == (name == "exponential")
    rtol = RTOL

    ours, phase2_L, phase3 = replay(g, schedule)
    reference = g["step_sizes"][1 : n1 + n2 + 1]  # the step size each next call of their kernel was given
    np.testing.assert_allclose(ours, reference, rtol=rtol)
    assert float(g["final_step_size"]) == pytest.approx(ours[-1], rel=rtol)
    assert phase2_L == pytest.approx(float(g["phase2_L"]), rel=rtol)

    # Phase III: L = 0.4 * step size * mean_i(n3 / ESS_i) of the positions the reference sampled with that L
    assert phase3.shape == (n3, int(g["dim"]))
    L, ok = tuning.L_from_ess(mclmc.ess(jnp.asarray(phase3)), jnp.float32(ours[-1]), schedule, jnp.float32(phase2_L))
    assert bool(ok)
    assert float(L) == pytest.approx(float(g["final_L"]), rel=max(rtol, 1e-4))


def test_the_golden_runs_cover_what_the_tuner_must_handle():
    """The record exercises rejected steps, both target schedules and the float32-underflow regime."""
    assert sum(int(np.sum(~np.isfinite(golden(n)["energy_changes"]))) for n in ("bnn", "bnn_x64")) >= 4
    tiny = golden("tiny")["step_sizes"]
    assert np.all(np.float32(tiny[100:]) ** 6 < np.finfo(np.float32).tiny)  # eps^6 is subnormal in float32
    bnn = golden("bnn_x64")["step_sizes"]
    assert 1e-3 < np.median(bnn) < 1e-1


def test_a_rejected_step_enters_the_averages_as_the_reference_enters_it():
    """The reference replaces a rejected step's energy change by 0 and keeps it in the averages (``xi = 1e-8``,
    weight 0.12 at trust 1.5) besides capping the step size at 0.8 of it. In the recorded runs the cap binds right
    after each rejection, so this difference stays below their tolerance: checked here on one step."""
    schedule = tuning.make_schedule(1000)
    adapt = tuning.init(4, 1e-2)
    for dE in (0.3, -0.2, 0.25):  # a few accepted steps first
        step_size, adapt = tuning.update_step_size(adapt, jnp.float32(1e-2), jnp.float32(dE), True, 4, 0.1, schedule)
    t_before = float(adapt.t)
    new, after = tuning.update_step_size(adapt, step_size, jnp.float32(jnp.nan), False, 4, 0.1, schedule)
    decay = (schedule.n_eff - 1) / (schedule.n_eff + 1)
    weight = np.exp(-0.5 * (np.log(1e-8) / (6 * schedule.trust)) ** 2)
    assert float(after.t) == pytest.approx(decay * t_before + weight, rel=1e-6)
    assert float(after.step_size_max) == pytest.approx(0.8 * float(step_size), rel=1e-6)
    assert float(new) == pytest.approx(0.8 * float(step_size), rel=1e-6)
