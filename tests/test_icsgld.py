"""ICSGLD ensemble kernel: zeta=0 is SGLD, the SA fixed point, a multimodal target, a BNN, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, init_to_uniform
from test_sgld import BATCH, DATA, EPS, HIDDEN, gaussian_mean, minibatch_run, prior_lppd, yacht_split

from numpyro_mile import to_inference_data
from numpyro_mile.kernels.icsgld import ICSGLD
from numpyro_mile.kernels.sgld import SGLD
from numpyro_mile.metrics import lppd
from numpyro_mile.models import mlp_regression
from numpyro_mile.kernels.icsgld import importance_weights


def test_zeta_zero_is_sgld_bit_for_bit():
    sgld_run = minibatch_run()  # SGLD(gaussian_mean, EPS), 4 chains, key 0 (cached from test_sgld)
    kernel = ICSGLD(gaussian_mean, EPS, zeta=0.0, num_bins=50, bin_width=20.0, min_energy=0.0)
    mcmc = MCMC(kernel, num_warmup=500, num_samples=20_000, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), DATA, subsample_size=BATCH, extra_fields=("potential_energy",))
    sgld, icsgld = sgld_run.get_samples(group_by_chain=True), mcmc.get_samples(group_by_chain=True)
    assert icsgld["theta"].shape == (4, 20_000) and icsgld["resid"].shape == (4, 20_000, len(DATA))  # (P, draws, ...)
    assert set(sgld) == set(icsgld) == {"theta", "theta_sq", "resid"}
    for site in sgld:
        np.testing.assert_array_equal(sgld[site], icsgld[site])
    np.testing.assert_array_equal(
        sgld_run.get_extra_fields()["potential_energy"], mcmc.get_extra_fields()["potential_energy"]
    )
    state = mcmc.last_state
    assert state.theta.shape == (50,) and state.rng_key.shape[0] == 4
    np.testing.assert_allclose(float(jnp.sum(state.theta)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(importance_weights(mcmc), 1 / 80_000)  # zeta = 0: equal weights
    # MCMC resumes an ensemble (post_warmup_state) by putting one key into rng_key: split per chain
    resumed = state._replace(rng_key=jax.random.PRNGKey(5))
    np.testing.assert_array_equal(resumed.rng_key, jax.random.split(jax.random.PRNGKey(5), 4))
    assert type(resumed) is type(state) and resumed.theta is state.theta


# ---------------------------------------------------------------------------------------------- SA fixed point
def gaussian_2d():
    numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]).to_event(1))


def replay_sa(bins, theta0, zeta, sa_schedule=lambda k: 1 / (k**0.6 + 100)):
    """ICSGLD's histogram recursion in numpy from the collected bins (steps, chains); theta after every step."""
    theta = np.asarray(theta0, np.float64).copy()
    out = np.empty((len(bins), len(theta)))
    eye = np.eye(len(theta))
    for k, J in enumerate(np.asarray(bins)):
        theta = theta + sa_schedule(k + 1) * np.mean(theta[J][:, None] * (eye[J] - theta), axis=0)
        out[k] = theta
    return out


def test_density_of_states_converges_to_the_bin_masses():
    # U(x) = |x|^2 / 2 + log(2 pi) for a 2-d standard Gaussian: U - log(2 pi) ~ Exp(1)
    u_min, du, m, zeta = float(np.log(2 * np.pi)), 0.25, 26, 0.75
    edges = np.arange(m - 1) * du
    true = np.exp(-edges[:-1]) - np.exp(-edges[1:])  # regular bins 1 .. m-2
    true /= true.sum()
    kernel = ICSGLD(gaussian_2d, 0.01, zeta=zeta, num_bins=m, bin_width=du, min_energy=u_min)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=22_000, num_chains=8, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    with pytest.warns(RuntimeWarning, match="overflow bin"):  # the flattened chains reach high energies
        dos = kernel.density_of_states(mcmc.last_state)
    assert dos[0] == 0 and np.isclose(dos.sum(), 1)

    # the collected bins of every step reproduce the kernel's histogram
    bins = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["bin"]).T  # (steps, chains)
    theta0 = np.arange(m, 0, -1) / np.sum(np.arange(m, 0, -1))
    history = replay_sa(bins, theta0, zeta)
    np.testing.assert_allclose(history[-1], mcmc.last_state.theta, rtol=2e-3)

    def regular_dos(theta):  # theta^zeta over the regular bins (the overflow bin holds a weight-0 remainder)
        log_dos = zeta * np.log(theta[1 : m - 1])
        return np.exp(log_dos - log_dos.max()) / np.exp(log_dos - log_dos.max()).sum()

    np.testing.assert_allclose(dos[1 : m - 1] / dos[1 : m - 1].sum(), regular_dos(history[-1]), rtol=1e-2)

    def errors(regular):
        return np.abs(np.cumsum(regular) - np.cumsum(true)).max(), np.abs(regular - true).sum()

    ks_short, l1_short = errors(regular_dos(history[1999]))
    ks_long, l1_long = errors(dos[1 : m - 1] / dos[1 : m - 1].sum())
    assert ks_long < 0.06 and l1_long < 0.15, (ks_long, l1_long)
    assert ks_long < ks_short / 2 and l1_long < l1_short / 2, (ks_short, ks_long, l1_short, l1_long)
    low, high = kernel.energy_range(mcmc.last_state)
    assert np.isclose(low, u_min, atol=0.01) and high > u_min + (m - 2) * du


# ---------------------------------------------------------------------------------------------- multimodal
W, MU = 0.8, 4.5
LOCS = jnp.array([[-MU, 0.0], [MU, 0.0]])


def mixture_2d():
    weights = dist.Categorical(probs=jnp.array([W, 1 - W]))
    numpyro.sample("x", dist.MixtureSameFamily(weights, dist.Normal(LOCS, 1.0).to_event(1)))


def test_importance_weighted_mode_weights_beat_sgld_on_a_mixture():
    num_chains = 8
    init = {"x": jnp.where((jnp.arange(num_chains) < num_chains // 2)[:, None], LOCS[0], LOCS[1])}
    estimates = {}
    for name, kernel in [
        ("sgld", SGLD(mixture_2d, 0.02)),
        ("icsgld", ICSGLD(mixture_2d, 0.02, zeta=1.0, num_bins=40, bin_width=0.5, min_energy=2.0)),
    ]:
        mcmc = MCMC(
            kernel,
            num_warmup=3000,
            num_samples=30_000,
            num_chains=num_chains,
            chain_method="vectorized",
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(0), init_params=init)
        left = np.asarray(mcmc.get_samples()["x"][:, 0]) < 0
        if name == "sgld":
            estimates[name] = left.mean()
            with pytest.raises(ValueError, match="ICSGLD"):
                importance_weights(mcmc)
        else:
            weights = importance_weights(mcmc)
            assert weights.shape == left.shape and np.isclose(weights.sum(), 1)
            estimates[name] = np.sum(weights * left)
            estimates["unweighted"] = left.mean()
    # SGLD chains stay in the mode they start in (half and half); ICSGLD's flattened chains cross
    # the barrier and its importance weights recover the 0.8 / 0.2 split
    assert abs(estimates["sgld"] - 0.5) < 0.02
    assert abs(estimates["icsgld"] - W) < 0.1, estimates
    assert abs(estimates["icsgld"] - W) < abs(estimates["sgld"] - W) / 2, estimates


# ---------------------------------------------------------------------------------------------- BNN
def test_bnn_on_yacht_beats_its_prior_and_converts_to_arviz():
    (X_train, y_train), (X_test, y_test) = yacht_split()
    kernel = ICSGLD(
        mlp_regression,
        1e-4,
        zeta=1.0,
        num_bins=100,
        bin_width=50.0,
        min_energy=-1000.0,
        init_strategy=init_to_uniform(radius=0.1),
    )
    mcmc = MCMC(kernel, num_warmup=1500, num_samples=500, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(
        jax.random.PRNGKey(0),
        X_train,
        y_train,
        hidden=HIDDEN,
        subsample_size=32,
        extra_fields=("potential_energy", "multiplier"),
    )
    idata = to_inference_data(mcmc, test=(X_test, y_test), prediction_sites=())
    assert idata.log_likelihood["y"].shape == (4, 500, len(y_test))
    assert {"bin", "log_weight", "multiplier", "lp"} <= set(idata.sample_stats)
    weights = importance_weights(mcmc)
    fitted = lppd(idata.log_likelihood["y"].values, weights=weights)
    assert fitted > prior_lppd(X_test, y_test) + 2.0
    assert fitted > 0.3
    assert np.all(np.isfinite(mcmc.get_extra_fields()["multiplier"]))


# ---------------------------------------------------------------------------------------------- errors
def test_errors():
    kernel = ICSGLD(gaussian_2d, 0.01, zeta=1.0, num_bins=10, bin_width=1.0, min_energy=0.0)
    with pytest.raises(ValueError, match="ensemble kernel"):
        MCMC(kernel, num_warmup=5, num_samples=5, num_chains=1, progress_bar=False).run(jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="vectorized"):
        MCMC(kernel, num_warmup=5, num_samples=5, num_chains=2, chain_method="sequential", progress_bar=False).run(
            jax.random.PRNGKey(0)
        )

    def discrete():
        numpyro.sample("k", dist.Bernoulli(0.5))
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match="discrete latent"):
        ICSGLD(discrete, 0.01, zeta=1.0, num_bins=10, bin_width=1.0, min_energy=0.0).init(
            jax.random.split(jax.random.PRNGKey(0), 2), 10
        )
    for bad in [
        dict(zeta=-1.0),
        dict(num_bins=2),
        dict(bin_width=0.0),
        dict(sa_schedule=2.0),
        dict(multiplier_clip=(1.0, -1.0)),
    ]:
        options = dict(zeta=1.0, num_bins=10, bin_width=1.0, min_energy=0.0) | bad
        with pytest.raises(ValueError):
            ICSGLD(gaussian_2d, 0.01, **options)
