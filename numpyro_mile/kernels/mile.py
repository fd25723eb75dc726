"""MILE: Microcanonical Langevin Ensembles as a NumPyro MCMC kernel.

Per chain: (1) a deep-ensemble member is trained with optax (unless ``init_params`` are given),
(2) MCLMC is tuned over NumPyro's ``num_warmup`` steps in three phases
(:mod:`numpyro_mile.kernels._mile_tuning`), (3) samples are drawn with the chain's tuned step size and L.
Chains never interact. Reference: Sommer et al., "Microcanonical Langevin Ensembles: Advancing
the Sampling of Bayesian Neural Networks", ICLR 2025.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import initialize_model, potential_energy

from .. import _model_utils as model_utils
from .. import _programs
from .._arrays import chain_mesh_of, default_chain_sharding, place_chains
from .._validation import MISSING_PLATE, check_init_params, check_plates, is_concrete
from . import _mclmc as mclmc
from ._base import ChainKernel, Pretraining, chain_axes, over_chains
from . import _mile_tuning as tuning
from ._mile_cost import CostEstimate, estimate_cost, num_grad_evals, phase3_limits


class MILEState(NamedTuple):
    """State of one MILE chain (in ``vectorized`` mode every field but ``i`` has a chain axis).

    :ivar i: iteration counter (scalar, shared by all chains); ``i < num_warmup`` is tuning.
    :ivar dynamics: BlackJAX MCLMC state (position, unit momentum, log density and its gradient).
    :ivar step_size: current step size.
    :ivar L: current momentum decoherence length.
    :ivar adapt: tuning statistics (:class:`numpyro_mile.kernels._mile_tuning.AdaptationState`).
    :ivar energy_change: energy change of the last step.
    :ivar num_nans: number of steps rejected so far because they produced NaN or inf.
    :ivar rng_key: PRNG key of the chain.
    :ivar diverging: whether the last step was rejected (NaN or inf); collected by default, so
        NumPyro's ``print_summary`` counts these steps as "divergences" as it does for NUTS.
    :ivar ess_fallback: whether the chain kept its Phase II L at the end of warmup because no
        coordinate had a usable Phase III ESS.
    :ivar data: the array arguments of the model (no chain axis), carried through the sampling
        loop so that they are arguments of the compiled loop rather than constants baked into
        it (``None`` when a run is started from a saved state).
    """

    i: jax.Array
    dynamics: mclmc.IntegratorState
    step_size: jax.Array
    L: jax.Array
    adapt: tuning.AdaptationState
    energy_change: jax.Array
    num_nans: jax.Array
    rng_key: jax.Array
    diverging: jax.Array | None = None
    ess_fallback: jax.Array | None = None
    data: tuple | None = None

    @property
    def z(self) -> dict:
        """Unconstrained position (NumPyro's ``sample_field``)."""
        return self.dynamics.position

    @property
    def potential_energy(self) -> jax.Array:
        """NumPyro potential energy (negative log density) at ``z``."""
        return -self.dynamics.logdensity


#: vmap axes of a vectorized state: the iteration counter and the data are shared by all chains
_STATE_AXES = chain_axes(MILEState)


#: an independent standard-normal coordinate (shape ``(2 - d,)``) that MILE adds to a model with ``d < 2`` latent
#: dimensions, since MCLMC's unit-norm momentum needs at least 2; it never reaches the draws (NUTS runs such
#: models, so MILE does too, at the cost of one or two extra coordinates)
AUXILIARY_SITE = "_mile_auxiliary"


def model_potential(model: Callable, args: tuple, kwargs: dict) -> Callable:
    """The potential energy of ``model`` on unconstrained latent values. A position that holds
    :data:`AUXILIARY_SITE` (decided when JAX traces it) also pays that coordinate's standard-normal energy."""
    potential_fn = partial(potential_energy, model, args, kwargs)

    def potential(params):
        if AUXILIARY_SITE not in params:
            return potential_fn(params)
        params = dict(params)
        auxiliary = params.pop(AUXILIARY_SITE)
        return potential_fn(params) + 0.5 * jnp.sum(jnp.square(auxiliary))

    return potential


def without_auxiliary(postprocess: Callable) -> Callable:
    """``postprocess`` applied to a position with :data:`AUXILIARY_SITE` left out."""
    return lambda z: postprocess({name: value for name, value in z.items() if name != AUXILIARY_SITE})


def _chains_init_program(potential: Callable):
    """Jitted ``init_all(params, keys, data_arrays, step_size, L) -> MILEState`` of all chains (chain axis
    first; ``data`` left empty), on ``potential(params, arrays)`` (:func:`~numpyro_mile._programs.on_data`)."""

    def init_all(init_params, state_keys, arrays, step_size, L):
        potential_fn = lambda params: potential(params, arrays)  # noqa: E731

        def init_chain(params, key):
            flat, _ = ravel_pytree(params)
            momentum_key, key = jax.random.split(key)
            return MILEState(
                i=jnp.asarray(0, jnp.int32),
                dynamics=mclmc.init(params, potential_fn, momentum_key),
                step_size=step_size.astype(flat.dtype),
                L=L.astype(flat.dtype),
                adapt=tuning.init(flat.shape[0], step_size),
                energy_change=jnp.zeros((), flat.dtype),
                num_nans=jnp.asarray(0, jnp.int32),
                rng_key=key,
                diverging=jnp.asarray(False),
                ess_fallback=jnp.asarray(False),
            )

        return jax.vmap(init_chain, out_axes=_STATE_AXES)(init_params, state_keys)

    return jax.jit(init_all)


#: a chain whose tuned step size is below this fraction of its starting one is reported as collapsed
COLLAPSED_STEP_SIZE = 1e-3


class MILEConfig(NamedTuple):
    """Settings of one MILE run, fixed when ``init`` runs.

    :ivar schedule: the tuning phases and their settings (:class:`~numpyro_mile.kernels._mile_tuning.Schedule`).
    :ivar num_coords: how many flattened coordinates of each chain Phase III stores for the ESS (``None``: all;
        otherwise a random subset of this size per chain, drawn from the chain's key at Phase III).
    :ivar batched: whether the state holds all chains (``vectorized``) or one.
    :ivar num_warmup: tuning steps.
    :ivar mesh: the one-axis device mesh the chains are sharded over (``None``: not sharded); the
        end-of-warmup ESS then runs on each device's block of chains, with no cross-device traffic.
    """

    schedule: tuning.Schedule
    num_coords: int | None
    batched: bool
    num_warmup: int
    mesh: jax.sharding.Mesh | None = None


def chain_move(state: MILEState, potential_fn: Callable) -> MILEState:
    """One MCLMC step of one chain with its current step size and L (no tuning); counts a rejection."""
    key, step_key = jax.random.split(state.rng_key)
    dynamics, info = mclmc.step(step_key, state.dynamics, potential_fn, state.L, state.step_size)
    return state._replace(
        i=state.i + 1,
        dynamics=dynamics,
        energy_change=info.energy_change,
        num_nans=state.num_nans + jnp.where(info.finite, 0, 1),
        rng_key=key,
        diverging=~info.finite,
    )


def chain_tune(state: MILEState, moved: MILEState, schedule: tuning.Schedule) -> MILEState:
    """The tuning bookkeeping of Phases I and II for one chain after its move from ``state`` to ``moved``;
    ``state.i`` is the (shared) iteration counter of the step."""
    i = state.i
    finite = ~moved.diverging
    flat, _ = ravel_pytree(moved.dynamics.position)
    dim = flat.shape[0]
    target = tuning.target_energy_variance(i, schedule)
    step_size, adapt = tuning.update_step_size(
        state.adapt, state.step_size, moved.energy_change, finite, dim, target, schedule
    )
    in_phase2 = i >= schedule.num_phase1
    # weighted by the step size the predictor just chose, as the reference code does
    adapt = tuning.accumulate_moments(adapt, flat, step_size, in_phase2 & finite)
    end_of_phase2 = i == schedule.num_phase1 + schedule.num_phase2 - 1
    L = jnp.where(end_of_phase2, tuning.L_from_moments(adapt, state.L), state.L)
    return moved._replace(step_size=step_size, L=L, adapt=adapt)


def phase3_positions(state: MILEState, move: Callable, config: MILEConfig) -> tuple[MILEState, jax.Array]:
    """Phase III's moves of the chains in ``state`` (one chain, or a batch of them with ``config.batched``):
    ``num_phase3`` moves with the chains' step size and Phase II L in one compiled loop, their positions stored as
    the reference code stores them (every coordinate, or a random subset of ``config.num_coords`` per chain; the
    steps :func:`~numpyro_mile.kernels._mile_tuning.stored_steps`).

    :param move: one MCLMC move of every chain in ``state`` (:func:`chain_move`, batched like ``state``).
    :return: the state after the moves (``i`` counts them, ``diverging`` says whether any was rejected) and the
        stored positions, shape ``(chains, num_stored, d_sub)`` (``(num_stored, d_sub)`` for one chain).
    """
    schedule = config.schedule
    flatten = (lambda p: ravel_pytree(p)[0]) if not config.batched else jax.vmap(lambda p: ravel_pytree(p)[0])
    flat = flatten(state.dynamics.position)
    if config.num_coords is None:
        subset = lambda flat: flat  # noqa: E731
    else:  # each chain its own coordinates, as the reference code draws them
        pick = lambda key: phase3_coords(key, flat.shape[-1], config.num_coords)  # noqa: E731
        coords = pick(state.rng_key) if not config.batched else jax.vmap(pick)(state.rng_key)
        subset = lambda flat: jnp.take_along_axis(flat, coords, axis=-1)  # noqa: E731
    samples = jnp.zeros(flat.shape[:-1] + (schedule.num_stored, subset(flat).shape[-1]), flat.dtype)
    if config.batched and config.mesh is not None:  # each device stores its own chains' positions
        samples = jax.lax.with_sharding_constraint(
            samples, NamedSharding(config.mesh, PartitionSpec(config.mesh.axis_names[0]))
        )

    def body(k, carry):
        state, samples, rejected = carry
        state = move(state)
        stored = subset(flatten(state.dynamics.position))
        return state, tuning.record_sample(samples, stored, k, schedule), rejected | state.diverging

    state, samples, rejected = jax.lax.fori_loop(
        0, schedule.num_phase3, body, (state, samples, jnp.zeros_like(state.diverging))
    )
    return state._replace(diverging=rejected), samples


def ess_in_blocks(samples: jax.Array, max_columns: int) -> jax.Array:
    """:func:`~numpyro_mile.kernels._mclmc.ess` of each column of each chain's ``samples`` (shape ``(n, d)`` for one
    chain, ``(chains, n, d)`` for several), computed on at most ``max_columns`` columns of one chain at a time: each
    column's ESS is its own, so the blocks bound the FFT's work space without changing the statistic. A chain's
    last block ends at its last column (it may repeat a few). Returns shape ``(d,)`` or ``(chains, d)``."""
    chains_samples = samples if samples.ndim == 3 else samples[None]
    num_chains, num_stored, num_columns = chains_samples.shape
    width = min(num_columns, max_columns)
    starts = np.minimum(np.arange(0, num_columns, width), num_columns - width)
    chain_of = jnp.asarray(np.repeat(np.arange(num_chains), len(starts)))
    start_of = jnp.asarray(np.tile(starts, num_chains))

    def block(j, ess):
        corner = (chain_of[j], 0, start_of[j])
        columns = jax.lax.dynamic_slice(chains_samples, corner, (1, num_stored, width))[0]
        ess_columns = mclmc.ess(columns).reshape(1, width)  # BlackJAX squeezes a single column's axis
        return jax.lax.dynamic_update_slice(ess, ess_columns, (chain_of[j], start_of[j]))

    ess = jax.lax.fori_loop(0, len(start_of), block, jnp.zeros((num_chains, num_columns), samples.dtype))
    return ess if samples.ndim == 3 else ess[0]


def phase3(state: MILEState, move: Callable, config: MILEConfig) -> MILEState:
    """Phase III of every chain in ``state``, all of it: the moves and stored positions of
    :func:`phase3_positions`, then L from their ESS (:func:`~numpyro_mile.kernels._mile_tuning.L_from_ess`).

    The positions exist only inside this step: MILE's step runs it at the first Phase III step and leaves the chain
    where it ends for the remaining Phase III steps, so that no buffer of positions rides in the state that
    NumPyro's progress-bar loop copies at every step. Chains sharded over devices keep their Phase III on their
    device; on CPU, groups of chains (the same number on each device) run one after another and the ESS runs on
    blocks of coordinates, within the limits of :func:`~numpyro_mile.kernels._mile_cost.phase3_limits`.

    :param move: one MCLMC move of every chain in ``state`` (:func:`chain_move`, batched like ``state``).
    :return: the state after the moves, with the new L (``i`` counts the moves).
    """
    dim = ravel_pytree(jax.tree.map(lambda x: x[0] if config.batched else x, state.dynamics.position))[0]
    num_columns = dim.shape[0] if config.num_coords is None else config.num_coords
    mesh = config.mesh if config.batched else None
    num_devices = 1 if mesh is None else mesh.size
    chains = state.step_size.shape[0] if config.batched else 1
    platform = next(iter(mesh.devices.flat if mesh is not None else jax.devices())).platform
    group, max_columns = phase3_limits(
        platform, chains // num_devices, config.schedule.num_stored, num_columns, dim.dtype.itemsize
    )

    def tuned_L(samples, step_size, phase2_L):  # the chains of one device
        L_of = lambda ess, step_size, L: tuning.L_from_ess(ess, step_size, config.schedule, L)  # noqa: E731
        return (jax.vmap(L_of) if config.batched else L_of)(ess_in_blocks(samples, max_columns), step_size, phase2_L)

    if mesh is not None:  # XLA does not partition the FFT over chains: per device
        split = PartitionSpec(mesh.axis_names[0])
        tuned_L = jax.shard_map(tuned_L, mesh=mesh, in_specs=(split,) * 3, out_specs=(split, split), check_vma=False)

    def chains_phase3(state):
        moved, samples = phase3_positions(state, move, config)
        L, ok = tuned_L(samples, state.step_size, state.L)
        return moved._replace(L=L, ess_fallback=~ok)

    num_groups = chains // (num_devices * group)
    if num_groups == 1:
        return chains_phase3(state)._replace(i=state.i + config.schedule.num_phase3)

    # chain c = (device d, group j, k-th of the group) in that order; group j's chains on every device together
    def to_groups(x):
        x = x.reshape((num_devices, num_groups, group) + x.shape[1:]).swapaxes(0, 1)
        x = x.reshape((num_groups, num_devices * group) + x.shape[3:])
        return (
            x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, *split)))
        )

    def from_groups(x):
        x = x.reshape((num_groups, num_devices, group) + x.shape[2:]).swapaxes(0, 1).reshape((chains,) + x.shape[2:])
        return x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, split))

    def group_phase3(per_chain):  # the per-chain fields of one group of chains
        return _per_chain(chains_phase3(_with_shared(per_chain, state)))

    done = jax.lax.map(group_phase3, jax.tree.map(to_groups, _per_chain(state)))
    return _with_shared(jax.tree.map(from_groups, done), state)._replace(i=state.i + config.schedule.num_phase3)


def _is_none(x) -> bool:
    return x is None


def _per_chain(state: MILEState) -> MILEState:
    """``state`` with its shared fields (``i``, ``data``) left out (``None``)."""
    return jax.tree.map(lambda axis, x: None if axis is None else x, _STATE_AXES, state, is_leaf=_is_none)


def _with_shared(per_chain: MILEState, state: MILEState) -> MILEState:
    """The per-chain fields of ``per_chain`` with the shared fields of ``state``."""
    return jax.tree.map(lambda axis, x, s: s if axis is None else x, _STATE_AXES, per_chain, state, is_leaf=_is_none)


#: folded into a chain's key to draw its Phase III coordinates (the chain's own stream of keys is left as it is)
_COORDS_STREAM = 0x4D494C45


def phase3_coords(rng_key, dim: int, num_coords: int) -> jax.Array:
    """The ``num_coords`` of ``dim`` flattened coordinates (sorted, without repeats) whose Phase III positions one
    chain stores, drawn from its key ``rng_key``."""
    chosen = jax.random.choice(jax.random.fold_in(rng_key, _COORDS_STREAM), dim, (num_coords,), replace=False)
    return jnp.sort(chosen)


def mile_step(state: MILEState, potential_fn: Callable, config: MILEConfig) -> MILEState:
    """One MILE step of every chain in ``state`` (one chain, or all with ``config.batched``).

    By the shared counter ``state.i``: in Phases I and II one MCLMC move and the tuning bookkeeping; at the first
    Phase III step all of Phase III (:func:`phase3`: its moves, the positions' ESS, the new L); at the other Phase
    III steps nothing but the counter (the chain waits where Phase III left it); after warmup one move. Phase
    III's moves are taken at its first step, so the number of moves, 2 gradient evaluations each, is the
    number of steps as in the reference code; NumPyro's progress bar pauses there for the time of Phase III.
    """
    schedule = config.schedule
    n12 = schedule.num_phase1 + schedule.num_phase2
    move = over_chains(lambda s: chain_move(s, potential_fn), _STATE_AXES, config.batched)
    tune = over_chains(lambda s, m: chain_tune(s, m, schedule), _STATE_AXES, config.batched, num_states=2)
    i = state.i

    def run_phase3():
        return phase3(state, move, config)._replace(i=i + 1)

    def wait():
        return state._replace(
            i=i + 1, energy_change=jnp.zeros_like(state.energy_change), diverging=jnp.zeros_like(state.diverging)
        )

    # branches by the shared counter, so that only one runs (a select would compute all of them)
    in_phase3 = (i >= n12) & (i < config.num_warmup)
    moved = jax.lax.cond(in_phase3, lambda: state, lambda: move(state))  # this step's move (none in Phase III)
    branch = jnp.where(i < n12, 0, jnp.where(i == n12, 1, jnp.where(in_phase3, 2, 3)))
    return jax.lax.switch(branch, [lambda: tune(state, moved), run_phase3, wait, lambda: moved])


class MILE(ChainKernel, Pretraining):
    """Microcanonical Langevin Ensembles (MILE) for NumPyro.

    Each chain starts from one deep-ensemble member (trained here with optax when ``init_params``
    are not given), tunes MCLMC's step size and momentum decoherence length L during NumPyro's
    ``num_warmup`` steps in three phases, and then samples with its tuned values. Every step costs
    exactly two gradient evaluations, so the cost of a run is known before it starts
    (:meth:`num_grad_evals`, :meth:`estimate_cost`).

    .. note:: MILE's default final energy-variance target (0.1 per dimension) is a choice for BNN
        predictive performance, not for exact moments: it leaves a small step-size bias. For
        exact sampling of simple targets use ``target_energy_variance=(5e-4, 5e-4)`` (BlackJAX's
        default; it works in float32). Smaller targets need x64 when the potential energy is large
        (float32 resolves energy changes of ~1e-7 of it): chains whose step size collapsed are
        named by :meth:`run_warnings`.

    Any model that NUTS accepts with continuous latent sites runs (a model with fewer than 2
    unconstrained dimensions, even none, gets an independent standard-normal auxiliary coordinate
    that never reaches the draws): ``ImproperUniform`` + ``numpyro.factor`` targets, constrained sites,
    observations in a plate with or without indexing through it. As with NUTS, a potential
    function can replace the model: ``MILE(potential_fn=U)`` with ``mcmc.run(key,
    init_params=...)`` samples ``exp(-U)`` in ``U``'s own space, with no pretraining.

    :param model: a NumPyro model with continuous latent sites and no subsample plate.
    :param potential_fn: instead of ``model``: a function of a position pytree returning the
        potential energy (negative log density, up to a constant). ``init_params`` must then be
        given to ``MCMC.run`` (with a leading chain axis for ``vectorized`` chains); draws are
        the positions themselves.
    :param pretrain: train a deep ensemble (one member per chain) as initialisation when no
        ``init_params`` are given and the model has an observation plate (``"data"``, or the one
        plate all observed sites share); otherwise start from ``init_strategy`` (after
        ``map_steps`` steps of Adam on the potential, if > 0). Pretraining holds out a
        validation fraction of the training rows for early stopping (they are not trained on)
        unless ``ensemble_options=dict(validation=(X_val, y_val))`` gives separate data; a model
        that cannot be evaluated on a subset of rows is pretrained full-batch, with a warning.
    :param ensemble_options: keyword arguments of :func:`numpyro_mile.deep_ensemble`
        (``optimizer``, ``batch_size``, ``max_epochs``, ``patience``, ``validation``,
        ``early_stopping``, ...).
    :param phase_split: fractions of ``num_warmup`` spent in Phases I, II and III.
    :param target_energy_variance: (start, end) of the energy variance per dimension targeted by
        the step-size adaptation over Phases I+II.
    :param target_schedule: how the target goes from start to end: ``"linear"``,
        ``"exponential"`` (``start e^(-i/tau) + end (1 - e^(-i/tau))``, ``tau = (n1 + n2 + 1) / 4``
        with ``n1``, ``n2`` the Phase I and II lengths; it ends ``e^-4`` of the way short of
        ``end``), or ``"auto"`` (default, as the MILE reference code: exponential when the start
        is above 2, else linear).
    :param n_eff: effective window (in steps) of the step-size averages.
    :param trust: width of the weighting of step-size estimates in log space (in units of 6).
    :param L_factor: factor of Phase III's ESS-based L (0.4).
    :param initial_step_size: starting step size (the pretraining learning rate, 1e-3).
    :param initial_L: starting L; default ``max(sqrt(d), 15)``.
    :param ess_num_coords: at most this many coordinates enter Phase III's ESS: all of them up to this
        number, above it a random subset of this size per chain, drawn from the chain's key (default 2,000, as
        the MILE reference code).
    :param max_stored_samples: at most this many Phase III positions are stored per chain: every step up
        to this number, equally spaced steps above (default 10,000, as the MILE reference code; at least 10).
        Memory: ``num_chains x min(n3, max_stored_samples) x min(d, ess_num_coords)`` floats (``n3`` the Phase
        III steps) and the ESS's work space, held only during the step that runs Phase III, never in the state
        NumPyro copies (:meth:`estimate_cost`'s ``phase3_bytes`` and ``predicted_bytes``). Lower values change
        the statistic that sets L (``docs/methods/mile.md``).
        Coordinates whose Phase III ESS is 0, NaN or infinite are left out of the mean that
        sets L; when none is usable the Phase II L is kept, with a warning.
    :param init_strategy: NumPyro init strategy when not pretraining.
    :param map_steps: Adam steps on the potential before tuning, when not pretraining.
    :param map_learning_rate: learning rate of those Adam steps.
    :param shard_chains: ``vectorized`` chains on several local devices (GPUs, or CPU cores exposed with
        ``numpyro.set_host_device_count``): ``None`` (default) shards them over CPU devices when a step of
        all chains is enough work to pay for launching a multi-device step once per step, as NumPyro's
        progress bar does (at least :data:`numpyro_mile._arrays.MIN_SHARDED_STEP_FLOPS`, from XLA's
        operation count of the gradient), and leaves them on one device of other platforms (NumPyro's
        placement; no threshold was measured there); ``True`` whenever there are several devices; ``False``
        never.
        Inputs the caller placed on devices (committed keys or ``init_params``) are kept where they are.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import MILE
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> kernel = MILE(mlp_regression, ensemble_options=dict(max_epochs=20, progress_bar=False))
        >>> mcmc = MCMC(kernel, num_warmup=200, num_samples=50, num_chains=2,
        ...             chain_method="vectorized", progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y)
        >>> mcmc.get_samples()["w0"].shape
        (100, 1, 16)
    """

    kernel_name = "MILE"
    state_axes = _STATE_AXES
    nan_advice = (
        "The tuned step size may be too large for this region: see the 'num_nans' and 'diverging' fields, "
        "and consider a lower target_energy_variance."
    )

    def __init__(
        self,
        model: Callable | None = None,
        *,
        potential_fn: Callable | None = None,
        pretrain: bool = True,
        ensemble_options: dict | None = None,
        phase_split: tuple[float, float, float] = (0.8, 0.1, 0.1),
        target_energy_variance: tuple[float, float] = (0.5, 0.1),
        target_schedule: str = "auto",
        n_eff: float = 100.0,
        trust: float = 1.5,
        L_factor: float = 0.4,
        initial_step_size: float = 1e-3,
        initial_L: float | None = None,
        ess_num_coords: int = tuning.REFERENCE_ESS_COORDS,
        max_stored_samples: int = tuning.REFERENCE_STORED_SAMPLES,
        init_strategy: Callable = init_to_uniform,
        map_steps: int = 0,
        map_learning_rate: float = 1e-2,
        shard_chains: bool | None = None,
    ):
        if (model is None) == (potential_fn is None):
            raise ValueError(
                "MILE needs exactly one of a NumPyro model (MILE(mlp_regression)) or a potential "
                "function (MILE(potential_fn=U), with init_params passed to mcmc.run)."
            )
        target = model if potential_fn is None else potential_fn
        if not callable(target):
            raise ValueError(
                f"MILE's {'model' if potential_fn is None else 'potential_fn'} must be callable, "
                f"got {type(target).__name__}."
            )
        for name, value, least in (
            ("ess_num_coords", ess_num_coords, 1),
            ("max_stored_samples", max_stored_samples, tuning.MIN_STORED_SAMPLES),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}.")
        if target_schedule not in tuning.TARGET_SCHEDULES:
            raise ValueError(f"target_schedule must be one of {tuning.TARGET_SCHEDULES}, got {target_schedule!r}.")
        super().__init__(model)
        self._potential_fn = potential_fn
        self.target_schedule = target_schedule
        self.init_pretraining(pretrain, ensemble_options)
        self.phase_split = tuple(phase_split)
        self.target_energy_variance = tuple(target_energy_variance)
        self.n_eff, self.trust, self.L_factor = n_eff, trust, L_factor
        self.initial_step_size, self.initial_L = initial_step_size, initial_L
        self.ess_num_coords, self.max_stored_samples = int(ess_num_coords), int(max_stored_samples)
        self.init_strategy = init_strategy
        self.shard_chains = shard_chains
        self.map_steps, self.map_learning_rate = map_steps, map_learning_rate
        self._potential = None  # potential(params, arrays) of this run (_programs.on_data; set by init)
        self._supports = None  # the latent sites' supports when the draws need no data (set by init)
        self._config: MILEConfig | None = None  # set by init

    # ------------------------------------------------------------------ NumPyro interface
    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z", "diverging")

    def run_warnings(self, state: MILEState) -> list[str]:
        """Messages about a finished run from its last state (rejected steps, ESS fallback); empty when none.

        The compiled step reports through state fields (``num_nans``, ``diverging``,
        ``ess_fallback``) rather than host callbacks (see :mod:`numpyro_mile.kernels._base`);
        :func:`numpyro_mile.to_inference_data` warns with these messages, and NumPyro's
        ``mcmc.print_summary()`` counts rejected steps as divergences.

        :param state: ``mcmc.last_state``.
        """
        messages = super().run_warnings(state)
        step_size, L = np.atleast_1d(np.asarray(state.step_size)), np.atleast_1d(np.asarray(state.L))
        start = np.atleast_1d(np.asarray(state.adapt.step_size_min)) / tuning.MIN_STEP_SIZE_FRACTION
        stuck = ~np.isfinite(step_size) | (step_size < COLLAPSED_STEP_SIZE * start) | ~np.isfinite(L)
        if np.any(stuck):
            messages.append(
                "MILE: use numpyro.enable_x64() or a larger target_energy_variance (e.g. (5e-4, 5e-4)). Chain(s) "
                f"{np.flatnonzero(stuck).tolist()} ended warmup with step size {step_size[stuck].tolist()} (started at "
                f"{start[stuck].tolist()}) and L {L[stuck].tolist()}: the tuner could not reach the target energy "
                "variance, typically because float32 does not resolve energy changes that small at this model's "
                "potential energy (about 1e-7 of it), so those chains barely move."
            )
        if state.ess_fallback is not None and np.any(np.asarray(state.ess_fallback)):
            chains = np.flatnonzero(np.atleast_1d(np.asarray(state.ess_fallback))).tolist()
            messages.append(
                f"MILE: no coordinate had a finite, positive Phase III ESS in chain(s) {chains} (e.g. the chain did "
                "not move during Phase III); those chains kept the Phase II L. Check the 'num_nans' field, and give "
                "the warmup more steps."
            )
        return messages

    def diagnostics_str(self, state: MILEState) -> str:
        return "step size {:.2e}. L {:.2e}. nans {}".format(
            float(jnp.mean(state.step_size)), float(jnp.mean(state.L)), int(jnp.sum(state.num_nans))
        )

    def postprocess_fn(self, args, kwargs):
        if self._potential_fn is not None:
            return lambda z: z
        return without_auxiliary(model_utils.constrain_draws(self._model, self._supports, args, kwargs))

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        keys = self.start_run(rng_key)
        num_chains = keys.shape[0]
        schedule = tuning.make_schedule(  # checks num_warmup and the phases before any pretraining
            num_warmup,
            phase_split=self.phase_split,
            target_energy_variance=self.target_energy_variance,
            target_schedule=self.target_schedule,
            n_eff=self.n_eff,
            trust=self.trust,
            L_factor=self.L_factor,
            max_stored_samples=self.max_stored_samples,
        )
        chain_keys = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
        pretrain_keys, init_keys, state_keys = chain_keys[:, 0], chain_keys[:, 1], chain_keys[:, 2]

        if self._potential_fn is not None:
            target = self._potential_fn
            init_params = self._check_potential_init_params(init_params, num_chains)
            self._data = _programs.split_data((), {})
            self._potential = lambda params, arrays: target(params)
            return self._init_chains(init_params, state_keys, schedule, num_warmup)

        # the data are split once, and the potential is built once on their arrays (arguments of its programs)
        self._data = _programs.split_data(model_args, model_kwargs)
        self._potential = _programs.on_data(partial(model_potential, self._model), self._data.key)
        trace = model_utils.trace_model(self._model, model_args, model_kwargs, keys[0], self.init_strategy)
        model_utils.check_continuous(trace, "MILE")
        model_utils.check_full_batch(trace, "MILE")
        check_plates(trace)  # NumPyro's own check, whichever way the chains start
        latent_dim = sum(int(np.prod(shape)) for shape in model_utils.unconstrained_shapes(trace).values())
        num_auxiliary = max(0, 2 - latent_dim)
        self._supports = model_utils.data_free_supports(trace)

        run_map = False
        if init_params is None:
            if self.pretrain and latent_dim > 0:
                init_params = self.pretrained_members(trace, pretrain_keys, model_args, model_kwargs)
            if init_params is None:
                with warnings.catch_warnings():  # checked above, at the user's line
                    warnings.filterwarnings("ignore", message=MISSING_PLATE)
                    init_params = initialize_model(
                        init_keys if self._batched else init_keys[0],
                        self._model,
                        init_strategy=self.init_strategy,
                        model_args=model_args,
                        model_kwargs=model_kwargs,
                    ).param_info.z
                if not self._batched:
                    init_params = jax.tree.map(lambda x: x[None], init_params)
                run_map = self.map_steps > 0 and latent_dim > 0
        else:
            init_params = self._check_init_params(init_params, trace, num_chains)
        if num_auxiliary:  # the auxiliary coordinate starts at its mode; the momentum is drawn at random
            init_params = {
                **init_params,
                AUXILIARY_SITE: jnp.zeros((num_chains, num_auxiliary), jnp.result_type(float)),
            }
        if run_map:  # the auxiliary coordinate's gradient is 0 at its mode: MAP leaves it there
            potential_fn = partial(self._potential, arrays=self._data.arrays)
            init_params = jax.vmap(self._map_optimise, (0, None))(init_params, potential_fn)
        return self._init_chains(init_params, state_keys, schedule, num_warmup)

    def _init_chains(self, init_params, state_keys, schedule: tuning.Schedule, num_warmup: int) -> MILEState:
        """The initial state of every chain from ``init_params`` (a pytree with a leading chain axis), and this
        run's :class:`MILEConfig` (with ``schedule``, the tuning phases)."""
        flat, _ = ravel_pytree(jax.tree.map(lambda x: x[0], init_params))
        dim = int(flat.shape[0])
        if dim < 2:  # a model gets an auxiliary coordinate in init; a potential_fn target does not
            raise ValueError(
                f"MILE (MCLMC) needs at least 2 latent dimensions; this potential_fn has {dim}. Add an independent "
                "standard-normal coordinate to it (its draws are then exact for the rest), or write it as a model."
            )
        if self._batched:  # vectorized chains: sharded over the local devices when it pays
            sharding = self._chain_sharding(init_params, state_keys)
            init_params, state_keys = place_chains(init_params, sharding), place_chains(state_keys, sharding)
        self._chain_mesh = chain_mesh_of(state_keys)
        num_coords = int(self.ess_num_coords) if dim > self.ess_num_coords else None
        self._config = MILEConfig(schedule, num_coords, self._batched, int(num_warmup), self._chain_mesh)
        initial_L = self.initial_L if self.initial_L is not None else max(np.sqrt(dim), 15.0)
        target = self._model if self._potential_fn is None else self._potential_fn
        build = partial(_chains_init_program, self._potential)
        # one program per target and data structure, whichever kernel asks
        init_all = _programs.program(("mile-init", target, self._potential_fn is None, self._data.key), build)
        state = init_all(
            init_params,
            state_keys,
            self._data.arrays,
            jnp.asarray(self.initial_step_size, flat.dtype),
            jnp.asarray(initial_L, flat.dtype),
        )
        return self.finish_init(self.one_chain(state))

    def _chain_sharding(self, init_params, state_keys):
        """Where ``vectorized`` chains go (``shard_chains``): a sharding over the local devices, or ``None``."""
        num_chains = int(state_keys.shape[0])
        if self.shard_chains is False or jax.local_device_count() < 2:
            return None
        flops = None
        if self.shard_chains is None and is_concrete(state_keys):
            one = jax.tree.map(lambda x: x[0], init_params)
            cost = jax.jit(jax.grad(self._potential_on(None))).lower(one).cost_analysis()
            flops = mclmc.GRAD_EVALS_PER_STEP * num_chains * float((cost or {}).get("flops", 0.0))
        return default_chain_sharding(num_chains, state_keys, init_params, step_flops=flops)

    def sample(self, state: MILEState, model_args, model_kwargs) -> MILEState:
        potential_fn = self._potential_on(*self.model_arrays(state, model_args, model_kwargs))
        return self.placed(self.step_fn(state, potential_fn))  # placed as it entered (see _init_chains)

    def _potential_on(self, key, arrays=None) -> Callable:
        """The potential of one position on the data ``(key, arrays)`` of a :class:`~numpyro_mile._programs.DataSplit`
        (``key=None``: this run's data): the run's potential when ``key`` is this run's, else one built for the
        other static arguments."""
        if key is None:
            key, arrays = self._data.key, self._data.arrays
        potential = self._potential
        if key is not self._data.key and self._potential_fn is None:
            potential = _programs.on_data(partial(model_potential, self._model), key)
        return lambda params: potential(params, arrays)

    def _potential_fn_gen(self, *model_args, **model_kwargs) -> Callable:
        """The potential of one position on the model's arguments (after ``init``; NumPyro's HMC has the same
        hook)."""
        split = _programs.split_data(model_args, model_kwargs)
        return self._potential_on(split.key, split.arrays)

    def step_fn(self, state: MILEState, potential_fn: Callable) -> MILEState:
        """:func:`mile_step` with this run's configuration (after ``init``)."""
        return mile_step(state, potential_fn, self._config)

    # ------------------------------------------------------------------ cost
    @staticmethod
    def num_grad_evals(num_warmup: int, num_samples: int, num_chains: int = 1, thinning: int = 1) -> int:
        """Gradient evaluations of a run (pretraining excluded): 2 per step, plus 1 per chain at init.

        ``thinning`` does not change the cost: every step is taken, only every ``thinning``-th kept.
        """
        return num_grad_evals(num_warmup, num_samples, num_chains, thinning)

    def estimate_cost(
        self,
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
        """Predict the wall time, CPU time and memory of a run before it starts.

        ``method="step"`` compiles MILE's step for ``num_chains`` vectorized chains (without
        pretraining, from ``init_params``) and times ``repeats`` steps in one
        compiled loop, repeated until ``min_seconds`` have passed: the per-step cost includes the
        tuning bookkeeping that a gradient count misses. ``method="gradient"`` times one vectorized
        ``value_and_grad`` of the potential instead (cheaper to compile) and counts two per step:
        a lower bound. Memory follows from the shapes (see :class:`CostEstimate`).

        .. note:: compilation of the run (``MCMC.run`` compiles NumPyro's sampling loop on every
            call unless :func:`numpyro_mile.enable_compilation_cache` is on) and deep-ensemble
            pretraining come on top of ``predicted_seconds``; ``compile_seconds`` is the compile
            time of the timed step, a lower bound of the former.

        :param rng_key: PRNG key.
        :param model_args: the model's arguments, as for ``MCMC.run``.
        :param num_warmup: warmup steps of the run.
        :param num_samples: sampling steps of the run.
        :param num_chains: chains (vectorized).
        :param thinning: MCMC's thinning (changes the memory of the draws, not the time).
        :param repeats: steps (or gradient evaluations) per timed call.
        :param method: ``"step"`` or ``"gradient"``.
        :param min_seconds: time the calls for at least this long (wall).
        :param init_params: unconstrained positions with a leading chain axis (default: drawn
            uniformly in (-0.1, 0.1); the values do not change the cost).
        :param chunk_size: steps per chunk of :func:`numpyro_mile.run_chunked`; the draws held
            in memory are then one chunk's.
        :param store_dtype: storage dtype of the draws (``"float32"``, ``"bfloat16"``, ...).
        :param model_kwargs: the model's keyword arguments.
        :return: a :class:`CostEstimate`.

        **Example**

        .. doctest::

            >>> import jax
            >>> from numpyro_mile import MILE
            >>> from numpyro_mile.datasets import toy_regression
            >>> from numpyro_mile.models import mlp_regression
            >>> X, y = toy_regression(100)
            >>> cost = MILE(mlp_regression).estimate_cost(jax.random.PRNGKey(0), X, y, num_warmup=1000,
            ...                                           num_samples=500, num_chains=4, min_seconds=0.1)
            >>> cost.num_grad_evals, cost.num_params
            (12004, 338)
        """
        return estimate_cost(
            self,
            rng_key,
            *model_args,
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            thinning=thinning,
            repeats=repeats,
            method=method,
            min_seconds=min_seconds,
            init_params=init_params,
            chunk_size=chunk_size,
            store_dtype=store_dtype,
            **model_kwargs,
        )

    # ------------------------------------------------------------------ internals
    def _check_potential_init_params(self, init_params, num_chains):
        """``init_params`` of a ``potential_fn`` run, validated, with a leading chain axis."""
        if init_params is None:
            raise ValueError(
                "MILE(potential_fn=...) needs init_params: pass mcmc.run(key, init_params=x0) with x0 a position "
                "(an array or a pytree of arrays) the potential accepts, with a leading axis of size num_chains "
                "when num_chains > 1."
            )
        leaves = jax.tree.leaves(init_params)
        if not leaves:
            raise ValueError("init_params of MILE(potential_fn=...) must hold at least one array.")
        init_params = jax.tree.map(jnp.asarray, init_params)
        if any(not jnp.issubdtype(leaf.dtype, jnp.floating) for leaf in jax.tree.leaves(init_params)):
            raise ValueError(
                "init_params of MILE(potential_fn=...) must be floating-point arrays (e.g. jnp.zeros(3), not integers)."
            )
        if self._batched:
            bad = [jnp.shape(leaf) for leaf in jax.tree.leaves(init_params) if jnp.shape(leaf)[:1] != (num_chains,)]
            if bad:
                raise ValueError(
                    f"init_params for {num_chains} vectorized chains need a leading axis of size "
                    f"{num_chains}; got arrays of shape {bad}."
                )
            return init_params
        return jax.tree.map(lambda x: x[None], init_params)

    def _check_init_params(self, init_params, trace, num_chains):
        """User ``init_params`` checked against the model's latent sites, with a leading chain axis."""
        lead = (num_chains,) if self._batched else ()
        init_params = check_init_params(
            init_params,
            model_utils.unconstrained_shapes(trace),
            lead,
            hint="a leading axis of size num_chains, then the site's shape" if lead else "",
        )
        return init_params if lead else jax.tree.map(lambda x: x[None], init_params)

    def _map_optimise(self, params, potential_fn):
        optimizer = optax.adam(self.map_learning_rate)

        def body(carry, _):
            p, opt_state = carry
            grads = jax.grad(potential_fn)(p)
            updates, opt_state = optimizer.update(grads, opt_state, p)
            return (optax.apply_updates(p, updates), opt_state), None

        (params, _), _ = jax.lax.scan(body, (params, optimizer.init(params)), None, length=self.map_steps)
        return params
