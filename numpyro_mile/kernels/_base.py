"""What the kernels of this package share: NumPyro's kernel interface around pure per-chain functions.

A kernel here is a thin :class:`ChainKernel` (a NumPyro ``MCMCKernel``) whose ``init`` builds an
immutable run configuration and a state NamedTuple, and whose ``sample`` calls a pure step
function of the kernel's module. This module holds, once, what every kernel needs:

- NumPyro's boilerplate: ``model``, ``sample_field``, ``is_ensemble_kernel``;
- chain batching (:func:`over_chains`): a per-chain function made to work on a
  ``vectorized`` state, whose ``state_axes`` say which fields have a chain axis;
- NaN reporting without host callbacks (:func:`rejected_steps_message`,
  :meth:`ChainKernel.run_warnings`): steps whose result is not finite are rejected and counted in
  the state (``num_nans``); the messages are built after the run from ``mcmc.last_state``
  (:func:`numpyro_mile.to_inference_data` warns with them). A host callback in the step would keep
  JAX's persistent compilation cache from storing the sampling loop;
- the model's data carried in the state (:meth:`ChainKernel.model_data`, :meth:`ChainKernel.model_arrays`):
  NumPyro passes the model's arguments to ``sample`` as constants; a state that carries the arrays makes them
  arguments of the compiled sampling loop, so a second run on new data of the same shapes compiles nothing new
  (checkpoints store the state without them: :meth:`ChainKernel.checkpoint_state`,
  :meth:`ChainKernel.resumed_state`);
- the run's lifecycle (:meth:`ChainKernel.start_run`, :meth:`ChainKernel.one_chain`, :meth:`ChainKernel.placed`,
  :meth:`ChainKernel.finish_init`) and deep-ensemble pretraining for the kernels that want it
  (:class:`Pretraining`);
- the progress bar's postfix (:meth:`ChainKernel.get_diagnostics_str`), read back from the device at most
  every :attr:`ChainKernel.diagnostics_interval` seconds: NumPyro asks for it after every step of a
  sequential chain, and a read-back every step would wait for each step to finish before the next is launched.
"""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from .. import _model_utils as model_utils
from .. import _programs
from .._arrays import place_state
from .._validation import is_concrete
from ..ensemble import DeepEnsemble, fit_members, pretraining_plate

__all__ = ["ChainKernel", "Pretraining", "chain_axes", "over_chains", "rejected_steps_message"]


def rejected_steps_message(kernel_name: str, num_nans, advice: str) -> str | None:
    """The warning for a run whose chains rejected non-finite steps, or ``None`` when none did.

    :param kernel_name: the kernel's name in the message.
    :param num_nans: rejected steps so far, per chain (any shape) or in total.
    :param advice: what the user may change (one sentence).
    """
    nans = np.atleast_1d(np.asarray(num_nans))
    if nans.sum() == 0:
        return None
    return (
        f"{kernel_name} rejected {int(nans.sum())} step(s) (over all chains; per chain {nans.tolist()}) because "
        "the energy, gradient or position became NaN or infinite; each time the chain stayed at its previous "
        f"position. {advice}"
    )


def chain_axes(state_type, shared: tuple[str, ...] | None = None):
    """The vmap axes of a ``vectorized`` state of ``state_type`` (a NamedTuple class), declared by name: ``None``
    for the ``shared`` fields (one value for all chains; default: the state's ``i`` and ``data`` fields), ``0`` (a
    leading chain axis) for every other field, so that a new field of the state gets its axis without counting
    positions."""
    if shared is None:
        shared = tuple(name for name in ("i", "data") if name in state_type._fields)
    unknown = sorted(set(shared) - set(state_type._fields))
    if unknown:
        raise TypeError(f"{state_type.__name__} has no field(s) {unknown}.")
    return state_type(**{name: None if name in shared else 0 for name in state_type._fields})


def over_chains(fn: Callable, state_axes, batched: bool, num_states: int = 1) -> Callable:
    """``fn`` of ``num_states`` single-chain states (returning a state), made to work on batched states
    when ``batched`` (a ``vectorized`` run): ``vmap`` over the chain axes given by ``state_axes`` (a
    state NamedTuple of ``0`` and ``None``)."""
    if not batched:
        return fn
    return jax.vmap(fn, in_axes=(state_axes,) * num_states, out_axes=state_axes)


class ChainKernel(MCMCKernel):
    """NumPyro's ``MCMCKernel`` interface shared by this package's kernels.

    Subclasses set :attr:`kernel_name` and :attr:`state_axes`, store each constructor argument (a setting) in
    the attribute of its name, implement ``init`` / ``sample`` with their module's pure functions (``init``
    builds the run's config with :meth:`config`), and may extend :meth:`run_warnings`. :meth:`settings` says
    what a run of the kernel depends on (checkpoints compare it); :meth:`replace` makes a changed copy for a
    driver that needs another setting.
    """

    sample_field = "z"
    #: the kernel's name in messages
    kernel_name = "kernel"
    #: vmap axes of a ``vectorized`` state: a state NamedTuple of ``0`` (chain axis) and ``None`` (shared)
    state_axes: Any = None
    #: advice appended to the rejected-steps warning
    nan_advice = "The step size is probably too large for this model: see the 'num_nans' extra field."

    def __new__(cls, *args, **kwargs):
        kernel = super().__new__(cls)
        kernel._constructor_args = (args, dict(kwargs))  # what the user passed, for :meth:`replace`
        return kernel

    def __init__(self, model: Callable | None):
        self._model = model
        self._data: _programs.DataSplit | None = None  # the model's arguments of this run (set by init)
        self._batched = False  # whether the state holds all chains (vectorized) or one (set by start_run)
        self._chain_mesh = None  # the mesh a vectorized run's chains are sharded over (set by init), or None
        # NumPyro calls ``init`` again for a run from ``mcmc.post_warmup_state`` while this is None: every
        # kernel sets it once initialised (:meth:`initialised`), so a continuation never pretrains again
        self._sample_fn = None

    def _bound_arguments(self) -> inspect.BoundArguments:
        args, kwargs = self._constructor_args
        return inspect.signature(type(self)).bind(*args, **kwargs)

    def settings(self) -> dict[str, Any]:
        """The kernel's settings by name: one per constructor argument (the model left out: the checkpoint
        fingerprint records it apart), each the value the constructor stored, validated and normalised, in the
        instance attribute of the same name (or, where a method has the name, ``_`` + name). The constructor
        is the one declaration of a setting: the run's config (:meth:`config`), a checkpoint's fingerprint
        (:func:`numpyro_mile.runs.checkpoint.run_fingerprint`) and the docs (its ``:param:``) follow from it.

        :raises TypeError: when the constructor stored no attribute for an argument.
        """
        stored = vars(self)
        values, missing = {}, []
        for name in inspect.signature(type(self)).parameters:
            if name == "model":
                continue
            attribute = name if name in stored else "_" + name
            if attribute in stored:
                values[name] = stored[attribute]
            else:
                missing.append(name)
        if missing:
            raise TypeError(
                f"{self.kernel_name}'s constructor stores no attribute for argument(s) {missing}: set "
                f"self.<name> = <validated value> in __init__ for each, so that runs and checkpoints see it."
            )
        return values

    def config(self, config_type, **run_values):
        """``config_type`` (a NamedTuple of a run's fixed settings) from ``settings()`` and the ``run_values``
        only ``init`` knows (e.g. ``num_warmup``).

        :raises TypeError: when a field of ``config_type`` is in neither (a constructor argument missing, which
            would otherwise be left out of checkpoint fingerprints too).
        """
        settings = self.settings()
        missing = [name for name in config_type._fields if name not in settings and name not in run_values]
        if missing:
            raise TypeError(
                f"{config_type.__name__} field(s) {missing} are neither settings of {self.kernel_name} "
                "(constructor arguments) nor run values passed to config()."
            )
        return config_type(
            **{name: settings[name] for name in config_type._fields if name not in run_values}, **run_values
        )

    def replace(self, **changes) -> ChainKernel:
        """A new kernel made with this one's constructor arguments, ``changes`` (constructor keyword arguments)
        applied; it has run nothing. Drivers use it to change a setting without touching the user's kernel."""
        unknown = sorted(set(changes) - set(inspect.signature(type(self)).parameters))
        if unknown:
            raise TypeError(f"{self.kernel_name} has no constructor argument(s) {unknown}.")
        bound = self._bound_arguments()
        bound.arguments.update(changes)
        return type(self)(*bound.args, **bound.kwargs)

    @staticmethod
    def split_chains(rng_key) -> tuple[jax.Array, bool]:
        """NumPyro's ``rng_key`` for ``init`` as ``(keys of shape (chains, 2), batched)``: one key per chain, and
        whether the run is ``vectorized`` (NumPyro passes one key per chain) rather than one chain's key."""
        batched = not is_prng_key(rng_key)
        return (rng_key if batched else rng_key[None]), batched

    def start_run(self, rng_key) -> jax.Array:
        """The first line of every ``init``: one key per chain (shape ``(chains, 2)``, from :meth:`split_chains`);
        records whether the run is ``vectorized`` (``self._batched``, read by :meth:`over_chains`,
        :meth:`one_chain` and :meth:`placed`) and clears the chain mesh of an earlier run."""
        keys, self._batched = self.split_chains(rng_key)
        self._chain_mesh = None
        return keys

    def one_chain(self, state):
        """A state built with a leading chain axis of size 1 as one chain's state (no chain axis, a scalar ``i``)
        when the run is not ``vectorized``; unchanged when it is. Kernels build every state batched and end
        ``init`` with this, so that one code path makes both."""
        if self._batched:
            return state
        return jax.tree.map(lambda x: x[0], state._replace(i=state.i[None]))

    def placed(self, state):
        """``state`` of ``vectorized`` chains sharded over ``self._chain_mesh``, placed as
        :func:`~numpyro_mile._arrays.place_state` says: the same placement entering and leaving the compiled step
        (one compilation of it); unchanged when the chains are not sharded or the kernel declares no
        :attr:`state_axes`."""
        if not self._batched or self.state_axes is None:
            return state
        return place_state(state, self.state_axes, self._chain_mesh)

    def initialised(self, state):
        """``state``, after marking the kernel initialised (see ``_sample_fn`` above)."""
        self._sample_fn = self.sample
        return state

    def finish_init(self, state):
        """The last line of a data-carrying kernel's ``init``: ``state`` carrying this run's data arrays
        (``state.data``, see :meth:`model_data`), :meth:`placed` as the step returns it, the kernel marked
        :meth:`initialised`."""
        return self.initialised(self.placed(state._replace(data=self._data.arrays)))

    @property
    def model(self) -> Callable | None:
        return self._model

    @property
    def is_ensemble_kernel(self) -> bool:
        return False

    def over_chains(self, fn: Callable, batched: bool | None = None, num_states: int = 1) -> Callable:
        """:func:`over_chains` with this kernel's :attr:`state_axes`, batched when this run is ``vectorized``
        (unless ``batched`` says otherwise)."""
        return over_chains(fn, self.state_axes, self._batched if batched is None else batched, num_states)

    #: seconds between two progress-bar postfix refreshes (each waits for the step and reads the state back)
    diagnostics_interval = 0.5

    def diagnostics_str(self, state) -> str:
        """The progress bar's postfix for ``state`` (reads it back from the device); override."""
        return ""

    def get_diagnostics_str(self, state) -> str:
        """NumPyro's progress-bar hook: :meth:`diagnostics_str`, recomputed at most every
        :attr:`diagnostics_interval` seconds (NumPyro calls this after every step of a sequential chain)."""
        cache = self.__dict__.setdefault("_diagnostics_cache", [-float("inf"), ""])  # [time (s), postfix]
        now = time.monotonic()
        if now - cache[0] >= self.diagnostics_interval:
            cache[:] = [now, self.diagnostics_str(state)]
        return cache[1]

    def _carried_data(self, state, model_args, model_kwargs) -> tuple | None:
        """``state.data`` when ``model_args`` are the very arrays ``init`` saw (NumPyro passes them as constants
        unless ``jit_model_args=True``): then the step reads the carried ones, which are arguments of the compiled
        loop. ``None`` for traced arguments, or new data for a run from ``post_warmup_state``."""
        data = getattr(state, "data", None)
        if (
            data is not None
            and self._data is not None
            and len(data) == len(self._data.sources)
            and _programs.same_data(self._data, model_args, model_kwargs or {})
        ):
            return data
        return None

    def model_arrays(self, state, model_args, model_kwargs) -> tuple[Any, tuple]:
        """The model's arguments for a step as ``(key, arrays)`` (a :class:`~numpyro_mile._programs.DataSplit`'s
        key and arrays): the carried arrays with this run's key (``self._data.key`` itself) when
        :meth:`_carried_data` has them, otherwise the given arguments split."""
        data = self._carried_data(state, model_args, model_kwargs)
        if data is not None:
            return self._data.key, data
        split = _programs.split_data(model_args, model_kwargs)
        return split.key, split.arrays

    def model_data(self, state, model_args, model_kwargs) -> tuple[tuple, dict]:
        """The model's ``(args, kwargs)`` for a step: the carried arrays (:meth:`_carried_data`) joined with this
        run's static arguments, otherwise the given ones."""
        data = self._carried_data(state, model_args, model_kwargs)
        if data is not None:
            return _programs.join_data(self._data.key, data)
        return tuple(model_args), model_kwargs or {}

    #: extra fields :meth:`sample_weights` reads (``mcmc.run(..., extra_fields=...)``); none for equal weights
    weight_fields: tuple[str, ...] = ()
    #: what the weights are and how to use them, stored with them by :func:`numpyro_mile.to_inference_data`
    weights_note = "importance_weight: normalised weights of the draws, summing to 1 over all chains and draws."

    def sample_weights(self, mcmc) -> np.ndarray | None:
        """Weights of the draws of ``mcmc`` (a run of this kernel), shape ``(chains, draws)``, summing to 1, or
        ``None`` when every draw weighs the same (all kernels but ICSGLD, whose draws target a flattened
        distribution). :func:`numpyro_mile.to_inference_data` stores them as ``sample_stats.importance_weight``.

        :raises ValueError: when they cannot be computed from this run.
        """
        return None

    def checkpoint_state(self, state):
        """``state`` as a checkpoint stores it (:mod:`numpyro_mile.runs`): without the model data it carries
        (``data``, see :meth:`model_data`), which :meth:`resumed_state` attaches again."""
        return state._replace(data=None)

    def resumed_state(self, saved, fresh):
        """A state stored by :meth:`checkpoint_state`, carrying the data of ``fresh`` (the state ``init`` just
        made for the resumed run, on that run's arguments)."""
        return saved._replace(data=fresh.data)

    def run_warnings(self, state) -> list[str]:
        """What went wrong in a run, from its last state (``mcmc.last_state``); empty when nothing did."""
        message = rejected_steps_message(self.kernel_name, state.num_nans, self.nan_advice)
        return [] if message is None else [message]


class Pretraining:
    """Deep-ensemble pretraining, offered to the kernels that start their chains from trained members (MILE,
    SMILE): a :class:`ChainKernel` subclass lists it as a second base and calls :meth:`init_pretraining` in its
    constructor."""

    def init_pretraining(self, pretrain: bool, ensemble_options: dict | None) -> None:
        """Store the pretraining settings (attributes ``pretrain`` and ``ensemble_options``, settings of the
        kernel) and an empty ``ensembles``."""
        self.pretrain = bool(pretrain)
        self.ensemble_options = dict(ensemble_options or {})
        #: deep ensembles trained by ``init`` (one entry per call: all chains when vectorized)
        self.ensembles: list[DeepEnsemble] = []

    def pretrained_members(self, trace: dict, member_keys, model_args: tuple, model_kwargs: dict) -> dict | None:
        """A deep ensemble's members as initial positions (unconstrained, leading member axis), one per key of
        ``member_keys`` (shape ``(members, 2)``), trained on the model's observation plate with the kernel's
        ``ensemble_options``; ``None``, after a warning saying why, when the model has no such plate. The
        ensemble is kept in ``ensembles`` (not under ``pmap``, where its arrays are traced).

        :param trace: a trace of the model on ``model_args`` (to find the plate; the ensemble reuses it).
        """
        options = {"progress_bar": True, **self.ensemble_options}
        if pretraining_plate(trace, options.get("plate_name"), self.kernel_name) is None:
            return None
        with warnings.catch_warnings():
            # the ensemble draws its own minibatches through the plate; NumPyro notes that their size is not the
            # model's subsample_size, which is expected here (the members are the same with or without it)
            warnings.filterwarnings("ignore", message=model_utils.SUBSAMPLE_MISMATCH, category=UserWarning)
            ensemble = fit_members(self.model, member_keys, model_args, model_kwargs, trace=trace, **options)
        if is_concrete(member_keys):
            self.ensembles.append(ensemble)
        return ensemble.init_params
