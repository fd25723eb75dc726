"""Train/validation/test splits and standardisation of tabular data."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import check_xy

__all__ = ["Split", "Standardizer", "split", "standardize"]

Part = tuple[np.ndarray, np.ndarray]

_FRACTION_TOL = 1e-6


class Split(NamedTuple):
    """A data set cut into three disjoint parts, each an ``(X, y)`` tuple.

    :param train: ``(X, y)`` with shapes ``(N_train, F)``, ``(N_train,)``.
    :param val: ``(X, y)`` with shapes ``(N_val, F)``, ``(N_val,)``.
    :param test: ``(X, y)`` with shapes ``(N_test, F)``, ``(N_test,)``.
    """

    train: Part
    val: Part
    test: Part


class Standardizer(NamedTuple):
    """Per-column affine scaling, ``z = (v - mean) / std``, and its inverse for targets.

    :param x_mean: feature means, shape ``(F,)``, in input units.
    :param x_std: feature standard deviations, shape ``(F,)``; 1 for constant columns.
    :param y_mean: target mean in target units (0 when ``y`` is not standardised).
    :param y_std: target standard deviation in target units (1 when not standardised).
    """

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float

    @classmethod
    def fit(cls, X, y=None) -> "Standardizer":
        """Column means and standard deviations (``ddof=0``) of ``X`` (N, F), and of ``y`` (N,) when given.

        Near-constant columns get a standard deviation of 1; without ``y`` targets are left as they are
        (``y_mean = 0``, ``y_std = 1``: class labels).
        """
        X = np.asarray(X, dtype=np.float64)
        x_mean, x_std = X.mean(axis=0), _safe_std(X)
        if y is None:
            return cls(x_mean, x_std, 0.0, 1.0)
        y = np.asarray(y, dtype=np.float64)
        return cls(x_mean, x_std, float(y.mean()), float(_safe_std(y)))

    def transform_x(self, X) -> np.ndarray:
        """Standardise inputs: ``(X - x_mean) / x_std``, shape ``(N, F)`` -> ``(N, F)``."""
        return (np.asarray(X) - self.x_mean) / self.x_std

    def transform_y(self, y) -> np.ndarray:
        """Standardise targets: ``(y - y_mean) / y_std``, any shape."""
        return (np.asarray(y) - self.y_mean) / self.y_std

    def inverse_y(self, y) -> np.ndarray:
        """Map standardised targets or predictive means back to target units, any shape."""
        return np.asarray(y) * self.y_std + self.y_mean

    def inverse_scale(self, s) -> np.ndarray:
        """Map a scale (standard deviation, RMSE, MAE) back to target units: ``s * y_std``."""
        return np.asarray(s) * self.y_std


def _check_fractions(fractions) -> tuple[float, float, float]:
    values = tuple(float(f) for f in fractions)
    if len(values) != 3:
        raise ValueError(f"fractions must have three entries (train, val, test), got {len(values)}: {values}.")
    if not all(math.isfinite(f) and f > 0 for f in values):
        raise ValueError(f"fractions must all be positive, got {values}.")
    if abs(sum(values) - 1.0) > _FRACTION_TOL:
        raise ValueError(f"fractions must sum to 1, got {values} (sum {sum(values):.6g}).")
    return values  # type: ignore[return-value]


def _part_sizes(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    # The small offset keeps e.g. 0.7 * 10 = 6.999... from flooring to 6.
    n_train = math.floor(fractions[0] * n + 1e-9)
    n_val = math.floor(fractions[1] * n + 1e-9)
    n_test = n - n_train - n_val
    if min(n_train, n_val, n_test) < 1:
        raise ValueError(
            f"{n} rows are too few for fractions {fractions}: the parts would have "
            f"{n_train}/{n_val}/{n_test} rows (train/val/test); every part needs at least one."
        )
    return n_train, n_val, n_test


def split(X, y, *, seed: int, fractions=(0.7, 0.1, 0.2)) -> Split:
    """Shuffle rows and cut them into train, validation and test parts.

    Sizes are ``n_train = floor(f_train * N)``, ``n_val = floor(f_val * N)`` and the rest
    for test. The permutation comes from ``numpy.random.default_rng(seed)``, so the same
    seed gives the same split.

    :param X: inputs, shape ``(N, F)``.
    :param y: targets, shape ``(N,)``.
    :param seed: seed of the shuffle.
    :param fractions: positive ``(train, val, test)`` fractions summing to 1.
    :return: :class:`Split` of ``(X, y)`` tuples; arrays are copies, dtypes kept.
    :raises ValueError: bad shapes, NaN/inf, bad fractions, or a part would be empty.
    """
    check_xy(X, y)
    X, y = np.asarray(X), np.asarray(y)
    fracs = _check_fractions(fractions)
    n_train, n_val, _ = _part_sizes(X.shape[0], fracs)
    order = np.random.default_rng(seed).permutation(X.shape[0])
    bounds = (order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :])
    return Split(*((X[idx], y[idx]) for idx in bounds))


def _safe_std(values: np.ndarray) -> np.ndarray:
    """Column standard deviations (``ddof=0``) with near-constant columns set to 1."""
    mean = values.mean(axis=0)
    std = values.std(axis=0)
    tiny = 1e3 * np.finfo(np.float64).eps * np.maximum(1.0, np.abs(mean))
    return np.where(std <= tiny, 1.0, std)


def _fit(data: Split, stats: str, standardize_y: bool) -> Standardizer:
    if stats == "train":
        X, y = data.train
    elif stats == "full":
        X = np.concatenate([part[0] for part in data])
        y = np.concatenate([part[1] for part in data])
    else:
        raise ValueError(f"stats must be 'train' or 'full', got {stats!r}.")
    return Standardizer.fit(X, y if standardize_y else None)


def standardize(data: Split, *, stats: str = "train", standardize_y: bool = True) -> tuple[Split, Standardizer]:
    """Standardise every part of a split with one set of column means and stds.

    :param data: a :class:`Split` from :func:`split`.
    :param stats: ``"train"`` (default) uses the training part's mean/std; ``"full"`` uses
        all rows of the three parts combined, as the MILE reference code does.
    :param standardize_y: also standardise the targets (regression). Use ``False`` for
        class labels: ``y`` is returned unchanged and ``y_mean = 0``, ``y_std = 1``.
    :return: ``(standardised Split, Standardizer)``; use :meth:`Standardizer.inverse_y` and
        :meth:`Standardizer.inverse_scale` to report predictions in original units.
    :raises ValueError: ``stats`` not ``"train"`` or ``"full"``.
    """
    scaler = _fit(data, stats, standardize_y)

    def scale(part: Part) -> Part:
        X, y = part
        return scaler.transform_x(X), (scaler.transform_y(y) if standardize_y else np.asarray(y))

    return Split(*(scale(part) for part in data)), scaler
