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
    mcmc = bde(linear, init, X, Y, rng_key=jax.random.PRNGKey(0), num_warmup=300, num_samples=600, progress_bar=False)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    assert draws.shape == (members, 600, 2)
    mean, sd = exact_posterior()
    n_eff = ess({"w": draws})["w"]
    assert np.all(np.abs(draws.mean(axis=(0, 1)) - mean) < Z * sd / np.sqrt(n_eff)), (draws.mean(axis=(0, 1)), mean)
    assert np.all(np.abs(draws.std(axis=(0, 1)) / sd - 1) < Z / np.sqrt(2 * n_eff))


OVER_DEVICES = """
import json, warnings
import jax, numpy as np
from test_baselines import X, Y, linear
from numpyro_mile import bde
assert jax.local_device_count() == 3
init = {"w": np.tile(np.array([[0.3, 0.2]], np.float32), (4, 1))}
res = {}
for method in ("auto", "sequential"):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPyro warning about the bar or the chain method
        mcmc = bde(linear, init, X, Y, rng_key=jax.random.PRNGKey(0), num_warmup=100, num_samples=100,
                   chain_method=method, progress_bar=True)
    res[method] = np.asarray(mcmc.get_samples(group_by_chain=True)["w"]).tolist()
    res[method + "_steps"] = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"]).tolist()
    res[method + "_over_devices"] = type(mcmc.chain_method).__name__ == "ChainsOverDevices"
print("RESULT " + json.dumps(res), flush=True)
"""


def test_bde_runs_its_chains_over_every_device_with_the_draws_of_sequential_chains():
    """``bde``'s default ``chain_method="auto"`` on 3 CPU devices with 4 chains: 2 devices run 2 chains each, one
    after another (NUTS chains never wait for each other's trees), each chain with the key and start it has
    under ``"sequential"``: the same draws up to float rounding, the same tree sizes, the progress bar kept."""
    import json
    import os
    import subprocess
    import sys

    import _subprocess

    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.path.dirname(__file__),
        XLA_FLAGS=f"--xla_force_host_platform_device_count=3 {_subprocess.FAST_COMPILE_XLA_FLAGS}",
    )
    proc = subprocess.run([sys.executable, "-c", OVER_DEVICES], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT ") :])
    auto, sequential = np.array(res["auto"]), np.array(res["sequential"])
    assert auto.shape == (4, 100, 2)
    np.testing.assert_allclose(auto, sequential, atol=1e-4)
    assert res["auto_steps"] == res["sequential_steps"]
    assert res["auto_over_devices"] and not res["sequential_over_devices"]
