"""Weight and layer pieces shared by the model builders of :mod:`numpyro_mile.models`.

Every builder (:mod:`~numpyro_mile.models.mlp`, :mod:`~numpyro_mile.models.cnn`,
:mod:`~numpyro_mile.models.attention`) describes its latent sites as an ordered dict
``site name -> shape``, draws them with :func:`sample_weights` and checks its inputs and
hyper-parameters with the functions below, so that the priors, site names and error messages are
the same for every model. The dense stack (:func:`dense_shapes`, :func:`dense_apply`) is the
whole network of the MLP models and the classifier head of the CNN.

Private to the package: the public names are the re-exports of :mod:`numpyro_mile.models`.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from .._validation import check_xy, is_concrete

# ------------------------------------------------------------------ priors


def sample_weights(
    shapes: Mapping[str, tuple[int, ...]], prior_scale: float, prior_mean: Mapping[str, jax.Array] | None
) -> dict[str, jax.Array]:
    """Draw one latent site per entry of ``shapes`` with an independent Gaussian prior.

    Site ``name`` gets ``Normal(prior_mean[name], prior_scale)`` (``loc = 0`` without
    ``prior_mean``), expanded to ``shapes[name]`` and declared as one event, so each site has a
    single log-density term.

    :param shapes: ordered dict site name -> shape, e.g. ``{"w0": (F, 16), "b0": (16,), ...}``;
        the sites are sampled in this order.
    :param prior_scale: standard deviation of the prior of every entry (in the units of the weights).
    :param prior_mean: optional dict site name -> array of shape ``shapes[name]`` centring the prior
        (e.g. the constrained samples of a deep-ensemble member); it must name every site.
    :return: dict site name -> sampled array of shape ``shapes[name]``.
    :raises ValueError: when ``prior_mean`` lacks a site or has an array of the wrong shape.
    """
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


# ------------------------------------------------------------------ dense stack


def dense_shapes(widths: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Shapes of the sites ``w0, b0, w1, b1, ...`` of a stack of dense layers, in order.

    :param widths: ``(F, h_1, ..., h_k, O)``: input features, hidden widths and outputs.
    :return: dict with ``w{k}`` of shape ``(widths[k], widths[k + 1])`` and ``b{k}`` of shape
        ``(widths[k + 1],)`` for every layer ``k``.
    """
    widths = list(widths)
    shapes: dict[str, tuple[int, ...]] = {}
    for k, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        shapes[f"w{k}"] = (n_in, n_out)
        shapes[f"b{k}"] = (n_out,)
    return shapes


def dense_apply(params: Mapping[str, jax.Array], X: jax.Array, activation: Callable = jax.nn.relu) -> jax.Array:
    """Forward pass of the dense stack ``w0, b0, w1, b1, ...`` found in ``params``.

    ``activation`` follows every layer but the last, whose outputs are returned as they are. The
    layers are counted by the keys that start with ``"w"``; no other site may start with ``"w"``.

    :param params: dict with ``w{k}`` of shape ``(h_k, h_{k+1})`` and ``b{k}`` of shape ``(h_{k+1},)``.
    :param X: inputs, shape ``(..., F)`` with ``F = h_0``.
    :param activation: element-wise non-linearity of the hidden layers.
    :return: outputs, shape ``(..., O)``.
    """
    num_layers = len([k for k in params if k.startswith("w")])
    h = X
    for k in range(num_layers):
        h = h @ params[f"w{k}"] + params[f"b{k}"]
        if k < num_layers - 1:
            h = activation(h)
    return h


# ------------------------------------------------------------------ input checks


def positive_int(value, name: str) -> int:
    """``value`` as an ``int``.

    :param value: a hyper-parameter such as a width or a kernel size.
    :param name: how the argument is called in the message.
    :raises ValueError: unless ``value`` is a positive integer (a ``bool`` is not).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def positive_ints(values, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of ``int``.

    :param values: a sequence of hyper-parameters, such as layer widths.
    :param name: how the argument is called in the message.
    :raises ValueError: unless ``values`` is a sequence (not a lone integer) of positive integers.
    """
    if isinstance(values, (int, np.integer)):
        raise ValueError(f"{name} must be a sequence of positive integers, e.g. ({values},), got {values!r}.")
    return tuple(positive_int(v, name) for v in values)


def check_subsample_size(X, subsample_size: int | None) -> None:
    """Check the minibatch size of the ``"data"`` plate against the number of rows of ``X``.

    Skipped when ``X`` is traced (inside ``jit``) or ``subsample_size`` is ``None`` (full batch).

    :param X: inputs, shape ``(N, ...)``.
    :param subsample_size: minibatch size, or ``None``.
    :raises ValueError: unless ``0 < subsample_size <= N``.
    """
    if subsample_size is not None and is_concrete(X):
        n = np.shape(X)[0]
        if not 0 < subsample_size <= n:
            raise ValueError(f"subsample_size={subsample_size} must be between 1 and the number of rows ({n}).")


def check_sequence_inputs(X, y, subsample_size: int | None, *, ranks: tuple[int, ...], what: str) -> None:
    """Rank, length, finiteness and ``subsample_size`` checks of the CNN and attention models.

    :param X: inputs, shape ``(N, ..., C_in)`` of a rank in ``ranks``.
    :param y: targets, shape ``(N,)``, or ``None`` to predict.
    :param subsample_size: minibatch size of the ``"data"`` plate, or ``None``.
    :param ranks: the accepted ranks of ``X`` (batch axis included).
    :param what: the accepted shapes in words, for the message (e.g. ``"rank 3 (N, length, channels)"``).
    :raises ValueError: on a wrong rank, mismatched rows, non-finite values or a bad ``subsample_size``.
    """
    if is_concrete(X) and np.ndim(X) not in ranks:
        raise ValueError(f"X must have {what}, got shape {tuple(np.shape(X))}. Add a channel axis with X[..., None].")
    check_xy(X, y, x_ndim=None)
    check_subsample_size(X, subsample_size)
