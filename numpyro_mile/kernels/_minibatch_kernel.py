"""NumPyro plumbing shared by the minibatch kernels (SGLD, ICSGLD, SMILE): the model's subsample plates
(:class:`~numpyro_mile.minibatch.MinibatchModel`), one compiled ``init`` per model and shapes, the
constrained-space ``postprocess_fn``, and the potential bound to a run's data. The pure SG-Langevin maths
are in :mod:`numpyro_mile.kernels._langevin`.
"""

from __future__ import annotations

import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _programs
from .._arrays import as_jax_arrays, chain_mesh_of, to_host
from .._validation import user_stacklevel
from ..minibatch import MinibatchModel
from ._base import ChainKernel

__all__ = ["MinibatchKernel", "as_jax_args", "build_init", "check_initial_state"]


def build_init(mb: MinibatchModel, data_key, init_strategy: Callable) -> Callable:
    """A jit-compiled ``init(keys, init_params, data_arrays) -> (z, energy, grad, state_keys)`` for a batch
    of chains: ``data_arrays`` and ``data_key`` are the model's arguments split by
    :func:`numpyro_mile._programs.split_data` (the arrays are arguments, not constants).

    Each chain's key is split into ``(init key, minibatch key, state key)``; positions come from
    ``init_params`` (a dict with a leading chain axis) or, when it is ``None``, from
    ``init_strategy`` on the full-data model; the minibatch energy and gradient are evaluated
    at them. Nothing of a kernel's settings enters, so every kernel shares the program of a model.
    """

    @jax.jit
    def init(keys, init_params, data_arrays):
        model_args, model_kwargs = _programs.join_data(data_key, data_arrays)
        potential = mb.indexed_potential_fn(model_args, model_kwargs)  # potential(z, indices), as in the steps
        split = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
        init_keys, batch_keys, state_keys = split[:, 0], split[:, 1], split[:, 2]
        if init_params is None:
            z = mb.init_positions(init_keys, model_args, model_kwargs, init_strategy)
        else:
            z = init_params
        energy, grad = jax.vmap(lambda z, key: jax.value_and_grad(potential)(z, mb.indices(key)))(z, batch_keys)
        return z, energy, grad, state_keys

    return init


def check_initial_state(kernel_name: str, energy, grad, z) -> None:
    """Raise when a chain starts where the energy or its gradient is not finite (concrete values only)."""
    if isinstance(energy, jax.core.Tracer):
        return
    # reduce where the chains live, then bring one flag per chain to the host (chains sharded over processes
    # by numpyro_mile.run_distributed are gathered)
    bad = ~jnp.isfinite(jnp.reshape(energy, -1))
    for leaf in jax.tree.leaves((grad, z)):
        bad |= ~jnp.all(jnp.isfinite(jnp.reshape(leaf, (bad.shape[0], -1))), axis=1)
    bad = to_host(bad)
    if bad.any():
        raise ValueError(
            f"{kernel_name}: the initial position of chain(s) {np.flatnonzero(bad).tolist()} has a non-finite "
            "potential energy or gradient. Pass finite init_params or another init_strategy."
        )


class MinibatchKernel(ChainKernel):
    """NumPyro plumbing of the minibatch kernels: the model's subsample plates
    (:class:`~numpyro_mile.minibatch.MinibatchModel`), one compiled ``init`` per model arguments,
    and the constrained-space ``postprocess_fn``."""

    def __init__(self, model: Callable, init_strategy: Callable):
        if model is None or not callable(model):
            raise ValueError(
                f"{self.kernel_name} needs a NumPyro model (a callable), e.g. {self.kernel_name}(mlp_regression)."
            )
        super().__init__(model)
        self.init_strategy = init_strategy
        self._mb: MinibatchModel | None = None

    def postprocess_fn(self, args, kwargs):
        if self._mb is None:
            return lambda z: z
        return self._mb.postprocess_fn(*as_jax_args(args, kwargs))

    def _init_chains(self, keys, init_params, model_args, model_kwargs, make_state: Callable, state_axes=None):
        """States of the chains with keys ``keys`` (a leading chain axis), from ``init_params`` (with a
        chain axis when the run is ``vectorized``) or the init strategy; sets up the minibatch model of this run."""
        self._data = _programs.split_data(model_args, model_kwargs)  # the user's arrays: model_data knows them
        model_args, model_kwargs = _programs.join_data(self._data.key, self._data.arrays)  # as JAX arrays
        self._mb = MinibatchModel(self._model, model_args, model_kwargs, kernel_name=self.kernel_name, rng_key=keys[0])
        if not self._mb.is_subsampled:
            warnings.warn(
                f"{self.kernel_name}: pass subsample_size to the model's data plate, e.g. "
                "numpyro.plate('data', N, subsample_size=subsample_size) and mcmc.run(..., subsample_size=32). "
                "No plate of this model draws a minibatch, so every step uses all rows: full-batch gradients, "
                "without the gradient noise the method's step is made for.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        if init_params is not None:
            init_params = self._mb.check_init_params(init_params, keys.shape[0], self._batched)
        mb = self._mb
        init = _programs.program(  # shared by every kernel and run of this model, static arguments and shapes
            (
                "minibatch-init",
                self._model,
                self._data.key,
                mb.plates,
                tuple(mb.latent_shapes.items()),
                self.init_strategy,
            ),
            lambda: build_init(mb, self._data.key, self.init_strategy),
        )
        z, energy, grad, state_keys = init(keys, init_params, self._data.arrays)
        if state_axes is not None:  # make_state builds one chain's state (a few small operations, not compiled)
            make_state = jax.vmap(make_state, out_axes=state_axes)
        state = make_state(z, energy, grad, state_keys)
        check_initial_state(self.kernel_name, state.potential_energy, state.z_grad, state.z)
        return state

    def _init_independent(self, rng_key, init_params, model_args, model_kwargs):
        """``init`` of chains that do not interact: one chain (``rng_key`` a key) or a batch of them (a
        leading axis of keys: ``vectorized``), each state made by ``self._init_state(z, energy, grad, key)``."""
        keys = self.start_run(rng_key)
        # chains sharded over devices (keys placed so, e.g. by run_distributed): every state, the first included,
        # placed as the step returns it (one compilation of the step)
        self._chain_mesh = chain_mesh_of(keys) if self._batched else None
        state = self._init_chains(keys, init_params, model_args, model_kwargs, self._init_state, self.state_axes)
        return self.finish_init(self.one_chain(state))

    def _sample_independent(self, state, model_args, model_kwargs, step: Callable):
        """``sample`` of chains that do not interact: ``step(state, potential, self._config)`` per chain
        (the step sees no ``data``: the potential is bound to it here)."""
        config = self._config
        state = self._step_on_data(
            state,
            model_args,
            model_kwargs,
            lambda s, potential: self.over_chains(lambda chain: step(chain, potential, config))(s),
        )
        return self.placed(state)

    def _step_on_data(self, state, model_args, model_kwargs, step: Callable):
        """``step(state, potential)`` with the potential bound to this run's data (:meth:`ChainKernel.model_data`);
        the step sees a state without ``data``, which is attached again to the result."""
        potential = self._potential(*self.model_data(state, model_args, model_kwargs))
        return step(state._replace(data=None), potential)._replace(data=state.data)

    def _potential(self, model_args, model_kwargs) -> Callable:
        """``potential(z, indices)``: the minibatch potential energy of this run's model on the plates' rows
        ``indices`` (``self._mb.indices(key)`` draws them), the one signature of every minibatch kernel's step."""
        return self._mb.indexed_potential_fn(*as_jax_args(model_args, model_kwargs))


def as_jax_args(model_args, model_kwargs) -> tuple[tuple, dict]:
    """The model's arguments with NumPy arrays as JAX arrays (:func:`numpyro_mile._arrays.as_jax_arrays`): a
    model that indexes its data with the subsample plate's (traced) indices, ``X[idx]``, works with NumPy data."""
    return as_jax_arrays(tuple(model_args)), as_jax_arrays(dict(model_kwargs or {}))
