"""SGLD and minibatching: closed-form stationary moments, running moments, pSGLD, a BNN, errors."""

import functools
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, init_to_uniform

from numpyro_mile import to_inference_data
from numpyro_mile.kernels.sgld import SGLD, polynomial_schedule
from numpyro_mile.metrics import lppd
from numpyro_mile.minibatch import MinibatchModel, sample_without_replacement
from numpyro_mile.models import mlp_regression

from _stats import moment_errors

Z = 4.5  # tolerance in Monte Carlo standard errors

# conjugate Gaussian mean model: x_i ~ N(theta, 1), theta ~ N(0, S0^2)
S0, N, BATCH, EPS = 10.0, 100, 10, 2e-3
DATA = np.random.default_rng(0).normal(1.0, 1.0, N).astype(np.float32)


def gaussian_mean(x, subsample_size=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, S0))
    numpyro.deterministic("theta_sq", theta**2)
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size):
        batch = numpyro.subsample(x, event_dim=0)
        numpyro.deterministic("resid", batch - theta)
        numpyro.sample("obs", dist.Normal(theta, 1.0), obs=batch)


def sgld_stationary_moments(x, eps, batch=None):
    """Stationary mean and variance of SGLD on ``gaussian_mean`` (an AR(1) recursion).

    grad U~(theta) = a theta - b_k with a = 1/S0^2 + N and b_k = (N/n) sum_{i in B_k} x_i, so
    theta_{k+1} = (1 - eps a) theta_k + eps b_k + sqrt(2 eps) xi_k. E b_k = sum x_i gives the
    mean sum x / a (the posterior mean); b_k is independent of theta_k, so
    V = (1 - eps a)^2 V + eps^2 Var(b_k) + 2 eps, with Var(b_k) = N^2 s^2 (N - n) / (n (N - 1))
    for n rows drawn without replacement (s^2 = population variance of x).
    """
    x = np.asarray(x, np.float64)
    n_rows = len(x)
    a = 1 / S0**2 + n_rows
    var_b = 0.0 if batch is None else n_rows**2 * x.var() * (n_rows - batch) / (batch * (n_rows - 1))
    return x.sum() / a, (2 * eps + eps**2 * var_b) / (1 - (1 - eps * a) ** 2), 1 / a


def z_scores(samples, mean, var):
    """(mean, variance) errors in Monte Carlo standard errors, and the variance's standard error; samples
    (chains, draws)."""
    errors = moment_errors(np.asarray(samples)[..., None], mean, var)
    return float(errors.z_mean[0]), float(errors.z_var[0]), float(errors.se_var[0])


@functools.cache
def minibatch_run():
    """SGLD on the minibatch conjugate model (shared with test_icsgld's zeta = 0 comparison)."""
    mcmc = MCMC(
        SGLD(gaussian_mean, EPS, running_moments=True),
        num_warmup=500,
        num_samples=20_000,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), DATA, subsample_size=BATCH, extra_fields=("potential_energy", "step_size"))
    return mcmc


def test_minibatch_stationary_moments_running_moments_and_deterministic_sites():
    mcmc = minibatch_run()
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    theta = samples["theta"]
    mean, var, posterior_var = sgld_stationary_moments(DATA, EPS, BATCH)
    assert var > 2 * posterior_var  # minibatch noise doubles the variance here: a sharp test
    z_mean, z_var, se_var = z_scores(theta, mean, var)
    assert abs(z_mean) < Z and abs(z_var) < Z, (z_mean, z_var)
    assert abs(np.mean((theta - mean) ** 2) - posterior_var) > 10 * se_var

    # deterministic sites are evaluated on all rows (the plate is bound to arange(N))
    np.testing.assert_allclose(samples["theta_sq"], theta**2, rtol=1e-5)
    assert samples["resid"].shape == (4, 20_000, N)
    np.testing.assert_allclose(samples["resid"][:, :3], DATA - theta[:, :3, None], rtol=1e-5, atol=1e-6)

    # BayesDLL's memory-light mode: running moments of every post-warmup iterate
    moments = mcmc.sampler.running_moments(mcmc.last_state)
    assert moments.count == 20_000
    np.testing.assert_allclose(moments.mean["theta"], np.mean(theta, dtype=np.float64), rtol=1e-4)
    np.testing.assert_allclose(moments.var["theta"], np.var(theta, dtype=np.float64), rtol=1e-3)
    per_chain = mcmc.sampler.running_moments(mcmc.last_state, combine_chains=False)
    np.testing.assert_allclose(per_chain.var["theta"], np.var(theta, axis=1, dtype=np.float64), rtol=1e-3)

    fields = mcmc.get_extra_fields(group_by_chain=True)
    assert fields["potential_energy"].shape == (4, 20_000)
    np.testing.assert_allclose(fields["step_size"], EPS)


def test_full_batch_stationary_variance_sequential_chains():
    mcmc = MCMC(
        SGLD(gaussian_mean, EPS),
        num_warmup=500,
        num_samples=20_000,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(1), DATA)  # no subsample_size: full-batch gradients
    theta = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])
    mean, var, posterior_var = sgld_stationary_moments(DATA, EPS)
    np.testing.assert_allclose(var, 2 * EPS / (1 - (1 - EPS * (1 / S0**2 + N)) ** 2))
    z_mean, z_var, se_var = z_scores(theta, mean, var)
    assert abs(z_mean) < Z and abs(z_var) < Z, (z_mean, z_var)
    assert abs(np.mean((theta - mean) ** 2) - posterior_var) > 4 * se_var  # the 11% step-size bias is resolved


def test_psgld_with_polynomial_schedule():
    schedule = ("polynomial", 0.5, 10.0, 0.55)
    # a slowly moving RMSprop average: the ignored Gamma term is then negligible (with the default
    # decay 0.99, V follows the gradient of this 1-d chain and the variance comes out ~50% too large)
    kernel = SGLD(gaussian_mean, schedule=schedule, preconditioner="rmsprop", rmsprop_decay=0.999)
    mcmc = MCMC(
        kernel, num_warmup=1000, num_samples=20_000, num_chains=4, chain_method="vectorized", progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(2), DATA, extra_fields=("step_size",))
    step_size = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["step_size"])
    k = np.arange(1000, 21_000)
    np.testing.assert_allclose(step_size[0], 0.5 * (10.0 + k) ** -0.55, rtol=1e-5)
    np.testing.assert_allclose(step_size[3], step_size[0])
    theta = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])
    mean, _, posterior_var = sgld_stationary_moments(DATA, EPS)
    z_mean, _, _ = z_scores(theta, mean, posterior_var)
    assert abs(z_mean) < Z
    assert abs(np.var(theta) / posterior_var - 1) < 0.15


def test_sample_without_replacement_is_uniform():
    keys = jax.random.split(jax.random.PRNGKey(0), 60_000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: sample_without_replacement(k, 6, 3)))(keys))
    assert all(len(set(row)) == 3 for row in draws[:2000])
    subsets, counts = np.unique(np.sort(draws, 1), axis=0, return_counts=True)
    assert len(subsets) == 20  # all (6 choose 3) subsets
    expected = len(draws) / 20
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < 43.8  # 99.9% quantile of chi^2 with 19 degrees of freedom


# ---------------------------------------------------------------------------------------------- BNN
def uci_dir():
    return Path(os.environ.get("NUMPYRO_MILE_DATA") or Path(__file__).parents[2] / "shared" / "data" / "uci")


def yacht_split():
    from numpyro_mile.datasets import load_uci, split, standardize

    if not (uci_dir() / "yacht.data").exists():
        pytest.skip(f"yacht.data not found in {uci_dir()}")
    X, y = load_uci("yacht", data_dir=uci_dir())
    parts, _ = standardize(split(X, y, seed=1))
    return parts.train, parts.test


HIDDEN = (8,)


def prior_lppd(X_test, y_test, num_draws=400):
    """Test LPPD of the prior (N(0, 1) weights) of ``mlp_regression``, in numpy (nothing to compile)."""
    from numpyro_mile.metrics import gaussian_log_likelihood
    from numpyro_mile.models.mlp import SIGMA_MAX, SIGMA_MIN, layer_shapes

    rng = np.random.default_rng(1)
    shapes = layer_shapes(X_test.shape[1], HIDDEN, 2)
    w = {k: rng.normal(size=(num_draws, *shape)) for k, shape in shapes.items()}
    h = np.maximum(np.einsum("nf,sfh->snh", X_test, w["w0"]) + w["b0"][:, None], 0)
    out = np.einsum("snh,sho->sno", h, w["w1"]) + w["b1"][:, None]
    sigma = np.clip(np.exp(out[..., 1]), SIGMA_MIN, SIGMA_MAX)
    return lppd(gaussian_log_likelihood(y_test, out[..., 0], sigma))


def test_bnn_on_yacht_beats_its_prior_and_converts_to_arviz():
    (X_train, y_train), (X_test, y_test) = yacht_split()
    kernel = SGLD(mlp_regression, 1e-4, init_strategy=init_to_uniform(radius=0.1))
    mcmc = MCMC(kernel, num_warmup=1500, num_samples=500, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(
        jax.random.PRNGKey(0),
        X_train,
        y_train,
        hidden=HIDDEN,
        subsample_size=32,
        extra_fields=("potential_energy", "num_nans"),
    )
    assert int(np.sum(mcmc.get_extra_fields()["num_nans"][-1])) == 0
    idata = to_inference_data(mcmc, test=(X_test, y_test), prediction_sites=())
    assert idata.log_likelihood["y"].shape == (4, 500, len(y_test))
    assert idata.posterior["w0"].shape == (4, 500, X_test.shape[1], HIDDEN[0])
    assert "lp" in idata.sample_stats
    fitted = lppd(idata.log_likelihood["y"].values)
    assert fitted > prior_lppd(X_test, y_test) + 2.0
    assert fitted > 0.3  # standardised targets: a Gaussian with the data's spread would give -1.42


# ---------------------------------------------------------------------------------------------- errors
def test_errors():
    def discrete():
        numpyro.sample("k", dist.Bernoulli(0.5))
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    def too_large(x):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0], subsample_size=2 * x.shape[0]):
            numpyro.sample("obs", dist.Normal(theta, 1.0), obs=numpyro.subsample(x, event_dim=0))

    with pytest.raises(ValueError, match="discrete latent"):
        SGLD(discrete).init(jax.random.PRNGKey(0), 10)
    with pytest.raises(ValueError, match="subsample_size=200"):
        MCMC(SGLD(too_large), num_warmup=5, num_samples=5, progress_bar=False).run(jax.random.PRNGKey(0), DATA)
    with pytest.raises(ValueError, match="schedule"):
        SGLD(gaussian_mean, schedule=("cosine", 1, 2))
    with pytest.raises(ValueError, match="gamma"):
        polynomial_schedule(1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="preconditioner"):
        SGLD(gaussian_mean, preconditioner="adam")
    with pytest.raises(ValueError, match="running_moments=True"):
        kernel = SGLD(gaussian_mean)
        kernel.running_moments(kernel.init(jax.random.PRNGKey(0), 10, model_args=(DATA,)))
    assert not MinibatchModel(gaussian_mean, (DATA,), {}).is_subsampled
    assert MinibatchModel(gaussian_mean, (DATA,), {"subsample_size": BATCH}).plates[0].subsample_size == BATCH
    with pytest.raises(ValueError, match="init_params"):
        SGLD(gaussian_mean).init(jax.random.PRNGKey(0), 10, init_params={"x": 0.0}, model_args=(DATA,))


def test_rejected_steps_are_counted_and_reported_after_the_run():
    """A step that overflows is rejected (the chain stays), counted in num_nans, and reported by
    run_warnings / to_inference_data after the run (no host callback in the step)."""

    def quartic(x):  # U = x^4: an explicit step of size 0.1 from x = 20 overflows float32
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        numpyro.factor("quartic", -(theta**4))
        numpyro.sample("obs", dist.Normal(theta, 1.0), obs=x)

    kernel = SGLD(quartic, 0.1)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=20, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(
        jax.random.PRNGKey(0), jnp.zeros(()), init_params={"theta": jnp.array([20.0, 0.1])}, extra_fields=("num_nans",)
    )
    nans = np.asarray(mcmc.last_state.num_nans)
    assert nans[0] > 0 and nans[1] == 0  # only the chain started far out rejects its steps
    assert np.all(np.isfinite(mcmc.get_samples()["theta"]))
    messages = kernel.run_warnings(mcmc.last_state)
    assert len(messages) == 1 and "NaN or infinite" in messages[0] and "SGLD" in messages[0]
    with pytest.warns(RuntimeWarning, match="SGLD rejected"):
        idata = to_inference_data(mcmc)
    assert idata.posterior.attrs["run_warnings"] == messages[0]  # the warning travels with the draws


def test_numpy_data_indexed_through_the_plate():
    """A model that indexes NumPy data with the plate's indices (``X[idx]``) runs (the kernel passes JAX arrays)."""

    def regression(X, y, subsample_size=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    X = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    y = X @ np.array([1.0, -1.0], np.float32)
    mcmc = MCMC(SGLD(regression, 1e-3), num_warmup=10, num_samples=10, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=10)
    assert mcmc.get_samples()["w"].shape == (10, 2)


@pytest.mark.parametrize("kernel_name", ["SGLD", "ICSGLD"])
def test_model_without_a_subsampled_plate_warns_at_the_users_line(kernel_name):
    """Forgetting ``subsample_size`` makes a minibatch kernel run full-batch: it says so, with the fix first, from
    the user's ``mcmc.run`` line (not NumPyro's source), and not when a minibatch is drawn (issue #30)."""
    import warnings

    from numpyro_mile import ICSGLD

    kernel = (
        SGLD(gaussian_mean, 1e-3)
        if kernel_name == "SGLD"
        else ICSGLD(gaussian_mean, 1e-3, zeta=1.0, num_bins=10, bin_width=10.0, min_energy=0.0)
    )
    mcmc = MCMC(kernel, num_warmup=5, num_samples=5, num_chains=2, chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), DATA)
        full_batch = [w for w in caught if "pass subsample_size" in str(w.message)]
        assert len(full_batch) == 1 and str(full_batch[0].message).startswith(f"{kernel_name}: pass subsample_size")
        assert full_batch[0].filename == __file__
        mcmc.run(jax.random.PRNGKey(0), DATA, subsample_size=10)
        assert len([w for w in caught if "pass subsample_size" in str(w.message)]) == 1


def test_progress_bar_postfix_is_read_back_at_most_every_interval():
    """NumPyro asks a sequential chain's kernel for the progress-bar postfix after every step; reading the state
    back each time would serialise the steps. The postfix is recomputed at most every ``diagnostics_interval``."""

    class Counting(SGLD):
        calls = 0

        def diagnostics_str(self, state):
            Counting.calls += 1
            return super().diagnostics_str(state)

    kernel = Counting(gaussian_mean, EPS)
    kernel.diagnostics_interval = 3600.0
    mcmc = MCMC(kernel, num_warmup=50, num_samples=50, progress_bar=True)
    mcmc.progress_bar = True  # NumPyro turns it off under CI and pytest-xdist
    mcmc.run(jax.random.PRNGKey(0), DATA, subsample_size=BATCH)
    assert Counting.calls == 1
    assert kernel.get_diagnostics_str(mcmc.last_state).startswith("step size")
    kernel.diagnostics_interval = 0.0
    assert Counting.calls == 1 and kernel.get_diagnostics_str(mcmc.last_state).startswith("step size")
    assert Counting.calls == 2
