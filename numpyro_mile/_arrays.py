"""Array helpers shared across the package (no imports from it, so any module may use them)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def to_host(tree: Any) -> Any:
    """NumPy copies of a pytree of arrays, gathering shards that live in other processes.

    Arrays that this process can read entirely (single process, or replicated) are copied;
    arrays sharded over several processes are all-gathered (every process must call this).
    """

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)
