"""A small single-block self-attention BNN classifier over sequences, as a NumPyro model.

Hand-written in ``jax.numpy`` (like :mod:`numpyro_mile.models.mlp` and
:mod:`numpyro_mile.models.cnn`) rather than a Flax module behind
``numpyro.contrib.module.random_flax_module``: one block is a dozen lines, and writing it out
gives every weight an explicit ``Normal(prior_mean, prior_scale)`` prior and a readable site
name. The layer normalisations have no learnable scale or shift, so that *every* parameter has
the same zero-centred prior (a learnable scale would need a prior centred at 1) and the deep
ensemble's initialisation (LeCun-normal for matrices, zero for vectors) is a sensible start.

Architecture for inputs ``(N, L, C_in)``, ``d = d_model``, ``H = num_heads``, ``C`` classes::

    tokens  h   = x_t @ embed_w + embed_b + pos[t]               (one token per time step,
                                                                   or per patch of ``patch_size`` steps)
    attention   h <- h + MHA(norm(h)) @ wo + bo                   (H heads of width d / H, no q/k/v biases)
    MLP         h <- h + act(norm(h) @ mlp_w0 + mlp_b0) @ mlp_w1 + mlp_b1
    pooling     m   = mean_t norm(h)
    logits          = m @ head_w + head_b

Sites, with ``P = patch_size`` and ``T = L / P`` tokens::

    embed_w (P C_in, d)  embed_b (d,)  pos (T, d)
    wq (d, d)  wk (d, d)  wv (d, d)  wo (d, d)  bo (d,)
    mlp_w0 (d, M)  mlp_b0 (M,)  mlp_w1 (M, d)  mlp_b1 (d,)
    head_w (d, C)  head_b (C,)

The MILE paper used an ``N(0, 0.2)`` prior for its attention model: ``prior_scale=0.2`` is the
default (a standard deviation). The ``"data"`` plate, ``subsample_size`` and the ``logits`` site
follow :func:`numpyro_mile.models.mlp_classification`.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from ._layers import check_sequence_inputs, positive_int, sample_weights
from ._likelihood import categorical_likelihood, check_labels

__all__ = ["attention", "attention_apply", "attention_shapes"]

#: variance floor of the parameter-free layer normalisation
NORM_EPS = 1e-5


def attention_shapes(
    input_shape, num_classes: int, *, d_model: int = 16, mlp_hidden: int = 32, patch_size: int = 1
) -> dict[str, tuple[int, ...]]:
    """Shapes of the latent sites of :func:`attention`, in order.

    :param input_shape: one input without the batch axis, ``(L, C_in)``.
    :return: dict site -> shape.

    **Example**

    >>> from numpyro_mile.models import attention_shapes
    >>> attention_shapes((40, 1), 10, d_model=16)["pos"]
    (40, 16)
    """
    length, c_in = (int(s) for s in input_shape)
    if length % patch_size:
        raise ValueError(f"the sequence length {length} is not a multiple of patch_size={patch_size}.")
    d, m = d_model, mlp_hidden
    return {
        "embed_w": (patch_size * c_in, d),
        "embed_b": (d,),
        "pos": (length // patch_size, d),
        "wq": (d, d),
        "wk": (d, d),
        "wv": (d, d),
        "wo": (d, d),
        "bo": (d,),
        "mlp_w0": (d, m),
        "mlp_b0": (m,),
        "mlp_w1": (m, d),
        "mlp_b1": (d,),
        "head_w": (d, num_classes),
        "head_b": (num_classes,),
    }


def _norm(h: jax.Array) -> jax.Array:
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + NORM_EPS)


def attention_apply(
    params: Mapping[str, jax.Array], X: jax.Array, *, num_heads: int = 2, activation: Callable = jax.nn.gelu
) -> jax.Array:
    """Forward pass of :func:`attention`: inputs ``(N, L, C_in)`` -> logits ``(N, C)``.

    The patch size is read from the shapes (``embed_w`` has ``patch_size * C_in`` rows).
    """
    n, length, c_in = X.shape
    patch = params["embed_w"].shape[0] // c_in
    tokens = X.reshape(n, length // patch, patch * c_in)
    h = tokens @ params["embed_w"] + params["embed_b"] + params["pos"]
    d = h.shape[-1]
    head_dim = d // num_heads

    def split_heads(a):
        return a.reshape(a.shape[0], a.shape[1], num_heads, head_dim)

    x = _norm(h)
    q, k, v = (split_heads(x @ params[w]) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("nqhc,nkhc->nhqk", q, k) / jnp.sqrt(head_dim).astype(h.dtype)
    mixed = jnp.einsum("nhqk,nkhc->nqhc", jax.nn.softmax(scores, axis=-1), v).reshape(h.shape)
    h = h + mixed @ params["wo"] + params["bo"]
    h = h + activation(_norm(h) @ params["mlp_w0"] + params["mlp_b0"]) @ params["mlp_w1"] + params["mlp_b1"]
    pooled = _norm(h).mean(axis=1)
    return pooled @ params["head_w"] + params["head_b"]


def attention(
    X,
    y=None,
    *,
    num_classes: int,
    d_model: int = 16,
    num_heads: int = 2,
    mlp_hidden: int = 32,
    patch_size: int = 1,
    activation: Callable = jax.nn.gelu,
    prior_scale: float = 0.2,
    prior_mean: Mapping[str, jax.Array] | None = None,
    subsample_size: int | None = None,
    record_outputs: bool | None = None,
):
    """Single-block self-attention classifier over sequences ``(N, L, C_in)``.

    Each time step (or each patch of ``patch_size`` steps) becomes a token with a learned
    embedding and position vector; one pre-norm block (multi-head self-attention and an MLP, both
    residual) mixes the tokens; the mean over tokens feeds a linear classifier. Every weight and
    bias has an independent ``Normal(prior_mean, prior_scale)`` prior;
    ``y_i ~ Categorical(logits_i)``. See the module docstring for the site layout.

    :param X: inputs, shape ``(N, L, C_in)`` (e.g. ``mnist1d(channel_axis=True)``: ``(N, 40, 1)``).
    :param y: integer labels in ``[0, num_classes)``, shape ``(N,)``, or ``None`` to predict.
    :param num_classes: number of classes ``C``.
    :param d_model: token width ``d`` (a multiple of ``num_heads``).
    :param num_heads: attention heads ``H``, each of width ``d / H``.
    :param mlp_hidden: hidden width ``M`` of the block's MLP.
    :param patch_size: time steps per token (``L`` must be a multiple); 1: one token per step.
    :param activation: non-linearity of the block's MLP.
    :param prior_scale: standard deviation of the prior of every weight (default 0.2, as the MILE
        paper's attention model).
    :param prior_mean: optional dict site -> array centring the prior (e.g. pretrained weights).
    :param subsample_size: minibatch size of the ``"data"`` plate (``None``: full batch).
    :param record_outputs: record ``logits`` ``(N, C)`` as a deterministic site; default: only when
        ``y is None``.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import MILE
        >>> from numpyro_mile.datasets import mnist1d
        >>> from numpyro_mile.models import attention
        >>> (X, y), _, _ = mnist1d(seed=0, num_samples=200, channel_axis=True)
        >>> mcmc = MCMC(MILE(attention, ensemble_options=dict(max_epochs=2, progress_bar=False)),
        ...             num_warmup=100, num_samples=5, num_chains=2, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y, num_classes=10, d_model=8, patch_size=4)
        >>> mcmc.get_samples()["pos"].shape
        (10, 10, 8)
    """
    check_sequence_inputs(X, y, subsample_size, ranks=(3,), what="rank 3 (N, length, channels)")
    check_labels(y, num_classes)
    d_model, num_heads = positive_int(d_model, "d_model"), positive_int(num_heads, "num_heads")
    mlp_hidden, patch_size = positive_int(mlp_hidden, "mlp_hidden"), positive_int(patch_size, "patch_size")
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be a multiple of num_heads={num_heads}.")
    shapes = attention_shapes(
        jnp.shape(X)[1:], num_classes, d_model=d_model, mlp_hidden=mlp_hidden, patch_size=patch_size
    )
    params = sample_weights(shapes, prior_scale, prior_mean)
    categorical_likelihood(
        lambda x: attention_apply(params, x, num_heads=num_heads, activation=activation),
        X,
        y,
        subsample_size,
        record_outputs,
    )
