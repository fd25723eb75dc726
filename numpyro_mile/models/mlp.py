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
import numpy as np
import numpyro
import numpyro.distributions as dist

from .._validation import check_xy, is_concrete

#: bounds of the predicted noise scale, as in the MILE reference
SIGMA_MIN, SIGMA_MAX = 1e-6, 1e6


def layer_shapes(num_features: int, hidden: Sequence[int], num_outputs: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the latent sites ``w0, b0, w1, b1, ...`` of an MLP, in order."""
    widths = [num_features, *hidden, num_outputs]
    shapes: dict[str, tuple[int, ...]] = {}
    for k, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        shapes[f"w{k}"] = (n_in, n_out)
        shapes[f"b{k}"] = (n_out,)
    return shapes


def mlp_apply(params: Mapping[str, jax.Array], X: jax.Array, activation: Callable = jax.nn.relu) -> jax.Array:
    """Forward pass of the MLP with weights ``params`` (``w0, b0, ...``) on inputs ``X`` (N, F) -> (N, O)."""
    num_layers = len([k for k in params if k.startswith("w")])
    h = X
    for k in range(num_layers):
        h = h @ params[f"w{k}"] + params[f"b{k}"]
        if k < num_layers - 1:
            h = activation(h)
    return h


def _sample_weights(shapes, prior_scale: float, prior_mean: Mapping | None) -> dict[str, jax.Array]:
    if prior_mean is not None:
        missing = set(shapes) - set(prior_mean)
        if missing:
            raise ValueError(
                f"prior_mean lacks the sites {sorted(missing)}; give an array for every one of {list(shapes)} "
                "(e.g. the constrained samples of a deep-ensemble member)."
            )
    params = {}
    for name, shape in shapes.items():
        loc = 0.0 if prior_mean is None else jnp.asarray(prior_mean[name])
        if prior_mean is not None and jnp.shape(loc) != shape:
            raise ValueError(f"prior_mean[{name!r}] has shape {jnp.shape(loc)}, expected {shape}.")
        params[name] = numpyro.sample(name, dist.Normal(loc, prior_scale).expand(shape).to_event(len(shape)))
    return params


def _check_inputs(X, y, subsample_size):
    check_xy(X, y, x_ndim=2)
    if subsample_size is not None and is_concrete(X):
        n = np.shape(X)[0]
        if not 0 < subsample_size <= n:
            raise ValueError(
                f"subsample_size={subsample_size} must be between 1 and the number of rows ({n})."
            )


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
    _check_inputs(X, y, subsample_size)
    n, num_features = jnp.shape(X)
    params = _sample_weights(layer_shapes(num_features, hidden, 2), prior_scale, prior_mean)
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
    _check_inputs(X, y, subsample_size)
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}.")
    if y is not None and is_concrete(y):
        labels = np.asarray(y)
        if labels.dtype.kind == "f" and not np.all(labels == np.round(labels)):
            raise ValueError("y must hold integer class labels, got non-integer values.")
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(
                f"labels must lie in [0, {num_classes}), got values from {labels.min()} to {labels.max()}. "
                "Encode classes as 0..num_classes-1 (e.g. with np.unique(y, return_inverse=True))."
            )
    n, num_features = jnp.shape(X)
    params = _sample_weights(layer_shapes(num_features, hidden, num_classes), prior_scale, prior_mean)
    if record_outputs is None:
        record_outputs = y is None
    with numpyro.plate("data", n, subsample_size=subsample_size):
        X_batch = numpyro.subsample(X, event_dim=1)
        y_batch = None if y is None else numpyro.subsample(jnp.asarray(y).astype(jnp.int32), event_dim=0)
        logits = mlp_apply(params, X_batch, activation)
        if record_outputs:
            numpyro.deterministic("logits", logits)
        numpyro.sample("y", dist.Categorical(logits=logits), obs=y_batch)
