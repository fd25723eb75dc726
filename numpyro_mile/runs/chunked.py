"""A chunked driver for MCMC runs that streams draws to disk and resumes bit for bit.

:func:`run_chunked` runs an ``MCMC`` object's whole run (warmup and sampling) in chunks of
``chunk_size`` steps, streams the kept draws of each chunk to a
:class:`numpyro_mile.sample_store.SampleStore` (memory is bounded by one chunk, not by the
run) and saves a checkpoint (:mod:`numpyro_mile.runs.checkpoint`) after each chunk. Called again
with the same arguments after a crash, it continues from the last checkpoint, mid-warmup or
mid-sampling, and produces the same draws, bit for bit, as an uninterrupted run, which are also
the draws ``MCMC.run`` keeps (same keys, same ``thinning`` positions).

NumPyro's ``MCMC.run`` cannot stop mid-warmup: kernels such as MILE and NUTS keep their
adaptation schedule in Python closures built by ``init`` from ``num_warmup``, and ``MCMC``
restarts its own step counter. :func:`run_chunked` therefore drives the kernel itself, with
NumPyro's interface only (``kernel.init``, ``kernel.sample``, ``kernel.postprocess_fn``): on
resume it calls ``init`` with the checkpoint's positions (which rebuilds those closures, and
for MILE skips pretraining), then replaces the fresh state by the saved one.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.util import is_prng_key

from .. import _programs
from .._arrays import storage_dtype
from .. import _progress
from ..inference_data import load_inference_data
from ._state_file import CheckpointError, checkpoint_state, digest, resumed_state, versions, write
from .checkpoint import Checkpoint, check_fingerprint, load_checkpoint, run_fingerprint
from ..sample_store import SampleStore, load_samples

__all__ = ["ChunkProgress", "ChunkedRun", "run_chunked"]


class ChunkProgress(NamedTuple):
    """Passed to ``run_chunked``'s ``callback`` after each chunk is on disk.

    :ivar step: steps taken so far (per chain, warmup included).
    :ivar num_steps: ``num_warmup + num_samples``.
    :ivar num_draws: draws per chain written so far.
    :ivar phase: ``"warmup"`` or ``"sample"`` (of the chunk just finished).
    :ivar seconds: wall time of the chunk (compilation included for the first one).
    :ivar cpu_seconds: CPU time of the process during the chunk.
    """

    step: int
    num_steps: int
    num_draws: int
    phase: str
    seconds: float
    cpu_seconds: float


class ChunkedRun(NamedTuple):
    """Result of :func:`run_chunked`.

    :ivar last_state: the kernel state after the last step taken (as ``mcmc.last_state``; for
        ``sequential`` chains, stacked along a leading chain axis).
    :ivar step: steps taken per chain.
    :ivar num_draws: draws per chain in the sample store.
    :ivar finished: whether all ``num_warmup + num_samples`` steps are done.
    :ivar checkpoint_path: the checkpoint file.
    :ivar sample_dir: the sample store.
    """

    last_state: Any
    step: int
    num_draws: int
    finished: bool
    checkpoint_path: Path
    sample_dir: Path

    def get_samples(self, group_by_chain: bool = False) -> dict:
        """Samples as ``MCMC.get_samples``: memory-mapped ``(chains, draws, ...)`` when ``group_by_chain``."""
        return load_samples(self.sample_dir, group_by_chain=group_by_chain)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict:
        """Collected extra fields, as ``MCMC.get_extra_fields``."""
        return load_samples(self.sample_dir, group_by_chain=group_by_chain, group="sample_stats")

    def to_inference_data(self, upcast: bool = False):
        """ArviZ ``InferenceData`` over the memory-mapped store
        (:func:`numpyro_mile.inference_data.load_inference_data`)."""
        return load_inference_data(self.sample_dir, upcast=upcast)


def _num_kept(step: int, num_warmup: int, num_samples: int, thinning: int) -> int:
    """Draws kept among the first ``step`` steps, at the positions ``MCMC.run`` keeps them.

    NumPyro keeps the state after global step ``j`` (1-based) when ``j - W - r`` is a positive
    multiple of ``thinning``, with ``r = num_samples % thinning``.
    """
    return max(0, step - num_warmup - num_samples % thinning) // thinning


def _collect_spec(kernel, extra_fields) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """NumPyro's collection rule: sample field, default fields, extra fields; ``~z.site`` removes a site."""
    sample_field = kernel.sample_field
    fields, removed = {}, {}
    for name in (sample_field,) + tuple(kernel.default_fields) + tuple(extra_fields):
        if name.startswith(f"~{sample_field}."):
            removed[name[len(sample_field) + 2 :]] = None
        else:
            fields[name] = None
    return tuple(fields), tuple(removed)


def _make_transform(postprocess: Callable, fields: tuple[str, ...], removed: tuple[str, ...]) -> Callable:
    getter = attrgetter(*fields)

    def transform(state):
        values = getter(state)
        values = [values] if len(fields) == 1 else list(values)
        sites = postprocess(values[0])
        if not isinstance(sites, dict):
            sites = {"z": sites}
        sites = {k: v for k, v in sites.items() if k not in removed}
        return {"posterior": sites, "sample_stats": dict(zip(fields[1:], values[1:]))}

    return transform


def _make_transform_of(kernel, mcmc_postprocess, vectorized: bool, fields, removed) -> Callable:
    """``transform_of(model_args, model_kwargs)``: the state -> collected sites function of a run on these
    arguments (``MCMC``'s ``postprocess_fn``, else the kernel's)."""

    def transform_of(model_args, model_kwargs):
        postprocess = (
            mcmc_postprocess if mcmc_postprocess is not None else kernel.postprocess_fn(model_args, model_kwargs)
        )
        return _make_transform(jax.vmap(postprocess) if vectorized else postprocess, fields, removed)

    return transform_of


def _make_advance(kernel, data_key, transform_of: Callable, chunk_size: int, num_buffer: int):
    """``advance(state, num_active, slots, data) -> (state, buffer)``: up to ``chunk_size`` steps in one
    compiled loop; the transformed state after local step ``k`` goes to ``buffer[slots[k]]``
    when ``slots[k] >= 0``. One compilation serves every chunk (``num_active`` is traced) and every
    run of the kernel on data of the same shapes: the model's arrays (``data``, from
    :func:`numpyro_mile._programs.split_data`, joined with ``data_key``) are arguments of the program,
    for the steps and the collected sites alike."""

    def advance(state, num_active, slots, data):
        model_args, model_kwargs = _programs.join_data(data_key, data)
        transform = transform_of(model_args, model_kwargs)
        proto = jax.eval_shape(transform, state)
        buffer = jax.tree.map(lambda s: jnp.zeros((num_buffer,) + s.shape, s.dtype), proto)

        def body(k, carry):
            state, buffer = carry
            state = kernel.sample(state, model_args, model_kwargs)
            slot = slots[k]
            buffer = jax.lax.cond(
                slot >= 0,
                lambda b: jax.tree.map(lambda c, v: c.at[slot].set(v), b, transform(state)),
                lambda b: b,
                buffer,
            )
            return state, buffer

        return jax.lax.fori_loop(0, num_active, body, (state, buffer))

    return jax.jit(advance)


def _cached_advance(key, kernel, build: Callable) -> Callable:
    """The compiled chunk function of an earlier call with the same kernel object and run settings (the
    package's one program cache, :func:`numpyro_mile._programs.program`): resuming, extending or running again
    on new data of the same shapes in the same process does not trace again. The key holds ``kernel`` itself
    (compared by identity), which keeps it alive."""
    return _programs.program(("run_chunked-advance", kernel) + tuple(key), build)


def _device_ids(tree) -> tuple[int, ...]:
    """Ids of the devices ``tree``'s arrays are on: part of the chunk program's key, as a program traced for
    chains sharded over some devices constrains its output to them."""
    return tuple(
        sorted(
            {device.id for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) for device in x.sharding.device_set}
        )
    )


def _strong(state):
    """The state with weak types made strong, as a compiled loop returns it (one compilation for all chunks)."""
    return jax.tree.map(lambda x: x.astype(x.dtype) if getattr(x, "weak_type", False) else x, state)


def _positions(kernel, state):
    return attrgetter(kernel.sample_field)(state)


def _check_mcmc(mcmc, chunk_size):
    if not (hasattr(mcmc, "sampler") and hasattr(mcmc, "num_warmup")):
        raise TypeError(f"run_chunked needs a numpyro.infer.MCMC, got {type(mcmc).__name__}.")
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer (steps per chunk), got {chunk_size!r}.")
    method = mcmc.chain_method
    if mcmc.num_chains > 1 and method not in ("vectorized", "sequential", "parallel"):
        raise ValueError(
            "run_chunked supports chain_method 'vectorized', 'sequential' and 'parallel' "
            f"(run as sequential), got {method!r}."
        )
    if mcmc.num_chains > 1 and mcmc.sampler.is_ensemble_kernel and method != "vectorized":
        raise ValueError("an ensemble kernel needs chain_method='vectorized'.")


def run_chunked(
    mcmc,
    rng_key,
    *args,
    checkpoint_path: str | os.PathLike,
    sample_dir: str | os.PathLike | None = None,
    chunk_size: int = 1000,
    store_dtype: str | None = None,
    extra_fields: tuple = (),
    init_params=None,
    resume: bool = True,
    callback: Callable[[ChunkProgress], bool | None] | None = None,
    **kwargs,
) -> ChunkedRun:
    """Run ``mcmc``'s warmup and sampling in chunks, streaming draws to disk, checkpointing each chunk.

    Uses the ``MCMC`` object's kernel and settings (``num_warmup``, ``num_samples``,
    ``num_chains``, ``chain_method``, ``thinning``, ``postprocess_fn``, ``progress_bar``) and
    takes ``run``'s arguments. Every ``chunk_size`` steps (and once after ``init``, which for
    MILE includes pretraining) the kept draws go to ``sample_dir`` and the state to
    ``checkpoint_path``. If ``checkpoint_path`` exists, the run continues from it (after
    checking that it was written by the same run: model, data, key, kernel and MCMC settings).
    The draws equal those of ``mcmc.run(rng_key, *args, **kwargs)`` bit for bit however often
    the run is interrupted (on the same machine and versions of JAX/XLA). Memory holds the
    state and one chunk of draws.

    :param mcmc: a ``numpyro.infer.MCMC`` (it is not run itself: use the returned object).
    :param rng_key: PRNG key, as for ``MCMC.run``.
    :param args: the model's arguments.
    :param checkpoint_path: checkpoint file (created, or resumed from).
    :param sample_dir: directory of the :class:`~numpyro_mile.sample_store.SampleStore`; default
        ``<checkpoint_path>.samples``.
    :param chunk_size: steps per chunk (per chain). The draws do not depend on it.
    :param store_dtype: storage precision of floating-point draws: ``None`` (as sampled),
        ``"float32"``, ``"bfloat16"``, ``"float16"``.
    :param extra_fields: as in ``MCMC.run`` (array-valued state fields, e.g. ``"step_size"``;
        ``"~z.site"`` leaves a site out).
    :param init_params: as in ``MCMC.run`` (used when starting; ignored when resuming).
    :param resume: continue from an existing checkpoint; ``False`` starts afresh, overwriting it.
    :param callback: called with a :class:`ChunkProgress` after each chunk is saved; returning
        ``True`` stops the run there (resume later by calling ``run_chunked`` again).
    :param kwargs: the model's keyword arguments.
    :return: a :class:`ChunkedRun` (samples via ``.get_samples()`` / ``.to_inference_data()``).

    **Example**

    .. doctest::

        >>> import jax, tempfile
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import MILE, run_chunked
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> kernel = MILE(mlp_regression, ensemble_options=dict(max_epochs=20, progress_bar=False))
        >>> mcmc = MCMC(kernel, num_warmup=200, num_samples=100, num_chains=2, chain_method="vectorized",
        ...             progress_bar=False)
        >>> out = run_chunked(mcmc, jax.random.PRNGKey(0), X, y, hidden=(8,),
        ...                   checkpoint_path=tempfile.mkdtemp() + "/run.ckpt", chunk_size=100)
        >>> out.finished, out.get_samples(group_by_chain=True)["w0"].shape
        (True, (2, 100, 1, 8))
    """
    _check_mcmc(mcmc, chunk_size)
    kernel = mcmc.sampler
    num_warmup, num_samples, num_chains = int(mcmc.num_warmup), int(mcmc.num_samples), int(mcmc.num_chains)
    thinning = int(mcmc.thinning)
    num_steps = num_warmup + num_samples
    checkpoint_path = Path(checkpoint_path)
    sample_dir = (
        Path(sample_dir) if sample_dir is not None else checkpoint_path.with_name(checkpoint_path.name + ".samples")
    )
    store_dtype = None if storage_dtype(store_dtype) is None else storage_dtype(store_dtype).name
    layout = _layout(mcmc)
    fingerprint = run_fingerprint(
        mcmc, args, kwargs, extra_fields=list(extra_fields), store_dtype=store_dtype, rng_key=digest(rng_key)
    )
    fingerprint["chain_method"] = layout
    init_params = jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.result_type(x)), init_params)
    keys = jax.random.split(rng_key, num_chains) if num_chains > 1 and is_prng_key(rng_key) else rng_key

    ckpt = _resume_point(checkpoint_path, fingerprint, layout) if resume and checkpoint_path.exists() else None
    states = _init_states(kernel, layout, keys, num_warmup, init_params, ckpt, args, kwargs)
    step = 0 if ckpt is None else int(ckpt.step)
    drawn = 0 if ckpt is None else int(ckpt.num_draws)

    fields, removed = _collect_spec(kernel, extra_fields)
    transform_of = _make_transform_of(kernel, mcmc.postprocess_fn, layout == "vectorized", fields, removed)
    spec = _store_spec(jax.eval_shape(transform_of(args, kwargs), states[0]), layout)
    store = SampleStore.create(
        sample_dir,
        spec,
        num_chains=num_chains,
        num_draws=num_samples // thinning,
        store_dtype=store_dtype,
        attrs={"num_warmup": num_warmup, "thinning": thinning},
    )
    if store.num_written != drawn:  # a crash after the store advanced but before the checkpoint did
        store.commit(drawn)

    def stacked_state():
        return jax.tree.map(lambda *xs: jnp.stack(xs), *states) if layout == "sequential" else states[0]

    def save(step_done, draws_done):
        meta = {
            "kind": "chunked",
            "step": step_done,
            "num_draws": draws_done,
            "fingerprint": fingerprint,
            "metadata": {"kind": "chunked", "layout": layout, "sample_dir": str(sample_dir)},
        }
        write(checkpoint_path, {"state": checkpoint_state(kernel, stacked_state()), "init_keys": keys}, meta)

    if ckpt is None:
        save(0, 0)  # after init (for MILE: after pretraining)

    num_buffer = max(1, -(-min(chunk_size, max(num_samples, 1)) // thinning))
    chunk_len = min(chunk_size, max(num_steps, 1))
    data = _programs.split_data(args, kwargs)
    # the run's settings without its data values and key (arguments of the program): a run on new data of the
    # same shapes reuses the program
    settings = {name: value for name, value in fingerprint.items() if name not in ("data", "rng_key")}
    advance = _cached_advance(
        (
            json.dumps(settings, sort_keys=True),
            data.key,
            layout,
            chunk_len,
            num_buffer,
            fields,
            removed,
            _device_ids(states),
        ),
        kernel,
        lambda: _make_advance(kernel, data.key, transform_of, chunk_len, num_buffer),
    )
    bar = _progress.progress_bar(num_steps, initial=step, disable=not mcmc.progress_bar)
    try:
        while step < num_steps:
            stop = min(step + chunk_size, num_warmup if step < num_warmup else num_steps)
            phase = "warmup" if step < num_warmup else "sample"
            slots, first, n_kept = _chunk_slots(step, stop, chunk_len, num_warmup, num_samples, thinning)
            t0, c0 = time.perf_counter(), time.process_time()
            buffers = []
            for c, state in enumerate(states):
                states[c], buffer = advance(state, jnp.asarray(stop - step, jnp.int32), jnp.asarray(slots), data.arrays)
                buffers.append(jax.device_get(buffer) if n_kept else None)
            if n_kept:
                store.write(_gather(buffers, spec, n_kept, layout), first)
            jax.block_until_ready(states)
            step, drawn = stop, first + n_kept
            save(step, drawn)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            bar.set_description(phase, refresh=False)
            bar.update(stop - bar.n)
            if callback is not None and callback(ChunkProgress(step, num_steps, drawn, phase, seconds, cpu)):
                break
    finally:
        bar.close()
    return ChunkedRun(stacked_state(), step, drawn, step >= num_steps, checkpoint_path, sample_dir)


def _layout(mcmc) -> str:
    """``"single"`` (one chain), ``"vectorized"`` (one batched state) or ``"sequential"`` (a state per chain)."""
    if mcmc.num_chains == 1:
        return "single"
    if mcmc.chain_method == "vectorized":
        return "vectorized"
    if mcmc.chain_method == "parallel":
        warnings.warn(
            "run_chunked runs chain_method='parallel' chains one after the other (as 'sequential').",
            UserWarning,
            stacklevel=3,
        )
    return "sequential"


def _resume_point(path: Path, fingerprint: dict, layout: str) -> Checkpoint:
    """The checkpoint to resume from, after checking that it is this run's."""
    ckpt = load_checkpoint(path)
    if ckpt.metadata.get("kind") != "chunked" or ckpt.metadata.get("layout") != layout:
        raise CheckpointError(
            f"{path} was not written by run_chunked with this chain layout; pass another checkpoint_path."
        )
    check_fingerprint(ckpt.fingerprint, fingerprint, path)
    saved_versions = ckpt.metadata.get("versions") or {}
    if saved_versions and saved_versions != versions():
        warnings.warn(
            f"{path} was written with {saved_versions}, this process runs {versions()}: the resumed draws "
            "may differ in the last bits from an uninterrupted run.",
            UserWarning,
            stacklevel=3,
        )
    return ckpt


def _init_states(kernel, layout, keys, num_warmup, init_params, ckpt, args, kwargs) -> list:
    """Initial states: ``kernel.init`` as ``MCMC.run`` calls it, or, when resuming, ``init`` at the saved
    positions (it rebuilds the kernel's closures; for MILE without pretraining) and then the saved state."""

    def init(key, params):
        return kernel.init(key, num_warmup, params, model_args=args, model_kwargs=kwargs)

    if layout != "sequential":
        if ckpt is None:
            return [_strong(init(keys, init_params))]
        fresh = init(keys, _positions(kernel, ckpt.state))
        return [_strong(resumed_state(kernel, ckpt.state, fresh))]
    num_chains = keys.shape[0]
    if ckpt is None:
        return [
            _strong(init(keys[c], None if init_params is None else jax.tree.map(lambda x: x[c], init_params)))
            for c in range(num_chains)
        ]
    saved = [jax.tree.map(lambda x: x[c], ckpt.state) for c in range(num_chains)]
    return [
        _strong(resumed_state(kernel, saved[c], init(keys[c], _positions(kernel, saved[c])))) for c in range(num_chains)
    ]


def _store_spec(proto: dict, layout: str) -> dict:
    """``{group: {name: (shape per draw, dtype)}}`` from the shapes of one collected step."""
    lead = 1 if layout == "vectorized" else 0
    spec = {}
    for group, values in proto.items():
        for name, shape in values.items():
            if not hasattr(shape, "shape"):
                raise ValueError(
                    f"extra field {name!r} is not an array; collect one of its array sub-fields "
                    f"(e.g. '{name}.step_size')."
                )
            spec.setdefault(group, {})[name] = (shape.shape[lead:], shape.dtype)
    return spec


def _chunk_slots(
    step: int, stop: int, chunk_len: int, num_warmup: int, num_samples: int, thinning: int
) -> tuple[np.ndarray, int, int]:
    """For steps ``step+1 .. stop``: the buffer slot of each kept state (-1: not kept), the index of the
    chunk's first draw, and the number of draws kept in the chunk."""
    first = _num_kept(step, num_warmup, num_samples, thinning)
    slots = np.full(chunk_len, -1, np.int32)
    for k in range(stop - step):
        kept = _num_kept(step + k + 1, num_warmup, num_samples, thinning)
        if kept > _num_kept(step + k, num_warmup, num_samples, thinning):
            slots[k] = kept - 1 - first
    return slots, first, _num_kept(stop, num_warmup, num_samples, thinning) - first


def _gather(buffers: list, spec: dict, n_kept: int, layout: str) -> dict:
    """The chunk's draws as ``{group: {name: (chains, n_kept, ...)}}`` from the per-state buffers."""
    values = {}
    for group, variables in spec.items():
        values[group] = {}
        for name in variables:
            parts = [np.asarray(b[group][name][:n_kept]) for b in buffers]
            parts = [np.swapaxes(p, 0, 1) if layout == "vectorized" else p[None] for p in parts]
            values[group][name] = np.concatenate(parts, axis=0)
    return values
