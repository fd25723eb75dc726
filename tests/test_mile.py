"""MILE kernel: exactness on known targets, cost, reproducibility and errors."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from numpyro_mile import MILE, deep_ensemble
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression

from _stats import check_moments

Z = 5.0  # tolerance in Monte Carlo standard errors (many coordinates are checked at once)


def run(
    model,
    *args,
    num_warmup,
    num_samples,
    num_chains=4,
    seed=0,
    extra_fields=(),
    chain_method="vectorized",
    **kernel_kwargs,
):
    mcmc = MCMC(
        MILE(model, **kernel_kwargs),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=extra_fields)
    return mcmc


SCALES = np.logspace(-1, 1, 100)  # two decades


def gaussian_100d():
    numpyro.sample("x", dist.Normal(0.0, SCALES))


def test_100d_gaussian_moments_and_energy_variance():
    target = 1e-5
    mcmc = run(
        gaussian_100d,
        num_warmup=4000,
        num_samples=8000,
        target_energy_variance=(target, target),
        extra_fields=("energy_change",),
    )
    check_moments(mcmc.get_samples(group_by_chain=True)["x"], 0.0, SCALES**2)
    energy_variance = np.mean(np.asarray(mcmc.get_extra_fields()["energy_change"]) ** 2) / SCALES.size
    assert target / 2 < energy_variance < 2 * target


def correlated_2d():
    cov = jnp.array([[1.0, 0.9], [0.9, 1.0]])
    numpyro.sample("x", dist.MultivariateNormal(jnp.array([1.0, -2.0]), covariance_matrix=cov))


def banana():
    x1 = numpyro.sample("x1", dist.Normal(0.0, 1.0))
    numpyro.sample("x2", dist.Normal(0.5 * (x1**2 - 1.0), 1.0))


def test_correlated_gaussian_moments():
    mcmc = run(correlated_2d, num_warmup=2000, num_samples=8000, target_energy_variance=(1e-4, 1e-4))
    x = mcmc.get_samples(group_by_chain=True)["x"]
    check_moments(x, np.array([1.0, -2.0]), np.array([1.0, 1.0]))
    flat = np.asarray(x).reshape(-1, 2)
    assert abs(np.corrcoef(flat.T)[0, 1] - 0.9) < 0.03


def test_banana_moments():
    mcmc = run(banana, num_warmup=2000, num_samples=8000, target_energy_variance=(1e-4, 1e-4))
    s = mcmc.get_samples(group_by_chain=True)
    x = np.stack([s["x1"], s["x2"]], -1)
    # x1 ~ N(0, 1); x2 | x1 ~ N(0.5 (x1^2 - 1), 1): E x2 = 0, Var x2 = 1 + 0.25 * 2
    check_moments(x, np.zeros(2), np.array([1.0, 1.5]))


class GradCounter:
    """A potential term whose every gradient evaluation is counted on the host."""

    def __init__(self):
        self.count = 0

        @jax.custom_vjp
        def f(x):
            return jnp.sum(x**2)

        def fwd(x):
            return f(x), x

        def bwd(x, g):
            jax.debug.callback(self._tick)
            return (2 * x * g,)

        f.defvjp(fwd, bwd)
        self.f = f

    def _tick(self):
        self.count += 1

    def model(self):
        x = numpyro.sample("x", dist.Normal(0.0, 10.0).expand([3]))
        numpyro.factor("quad", -0.5 * self.f(x))


def test_exactly_two_gradient_evaluations_per_step():
    counts = {}
    for steps in (200, 300):
        counter = GradCounter()
        mcmc = MCMC(MILE(counter.model), num_warmup=100, num_samples=steps - 100, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0))
        jax.effects_barrier()
        counts[steps] = counter.count
    assert counts[300] - counts[200] == 2 * 100
    assert MILE.num_grad_evals(100, 200, num_chains=1) == 2 * 300 + 1


@pytest.fixture(scope="module")
def toy_ensemble():
    X, y = toy_regression(60, seed=1)
    de = deep_ensemble(mlp_regression, jax.random.PRNGKey(3), 2, X, y, hidden=(4,), max_epochs=30, progress_bar=False)
    return X, y, de


def test_same_key_same_samples_and_chain_methods_agree(toy_ensemble):
    X, y, de = toy_ensemble
    # a short run: float32 rounding differences between vmapped and per-chain code grow chaotically
    kw = dict(num_warmup=20, num_samples=50, num_chains=2)
    out = {}
    vectorized = MCMC(
        MILE(mlp_regression, phase_split=(0.4, 0.1, 0.5)), chain_method="vectorized", progress_bar=False, **kw
    )
    sequential = MCMC(
        MILE(mlp_regression, phase_split=(0.4, 0.1, 0.5)), chain_method="sequential", progress_bar=False, **kw
    )
    for name, mcmc in [("v1", vectorized), ("v2", vectorized), ("seq", sequential)]:
        mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,), init_params=de.init_params)
        out[name] = np.asarray(mcmc.get_samples(group_by_chain=True)["w0"])
    np.testing.assert_array_equal(out["v1"], out["v2"])
    np.testing.assert_allclose(out["v1"], out["seq"], rtol=1e-4, atol=1e-4)


def test_warmup_then_run_equals_run(toy_ensemble):
    X, y, de = toy_ensemble
    kw = dict(num_warmup=100, num_samples=20, num_chains=2, chain_method="vectorized", progress_bar=False)
    one = MCMC(MILE(mlp_regression), **kw)
    one.run(jax.random.PRNGKey(0), X, y, hidden=(4,), init_params=de.init_params)
    two = MCMC(MILE(mlp_regression), **kw)
    two.warmup(jax.random.PRNGKey(0), X, y, hidden=(4,), init_params=de.init_params)
    two.run(two.post_warmup_state.rng_key, X, y, hidden=(4,))
    np.testing.assert_allclose(one.get_samples()["w0"], two.get_samples()["w0"], rtol=1e-5)


def test_nan_during_sampling_is_rejected_counted_and_warned():
    def model(trap=False):
        x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]))
        # with trap=True the density is NaN on half of the space the chain has been tuned on
        numpyro.factor("trap", jnp.where(trap & (x[0] > 0.0), jnp.nan, 0.0))

    mcmc = MCMC(MILE(model), num_warmup=200, num_samples=300, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(0), trap=False)
    assert not mcmc.sampler.run_warnings(mcmc.last_state)
    mcmc.run(jax.random.PRNGKey(1), trap=True, extra_fields=("num_nans",))
    x = np.asarray(mcmc.get_samples()["x"])
    assert np.all(np.isfinite(x))
    assert np.all(x[x[:, 0] > 0.0][:, 0] == x[0, 0])  # only the starting point may lie in the trap
    fields = mcmc.get_extra_fields()
    rejected = int(fields["num_nans"][-1] - mcmc.post_warmup_state.num_nans)
    assert rejected > 0
    # every rejected step is reported as NumPyro's 'diverging' (print_summary counts it) and in run_warnings
    assert int(np.sum(fields["diverging"])) == rejected
    assert any("NaN or infinite" in m for m in mcmc.sampler.run_warnings(mcmc.last_state))


def test_tuned_parameters_are_exposed(toy_ensemble):
    X, y, de = toy_ensemble
    mcmc = MCMC(
        MILE(mlp_regression), num_warmup=100, num_samples=5, num_chains=2, progress_bar=False, chain_method="vectorized"
    )
    mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,), init_params=de.init_params, extra_fields=("step_size", "L"))
    state = mcmc.last_state
    assert state.step_size.shape == (2,) and state.L.shape == (2,)
    np.testing.assert_allclose(mcmc.get_extra_fields(group_by_chain=True)["L"][:, -1], state.L)
    assert np.all(np.asarray(state.step_size) != 1e-3)  # tuned away from the initial value


# ----------------------------------------------------------------------------- errors
def test_error_discrete_latent_site():
    def model():
        numpyro.sample("k", dist.Bernoulli(0.5))
        numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]))

    with pytest.raises(ValueError, match=r"discrete latent site\(s\) \['k'\]"):
        MCMC(MILE(model), num_warmup=100, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0))


def test_error_subsample_plate():
    X, y = toy_regression(40)
    with pytest.raises(ValueError, match="full-batch kernel.*SGLD"):
        MCMC(MILE(mlp_regression), num_warmup=100, num_samples=1, progress_bar=False).run(
            jax.random.PRNGKey(0), X, y, subsample_size=8
        )


def test_error_num_warmup_too_small():
    with pytest.raises(ValueError, match="num_warmup=50 is too small"):
        MCMC(MILE(gaussian_100d), num_warmup=50, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0))
    kernel = MILE(mlp_regression)  # raised before pretraining: a bad budget costs no ensemble
    X, y = toy_regression(40)
    with pytest.raises(ValueError, match="num_warmup=50 is too small"):
        MCMC(kernel, num_warmup=50, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), X, y)
    assert kernel.ensembles == []


def test_error_init_params(toy_ensemble):
    X, y, de = toy_ensemble
    mcmc = MCMC(
        MILE(mlp_regression), num_warmup=100, num_samples=1, num_chains=2, progress_bar=False, chain_method="vectorized"
    )
    bad = dict(de.init_params)
    bad.pop("b1")
    with pytest.raises(ValueError, match="one unconstrained array per latent site"):
        mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,), init_params=bad)
    bad = {k: v[:, None] for k, v in de.init_params.items()}
    with pytest.raises(ValueError, match=r"init_params\['w0'\] has shape"):
        mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,), init_params=bad)


PARALLEL_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, numpy as np
from numpyro.infer import MCMC
from numpyro_mile import MILE
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression
X, y = toy_regression(60, seed=1)
out = {}
for method in ["vectorized", "parallel"]:
    kernel = MILE(mlp_regression, phase_split=(0.4, 0.1, 0.5),
                  ensemble_options=dict(max_epochs=5, progress_bar=False))
    mcmc = MCMC(kernel, num_warmup=20, num_samples=20, num_chains=2, chain_method=method, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,))
    out[method] = np.asarray(mcmc.get_samples(group_by_chain=True)["w0"])
assert jax.device_count() == 2
print(float(np.abs(out["vectorized"] - out["parallel"]).max()))
"""


def _run_parallel_script() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PARALLEL_SCRIPT], capture_output=True, text=True, timeout=600)


def test_parallel_chains_with_pretraining_agree_with_vectorized():
    """pmap over 2 (virtual CPU) devices, pretraining traced inside pmap (while-loop path)."""
    result = _run_parallel_script()
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-3


def test_estimate_cost_reports_gradient_count_and_positive_time():
    X, y = toy_regression(40)
    cost = MILE(mlp_regression).estimate_cost(
        jax.random.PRNGKey(0), X, y, num_warmup=1000, num_samples=500, num_chains=3, repeats=3, hidden=(4,)
    )
    assert cost.num_grad_evals == 3 * (2 * 1500 + 1)
    assert cost.seconds_per_step > 0
    assert cost.predicted_seconds == pytest.approx(cost.seconds_per_step * 1500)


@pytest.mark.parametrize("target_energy_variance, variance_bias", [(None, 0.15), ((5e-4, 5e-4), 0.05)])
def test_default_path_samples_a_conjugate_regression(target_energy_variance, variance_bias):
    """``MCMC(MILE(model))`` as a user runs it -- deep-ensemble pretraining on the model's data plate, the three
    tuning phases, NumPyro's loop -- on a regression with a closed-form posterior (N = 10,000, d = 4, 8 chains,
    2,000 + 5,000 steps).

    Tolerance: Monte Carlo error plus the bias of the setting. The default targets (energy variance 0.5 -> 0.1
    per dimension, the BNN setting) leave the draws under-dispersed: variance ratios 0.89-0.91 measured here
    (seeds 0 and 1; 0.87-1.00 on a heavy-tailed design), so 15 % is allowed. The exact setting (5e-4) must be
    within 5 % (0.97-1.02 measured; 0.98-0.99 on the heavy-tailed design)."""
    from _known_answers import check_posterior, conjugate_linear_regression, conjugate_regression

    X, y, mean, cov = conjugate_regression("gaussian")
    options = {} if target_energy_variance is None else dict(target_energy_variance=target_energy_variance)
    kernel = MILE(conjugate_linear_regression, ensemble_options=dict(progress_bar=False), **options)
    mcmc = MCMC(kernel, num_warmup=2000, num_samples=5000, num_chains=8, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    assert len(kernel.ensembles) == 1  # the default path pretrained
    ratios = check_posterior(mcmc.get_samples(group_by_chain=True)["w"], mean, cov, variance_bias=variance_bias, z=Z)
    if target_energy_variance is None:
        assert np.all(ratios < 0.97), ratios  # the documented under-dispersion is there (a sharp test: se 0.007)
