"""BayesDLL baselines (numpyro_mile.approx): closed-form answers on Bayesian linear regression, MC-dropout
sampling, prior means, the uniform sampling path and input errors.

Bayesian linear regression with known noise: w ~ N(m0, S0^2 I), y ~ N(X w, SIGMA^2). The posterior is
N(mu, Lambda^-1) with Lambda = I / S0^2 + X^T X / SIGMA^2 and mu = Lambda^-1 (m0 / S0^2 + X^T y / SIGMA^2).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest

from numpyro_mile.approx import ApproxPosterior, fit_laplace, fit_map, fit_mc_dropout, fit_vi
from numpyro_mile.approx._common import Problem
from numpyro_mile.approx.dropout import dropout_plan
from numpyro_mile.evaluation import predictive_probs
from numpyro_mile.models import layer_shapes, mlp_classification

D, SIGMA, S0 = 3, 0.5, 1.0
M0 = np.array([0.5, -0.5, 0.25], np.float32)
W_TRUE = np.array([1.0, -2.0, 0.5], np.float32)


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    y = (X @ W_TRUE + SIGMA * rng.normal(size=n)).astype(np.float32)
    return X, y


def blr(X, y=None, prior_mean=M0, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(jnp.asarray(prior_mean), S0).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
        xb = numpyro.subsample(X, event_dim=1)
        yb = None if y is None else numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(xb @ w, SIGMA), obs=yb)


def exact_posterior(X, y, prior_mean=M0, likelihood_weight=1.0):
    """Mean and precision of the posterior with the likelihood raised to ``likelihood_weight``."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    precision = np.eye(D) / S0**2 + likelihood_weight * X.T @ X / SIGMA**2
    mean = np.linalg.solve(
        precision, np.asarray(prior_mean, np.float64) / S0**2 + likelihood_weight * X.T @ y / SIGMA**2
    )
    return mean, precision


def decaying_adam(start=3e-2, end=1e-4, steps=3000):
    return optax.adam(optax.exponential_decay(start, steps, end / start))


# ------------------------------------------------------------------------------------------------
# VI
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_link, kl_discount", [("softplus", 1.0), ("exp", 0.5)])
def test_vi_matches_exact_mean_field_solution(scale_link, kl_discount):
    """For a Gaussian posterior mean-field VI is exact in the mean, and its variances are the inverse
    diagonal of the precision. With a KL discount kappa, -E log p(y|w) + kappa KL(q||p) is minimised by
    the mean-field fit of p(y | w)^(1/kappa) p(w): the likelihood precision is divided by kappa.

    Tolerance: the answer is deterministic; the error is that of stochastic optimisation (4
    reparameterised draws per step, Adam decaying from lr 3e-2 to 1e-3; a smaller final rate leaves
    the noisy scale gradient unconverged). Measured errors are below 0.04 posterior sd for the mean and
    2% for the scale; we allow 0.1 sd and 5%. Ignoring kappa = 0.5 makes the scale wrong by a factor
    sqrt(2); a KL left unnormalised by N (prior N times too strong) moves the mean by many sd.
    """
    X, y = data(200)
    mean, precision = exact_posterior(X, y, likelihood_weight=1.0 / kl_discount)
    q = fit_vi(
        blr,
        jax.random.PRNGKey(0),
        X,
        y,
        num_steps=3000,
        optimizer=decaying_adam(end=1e-3),
        init_scale=0.1,
        scale_link=scale_link,
        kl_discount=kl_discount,
        num_particles=4,
    )
    sd = 1.0 / np.sqrt(np.diag(precision))
    assert q.method == "vi"
    np.testing.assert_array_less(np.abs(np.asarray(q.loc["w"]) - mean) / sd, 0.1)
    np.testing.assert_allclose(np.asarray(q.scale["w"]), sd, rtol=0.05)


def test_vi_minibatch_through_subsample_plate():
    """Minibatches through the plate give an unbiased ELBO gradient: the fit still matches the exact mean
    (looser tolerance, 0.25 posterior sd, for the extra minibatch noise at the final learning rate)."""
    X, y = data(200)
    mean, precision = exact_posterior(X, y)
    q = fit_vi(
        blr,
        jax.random.PRNGKey(1),
        X,
        y,
        subsample_size=20,
        num_steps=3000,
        optimizer=decaying_adam(end=1e-3),
        init_scale=0.1,
    )
    sd = 1.0 / np.sqrt(np.diag(precision))
    np.testing.assert_array_less(np.abs(np.asarray(q.loc["w"]) - mean) / sd, 0.25)


# ------------------------------------------------------------------------------------------------
# Laplace
# ------------------------------------------------------------------------------------------------

Z = 4.0  # tolerance in standard deviations of the empirical Fisher around the Hessian


def test_laplace_precision_matches_exact_posterior_precision():
    """Diagonal Laplace on BLR: the MAP is the posterior mean, the prior part of the precision is exactly
    1 / S0^2, and the empirical Fisher F_j = sum_i x_ij^2 r_i^2 / SIGMA^4 matches the exact Hessian
    H_j = sum_i x_ij^2 / SIGMA^2 in expectation (r_i ~ N(0, SIGMA^2)). Given X, F_j has standard deviation
    sqrt(2 sum_i x_ij^4) / SIGMA^2 (Var r^2 = 2 SIGMA^4), about 3% of H_j for N = 2000: we allow Z = 4 of
    those. The sum of squared per-example gradients is also checked against the formula at the fitted
    MAP (a squared mean gradient, which is ~0 at the MAP, would fail), and data inflation multiplies F.
    """
    X, y = data(2000, seed=3)
    mean, precision = exact_posterior(X, y)
    la = fit_laplace(blr, jax.random.PRNGKey(0), X, y, num_steps=3000, optimizer=decaying_adam(), chunk_size=300)
    w = np.asarray(la.loc["w"], np.float64)
    sd = 1.0 / np.sqrt(np.diag(precision))
    np.testing.assert_array_less(np.abs(w - mean) / sd, 0.02)

    info = la.info
    np.testing.assert_allclose(np.asarray(info["prior_precision"]["w"]), 1.0 / S0**2, rtol=1e-5)
    resid = np.asarray(y, np.float64) - np.asarray(X, np.float64) @ w
    by_hand = (np.asarray(X, np.float64) ** 2 * resid[:, None] ** 2).sum(0) / SIGMA**4
    np.testing.assert_allclose(np.asarray(info["fisher"]["w"]), by_hand, rtol=1e-4)

    hessian = (np.asarray(X, np.float64) ** 2).sum(0) / SIGMA**2
    fisher_sd = np.sqrt(2.0 * (np.asarray(X, np.float64) ** 4).sum(0)) / SIGMA**2
    np.testing.assert_array_less(np.abs(np.asarray(info["precision"]["w"]) - np.diag(precision)), Z * fisher_sd)
    np.testing.assert_allclose(np.asarray(info["precision"]["w"]), hessian + 1.0 / S0**2, rtol=0.1)
    np.testing.assert_allclose(np.asarray(la.scale["w"]), np.asarray(info["precision"]["w"]) ** -0.5, rtol=1e-6)

    inflated = fit_laplace(blr, jax.random.PRNGKey(0), X, y, map_params=la.loc, data_inflation=3.0)
    np.testing.assert_allclose(
        np.asarray(inflated.info["precision"]["w"]), 3.0 * np.asarray(info["fisher"]["w"]) + 1.0 / S0**2, rtol=1e-5
    )

    # sampling from N(loc, scale^2): moments within 5 Monte Carlo standard errors
    S = 4000
    draws = np.asarray(la.sample(jax.random.PRNGKey(2), S)["w"], np.float64)
    scale = np.asarray(la.scale["w"], np.float64)
    assert draws.shape == (S, D)
    np.testing.assert_array_less(np.abs(draws.mean(0) - w), 5 * scale / np.sqrt(S))
    np.testing.assert_array_less(np.abs(draws.std(0) / scale - 1.0), 5 / np.sqrt(2 * S))


# ------------------------------------------------------------------------------------------------
# MAP and prior means
# ------------------------------------------------------------------------------------------------


def test_map_prior_mean_shift_and_data_inflation():
    """MAP of BLR = posterior mean; moving the prior mean by delta moves it by Lambda^-1 delta / S0^2;
    data inflation a weights the likelihood by a. Deterministic full-batch optimisation: 1e-3 tolerance."""
    X, y = data(4, seed=5)
    delta = np.array([2.0, 0.0, -4.0], np.float32)
    opt = dict(num_steps=3000, optimizer=decaying_adam(end=1e-5))
    base = fit_map(blr, jax.random.PRNGKey(0), X, y, **opt)
    shifted = fit_map(blr, jax.random.PRNGKey(0), X, y, prior_mean=M0 + delta, **opt)
    inflated = fit_map(blr, jax.random.PRNGKey(0), X, y, data_inflation=4.0, **opt)
    mean, precision = exact_posterior(X, y)
    shift = np.linalg.solve(precision, delta / S0**2)
    assert np.abs(shift).max() > 0.1  # the prior matters with 4 rows
    np.testing.assert_allclose(np.asarray(base.loc["w"]), mean, atol=1e-3)
    np.testing.assert_allclose(np.asarray(shifted.loc["w"]) - np.asarray(base.loc["w"]), shift, atol=2e-3)
    np.testing.assert_allclose(
        np.asarray(inflated.loc["w"]), exact_posterior(X, y, likelihood_weight=4.0)[0], atol=1e-3
    )
    np.testing.assert_array_equal(np.asarray(base.scale["w"]), 0.0)
    np.testing.assert_allclose(
        np.asarray(base.sample(jax.random.PRNGKey(1), 3)["w"]), np.tile(np.asarray(base.loc["w"]), (3, 1))
    )


# ------------------------------------------------------------------------------------------------
# MC-dropout
# ------------------------------------------------------------------------------------------------


def test_mc_dropout_optimum_on_linear_regression():
    """With every coordinate dropped to m0 with probability p, the expected loss of BLR is quadratic in
    d = m - m0: E_z |r0 - X (z * d)|^2 = |r0 - (1 - p) X d|^2 + p (1 - p) sum_j ||X_j||^2 d_j^2, plus the
    KL (1 - p) |d|^2 / (2 S0^2). Its minimiser solves
    [(1 - p) X^T X + p diag(X^T X) + SIGMA^2 / S0^2 I] d = X^T r0.
    The optimisation is stochastic (one mask per step); Adam decays to lr 1e-4: we allow 0.01 absolute
    (the solution is O(1)); a KL weight of 1 instead of 1 - p, or dropping to 0 instead of m0, is off by
    more than 0.05 here."""
    X, y = data(5, seed=7)
    p = 0.3
    Xd, r0 = np.asarray(X, np.float64), np.asarray(y, np.float64) - np.asarray(X, np.float64) @ M0
    lhs = (1 - p) * Xd.T @ Xd + p * np.diag((Xd**2).sum(0)) + SIGMA**2 / S0**2 * np.eye(D)
    expected = M0 + np.linalg.solve(lhs, Xd.T @ r0)
    q = fit_mc_dropout(
        blr,
        jax.random.PRNGKey(0),
        X,
        y,
        drop_prob=p,
        bias_sites=(),
        num_steps=4000,
        optimizer=decaying_adam(3e-2, 1e-4, 4000),
    )
    np.testing.assert_allclose(np.asarray(q.loc["w"]), expected, atol=1e-2)
    np.testing.assert_allclose(np.asarray(q.anchor["w"]), M0)
    mean = q.sample(jax.random.PRNGKey(0), 0)["w"]
    np.testing.assert_allclose(np.asarray(mean[0]), (1 - p) * np.asarray(q.loc["w"]) + p * M0, rtol=1e-6)


def _mlp_problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int32)
    shapes = layer_shapes(5, (6,), 2)
    prior_mean = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}
    return X, y, dict(num_classes=2, hidden=(6,), prior_mean=prior_mean)


def test_mc_dropout_sampling_shapes_and_rate():
    """Draws keep the site shapes; weights (and spikymix biases) equal the prior mean with frequency p
    within 5 binomial standard errors; Gaussian and uninformative biases are never dropped; the KL
    weight of a site is 1 - p when dropped, 1 for a Gaussian bias, 0 for an uninformative one."""
    X, y, kwargs = _mlp_problem()
    p, nst = 0.3, 500
    for bias in ("spikymix", "gaussian"):
        q = fit_mc_dropout(
            mlp_classification, jax.random.PRNGKey(0), X, y, drop_prob=p, bias=bias, num_steps=50, **kwargs
        )
        draws = q.sample(jax.random.PRNGKey(1), nst)
        for name, shape in layer_shapes(5, (6,), 2).items():
            assert draws[name].shape == (nst, *shape)
            np.testing.assert_array_equal(np.asarray(q.anchor[name]), np.asarray(kwargs["prior_mean"][name]))
            assert not np.any(np.asarray(q.loc[name]) == np.asarray(q.anchor[name]))
            dropped = np.asarray(draws[name]) == np.asarray(q.anchor[name])
            kept = np.asarray(draws[name]) == np.asarray(q.loc[name])
            assert np.all(dropped | kept)
            is_bias = name.startswith("b")
            rate = 0.0 if (is_bias and bias == "gaussian") else p
            assert abs(dropped.mean() - rate) < 5 * np.sqrt(p * (1 - p) / dropped.size), (bias, name, dropped.mean())
            assert q.info["kl_weight"][name] == pytest.approx(1.0 if (is_bias and bias == "gaussian") else 1 - p)
        assert all(v.shape[0] == 1 for v in q.sample(jax.random.PRNGKey(1), 0).values())
    probs = predictive_probs(mlp_classification, draws, X, **{k: v for k, v in kwargs.items() if k != "prior_mean"})
    assert probs.shape == (40, 2) and np.allclose(probs.sum(1), 1.0, atol=1e-5)
    problem = Problem(mlp_classification, (X, y), kwargs, "test")
    drop, kl_weight = dropout_plan(problem, p, "uninformative", None)
    assert drop == {"w0": p, "b0": 0.0, "w1": p, "b1": 0.0}
    assert kl_weight == pytest.approx({"w0": 1 - p, "b0": 0.0, "w1": 1 - p, "b1": 0.0})


def test_pretrained_prior_mean_pulls_the_map():
    """A tight prior (scale 0.01) centred on 'pretrained' weights (the model's prior_mean) holds the MAP of an
    MLP there: at the optimum theta - theta0 = prior_scale^2 * grad log p(y | theta), and the gradient of a
    softmax log-likelihood of 40 rows with O(1) activations is O(10), so the offset is O(1e-3); we allow
    0.02. Without the prior mean the MAP lies far (> 0.5) from those weights."""
    X, y, kwargs = _mlp_problem()
    opt = dict(num_steps=2000, optimizer=decaying_adam(5e-2, 1e-4, 2000))
    post = fit_map(mlp_classification, jax.random.PRNGKey(0), X, y, prior_scale=0.01, **opt, **kwargs)
    free = fit_map(
        mlp_classification, jax.random.PRNGKey(0), X, y, prior_scale=0.01, **opt, **{**kwargs, "prior_mean": None}
    )
    gaps = {k: np.abs(np.asarray(post.loc[k]) - np.asarray(v)).max() for k, v in kwargs["prior_mean"].items()}
    assert max(gaps.values()) < 0.02, gaps
    assert max(np.abs(np.asarray(free.loc[k]) - np.asarray(v)).max() for k, v in kwargs["prior_mean"].items()) > 0.5


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------


def no_plate_model(y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(w, 1.0), obs=y)


def test_bad_inputs_raise_clear_errors():
    X, y = data(10)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="plate named 'data'"):
        fit_map(no_plate_model, key, np.zeros(3))
    with pytest.raises(ValueError, match="drop_prob"):
        fit_mc_dropout(blr, key, X, y, drop_prob=1.0)
    with pytest.raises(ValueError, match="bias must be one of"):
        fit_mc_dropout(blr, key, X, y, bias="zero")
    with pytest.raises(ValueError, match="scale_link"):
        fit_vi(blr, key, X, y, scale_link="relu")
    with pytest.raises(ValueError, match="kl_discount"):
        fit_vi(blr, key, X, y, kl_discount=0.0)
    with pytest.raises(ValueError, match="data_inflation"):
        fit_laplace(blr, key, X, y, data_inflation=-1.0)
    with pytest.raises(ValueError, match="init_params"):
        fit_map(blr, key, X, y, init_params={"w": np.zeros(4)})
    post = ApproxPosterior("map", {"w": jnp.zeros(D)}, {"w": jnp.zeros(D)}, None, None, lambda u: u, {})
    with pytest.raises(ValueError, match="nst"):
        post.sample(key, -1)


def test_reliability_grid_one_panel_per_method():
    import matplotlib

    matplotlib.use("Agg")
    from numpyro_mile.plots import reliability_grid

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=(4, 30))  # (S, N, C)
    y = rng.integers(0, 3, 30)
    fig = reliability_grid(
        {"VI": probs, "MAP": probs[0], "ICSGLD": probs},
        y,
        num_bins=5,
        ncols=2,
        weights_by_method={"ICSGLD": np.array([0.7, 0.1, 0.1, 0.1])},
    )
    assert [ax.get_title().split(" ")[0] for ax in fig.axes] == ["VI", "MAP", "ICSGLD"]
    with pytest.raises(ValueError, match="at least one method"):
        reliability_grid({}, y)
