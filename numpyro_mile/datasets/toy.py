"""1-D toy regression with a gap in the inputs, for looking at predictive uncertainty."""

from __future__ import annotations

import numpy as np

__all__ = ["GAP", "toy_function", "toy_regression", "toy_regression_grid"]

#: No training input lies strictly inside this interval.
GAP: tuple[float, float] = (-0.3, 0.3)

_SEGMENTS = ((-1.0, GAP[0]), (GAP[1], 1.0))


def toy_function(x) -> np.ndarray:
    """Noise-free mean of the toy data: ``f(x) = x + 0.3 sin(2 pi x)``.

    :param x: inputs, any shape (unitless).
    :return: ``f(x)``, same shape as ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    return x + 0.3 * np.sin(2.0 * np.pi * x)


def toy_regression(n: int = 200, *, seed: int = 0, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Draw the gap regression data: ``y = f(x) + noise * eps``, ``eps ~ N(0, 1)``.

    Half of the inputs (``n // 2``) are uniform on ``[-1, -0.3)``, the rest uniform on
    ``[0.3, 1)``, so no input falls in the gap ``(-0.3, 0.3)``; rows come in random order.
    The same ``seed`` gives the same data.

    :param n: number of observations, at least 2.
    :param seed: seed of ``numpy.random.default_rng``.
    :param noise: standard deviation of the Gaussian observation noise, ``>= 0``.
    :return: ``(X, y)`` with shapes ``(n, 1)`` and ``(n,)``, ``float64``.
    :raises ValueError: ``n < 2`` or ``noise < 0``.
    """
    if int(n) != n or n < 2:
        raise ValueError(f"n must be an integer >= 2 (one point per side of the gap), got {n}.")
    if not noise >= 0:
        raise ValueError(f"noise must be a non-negative standard deviation, got {noise}.")
    rng = np.random.default_rng(seed)
    counts = (int(n) // 2, int(n) - int(n) // 2)
    x = np.concatenate([rng.uniform(lo, hi, size=k) for (lo, hi), k in zip(_SEGMENTS, counts)])
    x = rng.permutation(x)
    y = toy_function(x) + noise * rng.standard_normal(x.shape[0])
    return x[:, None], y


def toy_regression_grid(n: int = 200, *, low: float = -1.5, high: float = 1.5) -> np.ndarray:
    """Evenly spaced inputs, e.g. for plotting the predictive band across and beyond the gap.

    :param n: number of grid points, at least 2.
    :param low: left end (included).
    :param high: right end (included).
    :return: ``X`` of shape ``(n, 1)``, ``float64``.
    """
    if int(n) != n or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n}.")
    if not low < high:
        raise ValueError(f"low must be smaller than high, got low={low}, high={high}.")
    return np.linspace(low, high, int(n))[:, None]
