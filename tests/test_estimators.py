"""The scikit-learn estimators: scikit-learn's own estimator checks, the posterior they sample (a conjugate model
whose predictive is known), predictions in the data's units, pipelines, pickling, pandas and real data."""

from __future__ import annotations

import io
import pickle

import jax
import jax.numpy as jnp
import joblib
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import effective_sample_size
from scipy.special import ndtr
from sklearn.base import clone
from sklearn.metrics import log_loss
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from numpyro_mile import enable_compilation_cache, estimators, uncertainty
from numpyro_mile.estimators import MILEClassifier, MILERegressor

#: a budget that keeps each of scikit-learn's many small fits to about a second once compiled
SMALL = dict(
    hidden=(8,),
    num_chains=2,
    num_warmup=200,
    num_samples=20,
    thinning=1,
    progress_bar=False,
    ensemble_options=dict(max_epochs=50),
)


@pytest.fixture(autouse=True, scope="module")
def _compilation_cache(tmp_path_factory):
    """scikit-learn's checks refit clones on the same shapes dozens of times: each NumPyro run traces its loop
    again, and JAX's persistent cache spares XLA's compilation (3 s a fit here); restored afterwards."""
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    before = {name: getattr(jax.config, name) for name in names}
    enable_compilation_cache(tmp_path_factory.getbasetemp().parent / "estimator-compilation-cache")
    yield
    for name, value in before.items():
        jax.config.update(name, value)


@parametrize_with_checks([MILERegressor(**SMALL), MILEClassifier(**SMALL)])
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def _regression_data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, 3.0 + 2.0 * np.sin(X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=n)


# -- the posterior an estimator samples ------------------------------------------------------------------------

NOISE = 0.5  # known noise scale of the conjugate model, in standardised target units


def linear_gaussian(X, y=None):
    """Bayesian linear regression with a known noise scale: its posterior and predictive are Gaussian and known."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        mu = numpyro.subsample(X, event_dim=1) @ w
        sigma = jnp.full(mu.shape, NOISE)
        if y is None:
            numpyro.deterministic("mu", mu)
            numpyro.deterministic("sigma", sigma)
        numpyro.sample("y", dist.Normal(mu, sigma), obs=None if y is None else numpyro.subsample(y, event_dim=0))


@pytest.mark.slow
def test_custom_model_predictive_matches_the_conjugate_answer():
    """MILERegressor(model=...) on a conjugate model: predictive mean and epistemic sd at new inputs, in the data's
    units, agree with the exact posterior within Monte Carlo error (ESS of the draws); the aleatoric part is the
    known noise scale times y's sd. Fails when the estimator forgets to standardise or to map back."""
    rng = np.random.default_rng(3)
    X = rng.normal(loc=5.0, scale=2.0, size=(40, 2))
    y = 100.0 + 30.0 * X[:, 0] - 10.0 * X[:, 1] + 40.0 * rng.normal(size=40)
    reg = MILERegressor(
        linear_gaussian, num_chains=4, num_warmup=2000, num_samples=2000, thinning=2, progress_bar=False, random_state=1
    ).fit(X, y)
    X_new = rng.normal(loc=5.0, scale=3.0, size=(5, 2))

    scaler = reg.scaler_
    Xs, ys = scaler.transform_x(X), scaler.transform_y(y)
    precision = np.eye(2) + Xs.T @ Xs / NOISE**2
    cov = np.linalg.inv(precision)
    mean_w = cov @ Xs.T @ ys / NOISE**2
    Xs_new = scaler.transform_x(X_new)
    exact_mean = scaler.inverse_y(Xs_new @ mean_w)
    exact_sd = np.sqrt(np.einsum("ni,ij,nj->n", Xs_new, cov, Xs_new)) * scaler.y_std

    parts = reg.predict_uncertainty(X_new)
    w = reg.samples_["w"].reshape(4, -1, 2)
    ess = float(np.min(effective_sample_size(w)))
    assert ess > 200, ess
    # Monte Carlo sd of a posterior mean is sd / sqrt(ESS); of a posterior sd about sd / sqrt(2 ESS)
    np.testing.assert_array_less(np.abs(parts.mean - exact_mean), 4 * exact_sd / np.sqrt(ess))
    np.testing.assert_array_less(np.abs(parts.epistemic_std - exact_sd), 4 * exact_sd / np.sqrt(2 * ess) + 1e-9)
    np.testing.assert_allclose(parts.aleatoric_std, NOISE * scaler.y_std, rtol=1e-5)
    np.testing.assert_allclose(parts.std, np.hypot(parts.aleatoric_std, parts.epistemic_std), rtol=1e-6)


def test_predictions_come_back_in_the_datas_units():
    """Scaling X and y by powers of two leaves the standardised problem bit for bit the same: every prediction
    scales with y, and the log density shifts by -log(scale)."""
    X, y = _regression_data()
    a, c = 8.0, 4.0
    base = MILERegressor(**SMALL).fit(X, y)
    scaled = MILERegressor(**SMALL).fit(c * X, a * y)
    mean, std = base.predict(X[:10], return_std=True)
    mean_s, std_s = scaled.predict(c * X[:10], return_std=True)
    np.testing.assert_allclose(mean_s, a * mean, rtol=1e-5)
    np.testing.assert_allclose(std_s, a * std, rtol=1e-5)
    np.testing.assert_allclose(scaled.predict_quantiles(c * X[:10]), a * base.predict_quantiles(X[:10]), rtol=1e-5)
    np.testing.assert_allclose(
        scaled.log_predictive_density(c * X, a * y), base.log_predictive_density(X, y) - np.log(a), rtol=1e-5
    )
    lower, upper = base.predict_interval(X[:10], 0.5)
    np.testing.assert_allclose(np.stack([lower, upper]), base.predict_quantiles(X[:10], (0.25, 0.75)))


def test_regression_density_and_intervals_agree_with_the_draws():
    """log_predictive_density (through the model's log-likelihood) equals the mixture density of the mu / sigma draws
    at y; a predictive quantile is where the mixture's CDF of those draws reaches its probability."""
    X, y = _regression_data()
    reg = MILERegressor(**SMALL).fit(X, y)
    draws = reg.predict_draws(X)
    mu, sigma = draws["mu"], draws["sigma"]
    density = np.mean(np.exp(-0.5 * ((y - mu) / sigma) ** 2) / (np.sqrt(2 * np.pi) * sigma), axis=0)
    np.testing.assert_allclose(reg.log_predictive_density(X, y), np.mean(np.log(density)), rtol=1e-4)
    q = reg.predict_quantiles(X, (0.1, 0.9))
    for row, p in zip(q, (0.1, 0.9)):
        np.testing.assert_allclose(ndtr((row - mu) / sigma).mean(axis=0), p, atol=1e-6)


def test_predictions_chunk_by_chunk_of_rows_equal_one_chunk(monkeypatch):
    """Predictions reduce the draws chunk by chunk of rows (memory bounded whatever N), the last chunk padded: the
    same numbers as one chunk of all rows."""
    X, y = _regression_data()
    reg = MILERegressor(**SMALL).fit(X, y)
    whole = (
        *reg.predict(X, return_std=True),
        reg.predict_quantiles(X),
        reg.log_predictive_density(X, y),
        reg.predict_draws(X)["mu"],
    )
    monkeypatch.setattr(estimators, "_CHUNK_FLOATS", 40 * 2 * 7)  # 40 draws x (mu, sigma): 7 rows a chunk, 18 chunks
    chunked = (
        *reg.predict(X, return_std=True),
        reg.predict_quantiles(X),
        reg.log_predictive_density(X, y),
        reg.predict_draws(X)["mu"],
    )
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_custom_model_settings_are_checked():
    X, y = _regression_data(40)
    with pytest.warns(UserWarning, match="set the default network only"):
        MILERegressor(linear_gaussian, **{**SMALL, "hidden": (4,)}).fit(X, y)
    with pytest.raises(ValueError, match="subsample_size keyword"):
        MILERegressor(linear_gaussian, **{k: v for k, v in SMALL.items() if k != "hidden"}, sampler="psmile").fit(X, y)
    with pytest.raises(ValueError, match="hidden must be a sequence"):
        MILERegressor(**{**SMALL, "hidden": 16}).fit(X, y)


def test_classifier_decodes_labels_and_splits_its_entropy(monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 2))
    labels = np.array(["low", "mid", "high"])
    y = labels[np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])]
    clf = MILEClassifier(**SMALL).fit(X, y)
    assert sorted(clf.classes_.tolist()) == sorted(labels.tolist())
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert set(clf.predict(X)) <= set(labels.tolist()) and clf.score(X, y) > 0.8
    # the LPPD of labels is minus the log loss of the predictive probabilities, by definition
    np.testing.assert_allclose(clf.log_predictive_density(X, y), -log_loss(y, proba, labels=clf.classes_), rtol=1e-4)
    u = clf.predict_uncertainty(X)
    np.testing.assert_allclose(u.proba, proba)
    np.testing.assert_allclose(u.entropy, u.aleatoric + u.epistemic, atol=1e-9)
    assert np.all(u.epistemic >= 0) and np.all(u.entropy <= np.log(3) + 1e-9)
    with pytest.raises(ValueError, match="not seen in fit"):
        clf.log_predictive_density(X[:2], np.array(["low", "unknown"]))
    monkeypatch.setattr(estimators, "_CHUNK_FLOATS", 40 * 3 * 11)  # 11 rows a chunk, the last one padded
    np.testing.assert_allclose(clf.predict_proba(X), proba, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(clf.predict_uncertainty(X).epistemic, u.epistemic, rtol=1e-6, atol=1e-9)


def test_pipeline_grid_search_and_cross_validation():
    X, y = _regression_data(80)
    pipe = make_pipeline(StandardScaler(), MILERegressor(**SMALL))
    search = GridSearchCV(pipe, {"mileregressor__prior_scale": [0.5, 1.0]}, cv=2).fit(X, y)
    assert search.best_params_["mileregressor__prior_scale"] in (0.5, 1.0)
    assert search.score(X, y) > 0.5
    scores = cross_val_score(clone(pipe), X, y, cv=2)
    assert scores.shape == (2,) and np.all(scores > 0.3)


def test_pickle_and_joblib_give_identical_predictions():
    X, y = _regression_data()
    reg = MILERegressor(**SMALL).fit(X, y)
    for dump, load in ((pickle.dumps, pickle.loads), (_joblib_dumps, _joblib_loads)):
        again = load(dump(reg))
        np.testing.assert_array_equal(again.predict(X), reg.predict(X))
        np.testing.assert_array_equal(again.predict_quantiles(X[:5]), reg.predict_quantiles(X[:5]))


def test_a_refit_on_new_rows_of_the_same_shapes_is_not_traced_again(monkeypatch):
    """Refitting (new rows, the next fold, a clone with the same settings) reuses the kernel of an earlier fit and
    run_chunked's compiled loop for it, and gives the draws of a fit on a kernel of its own."""
    from collections import OrderedDict

    from numpyro_mile.runs import chunked

    monkeypatch.setattr(estimators, "_IDLE_KERNELS", OrderedDict())
    traces = []
    make = chunked._make_transform_of
    monkeypatch.setattr(
        chunked, "_make_transform_of", lambda *a: (lambda f: lambda *args: (traces.append(1), f(*args))[1])(make(*a))
    )
    (X, y), (X_new, y_new) = _regression_data(seed=0), _regression_data(seed=1)
    reg = MILERegressor(**SMALL).fit(X, y)
    first, before = len(traces), reg.samples_["w0"]  # the sample spec, then the loop's trace
    reg.fit(X_new, y_new)
    assert not np.allclose(reg.samples_["w0"], before)  # the new rows' posterior
    assert len(traces) - first == 1  # the sample spec only
    clone(reg).fit(X_new, y_new)
    assert len(traces) - first == 2
    estimators._IDLE_KERNELS.clear()
    own = MILERegressor(**SMALL).fit(X_new, y_new)
    assert len(traces) - first == 2 + first  # a kernel of its own: traced again
    for site, draws in own.samples_.items():
        np.testing.assert_array_equal(reg.samples_[site], draws, err_msg=site)


def _joblib_dumps(obj) -> bytes:
    buffer = io.BytesIO()
    joblib.dump(obj, buffer)
    return buffer.getvalue()


def _joblib_loads(data: bytes):
    return joblib.load(io.BytesIO(data))


def test_pandas_in_pandas_names_kept():
    pd = pytest.importorskip("pandas")
    X, y = _regression_data()
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    reg = MILERegressor(**SMALL).fit(frame, pd.Series(y, name="target"))
    assert reg.feature_names_in_.tolist() == ["a", "b", "c"]
    np.testing.assert_allclose(reg.predict(frame), MILERegressor(**SMALL).fit(X, y).predict(X), rtol=1e-6)
    with pytest.raises(ValueError, match="feature names"):
        reg.predict(frame.rename(columns={"a": "z"}))


def test_psmile_sampler_fits_on_minibatches():
    X, y = _regression_data(400)
    reg = MILERegressor(**{**SMALL, "num_warmup": 400}, sampler="psmile", subsample_size=32).fit(X, y)
    assert reg.score(X, y) > 0.5
    with pytest.raises(ValueError, match="subsample_size is for sampler"):
        MILERegressor(**SMALL, subsample_size=32).fit(X, y)


def test_bad_settings_and_models_get_clear_errors():
    X, y = _regression_data(40)
    with pytest.raises(ValueError, match="budget must be one of"):
        MILERegressor(budget="huge").fit(X, y)
    with pytest.raises(ValueError, match="num_warmup must be a positive integer"):
        MILERegressor(num_warmup=0).fit(X, y)
    with pytest.raises(ValueError, match="sampler must be one of"):
        MILERegressor(**SMALL, sampler="nuts").fit(X, y)
    with pytest.raises(ValueError, match="share their names with run_chunked"):
        MILERegressor(**SMALL, model_kwargs=dict(chunk_size=3)).fit(X, y)

    def no_outputs(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            X_rows = numpyro.subsample(X, event_dim=1)
            numpyro.sample(
                "y", dist.Normal(X_rows @ w, 1.0), obs=None if y is None else numpyro.subsample(y, event_dim=0)
            )

    reg = MILERegressor(no_outputs, **{k: v for k, v in SMALL.items() if k != "hidden"}).fit(X, y)
    with pytest.raises(ValueError, match="record the deterministic site"):
        reg.predict(X)


def test_uncertainty_functions_on_known_mixtures():
    mu = np.array([[-1.0, 0.0], [2.0, 0.0]])
    sigma = np.array([[0.5, 1.0], [1.0, 1.0]])
    parts = uncertainty.regression(mu, sigma)
    np.testing.assert_allclose(parts.mean, [0.5, 0.0])
    np.testing.assert_allclose(parts.std**2, [(0.25 + 1.0) / 2 + 2.25, 1.0])
    q = uncertainty.mixture_quantiles(mu, sigma, (0.025, 0.5, 0.975))
    np.testing.assert_allclose(q[:, 1], [-1.959964, 0.0, 1.959964], atol=1e-6)
    np.testing.assert_allclose(ndtr((q[:, :1] - mu[:, 0]) / sigma[:, 0]).mean(axis=1), [0.025, 0.5, 0.975], atol=1e-12)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        uncertainty.mixture_quantiles(mu, sigma, 1.0)
    # a few draws with a huge noise scale move the mixture's 90 % interval only by their weight (2 % here)
    rng = np.random.default_rng(0)
    mu_tail, sigma_tail = rng.normal(size=(500, 1)) * 0.01, np.where(np.arange(500)[:, None] < 10, 1e5, 1.0)
    lower, upper = uncertainty.mixture_quantiles(mu_tail, sigma_tail, (0.05, 0.95))
    assert -1.9 < lower[0] < -1.6 and 1.6 < upper[0] < 1.9, (lower, upper)
    certain = uncertainty.classification(np.array([[[0.5, 0.5]], [[0.5, 0.5]]]))
    np.testing.assert_allclose(
        [certain.entropy[0], certain.aleatoric[0], certain.epistemic[0]], [np.log(2), np.log(2), 0.0], atol=1e-12
    )


@pytest.mark.slow
def test_quick_budget_on_real_data_covers_held_out_rows():
    """The default budget on scikit-learn's diabetes data (442 patients): 90 % predictive intervals cover the
    held-out rows within three binomial standard errors of 90 %, and R^2 is that of a sound regression."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    reg = MILERegressor(progress_bar=False).fit(X_train, y_train)
    lower, upper = reg.predict_interval(X_test, 0.9)
    inside = np.mean((y_test >= lower) & (y_test <= upper))
    assert abs(inside - 0.9) < 3 * np.sqrt(0.9 * 0.1 / len(y_test)), inside
    assert reg.score(X_test, y_test) > 0.3


def test_custom_models_written_the_usual_ways():
    """A constrained noise scale (HalfNormal: sampled in unconstrained space, reported in its own) and observations
    in a plate without subsample indexing (pretraining full-batch, with NumPyro's warning): fit and predict run, and
    the posterior noise scale is near the truth."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 2))
    y = X @ np.array([1.0, -2.0]) + 0.5 * rng.normal(size=80)

    def regression(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        noise = numpyro.sample("noise", dist.HalfNormal(1.0))
        mu = X @ w
        if y is None:
            numpyro.deterministic("mu", mu)
            numpyro.deterministic("sigma", jnp.full(X.shape[0], noise))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(mu, noise), obs=y)

    with pytest.warns(UserWarning, match="pretrain"):
        reg = MILERegressor(
            regression,
            num_chains=2,
            num_warmup=600,
            num_samples=200,
            progress_bar=False,
            ensemble_options=dict(max_epochs=100),
        ).fit(X, y)
    assert np.all(reg.samples_["noise"] > 0)
    # the noise scale in y's units: the standardised posterior scale times y's sd; truth 0.5
    noise = reg.samples_["noise"].mean() * reg.scaler_.y_std
    assert 0.35 < noise < 0.7, noise
    assert reg.score(X, y) > 0.9
