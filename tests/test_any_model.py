"""Models written the usual NumPyro ways, under MILE, SGLD and ICSGLD: moments against exact answers.

Every run here would have crashed before structure discovery stopped sampling latent sites
(``ImproperUniform``) and pretraining learned to fall back to full batches (a plate whose
observations are not indexed through it). Tolerances are Monte Carlo standard errors from the
ESS (``check_moments``), plus, for MILE's default settings, a stated step-size bias allowance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC
from _stats import check_moments

from numpyro_mile import ICSGLD, MILE, SGLD, SMILE
from numpyro_mile.diagnostics import ess
from numpyro_mile import importance_weights

EXACT = (5e-4, 5e-4)  # energy-variance target small enough that MCLMC's step-size bias is below MC error

MEAN = np.array([1.0, -2.0, 0.5])
SCALE = np.array([1.0, 2.0, 0.5])


def gaussian_log_density(x):
    return -0.5 * jnp.sum(((x - MEAN) / SCALE) ** 2)


def factor_model():
    """A custom log density: an improper flat site plus a factor (cannot be sampled from a prior)."""
    x = numpyro.sample("x", dist.ImproperUniform(dist.constraints.real, (), (3,)))
    numpyro.factor("target", gaussian_log_density(x))


DATA = (np.random.default_rng(0).random(100) < 0.3).astype(np.float32)  # 100 Bernoulli(0.3) draws
HITS = float(DATA.sum())


def bernoulli_plate_model(data):
    """The most common way to write a NumPyro model: observations in a plate, not indexed through it."""
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    numpyro.sample("z", dist.Normal(0.0, 1.0))  # a second dimension: MCLMC needs d >= 2
    with numpyro.plate("data", data.shape[0]):
        numpyro.sample("obs", dist.Bernoulli(p), obs=data)


def beta_posterior():
    a, b = 2.0 + HITS, 2.0 + len(DATA) - HITS
    return a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))


ALPHA = np.array([1.0, 2.0, 3.0])


def constrained_model():
    numpyro.sample("a", dist.Beta(2.0, 5.0))
    numpyro.sample("d", dist.Dirichlet(jnp.asarray(ALPHA)))
    numpyro.sample("h", dist.HalfNormal(2.0))


CONSTRAINED_EXACT = {  # (mean, variance)
    "a": (2 / 7, 10 / (49 * 8)),
    "d": (ALPHA / 6, ALPHA * (6 - ALPHA) / (36 * 7)),
    "h": (2 * np.sqrt(2 / np.pi), 4 * (1 - 2 / np.pi)),
}


def run_mile(model, *args, num_warmup=2000, num_samples=10_000, num_chains=4, init_params=None, **kernel_kwargs):
    kernel = MILE(model, **kernel_kwargs) if model is not None else MILE(**kernel_kwargs)
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), *args, init_params=init_params)
    return mcmc


# ---------------------------------------------------------------------------------------------- MILE
def test_mile_factor_target_on_an_improper_site():
    mcmc = run_mile(factor_model, target_energy_variance=EXACT)
    check_moments(mcmc.get_samples(group_by_chain=True)["x"], MEAN, SCALE**2)


def test_mile_default_settings_bias_is_within_the_stated_allowance():
    """MILE's default target (0.5 -> 0.1 energy variance per dimension) biases variances.

    Allowance, for this anisotropic 3-d Gaussian (scales 0.5-2): means within 5 MC standard errors
    plus 0.05 sd, variances within 35 % (measured: the smallest scale's variance 27 % low, the others
    within 5 %; DESIGN.md measured up to 36 % on a 30-d Gaussian at a similar target). The bias is the
    price of the large steps that serve BNN predictions; a small target removes it (test above).
    """
    mcmc = run_mile(factor_model)
    x = np.asarray(mcmc.get_samples(group_by_chain=True)["x"], np.float64)
    flat = x.reshape(-1, 3)
    se = SCALE / np.sqrt(np.asarray(ess(x)))
    assert np.all(np.abs(flat.mean(0) - MEAN) < 5 * se + 0.05 * SCALE)
    ratio = flat.var(0) / SCALE**2
    assert np.all(np.abs(ratio - 1) < 0.35), ratio
    # and the bias is real (this is not a tolerance that hides everything): it exceeds MC error somewhere
    assert np.max(np.abs(ratio - 1)) > 0.1


def test_mile_plate_without_indexing_pretrains_full_batch_and_is_exact():
    with pytest.warns(UserWarning, match="trains full-batch") as record:
        mcmc = run_mile(
            bernoulli_plate_model,
            DATA,
            target_energy_variance=EXACT,
            ensemble_options=dict(max_epochs=50, progress_bar=False),
        )
    assert sum("full-batch" in str(w.message) for w in record) == 1  # said once
    assert len(mcmc.sampler.ensembles) == 1 and mcmc.sampler.ensembles[0].train_loss.shape == (4, 50)
    samples = mcmc.get_samples(group_by_chain=True)
    mean, var = beta_posterior()
    check_moments(samples["p"], mean, var)
    check_moments(samples["z"], 0.0, 1.0)


def test_mile_constrained_sites_without_data_start_from_the_init_strategy():
    mcmc = run_mile(constrained_model, target_energy_variance=EXACT)
    assert mcmc.sampler.ensembles == []  # no observations: nothing to pretrain
    samples = mcmc.get_samples(group_by_chain=True)
    for site, (mean, var) in CONSTRAINED_EXACT.items():
        check_moments(samples[site], mean, var)
    np.testing.assert_allclose(np.asarray(samples["d"]).sum(-1), 1.0, rtol=1e-5)


def test_mile_potential_fn_samples_in_its_own_space():
    def potential(x):
        return -gaussian_log_density(x)

    mcmc = run_mile(None, potential_fn=potential, target_energy_variance=EXACT, init_params=jnp.zeros((4, 3)))
    x = mcmc.get_samples(group_by_chain=True)
    assert x.shape == (4, 10_000, 3)  # the positions themselves, no postprocessing
    check_moments(x, MEAN, SCALE**2)
    # a pytree position works too, with one chain (no chain axis)
    tree = run_mile(
        None,
        potential_fn=lambda p: potential(jnp.concatenate([p["a"], p["b"]])),
        num_chains=1,
        num_samples=2000,
        init_params={"a": jnp.zeros(1), "b": jnp.zeros(2)},
    )
    assert tree.get_samples()["a"].shape == (2000, 1)


def test_mile_potential_fn_errors():
    with pytest.raises(ValueError, match="needs init_params"):
        run_mile(None, potential_fn=lambda x: jnp.sum(x**2), num_warmup=100, num_samples=10)
    with pytest.raises(ValueError, match="leading dimension"):  # NumPyro's MCMC checks first
        run_mile(
            None, potential_fn=lambda x: jnp.sum(x**2), num_warmup=100, num_samples=10, init_params=jnp.zeros((3, 2))
        )
    with pytest.raises(ValueError, match="exactly one of"):
        MILE(factor_model, potential_fn=lambda x: 0.0)
    with pytest.raises(ValueError, match="exactly one of"):
        MILE()


def test_post_warmup_state_does_not_pretrain_again():
    kernel = MILE(bernoulli_plate_model, ensemble_options=dict(max_epochs=5, progress_bar=False))
    mcmc = MCMC(kernel, num_warmup=200, num_samples=50, num_chains=2, chain_method="vectorized", progress_bar=False)
    with pytest.warns(UserWarning, match="full-batch"):
        mcmc.run(jax.random.PRNGKey(0), DATA)
    first = mcmc.get_samples(group_by_chain=True)["p"]
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, DATA)
    assert len(kernel.ensembles) == 1  # the continuation reused the tuned state
    second = mcmc.get_samples(group_by_chain=True)["p"]
    assert second.shape == first.shape and not np.array_equal(first, second)
    assert int(mcmc.last_state.i) == 200 + 2 * 50


def test_observation_plate_with_another_name_is_found_and_pretrained_on_minibatches():
    """A plate not called "data" but holding every observation is found; indexed data trains on minibatches."""
    X = np.random.default_rng(1).normal(size=(64, 2)).astype(np.float32)
    y = X @ np.array([1.0, -1.0], np.float32) + 0.1 * np.random.default_rng(2).normal(size=64).astype(np.float32)
    X, y = jnp.asarray(X), jnp.asarray(y)  # indexed by the plate under jit: JAX arrays (NUTS needs them too)

    def regression(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("rows", X.shape[0]) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, 0.1), obs=y[idx])

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no full-batch fallback here
        mcmc = run_mile(
            regression,
            X,
            y,
            num_warmup=400,
            num_samples=200,
            num_chains=2,
            ensemble_options=dict(max_epochs=30, progress_bar=False),
        )
    ensemble = mcmc.sampler.ensembles[0]
    assert ensemble.train_loss.shape[1] >= 1
    np.testing.assert_allclose(np.asarray(mcmc.get_samples()["w"]).mean(0), [1.0, -1.0], atol=0.1)


# ---------------------------------------------------------------------------------------------- SGLD / ICSGLD
def test_sgld_factor_target_on_an_improper_site():
    """No plate: full-batch Langevin (ULA); its O(eps) bias is below MC error at eps = 1e-3 here."""
    mcmc = MCMC(
        SGLD(factor_model, step_size=1e-3),
        num_warmup=1000,
        num_samples=40_000,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0))
    check_moments(mcmc.get_samples(group_by_chain=True)["x"], MEAN, SCALE**2)


def test_sgld_plate_without_indexing_runs_full_batch_and_explains_minibatch_failure():
    mcmc = MCMC(
        SGLD(bernoulli_plate_model, step_size=2e-4),
        num_warmup=1000,
        num_samples=20_000,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), DATA)
    mean, var = beta_posterior()
    check_moments(mcmc.get_samples(group_by_chain=True)["p"], mean, var)

    def subsampled(data, subsample_size=None):
        p = numpyro.sample("p", dist.Beta(2.0, 2.0))
        with numpyro.plate("data", data.shape[0], subsample_size=subsample_size):
            numpyro.sample("obs", dist.Bernoulli(p), obs=data)

    for kernel in (
        SGLD(subsampled, 1e-3),
        ICSGLD(subsampled, 1e-3, zeta=0.5, num_bins=20, bin_width=1.0, min_energy=0.0),
    ):
        # subsample_size=1: NumPyro broadcasts the full data against the 1-row plate without an error
        for size in (10, 1):
            with pytest.raises(ValueError, match=r"index the data it observes.*obs=y\[idx\]"):
                MCMC(
                    kernel, num_warmup=10, num_samples=10, num_chains=2, chain_method="vectorized", progress_bar=False
                ).run(jax.random.PRNGKey(0), DATA, subsample_size=size)


@pytest.mark.parametrize("kernel", ["SGLD", "SMILE", "MILE"])
def test_unindexed_data_under_a_subsampled_plate_gets_the_indexing_advice(kernel):
    """``Normal(X @ w)`` with all N rows under a plate that draws n: NumPyro fails on the shapes while the model
    is traced (before any check of the observed sites); the error says how to index the plate's rows."""
    X = jnp.asarray(np.random.default_rng(0).normal(size=(40, 2)))
    y = X @ jnp.array([1.0, -0.5])

    def unindexed(X, y, subsample_size=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
            numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)

    sampler = {
        "SGLD": lambda: SGLD(unindexed, 1e-3),
        "SMILE": lambda: SMILE(unindexed),
        "MILE": lambda: MILE(unindexed),
    }[kernel]()
    with pytest.raises(ValueError, match=r"minibatch of 10 of the 40 rows of plate 'data'.*obs=y\[idx\]"):
        MCMC(sampler, num_warmup=100, num_samples=10, num_chains=2, chain_method="vectorized", progress_bar=False).run(
            jax.random.PRNGKey(0), X, y, subsample_size=10
        )


def test_icsgld_factor_target_importance_weighted_mean():
    mcmc = MCMC(
        ICSGLD(factor_model, 1e-3, zeta=0.5, num_bins=40, bin_width=0.5, min_energy=0.0),
        num_warmup=1000,
        num_samples=20_000,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), extra_fields=("potential_energy",))
    x = np.asarray(mcmc.get_samples(group_by_chain=True)["x"], np.float64)
    weights = np.asarray(importance_weights(mcmc), np.float64).reshape(x.shape[:2])
    weighted_mean = np.einsum("cd,cdk->k", weights, x) / weights.sum()
    se = SCALE / np.sqrt(np.asarray(ess(x)))
    # importance weighting inflates the error by 1 / (1 - ...) at most a few-fold here: allow 3x the plain MC error
    assert np.all(np.abs(weighted_mean - MEAN) < 3 * 5 * se), (weighted_mean, se)


def test_local_latents_in_the_observation_plate_skip_pretraining_with_a_reason():
    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def eight_schools(y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", y.shape[0]):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    with pytest.warns(UserWarning, match=r"latent site\(s\) \['theta'\] lie inside the observation plate 'J'"):
        mcmc = run_mile(eight_schools, y, sigma, num_warmup=300, num_samples=100, num_chains=2)
    assert mcmc.sampler.ensembles == [] and np.all(np.isfinite(np.asarray(mcmc.get_samples()["theta"])))


def test_nested_observation_plates_say_how_to_name_the_plate():
    Y = jnp.ones((10, 3))

    def multi_output(Y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with numpyro.plate("rows", Y.shape[0], dim=-2), numpyro.plate("out", Y.shape[1], dim=-1):
            numpyro.sample("obs", dist.Normal(w, 1.0), obs=Y)

    with pytest.warns(UserWarning, match="no single plate holding the observed"):
        mcmc = run_mile(multi_output, Y, num_warmup=200, num_samples=50, num_chains=2)
    assert mcmc.sampler.ensembles == []
    with pytest.warns(UserWarning, match="trains full-batch"):  # named: pretrained (full-batch: Y is not indexed)
        mcmc = run_mile(
            multi_output,
            Y,
            num_warmup=200,
            num_samples=50,
            num_chains=2,
            ensemble_options=dict(plate_name="rows", max_epochs=5, progress_bar=False),
        )
    assert len(mcmc.sampler.ensembles) == 1


def test_pandas_data_give_the_same_run_as_numpy_arrays():
    """A DataFrame and a Series, as a tabular user holds them, go into MILE, predict and log_likelihood with the
    packaged models (they failed inside JAX before) and give the very draws NumPy arrays give."""
    pd = pytest.importorskip("pandas")
    from numpyro_mile import log_likelihood, predict
    from numpyro_mile.models import mlp_regression

    rng = np.random.default_rng(4)
    X = rng.normal(size=(50, 3)).astype(np.float32)
    y = (X[:, 0] - X[:, 1] + 0.1 * rng.normal(size=50)).astype(np.float32)
    frame, series = pd.DataFrame(X, columns=["a", "b", "c"]), pd.Series(y, name="target")
    runs = [
        run_mile(
            mlp_regression,
            *data,
            num_warmup=200,
            num_samples=20,
            num_chains=2,
            ensemble_options=dict(max_epochs=10, progress_bar=False),
        )
        for data in ((X, y), (frame, series))
    ]
    arrays, pandas = (run.get_samples() for run in runs)
    for name in arrays:
        np.testing.assert_array_equal(pandas[name], arrays[name])
    np.testing.assert_array_equal(
        predict(mlp_regression, pandas, frame, return_sites=["mu"])["mu"],
        predict(mlp_regression, arrays, X, return_sites=["mu"])["mu"],
    )
    np.testing.assert_array_equal(
        log_likelihood(mlp_regression, pandas, frame, series)["y"], log_likelihood(mlp_regression, arrays, X, y)["y"]
    )
