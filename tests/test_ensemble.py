"""Deep-ensemble pretraining and MILE's non-pretrained start."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest

from numpyro_mile import MILE, deep_ensemble
from numpyro_mile.ensemble import fit_members
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression


def test_members_do_not_depend_on_training_together():
    X, y = toy_regression(80, seed=2)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    together = fit_members(mlp_regression, keys, (X, y), {"hidden": (4,)}, max_epochs=15, progress_bar=False)
    alone = fit_members(mlp_regression, keys[2:], (X, y), {"hidden": (4,)}, max_epochs=15, progress_bar=False)
    np.testing.assert_allclose(together.init_params["w1"][2], alone.init_params["w1"][0], rtol=1e-4, atol=1e-5)


def test_early_stopping_and_validation_args():
    X, y = toy_regression(120, seed=3)
    X_val, y_val = toy_regression(40, seed=4)
    de = deep_ensemble(
        mlp_regression,
        jax.random.PRNGKey(1),
        2,
        X,
        y,
        validation=(X_val, y_val),
        patience=3,
        max_epochs=400,
        progress_bar=False,
        hidden=(8,),
        early_stopping="best",
    )
    assert np.all(de.num_epochs < 400)  # stopped early
    best = np.nanmin(de.val_loss, axis=1)
    np.testing.assert_allclose(de.best_val_loss, best, rtol=1e-6)
    # the returned members are the best ones: their validation NLL equals the best seen
    from numpyro_mile.evaluation import evaluate_regression

    _, lppd = evaluate_regression(mlp_regression, jax.tree.map(lambda x: x[:1], de.samples), X_val, y_val, hidden=(8,))
    np.testing.assert_allclose(-lppd, de.best_val_loss[0], rtol=1e-4)


def test_model_that_does_not_index_its_data_trains_full_batch_with_a_warning():
    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ w + b, 1.0), obs=y)  # X is not subsampled

    X, y = toy_regression(100)
    with pytest.warns(UserWarning, match=r"obs=y\[idx\].*trains full-batch instead"):
        de = deep_ensemble(
            model, jax.random.PRNGKey(0), 2, X, y, max_epochs=300, progress_bar=False, optimizer=optax.adam(0.05)
        )
    assert de.train_loss.shape == (2, 300) and np.all(de.num_epochs == 300)  # no rows held out: no early stop
    # one Adam step per epoch on all rows: the members reach the least-squares fit of the full data
    design = np.column_stack([np.asarray(X), np.ones(len(X))])
    w_ls, *_ = np.linalg.lstsq(design, np.asarray(y), rcond=None)
    np.testing.assert_allclose(np.asarray(de.samples["w"])[:, 0], w_ls[0], atol=0.02)
    np.testing.assert_allclose(np.asarray(de.samples["b"]), w_ls[1], atol=0.02)


def test_default_early_stopping_stops_as_the_reference_and_keeps_the_final_parameters():
    X, y = toy_regression(200, seed=3)
    de = deep_ensemble(
        mlp_regression,
        jax.random.PRNGKey(0),
        3,
        X,
        y,
        hidden=(16,),
        max_epochs=400,
        patience=5,
        progress_bar=False,
        optimizer=optax.adam(0.02),
    )  # the default: the reference's
    val = np.asarray(de.val_loss)
    for k in range(3):
        epochs = int(de.num_epochs[k])
        curve = val[k, :epochs]
        assert np.all(np.isnan(val[k, epochs:]))
        stop = [e for e in range(5, epochs) if np.all(curve[e - 4 : e + 1] >= curve[e - 5])]
        assert epochs < 400 and stop == [epochs - 1], (k, epochs, stop)  # first epoch where the rule fires
        assert de.best_val_loss[k] == pytest.approx(curve[-1], rel=1e-6)  # final, not best, parameters
    # "best" keeps the best parameters instead
    best = deep_ensemble(
        mlp_regression,
        jax.random.PRNGKey(0),
        3,
        X,
        y,
        hidden=(16,),
        max_epochs=400,
        patience=5,
        progress_bar=False,
        optimizer=optax.adam(0.02),
        early_stopping="best",
    )
    np.testing.assert_allclose(best.best_val_loss, np.nanmin(np.asarray(best.val_loss), axis=1), rtol=1e-6)
    with pytest.raises(ValueError, match="early_stopping must be one of"):
        deep_ensemble(mlp_regression, jax.random.PRNGKey(0), 1, X, y, early_stopping="patience")


def test_no_data_plate_error():
    def model():
        numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]))

    with pytest.raises(ValueError, match="plate named 'data'"):
        deep_ensemble(model, jax.random.PRNGKey(0), 2, progress_bar=False)


def test_map_start_without_pretraining():
    def model():
        numpyro.sample("x", dist.Normal(jnp.array([3.0, -2.0]), 0.5))

    kernel = MILE(model, pretrain=False, map_steps=300, map_learning_rate=0.05)
    state = kernel.init(jax.random.split(jax.random.PRNGKey(0), 2), 100, None, (), {})
    np.testing.assert_allclose(state.z["x"], np.array([[3.0, -2.0]] * 2), atol=1e-2)


def test_mile_early_stopping_stops_a_diverged_member_and_keeps_finite_parameters():
    X, y = toy_regression(200)
    de = deep_ensemble(
        mlp_regression,
        jax.random.PRNGKey(0),
        2,
        X,
        y,
        hidden=(16,),
        max_epochs=40,
        patience=3,
        early_stopping="mile",
        optimizer=optax.sgd(30.0),
        progress_bar=False,
    )
    assert np.all(np.asarray(de.num_epochs) < 40)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in de.init_params.values())


def test_one_row_batches_still_detect_a_model_that_does_not_index_its_data():
    def model(y):
        p = numpyro.sample("p", dist.Beta(2.0, 2.0))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Bernoulli(p), obs=y)  # broadcasts a 1-row plate against all rows

    y = (np.arange(100) % 3 == 0).astype(np.float32)
    with pytest.warns(UserWarning, match="trains full-batch"):
        de = deep_ensemble(model, jax.random.PRNGKey(0), 1, y, batch_size=1, max_epochs=3, progress_bar=False)
    assert float(de.train_loss[0, 0]) < 1.0  # the mean NLL per row (about 0.69), not N times it
