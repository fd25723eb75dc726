"""MILE's cost before a run: gradient evaluations, measured seconds per step, and memory.

:func:`estimate_cost` is what :meth:`numpyro_mile.MILE.estimate_cost` runs; it uses the kernel's
public settings and its ``init`` / ``step_fn`` only.
"""

from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import jax
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn, initialize_model, potential_energy

from .._arrays import storage_dtype
from ._mclmc import GRAD_EVALS_PER_STEP
from ._mile_tuning import make_schedule

__all__ = ["CostEstimate", "estimate_cost", "num_grad_evals", "phase3_limits"]


#: XLA's work space of the FFT-based ESS of one chain's Phase III positions, in units of those positions (4.75-4.78
#: by XLA's memory analysis of the compiled ESS at 300-10,000 positions x 40-2,000 coordinates, float32)
ESS_WORK_FACTOR = 4.8


#: per-device limits of Phase III's work space on CPU: its stored positions, and the ESS's FFT arrays. XLA's CPU
#: runtime allocates a program's whole work space at every launch (NumPyro's progress-bar loop launches MILE's
#: step once per step), and glibc maps large allocations afresh and may hand freed ones back to the system (its
#: mmap threshold adapts up to 32 MiB; its allocator's per-thread heaps shrink when their top is freed): then every
#: launch pays a page fault per page the step touches, at any phase of the run. Phase III keeps its part well
#: below that by moving groups of chains one group after another and by computing the ESS over blocks of
#: coordinates: the same moves and the same statistic.
PHASE3_POSITIONS_BYTES = 4 * 2**20
#: the ESS's part of that limit (:data:`PHASE3_POSITIONS_BYTES`: the stored positions' part)
PHASE3_ESS_BYTES = 4 * 2**20


def phase3_limits(platform: str, chains: int, num_stored: int, num_columns: int, itemsize: int) -> tuple[int, int]:
    """``(chains per group, ESS columns per block)`` that keep Phase III's work space on one device within
    :data:`PHASE3_POSITIONS_BYTES` and :data:`PHASE3_ESS_BYTES` on CPU (``platform``): ``chains`` on the device,
    each storing ``num_stored`` positions of ``num_columns`` coordinates of ``itemsize`` bytes. No limit on other
    platforms, whose work space comes from a pool. The group size divides ``chains``."""
    if platform != "cpu":
        return chains, num_columns
    fits = max(1, PHASE3_POSITIONS_BYTES // (num_stored * num_columns * itemsize))
    group = max(n for n in range(1, chains + 1) if chains % n == 0 and n <= fits)
    columns = int(PHASE3_ESS_BYTES / (ESS_WORK_FACTOR * num_stored * itemsize))
    return group, max(1, min(num_columns, columns))


class CostEstimate(NamedTuple):
    """Predicted cost of a MILE run (pretraining and compilation excluded) and its memory.

    :ivar num_grad_evals: gradient evaluations of all chains together.
    :ivar seconds_per_step: measured wall time of one step of all chains: MILE's compiled step
        (``method="step"``) or twice one vectorized gradient evaluation (``method="gradient"``).
    :ivar predicted_seconds: ``seconds_per_step * (num_warmup + num_samples)``.
    :ivar cpu_seconds_per_step: the same in process CPU time (less sensitive to other processes).
    :ivar predicted_cpu_seconds: ``cpu_seconds_per_step * (num_warmup + num_samples)``.
    :ivar compile_seconds: wall time to compile what was timed (the run compiles more: see the note
        of :meth:`MILE.estimate_cost`).
    :ivar num_params: unconstrained latent dimension ``d`` of one chain.
    :ivar state_bytes: the MILE state of all chains: position, momentum and gradient, Phase II mean
        and variance (``5 d``).
    :ivar phase3_bytes: the Phase III positions held at once during the one step that runs Phase III
        (``min(n3, max_stored_samples) x min(d, ess_num_coords)`` per chain; of all chains, or on CPU of one group
        of them: :func:`phase3_limits`, for chains on one device).
    :ivar sample_bytes: all kept draws, ``num_chains x (num_samples // thinning)`` times the
        constrained values of one draw (latent and deterministic sites), in the storage dtype.
    :ivar data_bytes: the array model arguments. (The state carries them through the sampling
        loop as JAX arrays: JAX inputs are shared, NumPy inputs are copied once to the device.)
    :ivar predicted_bytes: ``data_bytes + state_bytes + phase3_bytes +`` the ESS's work space (it runs on one
        chain at a time, on CPU on a block of its coordinates: :data:`ESS_WORK_FACTOR` times those positions;
        chains sharded over several devices hold one such space per device) ``+`` the draws held
        at once: all of them, or one chunk with ``chunk_size`` (:func:`numpyro_mile.run_chunked`); NumPyro
        allocates the draws before warmup, so both are held during Phase III. ``MCMC.run`` also makes transient
        copies of its draws (see ``docs/benchmarks/long_runs.md``).
    :ivar method: ``"step"`` or ``"gradient"``.
    """

    num_grad_evals: int
    seconds_per_step: float
    predicted_seconds: float
    cpu_seconds_per_step: float = float("nan")
    predicted_cpu_seconds: float = float("nan")
    compile_seconds: float = float("nan")
    num_params: int = 0
    state_bytes: int = 0
    sample_bytes: int = 0
    data_bytes: int = 0
    predicted_bytes: int = 0
    method: str = "gradient"
    phase3_bytes: int = 0


def _time_calls(fn, arg, min_seconds: float) -> tuple[float, float, int]:
    """Wall and CPU seconds per call of ``fn(arg)`` (compiled), called until ``min_seconds`` have passed."""
    jax.block_until_ready(fn(arg))
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        jax.block_until_ready(fn(arg))
        calls += 1
        wall = time.perf_counter() - start
        if wall >= min_seconds:
            return wall / calls, (time.process_time() - cpu) / calls, calls


def num_grad_evals(num_warmup: int, num_samples: int, num_chains: int = 1, thinning: int = 1) -> int:
    """Gradient evaluations of a MILE run (pretraining excluded): 2 per step, plus 1 per chain at init.

    ``thinning`` does not change the cost: every step is taken, only every ``thinning``-th kept.
    """
    return num_chains * (GRAD_EVALS_PER_STEP * (num_warmup + num_samples) + 1)


def estimate_cost(
    kernel,
    rng_key,
    *model_args,
    num_warmup: int,
    num_samples: int,
    num_chains: int = 1,
    thinning: int = 1,
    repeats: int = 20,
    method: str = "gradient",
    min_seconds: float = 0.5,
    init_params: dict | None = None,
    chunk_size: int | None = None,
    store_dtype=None,
    **model_kwargs,
) -> CostEstimate:
    """The cost of a run of the MILE ``kernel``: see :meth:`numpyro_mile.MILE.estimate_cost`."""
    if kernel.model is None:
        raise ValueError("estimate_cost needs a NumPyro model; a MILE(potential_fn=...) kernel has none.")
    if method not in ("step", "gradient"):
        raise ValueError(f"method must be 'step' or 'gradient', got {method!r}.")
    if int(thinning) < 1 or int(num_samples) < 0 or int(num_chains) < 1:
        raise ValueError("thinning and num_chains must be positive and num_samples non-negative.")
    keys = jax.random.split(rng_key, num_chains)
    if init_params is None:
        init_params = jax.jit(
            lambda k: (
                initialize_model(  # jitted: no eager per-operation compiles
                    k,
                    kernel.model,
                    init_strategy=init_to_uniform(radius=0.1),
                    model_args=model_args,
                    model_kwargs=model_kwargs,
                ).param_info.z
            )
        )(keys)
    num_steps = num_warmup + num_samples
    flat = ravel_pytree(jax.tree.map(lambda x: x[0], init_params))[0]
    dim, itemsize = int(flat.shape[0]), flat.dtype.itemsize
    if method == "step":
        kernel = kernel.replace(pretrain=False)
        state = kernel.init(keys, num_warmup, init_params=init_params, model_args=model_args, model_kwargs=model_kwargs)
        potential_fn = kernel._potential_fn_gen(*model_args, **model_kwargs)
        loop = jax.jit(lambda s: jax.lax.fori_loop(0, repeats, lambda _, x: kernel.step_fn(x, potential_fn), s))
        timed, arg, per_call = loop, state, repeats
    else:
        potential_fn = partial(potential_energy, kernel.model, model_args, model_kwargs)
        grad = jax.vmap(jax.value_and_grad(potential_fn))

        def loop(z):  # each evaluation moves z a little, so that none can be hoisted out of the loop
            def body(_, z):
                _, g = grad(z)
                return jax.tree.map(lambda a, b: a - 1e-12 * b, z, g)

            return jax.lax.fori_loop(0, repeats, body, z)

        timed, arg, per_call = jax.jit(loop), init_params, repeats / GRAD_EVALS_PER_STEP
    start = time.perf_counter()
    compiled = timed.lower(arg).compile()
    compile_seconds = time.perf_counter() - start
    wall, cpu, _ = _time_calls(compiled, arg, min_seconds)
    wall, cpu = wall / per_call, cpu / per_call

    schedule = make_schedule(
        num_warmup,
        phase_split=kernel.phase_split,
        target_energy_variance=kernel.target_energy_variance,
        target_schedule=kernel.target_schedule,
        max_stored_samples=kernel.max_stored_samples,
    )
    state_bytes = num_chains * itemsize * 5 * dim
    num_columns = min(dim, kernel.ess_num_coords)
    group, max_columns = phase3_limits(jax.default_backend(), num_chains, schedule.num_stored, num_columns, itemsize)
    phase3_bytes = group * itemsize * schedule.num_stored * num_columns
    ess_bytes = ESS_WORK_FACTOR * itemsize * schedule.num_stored * max_columns
    one = jax.eval_shape(
        partial(constrain_fn, kernel.model, model_args, model_kwargs, return_deterministic=True),
        jax.tree.map(lambda x: x[0], init_params),
    )
    store = storage_dtype(store_dtype)
    per_draw = sum(
        int(np.prod(v.shape)) * (store.itemsize if store is not None and v.dtype.kind == "f" else v.dtype.itemsize)
        for v in jax.tree.leaves(one)
    )
    num_draws = num_samples // thinning
    held = num_draws if chunk_size is None else min(num_draws, -(-int(chunk_size) // thinning))
    data_bytes = sum(
        int(np.asarray(a).nbytes) for a in jax.tree.leaves((model_args, model_kwargs)) if hasattr(a, "shape")
    )
    return CostEstimate(
        num_grad_evals(num_warmup, num_samples, num_chains),
        wall,
        wall * num_steps,
        cpu,
        cpu * num_steps,
        compile_seconds,
        dim,
        int(state_bytes),
        int(num_chains * num_draws * per_draw),
        int(data_bytes),
        int(data_bytes + state_bytes + phase3_bytes + ess_bytes + num_chains * held * per_draw),
        method,
        int(phase3_bytes),
    )
