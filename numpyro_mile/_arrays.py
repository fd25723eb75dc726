"""Array helpers shared across the package (no imports from it, so any module may use them):
copies to the host, and the storage precisions of saved draws."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import multihost_utils


#: storage precisions for floating-point samples (``None``: keep the sampler's dtype)
STORE_DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
                "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def storage_dtype(store_dtype) -> np.dtype | None:
    """The NumPy dtype of a storage precision name (``None`` stays ``None``); raises for others.

    >>> storage_dtype("bfloat16").itemsize
    2
    """
    if store_dtype is None:
        return None
    name = np.dtype(store_dtype).name if not isinstance(store_dtype, str) else store_dtype
    if name not in STORE_DTYPES:
        raise ValueError(f"store_dtype must be None or one of {sorted(STORE_DTYPES)}, got {store_dtype!r}.")
    return STORE_DTYPES[name]


def round_to_dtype(values, store_dtype) -> np.ndarray:
    """``values`` as they are stored with ``store_dtype`` (floating arrays only; others unchanged).

    :param values: array-like of any shape.
    :param store_dtype: ``None``, ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"float64"``.
    :return: a NumPy array in the storage dtype (round to nearest even).

    >>> round_to_dtype(np.array([1.0, 1.0 + 2**-10]), "bfloat16").astype(float).tolist()
    [1.0, 1.0]
    """
    values = np.asarray(values)
    dtype = storage_dtype(store_dtype)
    if dtype is None or values.dtype.kind != "f" and values.dtype != STORE_DTYPES["bfloat16"]:
        return values
    return values.astype(dtype)


def as_jax_arrays(tree: Any) -> Any:
    """NumPy arrays in ``tree`` as JAX arrays (other leaves unchanged), so that a model can index them with
    traced row indices (``X[idx]`` inside a subsample plate)."""
    return jax.tree.map(lambda a: jnp.asarray(a) if isinstance(a, np.ndarray) else a, tree)


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
