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
STORE_DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


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


#: name of the device-mesh axis that chains are sharded over
CHAIN_AXIS = "chains"


#: On CPU devices, ``vectorized`` chains are sharded by default when one step of all of them costs at least
#: this many floating-point operations (XLA's count): NumPyro's progress bar calls the compiled step once per
#: step, and a step split over several devices pays a launch on each, which a cheap step does not earn back.
#: The value comes from CPU measurements (docs/distributed.md says which), so it decides for CPU devices only:
#: on other platforms chains stay where NumPyro puts them unless the caller asks for sharding.
MIN_SHARDED_STEP_FLOPS = 2e7


def default_chain_sharding(
    num_chains: int, *trees: Any, step_flops: float | None = None
) -> jax.sharding.NamedSharding | None:
    """Where ``vectorized`` chains go by default: sharded over this process's devices when it has several.

    The chain axis is split over the largest number of local devices that divides ``num_chains``
    (12 chains on 2 CPU devices: 6 each; on 8 GPUs: 4 devices of 3), so no chain is padded and every
    chain computes what it computes on one device (up to float rounding). ``None`` (leave the
    placement to JAX) when there is one device or one chain, in a multi-process run
    (:func:`numpyro_mile.run_distributed` places those chains), under a transformation (traced
    values), or when any array of ``trees`` (the per-chain keys and initial values) is committed
    to devices: a placement the caller chose (``jax.device_put(key, jax.devices()[0])`` keeps a
    run on one device) is kept. With ``step_flops`` (the work of one step of all chains, the automatic
    rule), also ``None`` below :data:`MIN_SHARDED_STEP_FLOPS` on CPU devices and always on other platforms,
    where no threshold was measured (pass ``step_flops=None`` to shard there).

    CPU cores are JAX devices only after ``numpyro.set_host_device_count(n)`` (before JAX starts).
    """
    devices = jax.local_devices()
    if num_chains < 2 or len(devices) < 2 or jax.process_count() > 1:
        return None
    if step_flops is not None and (devices[0].platform != "cpu" or step_flops < MIN_SHARDED_STEP_FLOPS):
        return None
    for leaf in jax.tree.leaves(trees):
        if isinstance(leaf, jax.core.Tracer) or (isinstance(leaf, jax.Array) and leaf.committed):
            return None
    used = max(n for n in range(1, min(len(devices), num_chains) + 1) if num_chains % n == 0)
    if used < 2:
        return None
    mesh = jax.sharding.Mesh(np.asarray(devices[:used], dtype=object), (CHAIN_AXIS,))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CHAIN_AXIS))


def place_chains(tree: Any, sharding: jax.sharding.NamedSharding | None) -> Any:
    """``tree`` (arrays with a leading chain axis) placed with ``sharding``; unchanged for ``None``."""
    return tree if sharding is None or tree is None else jax.device_put(tree, sharding)


def place_state(state: Any, axes: Any, mesh: jax.sharding.Mesh | None) -> Any:
    """``state`` of chains sharded over ``mesh``, placed as a compiled step returns it: the leaves with a chain
    axis (``axes``: a prefix tree of ``state`` holding ``0``) split along it, the others (``None``: the step
    counter, the model's data) copied to every device of ``mesh``. Unchanged for ``mesh=None``.

    Called on the state ``init`` makes and, inside the step (traced: a sharding constraint), on the state it
    returns: a state that enters a compiled step placed the way it leaves it is compiled for once; otherwise the
    second call compiles the step again (NumPyro's progress-bar loop and ``run_chunked`` call it repeatedly)."""
    if mesh is None:
        return state
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names[0]))  # any axis name
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(x, sharding):
        if isinstance(x, jax.core.Tracer):
            return jax.lax.with_sharding_constraint(x, sharding)
        return jax.device_put(x, sharding)

    return jax.tree.map(
        lambda axis, sub: jax.tree.map(lambda x: put(x, whole if axis is None else split), sub),
        axes,
        state,
        is_leaf=lambda x: x is None,
    )


def chain_mesh_of(keys: Any) -> jax.sharding.Mesh | None:
    """The one-axis mesh that per-chain ``keys`` are sharded over along their chain axis (by
    :func:`default_chain_sharding` or :func:`numpyro_mile.runs.distributed.shard_chains`), or ``None``
    when they are not sharded over several devices, are traced, or span several processes."""
    sharding = getattr(keys, "sharding", None)
    if (
        isinstance(keys, jax.core.Tracer)
        or not isinstance(sharding, jax.sharding.NamedSharding)
        or len(sharding.mesh.axis_names) != 1
        or len(sharding.device_set) < 2
        or not keys.is_fully_addressable
    ):
        return None
    spec = tuple(sharding.spec)
    return sharding.mesh if spec and spec[0] == sharding.mesh.axis_names[0] else None
