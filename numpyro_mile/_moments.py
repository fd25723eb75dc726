"""Mean and variance summaries of draws, and Chan et al.'s merge of two partial summaries (one place for both)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["Moments", "merge_moments"]


class Moments(NamedTuple):
    """Mean and population variance (``ddof=0``) over ``count`` values, in float64.

    :ivar mean: the mean, an array (one site) or a dict site -> array.
    :ivar var: the variance, the same structure and shapes.
    :ivar count: number of values reduced over (per chain when a chain axis is kept).
    """

    mean: Any
    var: Any
    count: int


def merge_moments(count_a, mean_a, m2_a, count_b, mean_b, m2_b) -> tuple[Any, np.ndarray, np.ndarray]:
    """Chan et al.'s parallel update: the count, mean and sum of squared deviations ``m2`` of two groups
    together, from each group's (arrays broadcast; float64)."""
    total = count_a + count_b
    delta = np.asarray(mean_b, np.float64) - np.asarray(mean_a, np.float64)
    mean = mean_a + delta * (count_b / total)
    m2 = m2_a + m2_b + delta**2 * (count_a * count_b / total)
    return total, mean, m2
