"""Likelihood pieces shared by the classifiers of :mod:`numpyro_mile.models`.

:func:`~numpyro_mile.models.mlp_classification`, :func:`~numpyro_mile.models.cnn` and
:func:`~numpyro_mile.models.attention` check their labels with :func:`check_labels` and observe
them with :func:`categorical_likelihood`, so the three share the ``"data"`` plate, the ``y`` and
``logits`` sites and the error messages.

Private to the package: the public names are the re-exports of :mod:`numpyro_mile.models`.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from .._validation import is_concrete


def check_labels(y, num_classes: int) -> None:
    """Check the number of classes and, when ``y`` is concrete, the class labels.

    :param y: class labels, shape ``(N,)``, or ``None`` to predict; a traced ``y`` is not checked.
    :param num_classes: number of classes ``C``.
    :raises ValueError: when ``num_classes < 2``, or ``y`` holds non-integer values or labels
        outside ``[0, num_classes)``.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}.")
    if y is None or not is_concrete(y):
        return
    labels = np.asarray(y)
    if labels.dtype.kind == "f" and not np.all(labels == np.round(labels)):
        raise ValueError("y must hold integer class labels, got non-integer values.")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got values from {labels.min()} to {labels.max()}. "
            "Encode classes as 0..num_classes-1 (e.g. with np.unique(y, return_inverse=True))."
        )


def categorical_likelihood(forward: Callable, X, y, subsample_size: int | None, record_outputs: bool | None) -> None:
    """Observe ``y ~ Categorical(logits=forward(X_batch))`` inside the ``"data"`` plate.

    The plate has ``N`` rows and ``subsample_size`` of them per call, so a minibatch
    log-likelihood is scaled by ``N / subsample_size``.

    :param forward: maps a batch of inputs ``(B, ...)`` (the rows of ``X`` in the minibatch) to
        logits ``(B, C)``.
    :param X: inputs, shape ``(N, ...)``; every axis after the first is one row's event.
    :param y: integer labels, shape ``(N,)`` (cast to ``int32``), or ``None`` to predict.
    :param subsample_size: minibatch size ``B`` of the ``"data"`` plate (``None``: full batch).
    :param record_outputs: record the logits ``(B, C)`` as the deterministic site ``"logits"``;
        ``None``: only when ``y is None``.
    """
    if record_outputs is None:
        record_outputs = y is None
    n = jnp.shape(X)[0]
    event_dim = jnp.ndim(X) - 1
    with numpyro.plate("data", n, subsample_size=subsample_size):
        X_batch = numpyro.subsample(X, event_dim=event_dim)
        y_batch = None if y is None else numpyro.subsample(jnp.asarray(y).astype(jnp.int32), event_dim=0)
        logits = forward(X_batch)
        if record_outputs:
            numpyro.deterministic("logits", logits)
        numpyro.sample("y", dist.Categorical(logits=logits), obs=y_batch)
