"""Test-set evaluation of the package's BNN models (:mod:`numpyro_mile.models`) from posterior draws.

These helpers know the models' site names: a regression model's mean ``mu`` and observation ``y``, a
classifier's ``logits``. Prediction itself (any model, any sites, streamed over chunks of draws) is
:mod:`numpyro_mile.predictive`; the metrics are :mod:`numpyro_mile.metrics`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import metrics
from .predictive import log_likelihood, predict

__all__ = ["evaluate_classification", "evaluate_regression", "predictive_probs"]


def evaluate_regression(
    model: Callable, samples: dict, X_test, y_test, *, weights=None, **model_kwargs
) -> tuple[float, float]:
    """(RMSE, LPPD) on test data of a regression model with ``mu`` output; ``samples`` flat (S, ...);
    ``weights``: optional sample weights, shape ``(S,)`` (e.g. ICSGLD's importance weights)."""
    latent = {k: v for k, v in samples.items() if k not in ("mu", "sigma", "y")}
    ll = log_likelihood(model, latent, X_test, y_test, **model_kwargs)["y"]
    mu = predict(model, latent, X_test, return_sites=["mu"], rng_key=jax.random.PRNGKey(0), **model_kwargs)["mu"]
    return metrics.rmse(y_test, mu, weights), metrics.lppd(ll, weights)


def predictive_probs(model: Callable, samples: dict, X, batch_size: int = 100, **model_kwargs) -> np.ndarray:
    """Posterior predictive class probabilities of a classifier with a ``logits`` output.

    Per-sample softmax probabilities are averaged over samples chunk by chunk (memory
    ``O(batch_size x N x C)``).

    :param samples: flat samples, dict site -> ``(S, ...)``.
    :param X: inputs, leading axis ``N``.
    :return: shape ``(N, C)``.
    """
    latent = {k: v for k, v in samples.items() if k not in ("logits", "y")}
    num_samples = int(jax.tree.leaves(latent)[0].shape[0])
    total = None
    for start in range(0, num_samples, batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in latent.items()}
        logits = predict(model, chunk, X, batch_size=batch_size, return_sites=["logits"], **model_kwargs)["logits"]
        probs = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1), np.float64).sum(axis=0)
        total = probs if total is None else total + probs
    return total / num_samples


def evaluate_classification(
    model: Callable, samples: dict, X_test, y_test, num_bins: int = 15, **model_kwargs
) -> dict[str, float]:
    """Accuracy, LPPD (= -NLL), NLL, ECE and MCE (top label, ``num_bins`` bins) of the predictive mean."""
    probs = predictive_probs(model, samples, X_test, **model_kwargs)
    nll = metrics.nll(probs, y_test)
    return dict(
        accuracy=metrics.accuracy(probs, y_test),
        lppd=-nll,
        nll=nll,
        ece=metrics.ece(probs, y_test, num_bins),
        mce=metrics.mce(probs, y_test, num_bins),
    )
