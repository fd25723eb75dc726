"""SMILE / pSMILE: the tuner's arithmetic, the step's bookkeeping, and exact Gaussian targets with
injected gradient noise (no bias for isotropic noise, bias for anisotropic noise, removed by the
preconditioner), then the kernel through NumPyro's MCMC on a model with a subsample plate."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.stats
from numpyro.infer import MCMC

from numpyro_mile import SMILE, to_inference_data
from numpyro_mile.kernels import _smile_tuning as tuner
from numpyro_mile.kernels.smile import SMILEConfig, SMILEState, noise_scale, smile_step

from _known_answers import check_posterior, conjugate_linear_regression, conjugate_regression

Z = 5.0  # tolerance in Monte Carlo standard errors


# ---------------------------------------------------------------------------------------------- tuner
@pytest.mark.parametrize("shape", [0.05, 0.3, 1.0, 2.0, 10.0, 300.0])
def test_gamma_quantile_is_exact(shape):
    for p in (0.01, 1 / 30, 0.05, 0.5, 0.95, 1 - 0.2 / 3, 0.98, 0.999):
        got = float(tuner.gamma_quantile(p, jnp.float32(shape), jnp.float32(2.5)))
        want = scipy.stats.gamma.ppf(p, shape, scale=2.5)
        assert got == pytest.approx(want, rel=1e-4), (shape, p)


def _stats_of(samples, beta=0.01):
    stats = tuner.init_stats()
    for x in samples:
        stats = tuner.update_stats(stats, jnp.float32(x), beta)
    return stats


def _tune(stats, x, eps, settings):
    """The tuner's step size and reset decision (without the updated statistics)."""
    return tuner.tune(stats, x, eps, settings)[:2]


def test_tuner_rules():
    settings = tuner.TunerSettings(reset_quantile=0.98, adapt_prob=0.1, adapt_strength=0.02)
    settled = _stats_of(np.random.default_rng(0).gamma(2.0, 1.0, 500))
    mean, var = tuner.corrected(settled, settings.beta)
    assert float(mean) == pytest.approx(2.0, rel=0.3) and float(var) == pytest.approx(2.0, rel=0.6)
    eps = jnp.float32(0.1)
    # a typical |dE| leaves the step size alone; a small one grows it, a large one shrinks it, a huge one resets
    assert _tune(settled, jnp.float32(float(mean)), eps, settings) == (pytest.approx(0.1, rel=1e-6), False)
    assert float(_tune(settled, jnp.float32(1e-3), eps, settings)[0]) == pytest.approx(0.102, rel=1e-6)
    shape = float(mean) ** 2 / float(var)
    shrink_at, reset_at = (scipy.stats.gamma.ppf(p, shape, scale=float(mean) / shape) for p in (1 - 0.2 / 3, 0.98))
    new, reset = _tune(settled, jnp.float32(0.5 * (shrink_at + reset_at)), eps, settings)
    assert float(new) == pytest.approx(0.098, rel=1e-6) and not reset
    new, reset = _tune(settled, jnp.float32(1e3), eps, settings)
    assert float(new) == pytest.approx(0.098, rel=1e-6) and bool(reset)
    new, reset = _tune(settled, jnp.float32(np.nan), eps, settings)
    assert float(new) == pytest.approx(0.098, rel=1e-6) and bool(reset)
    # nothing happens while the averages settle (fewer than 10 steps), except resetting non-finite steps
    early = _stats_of([1.0] * 5)
    assert _tune(early, jnp.float32(1e3), eps, settings) == (pytest.approx(0.1, rel=1e-6), False)
    assert bool(_tune(early, jnp.float32(np.inf), eps, settings)[1])
    # the naive setting never changes the step size or resets a finite step
    naive = tuner.TunerSettings(reset_quantile=1.0, adapt_prob=0.0, adapt_strength=0.0)
    assert _tune(settled, jnp.float32(1e6), eps, naive) == (pytest.approx(0.1, rel=1e-6), False)
    # the step size stays within [1e-8, 10]
    assert float(_tune(settled, jnp.float32(1e-3), jnp.float32(10.0), settings)[0]) == pytest.approx(10.0, rel=1e-6)
    assert float(_tune(settled, jnp.float32(1e3), jnp.float32(1e-8), settings)[0]) == pytest.approx(1e-8, rel=1e-6)
    # a near-constant |dE| (no minibatch noise) does not put every threshold on the mean (shape <= 100), and
    # a tiny one does not put them all near 0 (shape >= 0.3)
    constant = _stats_of([1.0] * 200)
    assert _tune(constant, jnp.float32(1.05), eps, settings) == (pytest.approx(0.1, rel=1e-6), False)
    tiny = _stats_of(np.random.default_rng(1).gamma(0.01, 1e-6, 300))
    typical = tuner.corrected(tiny, settings.beta)[0]
    assert _tune(tiny, typical, eps, settings) == (pytest.approx(0.1, rel=1e-6), False)


def _synthetic_run(settings, num_chains=64, num_steps=3000, shape=2.0, perturb=lambda t, x: x, draw=None):
    """Log step sizes at the end, shape ``(chains,)``, and resets, shape ``(chains, steps)``, of the tuner fed
    |dE| ~ Gamma(shape, 1) (or ``draw(key)``) independent of the step size, changed by ``perturb(step, x)``."""
    draw = draw or (lambda key: jax.random.gamma(key, shape))

    def chain(key):
        def body(carry, inputs):
            stats, eps = carry
            t, key = inputs
            x = perturb(t, draw(key))
            eps, reset, stats = tuner.tune(stats, x, eps, settings)
            return (stats, eps), reset

        (_, eps), resets = jax.lax.scan(
            body, (tuner.init_stats(), jnp.float32(1.0)), (jnp.arange(num_steps), jax.random.split(key, num_steps))
        )
        return eps, resets

    eps, resets = jax.jit(jax.vmap(chain))(jax.random.split(jax.random.PRNGKey(0), num_chains))
    return np.log(np.asarray(eps)), np.asarray(resets)


def test_reference_tails_drift_down_as_their_formula_says_for_gamma_shaped_errors():
    """|dE| ~ Gamma(2) independent of the step size: 1/30 of the steps grow it 2 %, 2/30 shrink it 2 %, a drift
    of 3000 (a/3 ln 1.02 + 2a/3 ln 0.98) = -2.06 in log step size over 3,000 steps (the moving averages' own
    error adds ~-0.15). Symmetric tails would give 0, swapped tails +2.06."""
    settings = tuner.TunerSettings(reset_quantile=0.98, adapt_prob=0.1, adapt_strength=0.02)
    log_eps, resets = _synthetic_run(settings)
    drift = 3000 * (0.1 / 3 * np.log(1.02) + 0.2 / 3 * np.log(0.98))
    se = log_eps.std() / np.sqrt(len(log_eps))
    assert abs(log_eps.mean() - drift) < 0.3 + Z * se, (log_eps.mean(), drift)
    assert 0.015 < resets[:, 100:].mean() < 0.035  # ~2 % of the steps exceed the 98 % quantile


def test_step_size_holds_when_the_energy_error_is_gaussian_noise():
    """|dE| = |N(0, 1)| (Gaussian minibatch noise, independent of the step size; the regime of a BNN's
    minibatch energies) has more mass near 0 and a lighter upper tail than the Gamma of its mean and variance:
    7.4 % of the draws fall below that Gamma's a/3 quantile and 6.8 % above its 1 - 2a/3 quantile, a drift
    of +0.22 over 3,000 steps where symmetric tails drift +2.7 (the over-dispersion of issue #30)."""
    settings = tuner.TunerSettings(reset_quantile=0.98, adapt_prob=0.1, adapt_strength=0.02)
    log_eps, resets = _synthetic_run(settings, draw=lambda key: jnp.abs(jax.random.normal(key)))
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=1_000_000))
    shape = x.mean() ** 2 / x.var()
    grow_at, shrink_at = scipy.stats.gamma.ppf([0.1 / 3, 1 - 0.2 / 3], shape, scale=x.mean() / shape)
    p_grow, p_shrink = (x < grow_at).mean(), (x > shrink_at).mean()
    drift = 3000 * (p_grow * np.log(1.02) + p_shrink * np.log(0.98))
    se = log_eps.std() / np.sqrt(len(log_eps))
    assert abs(drift) < 0.3 and abs(log_eps.mean()) < 0.3 + Z * se, (log_eps.mean(), drift)
    assert 0.01 < resets[:, 100:].mean() < 0.03


def test_one_outlier_does_not_run_the_step_size_away_and_a_real_shift_is_absorbed():
    settings = tuner.TunerSettings(reset_quantile=0.98, adapt_prob=0.1, adapt_strength=0.02)
    plain, _ = _synthetic_run(settings)
    # one reset step with |dE| = 1e18 (seen on protein): averaged as it is, the mean stays above every later |dE|
    # for ~4,000 steps, each of which then grows the step size by 2 % (to the cap 10 = e^2.3 from 1)
    outlier, _ = _synthetic_run(settings, perturb=lambda t, x: jnp.where(t == 1000, 1e18, x))
    assert np.max(np.abs(outlier - plain)) < 0.5
    # |dE| 100 times larger from step 1000 on (a different region of the posterior): the resets stop within
    # a few hundred steps, as the averages follow the clipped values up
    shifted, resets = _synthetic_run(settings, perturb=lambda t, x: jnp.where(t >= 1000, 100.0 * x, x))
    assert 0.015 < resets[:, 2000:].mean() < 0.03
    assert resets[:, 1000:1100].mean() > 0.3  # the shift was seen (and reset)


# ---------------------------------------------------------------------------------------------- the step
STDS = np.logspace(-1, 1, 10).astype(np.float32)


def _gaussian_state(x, config_precondition=False, step_size=0.05, seed=0):
    """SMILE states (chain axis first) at positions ``x`` (chains, d) of N(0, diag(STDS^2))."""
    n, d = x.shape
    grad = -x / STDS**2
    ones = jnp.ones((n, d)) if config_precondition else None
    return SMILEState(
        i=jnp.asarray(0),
        z={"x": jnp.asarray(x)},
        momentum=jnp.zeros((n, d)),
        logdensity=-0.5 * jnp.sum(x**2 / STDS**2, axis=1),
        logdensity_grad=jnp.asarray(grad),
        step_size=jnp.full((n,), step_size, jnp.float32),
        stats=jax.vmap(lambda _: tuner.init_stats())(jnp.arange(n)),
        energy_change=jnp.zeros((n,)),
        reset=jnp.zeros((n,), bool),
        num_resets=jnp.zeros((n,), jnp.int32),
        num_nans=jnp.zeros((n,), jnp.int32),
        grad_mean=ones,
        grad_var=ones,
        rng_key=jax.random.split(jax.random.PRNGKey(seed), n),
    )


AXES = SMILEState(None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
NAIVE = tuner.TunerSettings(reset_quantile=1.0, adapt_prob=0.0, adapt_strength=0.0)


def _noisy_potential(noise_std):
    """U(x) = sum x^2 / (2 s^2) + xi . x with xi ~ N(0, noise_std^2) per minibatch key: additive gradient noise."""
    noise_std = jnp.asarray(noise_std, jnp.float32)

    def potential(z, key):
        x = z["x"]
        xi = noise_std * jax.random.normal(key, x.shape)
        return 0.5 * jnp.sum(x**2 / STDS**2) + jnp.dot(jax.lax.stop_gradient(xi), x)

    return potential


def test_two_gradient_evaluations_per_step_and_reversibility():
    calls = []

    def potential(z, key):
        calls.append(1)
        return 0.5 * jnp.sum(z["x"] ** 2 / STDS**2)

    config = SMILEConfig(0, NAIVE, False, False, None)
    x0 = np.random.default_rng(1).normal(size=(1, 10)).astype(np.float32) * STDS
    batch = _gaussian_state(x0, step_size=0.01)
    state = jax.tree.map(lambda a: a[0], batch._replace(i=jnp.zeros(1, jnp.int32)))
    state = state._replace(momentum=jnp.ones(10) / np.sqrt(10.0))
    moved = smile_step(state, potential, config)
    assert len(calls) == 2  # two value_and_grad evaluations (the first kick reuses the stored gradient)
    assert float(jnp.linalg.norm(moved.momentum)) == pytest.approx(1.0, abs=1e-5)
    # without noise the palindromic step is time-reversible: flip the velocity, step, flip back
    back = smile_step(moved._replace(momentum=-moved.momentum), potential, config)
    np.testing.assert_allclose(back.z["x"], state.z["x"], atol=2e-5)
    np.testing.assert_allclose(-back.momentum, state.momentum, atol=2e-5)
    # without noise the energy error is small and of both signs; it enters with the kinetic change
    assert abs(float(moved.energy_change)) < 1e-3
    # the kernel's minibatch: drawn once per step from the step's key, both evaluations on those rows
    draws, batches = [], []

    def draw(key):
        draws.append(key)
        return {"data": jax.random.randint(key, (4,), 0, 100)}

    def potential_on_rows(z, rows):
        batches.append(rows)
        return 0.5 * jnp.sum(z["x"] ** 2 / STDS**2)

    smile_step(state, potential_on_rows, config, draw)
    assert len(draws) == 1 and len(batches) == 2 and batches[0] is batches[1]


def _run_gaussian(noise_std, precondition, step_size, num_steps, num_chains=64, burn=2000, seed=0):
    """Per-coordinate variance ratios (chain / target), their MC standard errors, and d E[u_i^2]."""
    config = SMILEConfig(burn if precondition else 0, NAIVE, precondition, False, None)
    potential = _noisy_potential(noise_std)
    x0 = np.random.default_rng(seed).normal(size=(num_chains, 10)).astype(np.float32) * STDS  # exact draws
    step = jax.vmap(lambda s: smile_step(s, potential, config), in_axes=(AXES,), out_axes=AXES)

    @jax.jit
    def run(state):
        state = jax.lax.fori_loop(0, burn, lambda _, s: step(s), state)  # velocity (and preconditioner) settle

        def body(s, _):
            s = step(s)
            return s, (s.z["x"], s.momentum)

        return jax.lax.scan(body, state, None, length=num_steps)[1]

    xs, us = run(_gaussian_state(x0, precondition, step_size, seed))
    x2 = np.asarray(xs, np.float64) ** 2 / STDS**2  # (steps, chains, d): E = 1 under the target
    ratio = x2.mean(axis=(0, 1))
    # MC error from the per-chain means (chains are independent)
    se = x2.mean(axis=0).std(axis=0, ddof=1) / np.sqrt(num_chains)
    due = 10 * (np.asarray(us, np.float64) ** 2).mean(axis=(0, 1))
    return ratio, se, due


def _bias(ratio):
    return float(np.mean((ratio - 1.0) ** 2 / 2.0))


def test_a_reset_reverts_the_step_and_zeroes_the_velocity():
    """A step whose |dE| exceeds the reset quantile goes back: position, log density and gradient as before the
    step, velocity 0 (the next kick restarts along the gradient); the step counts. Statistics that say |dE| is
    ~1e-6 make any real step an outlier; with resets off (quantile 1) the same step is kept."""

    def potential(z, key):
        return 0.5 * jnp.sum(z["x"] ** 2 / STDS**2)

    x0 = np.random.default_rng(2).normal(size=(1, 10)).astype(np.float32) * STDS
    state = jax.tree.map(lambda a: a[0], _gaussian_state(x0, step_size=0.05)._replace(i=jnp.zeros(1, jnp.int32)))
    tiny = tuner.EnergyStats(jnp.float32(1e-6), jnp.float32(1e-14), jnp.asarray(1000, jnp.int32))
    state = state._replace(momentum=jnp.ones(10) / np.sqrt(10.0), stats=tiny)
    settings = tuner.TunerSettings(reset_quantile=0.98, adapt_prob=0.0, adapt_strength=0.0)
    reset = smile_step(state, potential, SMILEConfig(0, settings, False, False, None))
    assert bool(reset.reset) and int(reset.num_resets) == 1 and int(reset.i) == 1
    np.testing.assert_array_equal(reset.z["x"], state.z["x"])
    np.testing.assert_array_equal(reset.logdensity, state.logdensity)
    np.testing.assert_array_equal(reset.logdensity_grad, state.logdensity_grad)
    np.testing.assert_array_equal(reset.momentum, np.zeros(10))
    kept = smile_step(state, potential, SMILEConfig(0, settings._replace(reset_quantile=1.0), False, False, None))
    assert not bool(kept.reset) and float(jnp.max(jnp.abs(kept.z["x"] - state.z["x"]))) > 1e-3
    assert float(jnp.linalg.norm(kept.momentum)) == pytest.approx(1.0, abs=1e-5)


def test_isotropic_noise_leaves_no_bias():
    ratio, se, due = _run_gaussian(3.0, False, 0.05, 20_000)
    assert np.all(np.abs(ratio - 1.0) < np.maximum(Z * se, 0.03)), (ratio, se)
    # pooled over the coordinates (a tempered kernel, gradients x 0.8, gives 1.25 and fails here)
    assert abs(ratio.mean() - 1.0) < Z * np.sqrt(np.sum(se**2)) / len(se)
    np.testing.assert_allclose(due, 1.0, atol=0.1)  # the velocity is uniform on the sphere


def test_anisotropic_noise_biases_and_the_preconditioner_removes_most_of_it():
    noise = 3.0 * STDS / np.sqrt(np.mean(STDS**2))  # noise sd proportional to the target sd, RMS 3
    ratio, se, due = _run_gaussian(noise, False, 0.05, 20_000)
    assert _bias(ratio) > 0.5  # failure mode 1: noisy directions over-dispersed, quiet ones under-dispersed
    assert ratio[-1] > 1.5 and ratio[0] < 0.7
    # the target-free diagnostic tracks the variance ratio
    np.testing.assert_allclose(due, ratio, rtol=0.35)

    noise = 30.0 * STDS / np.sqrt(np.mean(STDS**2))  # strong noise: fast velocity decoherence
    plain, _, _ = _run_gaussian(noise, False, 0.005, 20_000)
    pre, se, _ = _run_gaussian(noise, True, 0.005, 20_000)
    assert _bias(plain) > 0.3
    # the online estimate over-estimates the noise where the true gradient varies more than the noise (the
    # quiet, small-variance coordinates here), which leaves a floor (b^2 ~ 0.1, as ../shared/SMILE.md 3.2 found)
    assert _bias(pre) < 0.2 and _bias(pre) < _bias(plain) / 3


def test_preconditioner_floor_bounds_the_drift_of_quiet_coordinates():
    """A coordinate with ~1e5 times less gradient noise than the rest (a weight of an inactive unit): the
    reference scale (RMS 1, no floor) lets it drift ~1e5 eps in one step; the floor (0.1) bounds it by 10 eps."""
    grad_var = jnp.asarray([1e6] * 9 + [1e-6], jnp.float32)
    reference = noise_scale(grad_var, 0.0)
    np.testing.assert_allclose(float(jnp.sqrt(jnp.mean(reference**2))), 1.0, rtol=1e-5)
    assert float(reference[-1]) < 2e-5
    floored = noise_scale(grad_var)
    np.testing.assert_allclose(floored[:-1], reference[:-1])  # the noisy coordinates keep their scale
    assert float(floored[-1]) == pytest.approx(0.1)

    def quiet_move(min_scale, eps=1e-3):
        """Drift of the quiet coordinate in one step, in units of eps, moving along it where the potential is
        flat (the kicks then leave the velocity alone)."""
        config = SMILEConfig(10, NAIVE, True, False, None, min_scale)
        state = jax.tree.map(
            lambda a: a[0],
            _gaussian_state(np.zeros((1, 10), np.float32), True, eps)._replace(i=jnp.zeros(1, jnp.int32)),
        )
        state = state._replace(momentum=jnp.zeros(10).at[-1].set(1.0), grad_var=grad_var, grad_mean=jnp.zeros(10))
        moved = smile_step(state, lambda z, key: 0.5 * jnp.sum(z["x"][:-1] ** 2), config)
        assert not bool(moved.reset)
        return abs(float(moved.z["x"][-1])) / eps

    assert quiet_move(0.1) == pytest.approx(10.0, rel=1e-4)
    assert quiet_move(0.0) == pytest.approx(1.0 / float(reference[-1]), rel=1e-3)


# ---------------------------------------------------------------------------------------------- through MCMC
def linear_regression(X, y=None, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=None if y is None else y[idx])


def test_kernel_runs_through_mcmc_and_reports():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 0.5]) + rng.normal(size=2000)).astype(np.float32)
    kernel = SMILE(linear_regression, 5e-3, precondition=True, ensemble_options=dict(max_epochs=20, progress_bar=False))
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=100, extra_fields=("step_size", "num_resets", "reset"))
    w = np.asarray(mcmc.get_samples()["w"])
    # posterior mean within a few posterior sds (~1/sqrt(2000)) of the least-squares fit (a loose smoke check)
    ls = np.linalg.lstsq(X, y, rcond=None)[0]
    assert np.all(np.abs(w.mean(0) - ls) < 0.1)
    fields = mcmc.get_extra_fields(group_by_chain=True)
    step_sizes = np.asarray(fields["step_size"])
    assert np.all(step_sizes > 0)
    assert np.all(step_sizes == step_sizes[:, :1])  # adapted during warmup only: fixed while sampling
    assert np.any(step_sizes[:, 0] != 5e-3)  # ... and it did adapt
    assert int(np.asarray(mcmc.last_state.num_resets).max()) < 0.2 * 2000
    # sequential chains give the same draws as vectorized ones
    assert len(kernel.ensembles) == 1 and kernel.ensembles[0].train_loss.shape[0] == 2  # started from 2 members
    seq = MCMC(
        SMILE(linear_regression, 5e-3, precondition=True, ensemble_options=dict(max_epochs=20, progress_bar=False)),
        num_warmup=1000,
        num_samples=1000,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    seq.run(jax.random.PRNGKey(0), X, y, subsample_size=100)
    np.testing.assert_allclose(np.asarray(seq.get_samples()["w"]), w, atol=1e-3)
    idata = to_inference_data(mcmc)
    assert idata.posterior["w"].shape == (2, 1000, 3)


def test_bad_settings_raise():
    for bad in [
        dict(step_size=0.0),
        dict(reset_quantile=0.0),
        dict(adapt_prob=1.0),
        dict(smoothing=0.0),
        dict(L=-1.0),
        dict(min_scale=-0.1),
        dict(min_scale=2.0),
    ]:
        with pytest.raises(ValueError):
            SMILE(linear_regression, **bad)
    with pytest.raises(ValueError, match="callable"):
        SMILE(None)


def test_a_step_size_at_its_bound_is_reported_per_chain():
    state = _gaussian_state(np.zeros((3, 10), np.float32))._replace(i=jnp.asarray(500))
    kernel = SMILE(linear_regression)
    assert not any("bound" in m for m in kernel.run_warnings(state))
    lost = state._replace(step_size=jnp.asarray([1e-3, 1e-8, 10.0], jnp.float32))
    (message,) = [m for m in kernel.run_warnings(lost) if "bound" in m]
    assert "[1, 2]" in message and "adapt_prob=0" in message
    # a step size 1,000 times below the initial 1e-3 is reported before it reaches the floor 1e-8 (a trapped
    # chain on protein fell to 1.4e-7 in 5,000 steps); 100 times below is not
    trapped = state._replace(step_size=jnp.asarray([1e-5, 1.4e-7, 5e-2], jnp.float32))
    (message,) = [m for m in kernel.run_warnings(trapped) if "bound" in m]
    assert "chain(s) [1]:" in message and "1000 times below the initial 0.001" in message


def test_run_chunked_resumes_smile_bit_for_bit(tmp_path):
    from numpyro_mile import run_chunked

    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.normal(size=(500, 3)), jnp.float32)
    y = X @ jnp.array([1.0, -1.0, 0.5]) + jnp.asarray(rng.normal(size=500), jnp.float32)

    def make():
        return MCMC(
            SMILE(linear_regression, 5e-3, precondition=True, pretrain=False),
            num_warmup=60,
            num_samples=40,
            num_chains=2,
            chain_method="vectorized",
            progress_bar=False,
        )

    whole = make()
    whole.run(jax.random.PRNGKey(3), X, y, subsample_size=50)
    stops = []
    out = run_chunked(
        make(),
        jax.random.PRNGKey(3),
        X,
        y,
        subsample_size=50,
        checkpoint_path=tmp_path / "s.ckpt",
        chunk_size=25,
        callback=lambda p: stops.append(p.step) or len(stops) == 2,
    )  # stop mid-warmup
    assert not out.finished and out.step == 50
    out = run_chunked(
        make(), jax.random.PRNGKey(3), X, y, subsample_size=50, checkpoint_path=tmp_path / "s.ckpt", chunk_size=25
    )
    assert out.finished
    np.testing.assert_array_equal(out.get_samples()["w"], np.asarray(whole.get_samples()["w"]))


def test_bias_grows_as_the_batch_shrinks_and_the_preconditioner_reduces_it():
    """Conjugate linear regression (N = 10,000 rows, d = 4, heteroscedastic correlated features: the per-row
    gradients' covariance is anisotropic): SMILE's b^2 of the posterior variances grows as the minibatch shrinks;
    pSMILE's is several times smaller at each batch size. (Fixed eps = 1e-3, no tuner, chains started from exact
    posterior draws; a development run of this setting gave SMILE 7.9 / 0.88, pSMILE 2.0 / 0.11 at b = 32 / 512.)"""
    N, d = 10_000, 4
    rng = np.random.default_rng(0)
    A = rng.normal(size=(d, d)) / np.sqrt(d) + np.eye(d)
    X = (rng.normal(size=(N, d)) @ A.T * np.exp(rng.normal(size=(N, 1))) * np.array([1, 0.3, 3, 1])).astype(np.float32)
    y = (X @ rng.normal(size=d) + rng.normal(size=N)).astype(np.float32)
    cov = np.linalg.inv(np.eye(d) + X.T.astype(np.float64) @ X)
    mu = cov @ (X.T.astype(np.float64) @ y)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def bias(b, precondition, chains=16, burn=2000, steps=8000):
        def potential(z, key):  # N/b-scaled minibatch potential, rows drawn with replacement
            idx = jax.random.randint(key, (b,), 0, N)
            return 0.5 * jnp.sum(z["w"] ** 2) + (N / b) * 0.5 * jnp.sum((yj[idx] - Xj[idx] @ z["w"]) ** 2)

        config = SMILEConfig(burn, NAIVE, precondition, False, None)
        w0 = jnp.asarray(rng.multivariate_normal(mu, cov, size=chains), jnp.float32)
        grad0 = jax.vmap(jax.grad(lambda w: -potential({"w": w}, jax.random.PRNGKey(0))))(w0)
        ones = jnp.ones((chains, d)) if precondition else None
        state = SMILEState(
            jnp.asarray(0),
            {"w": w0},
            jnp.zeros((chains, d)),
            jnp.zeros(chains),
            grad0,
            jnp.full((chains,), 1e-3, jnp.float32),
            jax.vmap(lambda _: tuner.init_stats())(jnp.arange(chains)),
            jnp.zeros(chains),
            jnp.zeros(chains, bool),
            jnp.zeros(chains, jnp.int32),
            jnp.zeros(chains, jnp.int32),
            ones,
            ones,
            jax.random.split(jax.random.PRNGKey(1), chains),
        )
        step = jax.vmap(lambda s: smile_step(s, potential, config), in_axes=(AXES,), out_axes=AXES)

        @jax.jit
        def run(s):
            s = jax.lax.fori_loop(0, burn, lambda _, s: step(s), s)

            def body(s, _):
                s = step(s)
                return s, s.z["w"]

            return jax.lax.scan(body, s, None, length=steps)[1]

        z = (np.asarray(run(state), np.float64) - mu) / np.sqrt(np.diag(cov))
        return _bias((z**2).mean(axis=(0, 1)))

    plain_small, plain_large = bias(32, False), bias(512, False)
    pre_small, pre_large = bias(32, True), bias(512, True)
    assert plain_small > 3 * plain_large and plain_large > 0.3
    assert pre_small < plain_small / 2.5 and pre_large < plain_large / 4


# ---------------------------------------------------------------------------------------------- default path
@pytest.mark.parametrize("precondition, design", [(False, "gaussian"), (True, "heavy-tailed")])
def test_default_path_samples_a_conjugate_regression(precondition, design):
    """``MCMC(SMILE(model))`` as a user runs it -- deep-ensemble pretraining, the tuner, resets, NumPyro's loop --
    on a regression with a closed-form posterior (N = 10,000, batch 256, 8 chains, 3,000 + 10,000 steps).

    Tolerance: Monte Carlo error (ESS of the draws and of their squared deviations) plus SMILE's bias, which
    this kernel leaves at this batch size: variance ratios 0.93-1.10 measured (keys 0-1; plain SMILE on the
    unit-scale design, pSMILE on both; 0.93-1.21 before), so 25 % is allowed. The symmetric-tail tuner of issue
    #30 gave 2.6-4.9 here; pSMILE without its scale (plain SMILE) 0.35-2.08 on the heavy-tailed design."""
    X, y, mean, cov = conjugate_regression(design)
    kernel = SMILE(conjugate_linear_regression, precondition=precondition, ensemble_options=dict(progress_bar=False))
    mcmc = MCMC(
        kernel, num_warmup=3000, num_samples=10_000, num_chains=8, chain_method="vectorized", progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=256, extra_fields=("reset",))
    assert len(kernel.ensembles) == 1  # the default path pretrained
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    check_posterior(draws, mean, cov, variance_bias=0.25, z=Z)
    # the default path's resets revert their step: a reset draw repeats the one before it (the moments above
    # barely notice resets on this target; with resets made a no-op, this line fails)
    reset = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["reset"])[:, 1:]
    assert 0 < reset.mean() < 0.1
    np.testing.assert_array_equal(draws[:, 1:][reset], draws[:, :-1][reset])
