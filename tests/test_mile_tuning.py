"""MILE's tuning options as the reference code defines them: target schedule, Phase III buffer, robust ESS."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from blackjax.diagnostics import effective_sample_size
from numpyro.infer import MCMC

from _mile_phases import phase3_positions, reference_ess, run_to_phase3
from numpyro_mile import MILE
from numpyro_mile.kernels import _mclmc as mclmc
from numpyro_mile.kernels import _mile_cost
from numpyro_mile.kernels import _mile_tuning as adaptation
from numpyro_mile.kernels._mile_cost import ESS_WORK_FACTOR, phase3_limits


# ---------------------------------------------------------------------------------------------- target schedule
def targets(schedule, steps):
    return np.array([float(adaptation.target_energy_variance(i, schedule)) for i in steps])


def test_auto_schedule_is_exponential_above_two_as_the_reference():
    schedule = adaptation.make_schedule(1000, target_energy_variance=(10.0, 0.1))
    assert schedule.exponential and (schedule.num_phase1, schedule.num_phase2) == (800, 100)
    tau = (800 + 100 + 1) / 4
    steps = np.array([0, 1, 100, 450, 899])
    expected = 10.0 * np.exp(-steps / tau) + 0.1 * (1 - np.exp(-steps / tau))
    np.testing.assert_allclose(targets(schedule, steps), expected, rtol=1e-5)
    # halfway it is e^-2 of the way from the end: well below the linear schedule's midpoint
    assert targets(schedule, [450])[0] < (10.0 + 0.1) / 2 / 3


def test_auto_schedule_is_linear_up_to_two_and_the_option_overrides():
    linear = adaptation.make_schedule(1000, target_energy_variance=(2.0, 0.1))
    assert not linear.exponential
    # the reference's denominator n1 + n2 + 1: the last Phase II step (899) is 2/901 of the way short of the end
    np.testing.assert_allclose(targets(linear, [0, 899, 901, 950]), [2.0, 2.0 - 1.9 * 899 / 901, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(targets(linear, [449.5]), [2.0 + (0.1 - 2.0) * 449.5 / 901], rtol=1e-6)
    assert adaptation.make_schedule(1000, target_energy_variance=(0.5, 0.1), target_schedule="exponential").exponential
    assert not adaptation.make_schedule(1000, target_energy_variance=(100.0, 0.1), target_schedule="linear").exponential
    with pytest.raises(ValueError, match="target_schedule must be one of"):
        adaptation.make_schedule(1000, target_schedule="cosine")
    with pytest.raises(ValueError, match="target_schedule must be one of"):
        MILE(lambda: None, target_schedule="cosine")


def gaussian_2d():
    numpyro.sample("x", dist.Normal(0.0, jnp.array([1.0, 2.0])))


def test_exponential_schedule_sets_the_sampling_step_size_in_the_kernel():
    """Starting at 10 (the reference ablation), the step size follows the exponential target.

    Its last Phase II value is ``10 e^-4 + 0.1 (1 - e^-4) = 0.28`` (the reference's schedule stops
    e^-4 short of its end value): the sampling phase's energy variance matches that, not the linear
    schedule's 0.1.
    """
    kernel = MILE(gaussian_2d, target_energy_variance=(10.0, 0.1))
    mcmc = MCMC(kernel, num_warmup=4000, num_samples=8000, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), extra_fields=("energy_change",))
    schedule = kernel._config.schedule
    assert schedule.exponential
    last = float(adaptation.target_energy_variance(schedule.num_phase1 + schedule.num_phase2 - 1, schedule))
    assert last == pytest.approx(10 * math.exp(-4) + 0.1 * (1 - math.exp(-4)), rel=0.01)
    energy_variance = np.mean(np.asarray(mcmc.get_extra_fields()["energy_change"]) ** 2) / 2
    assert last / 1.5 < energy_variance < 1.5 * last, energy_variance


# ---------------------------------------------------------------------------------------------- Phase III buffer
def test_phase3_stores_what_the_reference_stores():
    """Every Phase III step up to 10,000 steps; above, the reference's ``linspace(0, n3 - 1, 10000)`` steps."""
    short = adaptation.make_schedule(5000)  # n3 = 500
    assert short.num_stored == 500 and np.array_equal(adaptation.stored_steps(short), np.arange(500))
    paper = adaptation.make_schedule(50_000)  # n3 = 5,000: all of them
    assert paper.num_stored == 5000
    long = adaptation.make_schedule(500_000)  # n3 = 50,000: 10,000 equally spaced from the first to the last
    steps = adaptation.stored_steps(long)
    assert long.num_stored == 10_000 and steps[0] == 0 and steps[-1] == 49_999
    linspace = np.linspace(0, 49_999, 10_000).astype(np.int64)  # the reference's, in float64
    assert np.mean(steps == linspace) > 0.999 and np.max(np.abs(steps - linspace)) <= 1
    # the step's own test of a step (traced arithmetic) picks exactly these, each in its slot
    slot, stored = jax.jit(jax.vmap(lambda j: adaptation.stored_slot(j, long)))(jnp.arange(-2, 50_002))
    slot, stored = np.asarray(slot)[2:-2], np.asarray(stored)
    assert not stored[:2].any() and not stored[-2:].any()
    stored = stored[2:-2]
    assert np.array_equal(np.flatnonzero(stored), steps) and np.array_equal(slot[stored], np.arange(10_000))
    assert adaptation.make_schedule(5000, max_stored_samples=100).num_stored == 100
    for too_few in (0, 1, 9):  # one position divided by zero in the equally spaced steps
        with pytest.raises(ValueError, match="max_stored_samples must be at least 10"):
            adaptation.make_schedule(1000, max_stored_samples=too_few)


def test_cost_estimate_counts_the_phase3_positions():
    def model():
        numpyro.sample("x", dist.Normal(0.0, 1.0).expand([40]))

    cost = MILE(model).estimate_cost(
        jax.random.PRNGKey(0), num_warmup=200_000, num_samples=100, num_chains=3, min_seconds=0.01
    )
    assert adaptation.make_schedule(200_000).num_stored == 10_000  # n3 = 20,000
    assert cost.state_bytes == 3 * 4 * 5 * 40  # position, momentum, gradient, Phase II moments
    # on CPU Phase III holds one group of chains' positions at a time, and the ESS's work space of one block of
    # one chain's coordinates (every coordinate is stored)
    group, columns = phase3_limits("cpu", 3, 10_000, 40, 4)
    assert (group, columns) == (1, 21)
    assert cost.phase3_bytes == group * 4 * 10_000 * 40
    draws = 3 * 100 * 40 * 4
    assert cost.sample_bytes == draws
    assert cost.predicted_bytes == pytest.approx(
        cost.data_bytes + cost.state_bytes + cost.phase3_bytes + ESS_WORK_FACTOR * 4 * 10_000 * columns + draws, abs=1
    )


def test_default_L_is_the_reference_statistic_on_a_bnn():
    """The default buffer holds every coordinate (d = 106) and every Phase III position, so the L each chain
    samples with is the reference's ``0.4 eps mean_i(n3 / ESS_i)`` over all of them, recomputed here from the
    positions of n3 ordinary moves from the state at the start of Phase III. (With 32 random coordinates, the
    earlier default, this test fails.)"""
    from numpyro_mile.datasets import toy_regression
    from numpyro_mile.kernels.mile import _STATE_AXES, chain_move, over_chains
    from numpyro_mile.models import mlp_regression

    X, y = toy_regression(100, seed=0)
    num_warmup, chains = 3000, 2  # n3 = 300
    kernel = MILE(mlp_regression, ensemble_options=dict(progress_bar=False, max_epochs=50))
    start, step, potential_fn = run_to_phase3(kernel, num_warmup, chains, X, y, hidden=(8, 8))
    schedule = kernel._config.schedule
    assert kernel._config.num_coords is None and schedule.num_stored == schedule.num_phase3 == 300
    # the step at the first Phase III step runs Phase III (and counts one step); the next ones only count
    after = step(start)
    assert int(after.i) == int(start.i) + 1
    waited = step(after)
    assert int(waited.i) == int(after.i) + 1
    np.testing.assert_array_equal(np.asarray(waited.z["w0"]), np.asarray(after.z["w0"]))
    np.testing.assert_array_equal(np.asarray(waited.L), np.asarray(after.L))
    # Phase III = n3 ordinary moves with the Phase II L; their positions are what the ESS sees
    move = over_chains(lambda s: chain_move(s, potential_fn), _STATE_AXES, True)

    def one(state, _):
        state = move(state)
        return state, jnp.concatenate([state.z[k].reshape(chains, -1) for k in sorted(state.z)], -1)

    state, positions = jax.jit(lambda s: jax.lax.scan(one, s, length=schedule.num_phase3))(start)
    positions = np.swapaxes(np.asarray(positions), 0, 1)  # (chains, n3, d), in ravel_pytree's (sorted) order
    done, samples = phase3_positions(kernel, start, potential_fn)
    np.testing.assert_allclose(samples, positions, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(after.z["w0"]), np.asarray(state.z["w0"]), rtol=1e-5, atol=1e-6)
    assert positions.shape[-1] == 106
    for chain in range(chains):
        taus = _phase3_taus(positions[chain])
        reference = 0.4 * float(start.step_size[chain]) * taus.mean()
        assert float(after.L[chain]) == pytest.approx(reference, rel=1e-3), chain
        assert float(after.L[chain]) != pytest.approx(float(start.L[chain]), rel=0.02)  # not the Phase II L


def test_a_subset_of_coordinates_is_drawn_per_chain_as_the_reference_does():
    """Above ``ess_num_coords`` coordinates each chain stores its own random subset (drawn from its key, as the
    reference code draws one per chain), and its L is the reference statistic over those coordinates."""
    from numpyro_mile.datasets import toy_regression
    from numpyro_mile.kernels.mile import phase3_coords
    from numpyro_mile.models import mlp_regression

    X, y = toy_regression(100, seed=0)
    chains, num_coords = 3, 20
    kernel = MILE(mlp_regression, ess_num_coords=num_coords, ensemble_options=dict(progress_bar=False, max_epochs=50))
    start, step, potential_fn = run_to_phase3(kernel, 2000, chains, X, y, hidden=(8, 8))
    assert kernel._config.num_coords == num_coords
    after = step(start)
    _, samples = phase3_positions(kernel, start, potential_fn)
    assert samples.shape == (chains, kernel._config.schedule.num_stored, num_coords)
    subset_config = kernel._config
    kernel._config = subset_config._replace(num_coords=None)  # the same moves, every coordinate stored
    _, everything = phase3_positions(kernel, start, potential_fn)
    kernel._config = subset_config
    dim = everything.shape[-1]
    coords = [np.asarray(phase3_coords(start.rng_key[c], dim, num_coords)) for c in range(chains)]
    assert len({tuple(c) for c in coords}) == chains  # not one subset shared by all chains
    for chain in range(chains):
        assert len(set(coords[chain])) == num_coords
        np.testing.assert_allclose(samples[chain], everything[chain][:, coords[chain]], rtol=1e-5, atol=1e-6)
        reference = 0.4 * float(start.step_size[chain]) * _phase3_taus(samples[chain]).mean()
        assert float(after.L[chain]) == pytest.approx(reference, rel=1e-3), chain


def test_a_subset_of_coordinates_is_the_same_for_sequential_chains():
    """A chain that runs alone (``sequential``) draws the same coordinates from its key as in a batch, so its
    draws match those of ``vectorized`` chains."""
    draws = {}
    for method in ("sequential", "vectorized"):
        mcmc = MCMC(
            MILE(gaussian_2d, ess_num_coords=1),
            num_warmup=200,
            num_samples=20,
            num_chains=2,
            chain_method=method,
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(3))
        draws[method] = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    np.testing.assert_allclose(draws["sequential"], draws["vectorized"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group, columns", [(1, 1), (2, 30)])
def test_phase3_in_groups_of_chains_and_blocks_of_coordinates_is_the_same_phase3(monkeypatch, group, columns):
    """On CPU, Phase III moves groups of chains one after another and computes the ESS on blocks of coordinates
    where its work space would pass glibc's largest mmap threshold (which maps it afresh at every launch of the
    step, whatever the step does). That changes where the work happens, not what is computed: the same positions
    and L as one batch of all chains (4 chains in groups of 1 and of 2; 106 coordinates in blocks of 1 and of 30,
    the last block overlapping the one before)."""
    from numpyro_mile.datasets import toy_regression
    from numpyro_mile.models import mlp_regression

    X, y = toy_regression(100, seed=0)
    kernel = MILE(mlp_regression, ensemble_options=dict(progress_bar=False, max_epochs=50))
    start, step, potential_fn = run_to_phase3(kernel, 2000, 4, X, y, hidden=(8, 8))
    stored = kernel._config.schedule.num_stored  # 200
    assert phase3_limits("cpu", 4, stored, 106, 4) == (4, 106)  # one batch at this size
    one_batch = step(start)
    monkeypatch.setattr(_mile_cost, "PHASE3_POSITIONS_BYTES", group * stored * 106 * 4)
    monkeypatch.setattr(_mile_cost, "PHASE3_ESS_BYTES", (columns + 0.5) * ESS_WORK_FACTOR * stored * 4)
    assert phase3_limits("cpu", 4, stored, 106, 4) == (group, columns)
    assert phase3_limits("gpu", 4, stored, 106, 4) == (4, 106)  # a pooled allocator: no limit
    in_groups = jax.jit(lambda s: kernel.step_fn(s, potential_fn))(start)  # traced anew, with the limits
    for name in ("w0", "b1", "w2"):
        np.testing.assert_allclose(np.asarray(in_groups.z[name]), np.asarray(one_batch.z[name]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(in_groups.L), np.asarray(one_batch.L), rtol=1e-5)
    assert not np.allclose(np.asarray(in_groups.L), np.asarray(start.L), rtol=0.02)  # L came from the ESS
    assert int(in_groups.i) == int(one_batch.i) and not np.any(np.asarray(in_groups.ess_fallback))


def test_the_step_work_space_stays_small_at_the_papers_budget():
    """MILE's compiled step (what NumPyro's progress-bar loop launches at every step) for 12 chains of airfoil's
    network on one CPU device at 50,000 warmup steps (5,000 stored Phase III positions of 402 coordinates per
    chain, 96 MB in all) needs under 16 MiB of work space: above that glibc mapped it afresh at every launch
    (about 1,000 page faults per step on one device with 17 MB; with 86 MB per device on two, +1.4 ms a step)."""
    from numpyro.infer.util import initialize_model

    from numpyro_mile.models import mlp_regression

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(1052, 5)).astype(np.float32), rng.normal(size=1052).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(0), 12)
    init = initialize_model(keys, mlp_regression, model_args=(X, y), model_kwargs=dict(hidden=(16, 16)))
    kernel = MILE(mlp_regression, pretrain=False)
    state = kernel.init(keys, 50_000, init.param_info.z, (X, y), dict(hidden=(16, 16)))
    assert state.z["w0"].shape == (12, 5, 16) and kernel._config.schedule.num_stored == 5000
    step = jax.jit(lambda s: kernel.sample(s, (X, y), dict(hidden=(16, 16))))
    work = step.lower(state).compile().memory_analysis().temp_size_in_bytes
    assert work < 16 * 2**20, work / 2**20


@pytest.mark.parametrize(
    "setting, value",
    [
        ("ess_num_coords", 0),
        ("ess_num_coords", 2.5),
        ("ess_num_coords", None),
        ("max_stored_samples", 9),
        ("max_stored_samples", True),
    ],
)
def test_phase3_sizes_are_checked_when_the_kernel_is_made(setting, value):
    with pytest.raises(ValueError, match=f"{setting} must be an integer of at least"):
        MILE(gaussian_2d, **{setting: value})


def test_the_tests_ess_is_blackjaxs():
    """:func:`reference_ess` (float64 NumPy, the oracle of the Phase III tests) gives BlackJAX's ESS in float64 on
    AR(1) columns from anti-correlated to slowly mixing, odd and even lengths."""
    rng = np.random.default_rng(0)
    for n in (200, 201):
        phi = rng.uniform(-0.9, 0.99, 300)
        noise = rng.normal(size=(n, 300))
        x = np.zeros((n, 300))
        for t in range(1, n):
            x[t] = phi * x[t - 1] + noise[t]
        with jax.enable_x64(True):
            expected = np.asarray(effective_sample_size(jnp.asarray(x)[None]))
        np.testing.assert_allclose(reference_ess(x), expected, rtol=1e-10)


def _phase3_taus(positions):
    """``n / ESS`` of every coordinate of one chain's Phase III positions ``(n, d)``, as the reference computes it
    (in float64 here)."""
    ess = reference_ess(positions)
    assert np.all(np.isfinite(ess) & (ess > 0))
    return positions.shape[0] / ess


# ---------------------------------------------------------------------------------------------- robust ESS -> L
def test_L_from_ess_averages_over_finite_positive_values_only():
    schedule = adaptation.make_schedule(1000)
    ess = jnp.array([10.0, jnp.nan, 0.0, jnp.inf, 50.0])
    L, ok = adaptation.L_from_ess(ess, 0.2, schedule, fallback_L=7.0)
    assert bool(ok)
    np.testing.assert_allclose(float(L), 0.4 * 0.2 * np.mean([100 / 10.0, 100 / 50.0]), rtol=1e-6)
    L, ok = adaptation.L_from_ess(jnp.array([jnp.nan, 0.0, -jnp.inf]), 0.2, schedule, 7.0)
    assert not bool(ok) and float(L) == 7.0


def run_short(num_warmup=400):
    mcmc = MCMC(
        MILE(gaussian_2d),
        num_warmup=num_warmup,
        num_samples=10,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(1))
    return mcmc


def test_kernel_leaves_out_unusable_ess_coordinates(monkeypatch):
    real_ess = mclmc.ess
    monkeypatch.setattr(mclmc, "ess", lambda samples: real_ess(samples).at[0].set(jnp.nan))  # coordinate 0 unusable
    kernel = MILE(gaussian_2d)
    start, step, potential_fn = run_to_phase3(kernel, 400, 2)
    after = step(start)
    _, samples = phase3_positions(kernel, start, potential_fn)
    schedule = kernel._config.schedule
    for chain in range(2):
        ess1 = float(effective_sample_size(jnp.asarray(samples[chain])[None], chain_axis=0, sample_axis=1)[1])
        expected = 0.4 * float(start.step_size[chain]) * schedule.num_phase3 / ess1
        np.testing.assert_allclose(float(after.L[chain]), expected, rtol=1e-4)


def test_kernel_keeps_the_phase2_L_and_warns_when_no_ess_is_usable(monkeypatch):
    reference = run_short(num_warmup=400)
    monkeypatch.setattr(mclmc, "ess", lambda samples: jnp.full(samples.shape[1], jnp.nan))
    mcmc = run_short(num_warmup=400)
    assert np.all(np.asarray(mcmc.last_state.ess_fallback))
    assert any("kept the Phase II L" in m for m in mcmc.sampler.run_warnings(mcmc.last_state))
    assert not np.any(np.asarray(reference.last_state.ess_fallback)) and not reference.sampler.run_warnings(
        reference.last_state
    )
    L = np.asarray(mcmc.last_state.L)
    assert np.all(np.isfinite(L)) and np.all(L > 0)
    # the Phase II L: sqrt of the summed Phase II variances, as accumulated in the state
    adapt = mcmc.last_state.adapt
    phase2_L = np.sqrt(np.sum(np.asarray(adapt.m2) / np.asarray(adapt.weight_sum)[:, None], axis=1))
    np.testing.assert_allclose(L, phase2_L, rtol=1e-5)
    assert not np.allclose(L, np.asarray(reference.last_state.L))  # the ESS-based L differs
    assert math.isfinite(float(np.sum(mcmc.get_samples()["x"])))


# ---------------------------------------------------------------------------------------------- float32 safety
def test_step_size_predictor_is_the_reference_formula_and_float32_safe():
    """The log-space predictor equals the reference's ``(x / t)^(-1/6)`` (computed in float64) where that is
    representable, and stays finite, positive and above its floor at step sizes whose sixth power underflows
    float32 (the reference formula then overflowed: step size 0, L NaN, a frozen chain; issue #30)."""
    schedule = adaptation.make_schedule(1000)
    rng = np.random.default_rng(0)
    adapt = adaptation.init(2, 1e-3)
    eps, x, t = 1e-3, 0.0, 0.0
    decay = (schedule.n_eff - 1) / (schedule.n_eff + 1)
    for _ in range(50):  # moderate regime: compare with the reference formula in float64
        dE, target = rng.normal() * 0.05, 0.1
        new, adapt = adaptation.update_step_size(adapt, jnp.float32(eps), jnp.float32(dE), True, 2, target, schedule)
        xi = dE**2 / (2 * target) + 1e-8
        w = np.exp(-0.5 * (np.log(xi) / (6 * schedule.trust)) ** 2)
        x, t = decay * x + w * xi / eps**6, decay * t + w
        np.testing.assert_allclose(float(new), (x / t) ** (-1 / 6), rtol=2e-5)
        eps = float(new)
    adapt = adaptation.init(2, 1e-3)
    eps = jnp.float32(1e-3)
    for _ in range(3000):  # an energy error the target can never reach: the step size shrinks smoothly (no jump
        # to the floor when eps^6 underflows), never to 0 or NaN
        new, adapt = adaptation.update_step_size(adapt, eps, jnp.float32(0.01), True, 2, 1e-5, schedule)
        assert np.isfinite(float(new)) and float(new) >= float(adapt.step_size_min) > 0
        assert float(new) > 0.5 * float(eps)
        eps = new
    assert float(eps) < 1e-6


def _numpyro_normal_model(improper: bool):
    """NumPyro's ``test_uniform_normal`` / ``test_improper_normal`` models (test/infer/test_mcmc.py)."""
    from numpyro.distributions.transforms import AffineTransform
    from numpyro.infer.reparam import TransformReparam

    def model(data):
        alpha = numpyro.sample("alpha", dist.Uniform(0, 1))
        base = dist.Uniform(0, 1).mask(False) if improper else dist.Uniform(0, 1)
        with numpyro.handlers.reparam(config={"loc": TransformReparam()}):
            loc = numpyro.sample("loc", dist.TransformedDistribution(base, AffineTransform(0, alpha)))
        numpyro.sample("obs", dist.Normal(loc, 0.1), obs=data)

    return model


@pytest.mark.parametrize(
    "improper, atol, chains, map_steps",
    [(False, 0.05, 4, 0), (True, 0.007, 4, 0), (False, 0.007, 1, 500), (True, 0.007, 1, 500)],
)
def test_exact_setting_samples_numpyro_normal_models_in_float32(improper, atol, chains, map_steps):
    """README's exact setting in float32 on NumPyro's models (potential energy ~77,000, where float32 resolves
    ~0.008): the posterior mean of ``loc`` within NumPyro's tolerances of 0.9 (0.05 / 0.007 upstream). With 4
    chains from ``init_to_uniform``; and as upstream runs them (one chain, 1,000 + 1,000 steps, key 0) from
    ``map_steps=500`` Adam steps (from ``init_to_uniform`` that one chain is still travelling at the end of its
    warmup: mean 0.83)."""
    data = 0.9 + jax.random.normal(jax.random.PRNGKey(0), (1000,))
    kernel = MILE(
        _numpyro_normal_model(improper), target_energy_variance=(5e-4, 5e-4), pretrain=False, map_steps=map_steps
    )
    mcmc = MCMC(
        kernel, num_warmup=1000, num_samples=1000, num_chains=chains, chain_method="vectorized", progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(2 if chains > 1 else 0), data)
    assert mcmc.get_samples()["loc"].dtype == jnp.float32
    np.testing.assert_allclose(float(jnp.mean(mcmc.get_samples()["loc"])), 0.9, atol=atol)
    assert kernel.run_warnings(mcmc.last_state) == []


def test_unreachable_target_is_reported_not_frozen_silently():
    """A target float32 cannot resolve at this potential energy: the step sizes shrink by > 1000x but stay finite,
    L stays finite, and run_warnings names every chain with the fix first (x64 or a larger target)."""
    data = 0.9 + jax.random.normal(jax.random.PRNGKey(0), (1000,))
    kernel = MILE(_numpyro_normal_model(False), target_energy_variance=(1e-5, 1e-5), pretrain=False)
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=100, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), data)
    state = mcmc.last_state
    assert np.all(np.isfinite(np.asarray(state.L))) and np.all(np.asarray(state.step_size) > 0)
    messages = [m for m in kernel.run_warnings(state) if "enable_x64" in m]
    assert len(messages) == 1 and messages[0].startswith("MILE: use numpyro.enable_x64()"), messages
    assert "Chain(s) [0, 1]" in messages[0]


def test_collected_warmup_draws_show_phase3_as_one_step():
    """Through ``MCMC.warmup`` (collecting the warmup draws): the chain moves at every Phases I-II step, jumps at
    the first Phase III step (all of Phase III's moves), then stays there until sampling starts; L changes
    at that jump and nowhere else after Phase II."""
    stds = jnp.linspace(0.5, 2.0, 10)

    def model():
        numpyro.sample("x", dist.Normal(0.0, stds))

    num_warmup, (n1, n2) = 2000, (1600, 200)  # n3 = 200
    mcmc = MCMC(
        MILE(model), num_warmup=num_warmup, num_samples=5, num_chains=2, chain_method="vectorized", progress_bar=False
    )
    mcmc.warmup(jax.random.PRNGKey(0), collect_warmup=True, extra_fields=("L",))
    x = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    L = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["L"])
    assert x.shape == (2, num_warmup, 10)
    moved = np.any(x[:, 1:] != x[:, :-1], axis=(0, 2))  # moved[k]: step k + 1 changed the position
    assert moved[: n1 + n2 - 1].all() and moved[n1 + n2 - 1]  # Phases I-II and the Phase III step
    assert not moved[n1 + n2 :].any()
    assert np.all(L[:, n1 + n2] != L[:, n1 + n2 - 1]) and np.all(L[:, n1 + n2 :] == L[:, -1:])
    mcmc.run(mcmc.post_warmup_state.rng_key)
    assert np.all(np.asarray(mcmc.get_samples(group_by_chain=True)["x"])[:, 0] != x[:, -1])  # sampling moves


@pytest.mark.parametrize("scale", [0.01, 100.0])
def test_tuned_step_size_hits_the_target_energy_variance_at_any_scale(scale):
    """The step-size predictor is scale-free: on a 10-d Gaussian of sd 0.01 or 100 (tuned step sizes far from 1)
    the energy variance per dimension while sampling is near the target: the median over 8 chains within a factor
    3. A predictor with a wrong power of the step size (tried: 5 instead of 6) still lands near the target when
    the step size is near 1, as in the other tests, but not here (1e-8 of the target at sd 100).

    Each chain's tuned step size is noisy on this target (3-6 sd; the energy variance goes as its sixth power):
    per chain the ratio to the target spans 0.13-12 at sd 0.01 and 0.6-1.5 at sd 100 on this seed (medians
    0.4 and 1.1), so one or two chains would make a fragile test."""

    def model():
        numpyro.sample("x", dist.Normal(0.0, scale * jnp.ones(10)))

    target = 1e-3
    # 20,000 warmup steps: from its start at 1e-3 the step size needs them to grow to ~400 at sd 100 (2,000 leave it
    # at 17 and the energy variance 1e-8 of the target; measured 0.90 and 1.13 of the target with 20,000)
    mcmc = MCMC(
        MILE(model, target_energy_variance=(target, target)),
        num_warmup=20_000,
        num_samples=2000,
        num_chains=8,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), extra_fields=("energy_change",))
    energy_change = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["energy_change"], np.float64)
    energy_variance = np.median(np.mean(energy_change**2, axis=1) / 10)
    assert target / 3 < energy_variance < 3 * target, (energy_variance, np.asarray(mcmc.last_state.step_size))
