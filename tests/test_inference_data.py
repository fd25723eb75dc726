"""ArviZ conversion of MILE, NUTS, ICSGLD and SGLD runs, and the plots."""

from __future__ import annotations

import warnings

import jax
import matplotlib
import numpy as np
import pytest
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import log_likelihood as numpyro_log_likelihood

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

from numpyro_mile import ICSGLD, MILE, SGLD, importance_weights, metrics, plots  # noqa: E402
from numpyro_mile.datasets import toy_regression  # noqa: E402
from numpyro_mile.models import mlp_regression  # noqa: E402
from numpyro_mile.inference_data import to_inference_data  # noqa: E402

HIDDEN = (4,)
CHAINS, DRAWS = 2, 20
N_TRAIN, N_TEST = 60, 25


@pytest.fixture(scope="module")
def data():
    return toy_regression(N_TRAIN, seed=0), toy_regression(N_TEST, seed=1)


@pytest.fixture(scope="module")
def mile_run(data):
    (X, y), _ = data
    kernel = MILE(mlp_regression, ensemble_options=dict(max_epochs=5, progress_bar=False))
    mcmc = MCMC(
        kernel, num_warmup=100, num_samples=DRAWS, num_chains=CHAINS, chain_method="vectorized", progress_bar=False
    )
    mcmc.run(
        jax.random.PRNGKey(0), X, y, hidden=HIDDEN, extra_fields=("potential_energy", "step_size", "L", "energy_change")
    )
    return mcmc


@pytest.fixture(scope="module")
def mile_idata(mile_run, data):
    _, test = data
    return to_inference_data(mile_run, test=test, batch_size=7)


@pytest.fixture(scope="module")
def nuts_run(data):
    (X, y), _ = data
    mcmc = MCMC(
        NUTS(mlp_regression, max_tree_depth=4),
        num_warmup=30,
        num_samples=DRAWS,
        num_chains=CHAINS,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(1), X, y, hidden=HIDDEN, extra_fields=("potential_energy", "accept_prob", "num_steps"))
    return mcmc


def _direct_test_log_lik(mcmc, test):
    samples = mcmc.get_samples(group_by_chain=True)
    return np.asarray(numpyro_log_likelihood(mlp_regression, samples, *test, batch_ndims=2, hidden=HIDDEN)["y"])


def test_mile_groups_and_shapes(mile_run, mile_idata, data):
    idata = mile_idata
    (_, y), test = data
    for group in ("posterior", "sample_stats", "observed_data", "log_likelihood", "predictions"):
        assert group in idata.groups(), group
    assert sorted(idata.posterior.data_vars) == ["b0", "b1", "w0", "w1"]
    assert idata.posterior["w0"].shape == (CHAINS, DRAWS, 1, 4)
    stats = idata.sample_stats
    assert {"lp", "step_size", "L", "energy_change"} <= set(stats.data_vars)
    assert "potential_energy" not in stats
    pe = np.asarray(mile_run.get_extra_fields(group_by_chain=True)["potential_energy"])
    np.testing.assert_allclose(stats["lp"].values, -pe)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    assert idata.log_likelihood["y"].shape == (CHAINS, DRAWS, N_TEST)
    assert idata.log_likelihood.attrs["data"] == idata.predictions.attrs["data"] == "test"
    assert {"mu", "sigma", "y"} <= set(idata.predictions.data_vars)
    assert idata.predictions["mu"].shape == (CHAINS, DRAWS, N_TEST)
    np.testing.assert_allclose(
        idata.log_likelihood["y"].values, _direct_test_log_lik(mile_run, test), rtol=1e-5, atol=1e-5
    )


def test_arviz_functions_run(mile_idata):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto-k warnings with 40 samples
        loo = az.loo(mile_idata)
        ess = az.ess(mile_idata)
    assert np.isfinite(loo.elpd_loo)
    assert set(ess.data_vars) == {"b0", "b1", "w0", "w1"}


def test_subsample_plate_path(mile_run, mile_idata, data):
    """Samples of the full-batch model, converted with the minibatch model's kwargs."""
    (_, y), test = data
    idata = to_inference_data(mile_run, test=test, batch_size=16, model_kwargs={"subsample_size": 10})
    assert idata.log_likelihood["y"].shape == (CHAINS, DRAWS, N_TEST)
    np.testing.assert_allclose(
        idata.log_likelihood["y"].values, mile_idata.log_likelihood["y"].values, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
        idata.predictions["mu"].values, mile_idata.predictions["mu"].values, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)  # all rows, not 10


def test_nuts_run(nuts_run, data):
    _, test = data
    idata = to_inference_data(nuts_run, test=test, var_names=["w0", "b0"], prediction_sites=["mu"])
    assert sorted(idata.posterior.data_vars) == ["b0", "w0"]
    stats = idata.sample_stats
    assert {"lp", "diverging", "acceptance_rate", "n_steps", "tree_depth"} <= set(stats.data_vars)
    assert stats["diverging"].shape == (CHAINS, DRAWS)
    assert list(idata.predictions.data_vars) == ["mu"]
    np.testing.assert_allclose(
        idata.log_likelihood["y"].values, _direct_test_log_lik(nuts_run, test), rtol=1e-5, atol=1e-5
    )
    assert az.summary(idata, var_names=["b0"]).shape[0] == 4


def test_without_test_data(nuts_run, data):
    (X, y), _ = data
    idata = to_inference_data(nuts_run, train=(X, y))
    assert set(idata.groups()) == {"posterior", "sample_stats", "observed_data"}


def test_errors(nuts_run, data):
    _, (X_test, y_test) = data
    with pytest.raises(ValueError, match="observations last"):
        to_inference_data(nuts_run, test=(X_test,))
    with pytest.raises(ValueError, match="var_names"):
        to_inference_data(nuts_run, var_names=["nope"])
    with pytest.raises(ValueError, match="tuple of model arguments"):
        to_inference_data(nuts_run, train=X_test)


# ------------------------------------------------------------------------------ ICSGLD importance weights


@pytest.fixture(scope="module")
def icsgld_run(data):
    (X, y), _ = data
    kernel = ICSGLD(mlp_regression, 1e-4, zeta=1.0, num_bins=62, bin_width=20.0, min_energy=0.0)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=DRAWS, num_chains=3, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y, hidden=HIDDEN, subsample_size=20, extra_fields=("potential_energy",))
    return mcmc


def test_icsgld_carries_importance_weights(icsgld_run, data):
    _, test = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all fields there: no warning
        idata = to_inference_data(icsgld_run, test=test, prediction_sites=())
    stats = idata.sample_stats
    assert {"importance_weight", "bin", "log_weight", "lp"} <= set(stats.data_vars)
    weight = stats["importance_weight"]
    assert weight.dims == ("chain", "draw") and weight.shape == (3, DRAWS)
    assert weight.dtype == np.float64 and np.all(weight.values >= 0)
    np.testing.assert_allclose(float(weight.sum()), 1.0, rtol=1e-12)  # over all chains and draws
    assert np.ptp(weight.values) > 0  # zeta > 0: not all equal, so the comparisons below mean something
    np.testing.assert_array_equal(weight.values, importance_weights(icsgld_run, group_by_chain=True))
    np.testing.assert_array_equal(weight.values.reshape(-1), importance_weights(icsgld_run))  # get_samples order
    assert (
        "summing to 1 over all chains and draws" in stats.attrs["importance_weight"]
        and "flattened" in stats.attrs["importance_weight"]
    )
    assert weight.attrs["note"] == ICSGLD.weights_note
    # weighted posterior expectations in xarray agree with importance_weights over get_samples()
    mean = (weight * idata.posterior["b1"]).sum(("chain", "draw")).values
    flat = np.asarray(icsgld_run.get_samples()["b1"])
    np.testing.assert_allclose(mean, np.einsum("s,s...->...", importance_weights(icsgld_run), flat), rtol=1e-5)


def test_icsgld_without_the_bin_field_warns(icsgld_run, monkeypatch):
    fields = icsgld_run.get_extra_fields

    def without_bin(*args, **kwargs):
        return {k: v for k, v in fields(*args, **kwargs).items() if k != "bin"}

    monkeypatch.setattr(icsgld_run, "get_extra_fields", without_bin)
    with pytest.warns(UserWarning, match=r"extra_fields=\('bin',\)") as record:
        idata = to_inference_data(icsgld_run)
    assert "ICSGLD" in str(record[0].message) and record[0].filename == __file__
    assert "importance_weight" not in idata.sample_stats and "lp" in idata.sample_stats

    monkeypatch.setattr(icsgld_run, "get_extra_fields", fields)
    monkeypatch.setattr(icsgld_run, "_last_state", None)
    with pytest.warns(UserWarning, match="last_state"):
        idata = to_inference_data(icsgld_run)
    assert "importance_weight" not in idata.sample_stats


def test_icsgld_all_weights_zero_warns(icsgld_run, monkeypatch):
    def overflow(*args, **kwargs):
        raise ValueError("every sample lies in the overflow bin (importance weight 0)")

    monkeypatch.setattr(type(icsgld_run.sampler), "sample_weights", overflow)  # the hook to_inference_data asks
    with pytest.warns(RuntimeWarning, match="overflow bin"):
        idata = to_inference_data(icsgld_run)
    assert "importance_weight" not in idata.sample_stats and "bin" in idata.sample_stats


def test_sgld_has_no_importance_weights(data):
    (X, y), _ = data
    mcmc = MCMC(
        SGLD(mlp_regression, 1e-4),
        num_warmup=50,
        num_samples=DRAWS,
        num_chains=CHAINS,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(3), X, y, hidden=HIDDEN, subsample_size=20, extra_fields=("potential_energy",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idata = to_inference_data(mcmc)
    assert "lp" in idata.sample_stats and "importance_weight" not in idata.sample_stats
    assert "importance_weight" not in idata.sample_stats.attrs


def test_non_icsgld_has_no_importance_weights(nuts_run):
    idata = to_inference_data(nuts_run)
    assert "importance_weight" not in idata.sample_stats


# ------------------------------------------------------------------------------ plots


@pytest.fixture(autouse=False)
def close_figures():
    yield
    plt.close("all")


def test_reliability_diagram(close_figures):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 40, 3))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    fig = plots.reliability_diagram(probs, rng.integers(0, 3, size=40), num_bins=10)
    assert isinstance(fig, Figure)
    assert "ECE" in fig.axes[0].get_title()


def test_predictive_band(mile_idata, data, close_figures):
    (X, y), (X_test, _) = data
    pred = mile_idata.predictions
    mu = pred["mu"].values.reshape(-1, N_TEST)
    sigma = pred["sigma"].values.reshape(-1, N_TEST)
    std = np.sqrt((sigma**2).mean(0) + mu.var(0))
    fig = plots.predictive_band(X, y, X_test, mu.mean(0), std)
    assert isinstance(fig, Figure)
    with pytest.raises(ValueError, match="1-D inputs"):
        plots.predictive_band(np.zeros((3, 2)), np.zeros(3), X_test, mu.mean(0), std)


def test_warmup_trace(close_figures):
    rng = np.random.default_rng(1)
    step = np.exp(rng.normal(size=(2, 30)))
    fig = plots.warmup_trace(step, 10 * step, rng.normal(size=(2, 30)))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    with pytest.raises(ValueError, match="same shape"):
        plots.warmup_trace(step, step[:, :5], step)


def test_lppd_vs_samples(mile_idata, close_figures):
    ll = mile_idata.log_likelihood["y"].values
    fig = plots.lppd_vs_samples(ll)
    assert isinstance(fig, Figure)
    pooled = fig.axes[0].lines[-1]
    assert pooled.get_xdata()[-1] == CHAINS * DRAWS
    np.testing.assert_allclose(pooled.get_ydata()[-1], metrics.lppd(ll), rtol=1e-10)
