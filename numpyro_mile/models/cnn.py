"""LeNet-style convolutional BNN classifiers (1-D sequences and 2-D images) as NumPyro models.

The network is written with :func:`jax.lax.conv_general_dilated` and plain ``jax.numpy`` rather
than as a Flax module wrapped by ``numpyro.contrib.module.random_flax_module``, for the same
reasons as :mod:`numpyro_mile.models.mlp`: a handful of layers is shorter to write than the
wrapper's prior plumbing, every weight gets an explicit ``Normal(prior_mean, prior_scale)``
prior and a short, stable site name that appears in ``init_params``, ArviZ output and
``prior_mean``, and one builder serves images and sequences (the rank of ``X`` picks the
convolution). Kernels are stored in ``HWIO`` (2-D) / ``WIO`` (1-D) layout so that the deep
ensemble's LeCun initialisation, ``N(0, 1 / prod(shape[:-1]))``, uses the right fan-in.

Architecture (``channels=(c0, c1)``, ``hidden=(h,)``, ``C`` classes)::

    [conv k x k (SAME) -> activation -> max-pool p]  x len(channels)
    flatten -> dense h -> activation -> dense C (logits)

Site layout for an ``(N, 8, 8, 1)`` input, ``channels=(4, 8)``, ``kernel_size=3``, ``pool=2``,
``hidden=(16,)``, 10 classes::

    cw0 (3, 3, 1, 4)  cb0 (4,)  cw1 (3, 3, 4, 8)  cb1 (8,)      convolutions
    w0 (32, 16)  b0 (16,)  w1 (16, 10)  b1 (10,)                 dense head (as in mlp_classification)

The MILE paper put an ``N(0, 0.1)`` prior on its LeNet weights: ``prior_scale=0.1`` is the
default (a standard deviation). Observations live in ``numpyro.plate("data", N,
subsample_size=...)`` and ``logits`` are recorded only when ``y is None``, exactly as in
:func:`numpyro_mile.models.mlp_classification`, so the same model serves MILE, NUTS, SGLD,
ICSGLD and the deep ensemble.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._layers import (
    check_sequence_inputs,
    dense_apply,
    dense_shapes,
    positive_int,
    positive_ints,
    sample_weights,
)
from ._likelihood import categorical_likelihood, check_labels

__all__ = ["cnn", "cnn_apply", "cnn_shapes"]

_DIMENSION_NUMBERS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC")}


def cnn_shapes(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    channels: Sequence[int] = (8, 16),
    kernel_size: int = 3,
    pool: int = 2,
    hidden: Sequence[int] = (32,),
) -> dict[str, tuple[int, ...]]:
    """Shapes of the latent sites of :func:`cnn`, in order.

    :param input_shape: one input without the batch axis: ``(L, C_in)`` or ``(H, W, C_in)``.
    :return: dict site -> shape (``cw0, cb0, ...`` then ``w0, b0, ...``).

    **Example**

    >>> from numpyro_mile.models import cnn_shapes
    >>> cnn_shapes((8, 8, 1), 10, channels=(4, 8), hidden=(16,))["w0"]
    (32, 16)
    """
    input_shape = tuple(int(s) for s in input_shape)
    if len(input_shape) not in (2, 3):
        raise ValueError(f"input_shape must be (length, channels) or (height, width, channels), got {input_shape}.")
    spatial, c_in = list(input_shape[:-1]), input_shape[-1]
    shapes: dict[str, tuple[int, ...]] = {}
    for k, c_out in enumerate(channels):
        shapes[f"cw{k}"] = (kernel_size,) * len(spatial) + (c_in, int(c_out))
        shapes[f"cb{k}"] = (int(c_out),)
        spatial = [s // pool for s in spatial]
        if min(spatial) < 1:
            raise ValueError(
                f"the input {input_shape[:-1]} is too small for {len(channels)} pooling layers of size {pool}; "
                "use fewer channels entries or a smaller pool."
            )
        c_in = int(c_out)
    shapes.update(dense_shapes((int(np.prod(spatial)) * c_in, *hidden, num_classes)))
    return shapes


def _max_pool(h: jax.Array, pool: int) -> jax.Array:
    """Non-overlapping ``pool``-wide max-pooling of ``(N, *spatial, C)`` (trailing rows/columns dropped)."""
    if pool == 1:
        return h
    n, *spatial, c = h.shape
    kept = [(s // pool) * pool for s in spatial]
    h = h[(slice(None), *(slice(0, k) for k in kept), slice(None))]
    split = [n]
    for k in kept:
        split += [k // pool, pool]
    return h.reshape(*split, c).max(axis=tuple(range(2, 2 * len(spatial) + 1, 2)))


def _conv(h: jax.Array, w: jax.Array) -> jax.Array:
    """``SAME`` convolution, stride 1, of ``(N, *spatial, C_in)`` with a ``(*window, C_in, C_out)`` kernel."""
    spatial_dims = h.ndim - 2
    return jax.lax.conv_general_dilated(
        h, w, window_strides=(1,) * spatial_dims, padding="SAME", dimension_numbers=_DIMENSION_NUMBERS[spatial_dims]
    )


def _conv_as_matmul(h: jax.Array, w: jax.Array) -> jax.Array:
    """The same convolution as one dense matrix product.

    The convolution's matrix (``F_in x F_out``, ``F = prod(spatial) * C``) is built by convolving
    the identity basis; it is linear in ``w``, so gradients are exact. For small inputs this is
    several times faster on CPU than a convolution with few channels, and it stays fast under the
    chain ``vmap`` of a vectorized sampler (a batched matmul instead of a grouped convolution).
    """
    n, *spatial, c_in = h.shape
    num_in = int(np.prod(spatial)) * c_in
    basis = jnp.eye(num_in, dtype=h.dtype).reshape(num_in, *spatial, c_in)
    matrix = _conv(basis, w).reshape(num_in, -1)
    return (h.reshape(n, num_in) @ matrix).reshape(n, *spatial, w.shape[-1])


#: ``conv_impl="auto"`` multiplies by the convolution's matrix when it has at most this many entries
MATMUL_MAX_ENTRIES = 2**18


def cnn_apply(
    params: Mapping[str, jax.Array],
    X: jax.Array,
    *,
    pool: int = 2,
    activation: Callable = jax.nn.relu,
    conv_impl: str = "auto",
) -> jax.Array:
    """Forward pass of :func:`cnn`: inputs ``(N, L, C_in)`` or ``(N, H, W, C_in)`` -> logits ``(N, C)``.

    :param params: dict with ``cw0, cb0, ...`` (convolutions) and ``w0, b0, ...`` (dense head).
    :param X: a batch of inputs; extra leading axes are not supported (vmap instead).
    :param pool: max-pooling window and stride after every convolution.
    :param activation: non-linearity after every convolution and hidden dense layer.
    :param conv_impl: ``"lax"`` (``jax.lax.conv_general_dilated``), ``"matmul"`` (multiply by the
        convolution's dense matrix, see :func:`_conv_as_matmul`) or ``"auto"`` (``"matmul"`` for
        layers whose matrix has at most :data:`MATMUL_MAX_ENTRIES` entries). All give the same values.
    """
    if conv_impl not in ("auto", "lax", "matmul"):
        raise ValueError(f"conv_impl must be 'auto', 'lax' or 'matmul', got {conv_impl!r}.")
    num_conv = len([k for k in params if k.startswith("cw")])
    h = X
    for k in range(num_conv):
        w = params[f"cw{k}"]
        entries = int(np.prod(h.shape[1:-1])) ** 2 * w.shape[-2] * w.shape[-1]
        use_matmul = conv_impl == "matmul" or (conv_impl == "auto" and entries <= MATMUL_MAX_ENTRIES)
        h = (_conv_as_matmul if use_matmul else _conv)(h, w)
        h = _max_pool(activation(h + params[f"cb{k}"]), pool)
    h = h.reshape(h.shape[0], -1)
    return dense_apply({k: v for k, v in params.items() if not k.startswith("c")}, h, activation)


def cnn(
    X,
    y=None,
    *,
    num_classes: int,
    channels: Sequence[int] = (8, 16),
    kernel_size: int = 3,
    pool: int = 2,
    hidden: Sequence[int] = (32,),
    activation: Callable = jax.nn.relu,
    conv_impl: str = "auto",
    prior_scale: float = 0.1,
    prior_mean: Mapping[str, jax.Array] | None = None,
    subsample_size: int | None = None,
    record_outputs: bool | None = None,
):
    """LeNet-style convolutional classifier for images ``(N, H, W, C_in)`` or sequences ``(N, L, C_in)``.

    Each entry of ``channels`` adds a ``kernel_size``-wide convolution with ``SAME`` padding,
    the activation and a ``pool``-wide max-pooling; the flattened features feed a dense head
    with hidden widths ``hidden`` and ``num_classes`` logits. Every weight and bias has an
    independent ``Normal(prior_mean, prior_scale)`` prior; ``y_i ~ Categorical(logits_i)``.

    :param X: inputs, shape ``(N, H, W, C_in)`` (2-D convolutions) or ``(N, L, C_in)`` (1-D).
    :param y: integer labels in ``[0, num_classes)``, shape ``(N,)``, or ``None`` to predict.
    :param num_classes: number of classes ``C``.
    :param channels: output channels of the convolutions (one layer per entry).
    :param kernel_size: width of every convolution kernel (``k x k`` for images).
    :param pool: max-pooling window and stride after every convolution (1: no pooling).
    :param hidden: widths of the hidden dense layers of the head.
    :param activation: non-linearity after every convolution and hidden dense layer.
    :param conv_impl: how convolutions are computed (same values): ``"auto"``, ``"lax"`` or
        ``"matmul"``; see :func:`cnn_apply`.
    :param prior_scale: standard deviation of the prior of every weight (default 0.1, as the MILE
        paper's LeNet).
    :param prior_mean: optional dict site -> array centring the prior (e.g. pretrained weights).
    :param subsample_size: minibatch size of the ``"data"`` plate (``None``: full batch).
    :param record_outputs: record ``logits`` ``(N, C)`` as a deterministic site; default: only when
        ``y is None``.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import MILE
        >>> from numpyro_mile.datasets import digits
        >>> from numpyro_mile.models import cnn
        >>> (X, y), _, _ = digits(seed=0, images=True)
        >>> mcmc = MCMC(MILE(cnn, ensemble_options=dict(max_epochs=2, progress_bar=False)),
        ...             num_warmup=100, num_samples=5, num_chains=2, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X[:100], y[:100], num_classes=10, channels=(4, 8), hidden=(16,))
        >>> mcmc.get_samples()["cw0"].shape
        (10, 3, 3, 1, 4)
    """
    check_sequence_inputs(
        X, y, subsample_size, ranks=(3, 4), what="rank 4 (N, height, width, channels) or rank 3 (N, length, channels)"
    )
    check_labels(y, num_classes)
    if conv_impl not in ("auto", "lax", "matmul"):
        raise ValueError(f"conv_impl must be 'auto', 'lax' or 'matmul', got {conv_impl!r}.")
    kernel_size, pool = positive_int(kernel_size, "kernel_size"), positive_int(pool, "pool")
    channels, hidden = positive_ints(channels, "channels"), positive_ints(hidden, "hidden")
    shapes = cnn_shapes(
        jnp.shape(X)[1:], num_classes, channels=channels, kernel_size=kernel_size, pool=pool, hidden=hidden
    )
    params = sample_weights(shapes, prior_scale, prior_mean)
    categorical_likelihood(
        lambda x: cnn_apply(params, x, pool=pool, activation=activation, conv_impl=conv_impl),
        X,
        y,
        subsample_size,
        record_outputs,
    )
