"""BDE (NUTS from ensemble members): exact posterior moments of a conjugate model, one or several members."""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_mile import bde
from numpyro_mile.diagnostics import ess

Z = 4.5  # tolerance in Monte Carlo standard errors
SIGMA = 0.5
X = np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32)
Y = (X @ np.array([1.0, -0.5]) + SIGMA * np.random.default_rng(1).normal(size=30)).astype(np.float32)


def linear(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(X @ w, SIGMA), obs=y)


def exact_posterior():
    precision = np.eye(2) + X.T @ X / SIGMA**2
    cov = np.linalg.inv(precision)
    return cov @ X.T @ Y / SIGMA**2, np.sqrt(np.diag(cov))


@pytest.mark.parametrize("members", [1, 3])
def test_bde_matches_the_exact_posterior_from_any_number_of_members(members):
    # one member used to fail: NumPyro reads a single chain's init_params without the chain axis
    init = {"w": np.tile(np.array([[0.3, 0.2]], np.float32), (members, 1))}
    mcmc = bde(linear, init, X, Y, rng_key=jax.random.PRNGKey(0), num_warmup=300, num_samples=600,
               progress_bar=False)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    assert draws.shape == (members, 600, 2)
    mean, sd = exact_posterior()
    n_eff = ess({"w": draws})["w"]
    assert np.all(np.abs(draws.mean(axis=(0, 1)) - mean) < Z * sd / np.sqrt(n_eff)), (draws.mean(axis=(0, 1)), mean)
    assert np.all(np.abs(draws.std(axis=(0, 1)) / sd - 1) < Z / np.sqrt(2 * n_eff))
