"""Chains sharded over every device JAX sees: several GPUs, or several hosts after ``jax.distributed.initialize()``.

JAX is the distributed engine; nothing here schedules work itself. :func:`run_distributed`
runs an ordinary ``MCMC(..., chain_method="vectorized")`` with its per-chain inputs (keys,
``init_params``) placed as *global* arrays sharded over a one-axis device mesh named
``"chains"`` (:func:`chain_mesh`). The vectorized program is then compiled once for all
devices and partitioned by XLA (GSPMD): every device runs its block of chains, and every
per-chain array of the state and of the collected samples stays sharded over the chain axis.
It is the same code path as ``vectorized``, so a chain gives the same draws as in a
single-device vectorized run with the same key (up to float rounding: XLA may vectorise a
block of 2 chains differently from a block of 8).

Why not a ``chain_method`` callable: NumPyro's ``MCMC`` batches the postprocessing (and the
kernels batch their own state, e.g. MILE's shared iteration counter and ICSGLD's shared
histogram) only for the string ``"vectorized"``; a callable receives the *per-chain* function,
under which MILE's phase counter becomes batched (its end-of-warmup ESS would run every step)
and an ensemble kernel cannot work at all. ``pmap`` (``chain_method="parallel"``) is in
maintenance mode and sees only one process's devices.

Chain counts that are not a multiple of the device count are padded: the chain axis is
extended to the next multiple with copies of the last chain (same key, same start, so the
copy repeats that chain's computation and cannot change any other chain), and the copies are
dropped from the results. An ensemble kernel is told the number of real walkers through its
``num_active_chains`` setting, so that padded walkers do not enter shared statistics
(ICSGLD's histogram update is a mean over the real walkers only): the run uses a copy of the
kernel with that setting (``kernel.replace(num_active_chains=...)``), which becomes ``mcmc.sampler``.

What crosses devices: for MILE and SGLD only a few scalars per step (the NaN-warning counts);
for ICSGLD the histogram update ``H`` (``m`` numbers) and the energy range (2 scalars), never
positions or gradients. :func:`collectives` lists the collective operations of a compiled
function so that this can be checked (the tests do).

Several processes (Slurm, Open MPI, TPU pods): call ``jax.distributed.initialize()`` first;
every process then runs the same script with the same key and data, :func:`chain_mesh` spans
the devices of all processes, and with ``gather=True`` every process receives all chains'
samples as NumPy arrays (an all-gather; keep ``gather=False`` to leave them sharded). See
``docs/distributed.md`` for the commands.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._arrays import CHAIN_AXIS, to_host
from ..ensemble import fit_members

__all__ = [
    "CHAIN_AXIS",
    "Collective",
    "DistributedRun",
    "chain_mesh",
    "collectives",
    "padded_size",
    "run_distributed",
    "shard_chains",
    "sharded_deep_ensemble",
    "to_host",
]


class DistributedRun(NamedTuple):
    """Result of :func:`run_distributed`.

    :ivar samples: dict site -> array ``(num_chains, num_draws, ...)`` (unconstrained sites
        and deterministic sites, as ``mcmc.get_samples(group_by_chain=True)``). NumPy arrays
        when gathered, else global ``jax.Array`` s sharded over the chain axis and still holding
        the ``num_padded_chains - num_chains`` padding chains at the end.
    :ivar extra_fields: dict field -> array ``(num_chains, num_draws, ...)``, like ``samples``.
    :ivar num_chains: number of real chains.
    :ivar num_padded_chains: length of the chain axis that ran (a multiple of the device count).
    :ivar mesh: the device mesh the chains ran on.
    """

    samples: dict
    extra_fields: dict
    num_chains: int
    num_padded_chains: int
    mesh: Mesh


class Collective(NamedTuple):
    """One cross-device operation of a compiled program (see :func:`collectives`).

    :ivar op: HLO operation (``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
        ``collective-permute``, with or without an async ``-start`` suffix).
    :ivar shape: result shape(s) as written in the HLO, e.g. ``"f32[20]"``.
    :ivar num_elements: number of elements of the result (summed over a tuple result).
    """

    op: str
    shape: str
    num_elements: int


# ---------------------------------------------------------------------------------------------- mesh and padding
def chain_mesh(devices: Sequence[jax.Device] | None = None, axis_name: str = CHAIN_AXIS) -> Mesh:
    """A one-axis device mesh for chains: every device JAX sees (all processes) by default.

    :param devices: the devices to use, e.g. ``jax.devices()[:2]``; default ``jax.devices()``
        (after ``jax.distributed.initialize()`` this includes the other processes' devices).
    :param axis_name: name of the mesh axis.
    :return: a :class:`jax.sharding.Mesh` of shape ``(len(devices),)``.

    **Example**

    .. doctest::

        >>> from numpyro_mile.runs.distributed import chain_mesh
        >>> chain_mesh().axis_names
        ('chains',)
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("chain_mesh needs at least one device; pass devices=jax.devices() or a non-empty subset.")
    return Mesh(np.asarray(devices, dtype=object), (axis_name,))


def padded_size(num_chains: int, num_devices: int) -> int:
    """The smallest multiple of ``num_devices`` that is at least ``num_chains``.

    >>> padded_size(6, 4)
    8
    """
    if int(num_chains) != num_chains or num_chains < 1:
        raise ValueError(f"num_chains must be a positive integer, got {num_chains!r}.")
    if int(num_devices) != num_devices or num_devices < 1:
        raise ValueError(f"num_devices must be a positive integer, got {num_devices!r}.")
    return int(math.ceil(num_chains / num_devices) * num_devices)


def _mesh_size(mesh: Mesh) -> int:
    return int(np.prod(list(mesh.shape.values())))


def _chain_sharding(mesh: Mesh) -> NamedSharding:
    if len(mesh.axis_names) != 1:
        raise ValueError(
            f"expected a one-axis mesh of chains (chain_mesh()), got axes {mesh.axis_names}; the chains are "
            "sharded over a single axis."
        )
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))


def _pad_host(value: np.ndarray, size: int) -> np.ndarray:
    """Extend the leading axis to ``size`` with copies of the last entry."""
    if value.shape[0] == size:
        return value
    extra = np.repeat(value[-1:], size - value.shape[0], axis=0)
    return np.concatenate([value, extra], axis=0)


def _put_sharded(host: np.ndarray, sharding: NamedSharding) -> jax.Array:
    # make_array_from_callback works with devices of other processes: each process fills its own shards
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_chains(tree: Any, mesh: Mesh | None = None, num_chains: int | None = None) -> Any:
    """Place arrays with a leading chain axis on ``mesh``, padded to a multiple of its size.

    Every leaf must have the same leading size ``num_chains``; it is padded with copies of the
    last chain (:func:`padded_size`) and sharded over the mesh's axis. Typed PRNG keys
    (``jax.random.key``) and raw ``uint32`` keys (``jax.random.PRNGKey``) both work. In a
    multi-process run every process must pass the same values.

    :param tree: a pytree of arrays, each of shape ``(num_chains, ...)``.
    :param mesh: default :func:`chain_mesh`.
    :param num_chains: expected leading size (checked); default: that of the first leaf.
    :return: the same pytree of global arrays of shape ``(padded, ...)``.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile.runs.distributed import shard_chains
        >>> keys = shard_chains(jax.random.split(jax.random.PRNGKey(0), 3))
        >>> keys.shape[0] % jax.device_count()
        0
    """
    mesh = chain_mesh() if mesh is None else mesh
    sharding = _chain_sharding(mesh)
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return tree
    sizes = {int(np.shape(leaf)[0]) if np.ndim(leaf) else None for leaf in leaves}
    if num_chains is None:
        num_chains = next(iter(sizes))
    if sizes != {num_chains}:
        raise ValueError(
            f"every array must have a leading chain axis of size num_chains={num_chains}; got leading sizes "
            f"{sorted(map(str, sizes))}."
        )
    size = padded_size(num_chains, _mesh_size(mesh))

    def place(leaf):
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(leaf)
            data = _put_sharded(_pad_host(np.asarray(to_host(jax.random.key_data(leaf))), size), sharding)
            return jax.random.wrap_key_data(data, impl=impl)
        return _put_sharded(_pad_host(np.asarray(to_host(leaf)), size), sharding)

    return jax.tree.map(place, tree)


def _unpad(tree: Any, num_chains: int) -> Any:
    return jax.tree.map(lambda x: x[:num_chains], tree)


# ---------------------------------------------------------------------------------------------- run
def _chain_keys(rng_key, num_chains: int):
    if isinstance(rng_key, jax.Array) and jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        single = rng_key.ndim == 0
    else:
        single = np.ndim(rng_key) == 1
    if single:
        return jax.random.split(rng_key, num_chains) if num_chains > 1 else rng_key[None]
    if int(np.shape(rng_key)[0]) != num_chains:
        raise ValueError(
            f"rng_key holds {np.shape(rng_key)[0]} keys but the MCMC has num_chains={num_chains}; pass one key "
            "or one per chain."
        )
    return rng_key


def _set_results(mcmc, states: dict, num_chains: int) -> None:
    """Make ``mcmc.get_samples`` / ``get_extra_fields`` return the unpadded chains."""
    if not hasattr(mcmc, "_states") or not hasattr(mcmc, "_states_flat"):
        raise RuntimeError(
            "this NumPyro version keeps MCMC results elsewhere; use the samples returned by run_distributed "
            "(DistributedRun.samples) instead of mcmc.get_samples()."
        )
    mcmc._states = states
    mcmc._states_flat = None
    mcmc.num_chains = num_chains


def run_distributed(
    mcmc,
    rng_key,
    *model_args,
    mesh: Mesh | None = None,
    gather: bool = True,
    extra_fields: Sequence[str] = (),
    init_params: dict | None = None,
    **model_kwargs,
) -> DistributedRun:
    """Run ``mcmc`` (``chain_method="vectorized"``) with its chains sharded over ``mesh``.

    The chain keys are those of ``mcmc.run`` (``jax.random.split(rng_key, num_chains)``), so
    chain ``k`` gives the draws of chain ``k`` of an ordinary vectorized run with the same key
    (up to float rounding). Works for MILE (including its deep-ensemble pretraining, which is
    sharded the same way), SMILE, SGLD, ICSGLD and any per-chain NumPyro kernel that supports
    ``vectorized``.

    After the call ``mcmc.get_samples()`` and ``mcmc.get_extra_fields()`` return the real
    chains (gathered NumPy values with ``gather=True``); ``mcmc.last_state`` keeps the padded,
    sharded state (the first ``num_chains`` entries are the real chains), so that a later
    ``mcmc.post_warmup_state = mcmc.last_state`` followed by ``run_distributed`` resumes. When it
    pads an ensemble kernel's walkers, ``mcmc.sampler`` is from then on a copy of the kernel whose
    ``num_active_chains`` names the real ones (the kernel passed in is left as it was).

    :param mcmc: a ``numpyro.infer.MCMC`` with ``chain_method="vectorized"`` (any method when
        ``num_chains=1``).
    :param rng_key: one PRNG key, or one per chain ``(num_chains, 2)``. In a multi-process run
        every process passes the same key and the same data.
    :param model_args: the model's positional arguments (e.g. ``X, y``), as for ``mcmc.run``.
    :param mesh: a one-axis mesh; default :func:`chain_mesh` (every device of every process).
    :param gather: return the samples as NumPy arrays on every process (an all-gather across
        processes), with the padding removed; ``False`` keeps global sharded arrays with the
        padding chains at the end of the chain axis.
    :param extra_fields: as for ``mcmc.run``.
    :param init_params: unconstrained initial values, dict site -> ``(num_chains, ...)``.
    :param model_kwargs: the model's keyword arguments.
    :return: a :class:`DistributedRun`.
    :raises ValueError: for another ``chain_method``, or an ensemble kernel that cannot mask
        padded walkers when the chain count is not a multiple of the device count.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import SGLD, run_distributed
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> mcmc = MCMC(SGLD(mlp_regression, 1e-4), num_warmup=50, num_samples=20, num_chains=3,
        ...             chain_method="vectorized", progress_bar=False)
        >>> out = run_distributed(mcmc, jax.random.PRNGKey(0), X, y, hidden=(8,), subsample_size=20)
        >>> out.samples["w0"].shape
        (3, 20, 1, 8)
    """
    if mcmc.chain_method != "vectorized" and mcmc.num_chains != 1:
        raise ValueError(
            f"run_distributed shards the 'vectorized' chain method, got chain_method={mcmc.chain_method!r}; "
            "create the MCMC with chain_method='vectorized'."
        )
    mesh = chain_mesh() if mesh is None else mesh
    num_chains = int(mcmc.num_chains)
    size = padded_size(num_chains, _mesh_size(mesh))
    kernel = mcmc.sampler
    masks_walkers = "num_active_chains" in getattr(kernel, "settings", dict)()
    if kernel.is_ensemble_kernel and size != num_chains and not masks_walkers:
        raise ValueError(
            f"{type(kernel).__name__} is an ensemble kernel whose walkers interact, and {num_chains} walkers do not "
            f"fill {_mesh_size(mesh)} devices evenly; padding walkers would change the shared statistics. Use a "
            f"multiple of {_mesh_size(mesh)} chains."
        )
    if kernel.is_ensemble_kernel and num_chains < 2:
        raise ValueError("an ensemble kernel needs at least 2 walkers (num_chains >= 2).")

    keys = shard_chains(_chain_keys(rng_key, num_chains), mesh, num_chains)
    if init_params is not None:
        init_params = shard_chains(init_params, mesh, num_chains)
    if size == 1:  # MCMC runs a single chain unbatched (one device, nothing to shard)
        keys = keys[0]
        init_params = None if init_params is None else jax.tree.map(lambda x: x[0], init_params)
    active = num_chains if size != num_chains else None
    if kernel.is_ensemble_kernel and masks_walkers and kernel.num_active_chains != active:
        mcmc.sampler = kernel = kernel.replace(num_active_chains=active)  # the user's kernel keeps its settings
        # NumPyro keeps the compiled sampling functions of the previous sampler, keyed by the data only
        mcmc._cache.clear()  # noqa: SLF001
        mcmc._init_state_cache.clear()  # noqa: SLF001
    chain_method = mcmc.chain_method
    mcmc.num_chains, mcmc.chain_method = size, "vectorized"  # one chain padded to several: batched
    try:
        mcmc.run(keys, *model_args, extra_fields=tuple(extra_fields), init_params=init_params, **model_kwargs)
    finally:
        mcmc.num_chains, mcmc.chain_method = num_chains, chain_method
    states = mcmc._states  # noqa: SLF001  (the padded, sharded results of the vectorized run)
    if gather:
        states = _unpad(to_host(states), num_chains)
    _set_results(mcmc, states, num_chains)
    sample_field = kernel.sample_field
    return DistributedRun(
        samples=states[sample_field],
        extra_fields={k: v for k, v in states.items() if k != sample_field},
        num_chains=num_chains,
        num_padded_chains=size,
        mesh=mesh,
    )


# ---------------------------------------------------------------------------------------------- deep ensemble
def sharded_deep_ensemble(
    model: Callable,
    rng_key,
    num_members: int,
    *model_args,
    mesh: Mesh | None = None,
    gather: bool = True,
    **kwargs,
):
    """:func:`numpyro_mile.deep_ensemble` with the members sharded over ``mesh``.

    Member ``k`` uses the same key as in ``deep_ensemble(model, rng_key, num_members, ...)``
    and depends on nothing else, so the members equal the single-device ones (up to float
    rounding). Padding members (copies of the last one) are dropped.

    :param model: a NumPyro model with its observations in the ``"data"`` plate.
    :param rng_key: a PRNG key (the same on every process).
    :param num_members: ensemble size.
    :param model_args: the training data, as passed to the model.
    :param mesh: default :func:`chain_mesh`.
    :param gather: NumPy results on every process (``False``: global sharded arrays, padded).
    :param kwargs: options of :func:`numpyro_mile.deep_ensemble` (``max_epochs``,
        ``optimizer``, ...) and the model's keyword arguments.
    :return: a :class:`numpyro_mile.DeepEnsemble` with ``num_members`` members.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile.runs.distributed import sharded_deep_ensemble
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> de = sharded_deep_ensemble(mlp_regression, jax.random.PRNGKey(0), 3, X, y, max_epochs=5,
        ...                            progress_bar=False)
        >>> de.init_params["w0"].shape
        (3, 1, 16)
    """

    if int(num_members) != num_members or num_members < 1:
        raise ValueError(f"num_members must be a positive integer, got {num_members!r}.")
    mesh = chain_mesh() if mesh is None else mesh
    option_names = {
        name
        for name, p in inspect.signature(fit_members).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    options = {k: v for k, v in kwargs.items() if k in option_names}
    model_kwargs = {k: v for k, v in kwargs.items() if k not in option_names}
    keys = shard_chains(jax.random.split(rng_key, num_members), mesh, num_members)
    ensemble = fit_members(model, keys, tuple(model_args), model_kwargs, **options)
    if not gather:
        return ensemble
    fields = ensemble._asdict()
    for name in ("init_params", "samples", "train_loss", "val_loss", "num_epochs", "best_val_loss"):
        fields[name] = _unpad(to_host(fields[name]), num_members)
    return type(ensemble)(**fields)


# ---------------------------------------------------------------------------------------------- inspection
_COLLECTIVE = re.compile(
    r"=\s*(?P<shape>\([^)]*\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?P<start>-start)?\("
)
_ARRAY = re.compile(r"[a-z0-9]+\[([0-9,]*)\]")


def collectives(compiled: Any) -> list[Collective]:
    """The cross-device operations of a compiled program, with their result sizes.

    :param compiled: ``jax.jit(f).lower(*args).compile()`` or its ``as_text()``.
    :return: one :class:`Collective` per operation in the optimised HLO.

    **Example**

    .. doctest::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro_mile.runs.distributed import chain_mesh, collectives, shard_chains
        >>> x = shard_chains(jnp.ones((jax.device_count(), 3)))
        >>> ops = collectives(jax.jit(lambda a: a.mean(0)).lower(x).compile())
        >>> all(op.num_elements <= 3 for op in ops)
        True
    """
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    out = []
    for match in _COLLECTIVE.finditer(text):
        shape = match.group("shape")
        arrays = _ARRAY.findall(shape)
        if match.group("start") and shape.startswith("("):  # async start: (operands, results, ...) tuple
            arrays = arrays[len(arrays) // 2 :] if len(arrays) > 1 else arrays
        count = sum(int(np.prod([int(d) for d in dims.split(",") if d])) for dims in arrays)
        out.append(Collective(match.group("op") + (match.group("start") or ""), shape, count))
    return out
