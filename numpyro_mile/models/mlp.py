"""Multilayer-perceptron BNNs as ordinary NumPyro models.

The networks are hand-written rather than built from Flax through ``numpyro.contrib.module``:
with a handful of dense layers the code is shorter than the wrapper, the latent sites get short
stable names (``w0``, ``b0``, ``w1``, ... — these appear in ArviZ output and in ``init_params``),
and a prior centred on pretrained weights (``prior_mean``) is a plain ``loc`` argument. A Flax
module works just as well with every kernel of this package (see ``examples/``).

Site layout for ``hidden=(16, 16)`` and ``F`` input features, ``O`` outputs::

    w0 (F, 16)  b0 (16,)  w1 (16, 16)  b1 (16,)  w2 (16, O)  b2 (O,)

Observations live in ``numpyro.plate("data", N, subsample_size=subsample_size)``, so the same
model serves full-batch kernels (MILE, NUTS) and minibatch kernels (SGLD, ICSGLD); the plate
scales the minibatch log-likelihood by ``N / subsample_size``.

The network outputs (``mu``/``sigma`` or ``logits``) are recorded as deterministic sites only
when ``y is None`` (prediction), so posterior sampling does not store an ``(N,)`` array per
sample; pass ``record_outputs=True`` to force it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from .._validation import as_array, check_xy
from ._layers import check_subsample_size, dense_apply, dense_shapes, sample_weights
from ._likelihood import categorical_likelihood, check_labels

#: bounds of the predicted noise scale, as in the MILE reference
SIGMA_MIN, SIGMA_MAX = 1e-6, 1e6


def layer_shapes(num_features: int, hidden: Sequence[int], num_outputs: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the latent sites ``w0, b0, w1, b1, ...`` of an MLP, in order.

    :param num_features: input features ``F``.
    :param hidden: widths of the hidden layers.
    :param num_outputs: outputs ``O`` of the last layer.
    :return: dict site -> shape: ``w{k}`` ``(n_in, n_out)`` and ``b{k}`` ``(n_out,)`` for every layer.

    **Example**

    >>> from numpyro_mile.models import layer_shapes
    >>> layer_shapes(3, (16,), 2)
    {'w0': (3, 16), 'b0': (16,), 'w1': (16, 2), 'b1': (2,)}
    """
    return dense_shapes((num_features, *hidden, num_outputs))


def mlp_apply(params: Mapping[str, jax.Array], X: jax.Array, activation: Callable = jax.nn.relu) -> jax.Array:
    """Forward pass of the MLP with weights ``params`` (``w0, b0, ...``) on inputs ``X`` (N, F) -> (N, O).

    :param params: dict site -> array with the shapes of :func:`layer_shapes`.
    :param X: inputs, shape ``(N, F)``.
    :param activation: hidden-layer non-linearity (not applied to the outputs).
    :return: network outputs, shape ``(N, O)``.
    """
    return dense_apply(params, X, activation)


def _check_inputs(X, y, subsample_size):
    check_xy(X, y, x_ndim=2)
    check_subsample_size(X, subsample_size)


def mlp_regression(
    X,
    y=None,
    *,
    hidden: Sequence[int] = (16, 16),
    activation: Callable = jax.nn.relu,
    prior_scale: float = 1.0,
    prior_mean: Mapping[str, jax.Array] | None = None,
    subsample_size: int | None = None,
    record_outputs: bool | None = None,
):
    """Heteroscedastic Gaussian regression MLP: the MILE/BDE benchmark network.

    The last layer has two outputs, ``(mu, log sigma)``; ``sigma = clip(exp(log sigma), 1e-6, 1e6)``
    and ``y_i ~ Normal(mu_i, sigma_i)``. Every weight and bias has an independent
    ``Normal(prior_mean, prior_scale)`` prior.

    :param X: inputs, shape ``(N, F)``.
    :param y: targets, shape ``(N,)``, or ``None`` to predict.
    :param hidden: widths of the hidden layers.
    :param activation: hidden-layer non-linearity.
    :param prior_scale: standard deviation of the prior of every weight and bias.
    :param prior_mean: optional dict site -> array centring the prior (e.g. pretrained weights).
    :param subsample_size: minibatch size of the ``"data"`` plate (``None``: full batch).
    :param record_outputs: record ``mu`` and ``sigma`` (shape ``(N,)``) as deterministic sites;
        default: only when ``y is None``.

    **Example**

    .. doctest::

        >>> import jax, numpy as np
        >>> from numpyro.infer import MCMC, NUTS
        >>> from numpyro_mile.models import mlp_regression
        >>> X = np.linspace(-1, 1, 20)[:, None]; y = np.sin(3 * X[:, 0])
        >>> mcmc = MCMC(NUTS(mlp_regression), num_warmup=5, num_samples=5, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,))
        >>> sorted(mcmc.get_samples())
        ['b0', 'b1', 'w0', 'w1']
    """
    X, y = as_array(X), as_array(y)
    _check_inputs(X, y, subsample_size)
    n, num_features = jnp.shape(X)
    params = sample_weights(layer_shapes(num_features, hidden, 2), prior_scale, prior_mean)
    if record_outputs is None:
        record_outputs = y is None
    with numpyro.plate("data", n, subsample_size=subsample_size):
        X_batch = numpyro.subsample(X, event_dim=1)
        y_batch = None if y is None else numpyro.subsample(y, event_dim=0)
        out = mlp_apply(params, X_batch, activation)
        mu = out[..., 0]
        sigma = jnp.clip(jnp.exp(out[..., 1]), SIGMA_MIN, SIGMA_MAX)
        if record_outputs:
            numpyro.deterministic("mu", mu)
            numpyro.deterministic("sigma", sigma)
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y_batch)


def mlp_classification(
    X,
    y=None,
    *,
    num_classes: int,
    hidden: Sequence[int] = (16, 16),
    activation: Callable = jax.nn.relu,
    prior_scale: float = 1.0,
    prior_mean: Mapping[str, jax.Array] | None = None,
    subsample_size: int | None = None,
    record_outputs: bool | None = None,
):
    """Categorical classification MLP on logits.

    :param X: inputs, shape ``(N, F)``.
    :param y: integer labels in ``[0, num_classes)``, shape ``(N,)``, or ``None`` to predict.
    :param num_classes: number of classes ``C`` (the last layer has ``C`` outputs).
    :param record_outputs: record ``logits`` (shape ``(N, C)``) as a deterministic site;
        default: only when ``y is None``.

    Other parameters as in :func:`mlp_regression`.
    """
    X, y = as_array(X), as_array(y)
    _check_inputs(X, y, subsample_size)
    check_labels(y, num_classes)
    _, num_features = jnp.shape(X)
    params = sample_weights(layer_shapes(num_features, hidden, num_classes), prior_scale, prior_mean)
    categorical_likelihood(lambda x: mlp_apply(params, x, activation), X, y, subsample_size, record_outputs)
