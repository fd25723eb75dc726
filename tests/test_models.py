import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer.util import log_density, potential_energy
from scipy import stats

from numpyro_mile.models import layer_shapes, mlp_apply, mlp_classification, mlp_regression


def tiny_params(rng, shapes):
    return {k: jnp.asarray(rng.normal(size=s)) for k, s in shapes.items()}


def test_regression_log_joint_matches_hand_computation():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(5, 3)), rng.normal(size=5)
    params = tiny_params(rng, layer_shapes(3, (2,), 2))
    logp, _ = log_density(mlp_regression, (X, y), {"hidden": (2,), "prior_scale": 0.7}, params)
    # by hand, in numpy
    h = np.maximum(X @ np.asarray(params["w0"]) + np.asarray(params["b0"]), 0)
    out = h @ np.asarray(params["w1"]) + np.asarray(params["b1"])
    sigma = np.clip(np.exp(out[:, 1]), 1e-6, 1e6)
    expected = stats.norm(out[:, 0], sigma).logpdf(y).sum()
    expected += sum(stats.norm(0, 0.7).logpdf(np.asarray(v)).sum() for v in params.values())
    np.testing.assert_allclose(float(logp), expected, rtol=1e-5)


def test_classification_log_joint_and_prior_mean():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(6, 2)), np.array([0, 1, 2, 2, 1, 0])
    shapes = layer_shapes(2, (3,), 3)
    params, mean = tiny_params(rng, shapes), tiny_params(rng, shapes)
    kwargs = {"num_classes": 3, "hidden": (3,), "prior_mean": mean}
    logp, _ = log_density(mlp_classification, (X, y), kwargs, params)
    logits = np.asarray(mlp_apply(params, X))
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = log_softmax[np.arange(6), y].sum()
    expected += sum(stats.norm(np.asarray(mean[k]), 1.0).logpdf(np.asarray(v)).sum() for k, v in params.items())
    np.testing.assert_allclose(float(logp), expected, rtol=1e-5)


def test_site_shapes_and_prediction_outputs():
    X = np.zeros((7, 4))
    tr = numpyro.handlers.trace(numpyro.handlers.seed(mlp_regression, 0)).get_trace(X)
    assert {k: tr[k]["value"].shape for k in ["w0", "b0", "w1", "b1", "w2", "b2"]} == layer_shapes(4, (16, 16), 2)
    assert tr["y"]["value"].shape == (7,) and tr["mu"]["value"].shape == (7,) and tr["sigma"]["value"].shape == (7,)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(mlp_regression, 0)).get_trace(X, np.zeros(7))
    assert "mu" not in tr  # outputs are not recorded while fitting
    tr = numpyro.handlers.trace(numpyro.handlers.seed(mlp_classification, 0)).get_trace(X, num_classes=5)
    assert tr["logits"]["value"].shape == (7, 5)


def test_plate_scaling_is_unbiased():
    """Mean over random minibatches of the minibatch potential equals the full potential."""
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(50, 2)), rng.normal(size=50)
    params = tiny_params(rng, layer_shapes(2, (4,), 2))
    full = float(potential_energy(mlp_regression, (X, y), {"hidden": (4,)}, params))

    def minibatch_potential(key):
        model = numpyro.handlers.seed(mlp_regression, key)
        return potential_energy(model, (X, y), {"hidden": (4,), "subsample_size": 10}, params)

    values = np.asarray(jax.vmap(minibatch_potential)(jax.random.split(jax.random.PRNGKey(0), 4000)))
    se = values.std() / np.sqrt(len(values))
    assert abs(values.mean() - full) < 4 * se
    assert values.std() > 0  # really subsampled


@pytest.mark.parametrize(
    "X, y, match",
    [
        (np.full((4, 2), np.nan), np.zeros(4), "NaN or infinite"),
        (np.zeros((4, 2)), np.array([0, 1, np.inf, 0]), "y contains"),
        (np.zeros((4, 2)), np.zeros(5), "different numbers of rows"),
        (np.zeros(4), np.zeros(4), "rank 2"),
        (np.zeros((4, 2)), np.zeros((4, 1)), "rank 1"),
    ],
)
def test_bad_input_errors(X, y, match):
    with pytest.raises(ValueError, match=match):
        numpyro.handlers.seed(mlp_regression, 0)(X, y)


@pytest.mark.parametrize("bad", ["X", "y"])
def test_nan_advice_names_the_array_at_fault_and_its_code_runs(bad):
    """The advice for a NaN is about the array that holds it, and its line, run as printed, leaves finite rows."""
    X, y = np.arange(12.0).reshape(6, 2), np.arange(6.0)
    (X if bad == "X" else y)[2] = np.nan
    with pytest.raises(ValueError, match=f"^{bad} contains [12] NaN") as error:
        numpyro.handlers.seed(mlp_regression, 0)(X, y)
    code = str(error.value).split("e.g. ")[1].rstrip(".")
    namespace = {"np": np, "X": X, "y": y}
    exec(code, namespace)  # noqa: S102
    assert namespace["X"].shape == (5, 2) and namespace["y"].shape == (5,)
    assert np.isfinite(namespace["X"]).all() and np.isfinite(namespace["y"]).all()


def test_label_and_subsample_errors():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        numpyro.handlers.seed(mlp_classification, 0)(np.zeros((3, 2)), np.array([0, 1, 3]), num_classes=3)
    with pytest.raises(ValueError, match="subsample_size=10"):
        numpyro.handlers.seed(mlp_regression, 0)(np.zeros((3, 2)), np.zeros(3), subsample_size=10)
    with pytest.raises(ValueError, match="prior_mean lacks"):
        numpyro.handlers.seed(mlp_regression, 0)(np.zeros((3, 2)), np.zeros(3), prior_mean={"w0": 0})


def test_model_modules_share_helpers_only_through_private_modules():
    """mlp, cnn and attention import shared pieces from _layers / _likelihood, never from each other."""
    import ast
    from pathlib import Path

    import numpyro_mile.models as models

    folder = Path(models.__file__).parent
    for name in ("mlp", "cnn", "attention"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        relative = {
            (node.level, node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
        }
        assert relative <= {(1, "_layers"), (1, "_likelihood"), (2, "_validation")}, (name, relative)
