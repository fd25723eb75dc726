"""Chunked prediction and log-likelihood against NumPyro's all-at-once versions."""

from __future__ import annotations

import contextlib
import warnings

import jax
import numpy as np
import pytest
from numpyro.infer import Predictive
from numpyro.infer.util import log_likelihood as numpyro_log_likelihood

from numpyro_mile import _programs, metrics
from numpyro_mile import predictive as P
from numpyro_mile.evaluation import evaluate_regression
from numpyro_mile.models import mlp_classification, mlp_regression

HIDDEN = (4,)
NUM_SAMPLES = 23


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2)).astype(np.float32)
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.normal(size=30)).astype(np.float32)
    return X, y


@pytest.fixture(scope="module")
def samples(data):
    """Prior draws of the weights, scaled down so that sigma stays moderate."""
    X, _ = data
    prior = Predictive(mlp_regression, num_samples=NUM_SAMPLES)(jax.random.PRNGKey(1), X, hidden=HIDDEN)
    return {k: 0.5 * np.asarray(v) for k, v in prior.items() if k[0] in "wb"}


@pytest.fixture(scope="module")
def reference(data, samples):
    X, _ = data
    ref = jax.jit(lambda key: Predictive(mlp_regression, samples)(key, X, hidden=HIDDEN))(jax.random.PRNGKey(2))
    return {k: np.asarray(v) for k, v in ref.items()}


@pytest.fixture
def count_traces(monkeypatch):
    traces = []
    monkeypatch.setattr(P, "_on_trace", lambda: traces.append(1))
    monkeypatch.setattr(_programs, "_PROGRAMS", type(_programs._PROGRAMS)())  # programs compiled by this test only
    return traces


def test_a_second_call_on_new_data_of_the_same_shapes_reuses_the_program(data, samples, count_traces):
    """predict and log_likelihood compile once per model, sites and shapes: a call on other data of the same shapes
    (the next batch of test rows, a refitted estimator's predictions) is not traced again."""
    X, y = data
    first = P.predict(mlp_regression, samples, X, return_sites=["mu"], hidden=HIDDEN)["mu"]
    second = P.predict(mlp_regression, samples, X + 1.0, return_sites=["mu"], hidden=HIDDEN)["mu"]
    P.log_likelihood(mlp_regression, samples, X, y, hidden=HIDDEN)
    P.log_likelihood(mlp_regression, samples, X, y + 1.0, hidden=HIDDEN)
    assert len(count_traces) == 2 and not np.allclose(first, second)
    P.predict(mlp_regression, samples, X, return_sites=["sigma"], hidden=HIDDEN)  # other sites: another program
    assert len(count_traces) == 3


# non-divisors of 23, and more than 23; vectorised and looped chunks
@pytest.mark.parametrize("batch_size, parallel", [(3, True), (7, False), (64, None)])
def test_predict_equals_predictive(data, samples, reference, batch_size, parallel, count_traces):
    X, _ = data
    out = P.predict(
        mlp_regression,
        samples,
        X,
        batch_size=batch_size,
        rng_key=jax.random.PRNGKey(2),
        parallel=parallel,
        hidden=HIDDEN,
    )
    assert len(count_traces) == 1  # one compilation: the last chunk is padded
    assert sorted(out) == sorted(reference) == ["mu", "sigma", "y"]
    for name, ref in reference.items():
        assert isinstance(out[name], np.ndarray)
        assert out[name].shape == ref.shape == (NUM_SAMPLES, X.shape[0])
        np.testing.assert_allclose(out[name], ref, rtol=1e-6, atol=1e-6)


def test_predict_return_sites_chain_axis_typed_key(data, samples):
    X, _ = data
    grouped = {k: v[:22].reshape(2, 11, *v.shape[1:]) for k, v in samples.items()}
    key = jax.random.key(3)
    ref = jax.jit(
        lambda k: Predictive(mlp_regression, grouped, batch_ndims=2, return_sites=["mu", "y"])(k, X, hidden=HIDDEN)
    )(key)
    out = P.predict(
        mlp_regression,
        grouped,
        X,
        batch_size=4,
        return_sites=["mu", "y"],
        rng_key=key,
        chain_axis=True,
        parallel=False,
        hidden=HIDDEN,
    )
    assert sorted(out) == ["mu", "y"]
    for name in out:
        assert out[name].shape == (2, 11, X.shape[0])
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-6, atol=1e-6)


def test_moments_equal_numpy(data, samples, reference, count_traces):
    X, _ = data
    out = P.predict(
        mlp_regression,
        samples,
        X,
        batch_size=7,
        reduce="moments",
        rng_key=jax.random.PRNGKey(2),
        parallel=True,
        hidden=HIDDEN,
    )
    assert len(count_traces) == 1
    for name, ref in reference.items():
        full = ref.astype(np.float64)
        assert isinstance(out[name], P.Moments) and out[name].count == NUM_SAMPLES
        np.testing.assert_allclose(out[name].mean, full.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[name].var, full.var(axis=0), rtol=1e-4, atol=1e-6)


def test_moments_and_log_likelihood_classification(data):
    X, _ = data
    labels = (X[:, 0] > 0).astype(np.int32)
    kwargs = dict(num_classes=3, hidden=HIDDEN)
    prior = Predictive(mlp_classification, num_samples=9)(jax.random.PRNGKey(5), X, **kwargs)
    cls_samples = {k: np.asarray(v) for k, v in prior.items() if k[0] in "wb"}
    full = np.asarray(prior["logits"], dtype=np.float64)  # (9, 30, 3), deterministic given the weights
    mom = P.predict(
        mlp_classification, cls_samples, X, batch_size=4, return_sites=["logits"], reduce="moments", **kwargs
    )["logits"]
    assert mom.mean.shape == mom.var.shape == (30, 3)
    np.testing.assert_allclose(mom.mean, full.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mom.var, full.var(0), rtol=1e-4, atol=1e-6)
    ll = P.log_likelihood(mlp_classification, cls_samples, X, labels, batch_size=4, **kwargs)
    ref = numpyro_log_likelihood(mlp_classification, cls_samples, X, labels, **kwargs)
    np.testing.assert_allclose(ll["y"], ref["y"], rtol=1e-6, atol=1e-6)


def test_log_likelihood_equals_numpyro(data, samples):
    X, y = data
    ref = numpyro_log_likelihood(mlp_regression, samples, X, y, hidden=HIDDEN)
    out = P.log_likelihood(mlp_regression, samples, X, y, batch_size=6, hidden=HIDDEN)
    assert sorted(out) == ["y"] and out["y"].shape == (NUM_SAMPLES, X.shape[0])
    np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-6, atol=1e-6)

    grouped = {k: v[:20].reshape(4, 5, *v.shape[1:]) for k, v in samples.items()}
    by_chain = P.log_likelihood(
        mlp_regression, grouped, X, y, batch_size=6, chain_axis=True, parallel=True, hidden=HIDDEN
    )
    assert by_chain["y"].shape == (4, 5, X.shape[0])
    np.testing.assert_allclose(by_chain["y"].reshape(20, -1), ref["y"][:20], rtol=1e-6, atol=1e-6)


def test_subsample_plate_uses_all_rows(data, samples, reference):
    X, y = data
    ref = numpyro_log_likelihood(mlp_regression, samples, X, y, hidden=HIDDEN)["y"]
    with _no_warning():
        ll = P.log_likelihood(mlp_regression, samples, X, y, batch_size=8, hidden=HIDDEN, subsample_size=10)
    assert ll["y"].shape == ref.shape  # every row, not a minibatch of 10
    np.testing.assert_allclose(ll["y"], ref, rtol=1e-6, atol=1e-6)
    out = P.predict(
        mlp_regression, samples, X, batch_size=8, rng_key=jax.random.PRNGKey(2), hidden=HIDDEN, subsample_size=10
    )
    for name in reference:
        np.testing.assert_allclose(out[name], reference[name], rtol=1e-6, atol=1e-6)


def test_full_plate_model_leaves_full_batch_models_alone(data):
    X, y = data
    assert P.full_plate_model(mlp_regression, (X, y), {"hidden": HIDDEN}) is mlp_regression
    wrapped = P.full_plate_model(mlp_regression, (X, y), {"hidden": HIDDEN, "subsample_size": 10})
    assert wrapped is not mlp_regression and wrapped.__wrapped__ is mlp_regression


def test_evaluate_regression_with_weights(data, samples):
    X, y = data
    plain = evaluate_regression(mlp_regression, samples, X, y, hidden=HIDDEN)
    uniform = evaluate_regression(
        mlp_regression, samples, X, y, weights=np.full(NUM_SAMPLES, 1 / NUM_SAMPLES), hidden=HIDDEN
    )
    np.testing.assert_allclose(uniform, plain, rtol=1e-5)
    # all the weight on draw 3: the metrics of draw 3 alone
    one_hot = np.eye(NUM_SAMPLES)[3]
    weighted = evaluate_regression(mlp_regression, samples, X, y, weights=one_hot, hidden=HIDDEN)
    alone = evaluate_regression(mlp_regression, {k: v[3:4] for k, v in samples.items()}, X, y, hidden=HIDDEN)
    np.testing.assert_allclose(weighted, alone, rtol=1e-5)
    assert abs(weighted[1] - plain[1]) > 1e-3  # the weights changed the answer


def test_errors(data, samples):
    X, y = data
    with pytest.raises(ValueError, match="batch_size"):
        P.predict(mlp_regression, samples, X, batch_size=0, hidden=HIDDEN)
    with pytest.raises(ValueError, match="reduce"):
        P.predict(mlp_regression, samples, X, reduce="quantiles", hidden=HIDDEN)
    with pytest.raises(ValueError, match="non-empty dict"):
        P.predict(mlp_regression, {}, X, hidden=HIDDEN)
    bad = dict(samples, b0=samples["b0"][:5])
    with pytest.raises(ValueError, match="different numbers"):
        P.log_likelihood(mlp_regression, bad, X, y, hidden=HIDDEN)
    with pytest.raises(ValueError, match="chains, draws"):
        P.predict(mlp_regression, {"b0": np.zeros(3)}, X, chain_axis=True, hidden=HIDDEN)
    with pytest.raises(ValueError, match="no observed sample site"):
        P.log_likelihood(mlp_regression, samples, X, hidden=HIDDEN)


@contextlib.contextmanager
def _no_warning():
    """Fail on a UserWarning inside the block (the plate substitution must be silent)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        yield


def test_predictive_probs_average_softmax_over_samples_in_chunks():
    from numpyro_mile.evaluation import evaluate_classification, predictive_probs
    from numpyro_mile.models import mlp_apply, mlp_classification

    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=7)
    shapes = {"w0": (3, 5), "b0": (5,), "w1": (5, 4), "b1": (4,)}
    samples = {k: rng.normal(size=(5, *s)).astype(np.float32) for k, s in shapes.items()}
    probs = predictive_probs(mlp_classification, samples, X, batch_size=2, num_classes=4, hidden=(5,))
    manual = np.mean(
        [jax.nn.softmax(mlp_apply({k: v[s] for k, v in samples.items()}, X), axis=-1) for s in range(5)], axis=0
    )
    np.testing.assert_allclose(probs, manual, rtol=1e-5, atol=1e-6)
    scores = evaluate_classification(mlp_classification, samples, X, y, num_classes=4, hidden=(5,))
    assert scores["lppd"] == pytest.approx(np.mean(np.log(manual[np.arange(7), y])), rel=1e-5)


def test_intervals_from_y_draws_hold_when_a_few_draws_have_a_huge_noise_scale():
    """The README's advice on a posterior whose noise scale is 1e5 at 2 % of its draws (as heteroscedastic BNN
    posteriors can have at a test input): quantile intervals of the sampled ``y`` keep their coverage and width,
    the mean of ``mu`` stays a good point prediction, while the mean of the ``y`` draws is off by orders of
    magnitude.

    The draws' network computes ``mu = x0 - 0.5 x1`` exactly and ``sigma = 0.3`` (1e5 in 10 of 500 draws). At
    each input the predictive is then 0.98 N(mu, 0.3^2) + 0.02 N(mu, 1e10), whose central 90 % interval is
    mu +- 1.741 * 0.3 (the wide part puts about 1 % outside on each side): 91.8 % of the test points fall in it.
    """
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2000, 2)).astype(np.float32)
    truth = X[:, 0] - 0.5 * X[:, 1]
    y = truth + 0.3 * rng.normal(size=2000)
    w0 = np.array([[1, -1, 0, 0], [0, 0, 1, -1]], np.float32)  # relu(x0), relu(-x0), relu(x1), relu(-x1)
    w1 = np.array([[1, 0], [-1, 0], [-0.5, 0], [0.5, 0]], np.float32)  # mu from them; log sigma from the bias
    S = 500
    sigma = np.full(S, 0.3, np.float32)
    sigma[rng.choice(S, 10, replace=False)] = 1e5
    draws = dict(
        w0=np.broadcast_to(w0, (S, 2, 4)),
        b0=np.zeros((S, 4), np.float32),
        w1=np.broadcast_to(w1, (S, 4, 2)),
        b1=np.stack([np.zeros(S, np.float32), np.log(sigma)], 1),
    )
    out = P.predict(mlp_regression, draws, X, hidden=(4,), return_sites=["y", "mu"], rng_key=jax.random.PRNGKey(4))
    np.testing.assert_allclose(out["mu"][0], truth, rtol=1e-5, atol=1e-5)
    y_draws = out["y"]
    lo, hi = np.quantile(y_draws, [0.05, 0.95], axis=0)
    covered = metrics.coverage(y, y_draws, levels=(0.9,))[0.9]
    assert abs(covered - 0.918) < 0.03, covered  # se 0.006, plus the quantiles' own noise
    assert np.all(hi - lo < 2 * 0.3 * 2.5), np.max(hi - lo)  # 2 x 1.741 x 0.3 = 1.04, not 1e5
    mu_mean = P.predict(mlp_regression, draws, X, hidden=(4,), reduce="moments")["mu"].mean
    assert metrics.rmse(y, mu_mean) < 0.33  # the noise sd: as good as it gets
    assert metrics.rmse(y, y_draws.mean(0)) > 100  # the mean of the y draws: off by 1e5 / 50
