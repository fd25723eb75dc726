"""SGLD: stochastic-gradient Langevin dynamics as a NumPyro MCMC kernel.

One step of one chain (Welling & Teh 2011), on a fresh minibatch each step::

    x <- x - eps_k * grad U~(x) + sqrt(2 eps_k tau) * xi,        xi ~ N(0, I)

``U~`` is NumPyro's potential energy of the model on the minibatch its subsample plate selects
(:mod:`numpyro_mile.minibatch`): an unbiased estimate of the full-data potential ``U``; ``tau``
is the temperature (``tau < 1``: a cold posterior). With ``preconditioner="rmsprop"`` the step
is pSGLD's (Li et al. 2016) with a diagonal RMSprop preconditioner ``G``::

    V <- a V + (1 - a) g * g,   G = 1 / (lambda + sqrt(V)),
    x <- x - eps_k G g + sqrt(2 eps_k tau G) xi

(``a = rmsprop_decay``, ``lambda = rmsprop_eps``), *without* pSGLD's correction term
``Gamma(x) = eps sum_j d G_ij / d x_j``, which the paper also drops in practice. With a slowly
changing ``V`` the omission is negligible; when ``V`` follows the chain (a decay whose memory,
``1 / (1 - a)`` steps, is not long compared with the chain's relaxation) the chain lingers where
gradients are large: on a 1-d Gaussian posterior with the default ``a = 0.99`` the variance came
out about 50% too large, with ``a = 0.999`` within 5%.

The state carries the minibatch energy and gradient at the current position, so each step
costs exactly one gradient evaluation per chain (plus one at ``init``); ``potential_energy``
is the minibatch energy of the collected position. Burn-in and thinning are NumPyro's
``num_warmup`` / ``thinning``.

The pure building blocks (:func:`chain_keys`, :func:`sgld_transition`, :func:`build_init`) are
shared with :mod:`numpyro_mile.kernels.icsgld`, which is why ICSGLD with ``zeta=0`` reproduces
this kernel bit for bit.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from .._arrays import to_host
from ..minibatch import MinibatchModel

__all__ = ["SGLD", "SGLDState", "RunningMoments", "Moments", "langevin_move", "polynomial_schedule", "sgld_transition"]


# ---------------------------------------------------------------------------------------------- state
class RunningMoments(NamedTuple):
    """Welford accumulators of the post-warmup iterates of one chain (unconstrained space).

    :ivar count: number of iterates accumulated.
    :ivar mean: running mean, a dict like ``z``.
    :ivar m2: running sum of squared deviations from the mean, a dict like ``z``.
    """

    count: jax.Array
    mean: dict
    m2: dict


class Moments(NamedTuple):
    """Mean and variance of iterates (returned by :meth:`SGLD.running_moments`).

    :ivar mean: dict site -> mean (unconstrained space).
    :ivar var: dict site -> variance (``ddof=0``).
    :ivar count: number of iterates per chain.
    """

    mean: dict
    var: dict
    count: int


class SGLDState(NamedTuple):
    """State of one SGLD chain (in ``vectorized`` mode every field but ``i`` has a chain axis).

    :ivar i: iteration counter (``i < num_warmup``: burn-in).
    :ivar z: unconstrained position (NumPyro's ``sample_field``).
    :ivar potential_energy: minibatch potential energy ``U~(z)`` (the energy of the position,
        on the minibatch drawn when it was reached).
    :ivar z_grad: gradient of that minibatch energy at ``z``.
    :ivar step_size: step size ``eps_k`` of the step that produced ``z``.
    :ivar preconditioner: RMSprop average of squared gradients ``V`` (pSGLD), else ``None``.
    :ivar moments: :class:`RunningMoments` of the post-warmup iterates when
        ``running_moments=True``, else ``None``.
    :ivar num_nans: number of steps rejected so far because the energy, gradient or position
        became NaN or infinite (the chain stayed where it was).
    :ivar rng_key: PRNG key of the chain.
    """

    i: jax.Array
    z: dict
    potential_energy: jax.Array
    z_grad: dict
    step_size: jax.Array
    preconditioner: dict | None
    moments: RunningMoments | None
    num_nans: jax.Array
    rng_key: jax.Array


# ---------------------------------------------------------------------------------------------- pure functions
def chain_keys(rng_key):
    """Split a chain's key into ``(next key, minibatch key, noise key)``: the key use of one step."""
    key, batch_key, noise_key = jax.random.split(rng_key, 3)
    return key, batch_key, noise_key


def langevin_move(z, grad, step_size, temperature, noise_key, multiplier=1.0, preconditioner=None):
    """One Euler step of overdamped Langevin dynamics on the potential (NumPyro's sign convention).

    ``z - eps * G * (multiplier * grad) + sqrt(2 eps tau G) * xi``, with ``G = 1`` when
    ``preconditioner`` is ``None`` (else the diagonal ``G`` as a pytree like ``z``).
    ``xi`` is one standard normal vector of the size of the flattened ``z``.
    """
    flat, unravel = ravel_pytree(z)
    g, _ = ravel_pytree(grad)
    noise = jax.random.normal(noise_key, flat.shape, flat.dtype)
    drift = multiplier * g
    if preconditioner is None:
        new = flat - step_size * drift + jnp.sqrt(2 * step_size * temperature) * noise
    else:
        G, _ = ravel_pytree(preconditioner)
        new = flat - step_size * (G * drift) + jnp.sqrt(2 * step_size * temperature * G) * noise
    return unravel(new)


def sgld_transition(rng_key, z, energy, grad, potential: Callable, step_size, temperature, multiplier=1.0,
                    preconditioner=None):
    """One (p)SGLD step of one chain, from a position with its minibatch energy and gradient.

    Splits ``rng_key`` with :func:`chain_keys`, moves ``z`` (:func:`langevin_move`, with the
    gradient multiplied by ``multiplier``), and evaluates ``value_and_grad(potential)`` at the
    new position on a fresh minibatch. A non-finite energy, gradient or position is rejected:
    the inputs are returned. Works on the flattened position (one select per array instead of
    one per site). Returns ``(next key, z, energy, grad, accepted)``.
    """
    key, batch_key, noise_key = chain_keys(rng_key)
    flat, unravel = ravel_pytree(z)
    g, _ = ravel_pytree(grad)
    G = None if preconditioner is None else ravel_pytree(preconditioner)[0]
    new = langevin_move(flat, g, step_size, temperature, noise_key, multiplier, G)
    new_energy, new_grad = jax.value_and_grad(potential)(unravel(new), batch_key)
    new_g, _ = ravel_pytree(new_grad)
    ok = jnp.isfinite(new_energy) & jnp.all(jnp.isfinite(new_g)) & jnp.all(jnp.isfinite(new))
    return (key, unravel(jnp.where(ok, new, flat)), jnp.where(ok, new_energy, energy),
            unravel(jnp.where(ok, new_g, g)), ok)


def build_init(mb: MinibatchModel, model_args: tuple, model_kwargs: dict, init_strategy: Callable,
               make_state: Callable) -> Callable:
    """A jit-compiled ``init(keys, init_params) -> state`` for a batch of chains (one compilation).

    Each chain's key is split into ``(init key, minibatch key, state key)``; positions come from
    ``init_params`` (a dict with a leading chain axis) or, when it is ``None``, from
    ``init_strategy`` on the full-data model; the minibatch energy and gradient are evaluated
    at them, and ``make_state(z, energy, grad, state_keys)`` (all with a chain axis) builds the
    kernel's state.
    """
    potential = mb.potential_fn(model_args, model_kwargs)

    @jax.jit
    def init(keys, init_params):
        split = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
        init_keys, batch_keys, state_keys = split[:, 0], split[:, 1], split[:, 2]
        if init_params is None:
            z = mb.init_positions(init_keys, model_args, model_kwargs, init_strategy)
        else:
            z = init_params
        energy, grad = jax.vmap(jax.value_and_grad(potential))(z, batch_keys)
        return make_state(z, energy, grad, state_keys)

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


def polynomial_schedule(a: float, b: float, gamma: float) -> Callable:
    """``k -> a * (b + k)^(-gamma)``: the decaying SGLD step size (``k`` counts from 0)."""
    if not a > 0 or not b > 0 or not 0 < gamma <= 1:
        raise ValueError(
            f"a polynomial step-size schedule a * (b + k)^(-gamma) needs a > 0, b > 0 and 0 < gamma <= 1 "
            f"(0.5 < gamma <= 1 for SGLD's convergence theory), got a={a}, b={b}, gamma={gamma}."
        )
    return lambda k: a * (b + k) ** (-gamma)


def _as_schedule(step_size, schedule) -> Callable:
    if schedule is None:
        if not (isinstance(step_size, (int, float, np.floating)) and step_size > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        return lambda k: step_size
    if callable(schedule):
        return schedule
    if isinstance(schedule, (tuple, list)) and len(schedule) == 4 and schedule[0] == "polynomial":
        return polynomial_schedule(*schedule[1:])
    raise ValueError(
        "schedule must be None (constant step_size), a callable k -> step size, or "
        f"('polynomial', a, b, gamma) for a * (b + k)^(-gamma); got {schedule!r}."
    )


def _warn_nan(count, iteration, kernel_name="SGLD"):
    warnings.warn(
        f"{kernel_name} rejected a step at iteration {int(iteration)} because the energy, gradient or position "
        f"became NaN or infinite ({int(count)} rejection(s) so far); the chain stayed at its previous position. "
        "The step size is probably too large for this model: see the 'num_nans' extra field.",
        RuntimeWarning,
        stacklevel=2,
    )


def _args_key(model_args, model_kwargs):
    return tuple(id(a) for a in model_args) + tuple((k, id(v)) for k, v in sorted(model_kwargs.items()))


class _CachedPerArgs:
    """Cache of jitted closures per model arguments (by identity, keeping them alive), so that
    ``sequential`` chains, which call ``init`` once each, compile once."""

    def __init__(self):
        self._entries = {}

    def get(self, name, model_args, model_kwargs, build):
        key = (name,) + _args_key(model_args, model_kwargs)
        if key not in self._entries:
            if len(self._entries) > 16:
                self._entries.clear()
            self._entries[key] = (build(), model_args, model_kwargs)  # keep the arguments alive
        return self._entries[key][0]


# ---------------------------------------------------------------------------------------------- kernel
class SGLD(MCMCKernel):
    """Stochastic-gradient Langevin dynamics (SGLD / pSGLD) with NumPyro's subsample plates.

    Write the model with ``numpyro.plate("data", N, subsample_size=n)`` (as
    :func:`numpyro_mile.models.mlp_regression` does with ``subsample_size=n``): every step then
    draws a fresh minibatch of ``n`` rows and uses NumPyro's scaled minibatch potential. A model
    without a subsampled plate gets full-batch gradients (the unadjusted Langevin algorithm).
    Chains never interact: ``sequential``, ``vectorized`` and ``parallel`` all work.

    :param model: a NumPyro model with continuous latent sites.
    :param step_size: constant step size ``eps`` (when ``schedule`` is ``None``).
    :param schedule: ``None`` (constant ``step_size``), a callable ``k -> eps_k`` (``k`` =
        iteration, from 0, warmup included; it must be traceable by JAX), or
        ``("polynomial", a, b, gamma)`` for ``eps_k = a (b + k)^(-gamma)``.
    :param temperature: ``tau``; the chain targets ``exp(-U / tau)``.
    :param preconditioner: ``None`` or ``"rmsprop"`` (pSGLD, see the module docstring; the
        ``Gamma`` correction term is ignored, and ``V`` starts at the squared initial gradient).
    :param rmsprop_decay: RMSprop decay ``a`` of ``V``.
    :param rmsprop_eps: ``lambda`` in ``G = 1 / (lambda + sqrt(V))``.
    :param init_strategy: NumPyro init strategy when no ``init_params`` are given (evaluated
        on the full-data model). For BNNs start near the prior's centre or from trained weights:
        with NumPyro's default ``init_to_uniform`` (radius 2) ``mlp_regression`` on yacht starts
        at energies of 1e12 and more (extreme predicted noise scales) and every step is rejected;
        ``init_to_uniform(radius=0.1)`` or ``init_params=deep_ensemble(...).init_params`` work.
    :param running_moments: BayesDLL's memory-light mode: keep a running mean and variance of
        the post-warmup iterates (every step, before thinning) in the state; read them with
        :meth:`running_moments` on ``mcmc.last_state``. To store no samples at all, exclude the
        sites from collection: ``mcmc.run(..., extra_fields=("~z.w0", "~z.b0", ...))``.

    Extra fields: ``potential_energy`` (minibatch energy), ``step_size``, ``num_nans``.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import SGLD
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> mcmc = MCMC(SGLD(mlp_regression, step_size=1e-4), num_warmup=100, num_samples=50,
        ...             num_chains=2, chain_method="vectorized", progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(8,), subsample_size=20)
        >>> mcmc.get_samples(group_by_chain=True)["w0"].shape
        (2, 50, 1, 8)
    """

    sample_field = "z"
    _kernel_name = "SGLD"

    def __init__(
        self,
        model: Callable,
        step_size: float = 1e-4,
        *,
        schedule=None,
        temperature: float = 1.0,
        preconditioner: str | None = None,
        rmsprop_decay: float = 0.99,
        rmsprop_eps: float = 1e-5,
        init_strategy: Callable = init_to_uniform,
        running_moments: bool = False,
    ):
        if model is None or not callable(model):
            raise ValueError("SGLD needs a NumPyro model (a callable), e.g. SGLD(mlp_regression).")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}.")
        if preconditioner not in (None, "rmsprop"):
            raise ValueError(f"preconditioner must be None or 'rmsprop', got {preconditioner!r}.")
        if not 0 <= rmsprop_decay < 1 or not rmsprop_eps > 0:
            raise ValueError("rmsprop_decay must lie in [0, 1) and rmsprop_eps be positive.")
        self._model = model
        self.step_size = step_size
        self.schedule = _as_schedule(step_size, schedule)
        self.temperature = float(temperature)
        self.preconditioner = preconditioner
        self.rmsprop_decay, self.rmsprop_eps = float(rmsprop_decay), float(rmsprop_eps)
        self.init_strategy = init_strategy
        self._running_moments = bool(running_moments)
        self._mb: MinibatchModel | None = None
        self._batched = False
        self._num_warmup = 0
        self._cache = _CachedPerArgs()

    # ------------------------------------------------------------------ NumPyro interface
    @property
    def model(self) -> Callable:
        return self._model

    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z",)

    @property
    def is_ensemble_kernel(self) -> bool:
        return False

    def get_diagnostics_str(self, state: SGLDState) -> str:
        return "step size {:.2e}. U~ {:.4g}. nans {}".format(
            float(jnp.mean(state.step_size)), float(jnp.mean(state.potential_energy)), int(jnp.sum(state.num_nans))
        )

    def postprocess_fn(self, args, kwargs):
        if self._mb is None:
            return lambda z: z
        return self._mb.postprocess_fn(args, kwargs or {})

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        model_args = tuple(model_args)
        self._batched = not is_prng_key(rng_key)
        keys = rng_key if self._batched else rng_key[None]
        self._num_warmup = int(num_warmup)
        self._mb = MinibatchModel(self._model, model_args, model_kwargs, kernel_name=self._kernel_name,
                                  rng_key=keys[0])
        if init_params is not None:
            init_params = self._mb.check_init_params(init_params, keys.shape[0], self._batched)
        init = self._cache.get("init", model_args, model_kwargs, lambda: build_init(
            self._mb, model_args, model_kwargs, self.init_strategy,
            jax.vmap(self._init_state, out_axes=self._state_axes())))
        state = init(keys, init_params)
        check_initial_state(self._kernel_name, state.potential_energy, state.z_grad, state.z)
        if not self._batched:
            state = jax.tree.map(lambda x: x[0], state._replace(i=state.i[None]))
        return state

    def sample(self, state: SGLDState, model_args, model_kwargs) -> SGLDState:
        potential = self._mb.potential_fn(tuple(model_args), model_kwargs or {})
        step = lambda s: self._chain_step(s, potential)  # noqa: E731
        if self._batched:
            axes = self._state_axes()
            step = jax.vmap(step, in_axes=(axes,), out_axes=axes)
        new_state = step(state)
        old_nans, new_nans = jnp.sum(state.num_nans), jnp.sum(new_state.num_nans)
        jax.lax.cond(
            (new_nans > 0) & (old_nans == 0),
            lambda: jax.debug.callback(_warn_nan, new_nans, state.i, self._kernel_name),
            lambda: None,
        )
        return new_state

    # ------------------------------------------------------------------ results
    def running_moments(self, state: SGLDState, combine_chains: bool = True) -> Moments:
        """Mean and variance of the post-warmup iterates kept by ``running_moments=True``.

        :param state: ``mcmc.last_state``.
        :param combine_chains: pool the chains (vectorized runs); else keep a leading chain axis.
        """
        if state.moments is None:
            raise ValueError("this SGLD kernel keeps no running moments: create it with running_moments=True.")
        count = np.asarray(state.moments.count)
        if np.any(count == 0):
            raise ValueError("no post-warmup iterations yet: the running moments are empty.")
        mean = {k: np.asarray(v, np.float64) for k, v in state.moments.mean.items()}
        m2 = {k: np.asarray(v, np.float64) for k, v in state.moments.m2.items()}
        if count.ndim == 0:
            return Moments(mean, {k: m2[k] / count for k in m2}, int(count))
        if not combine_chains:
            var = {k: m2[k] / count.reshape((-1,) + (1,) * (m2[k].ndim - 1)) for k in m2}
            return Moments(mean, var, int(count[0]))
        # pool chains (Chan et al.): total M2 = sum M2_c + sum n_c (mean_c - mean)^2
        total = count.sum()
        pooled_mean, pooled_var = {}, {}
        for k in mean:
            w = (count / total).reshape((-1,) + (1,) * (mean[k].ndim - 1))
            grand = (w * mean[k]).sum(0)
            n = count.reshape(w.shape)
            pooled_mean[k] = grand
            pooled_var[k] = (m2[k].sum(0) + (n * (mean[k] - grand) ** 2).sum(0)) / total
        return Moments(pooled_mean, pooled_var, int(count[0]))

    # ------------------------------------------------------------------ internals
    def _state_axes(self) -> SGLDState:
        return SGLDState(None, 0, 0, 0, 0, 0, 0, 0, 0)

    def _init_state(self, z, energy, grad, key) -> SGLDState:
        dtype = energy.dtype
        precond = None
        if self.preconditioner == "rmsprop":
            precond = jax.tree.map(jnp.square, grad)
        moments = None
        if self._running_moments:
            moments = RunningMoments(jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, z),
                                     jax.tree.map(jnp.zeros_like, z))
        return SGLDState(
            i=jnp.asarray(0), z=z, potential_energy=energy, z_grad=grad,
            step_size=jnp.asarray(self.schedule(0), dtype=dtype), preconditioner=precond, moments=moments,
            num_nans=jnp.asarray(0), rng_key=key,
        )

    def _chain_step(self, state: SGLDState, potential: Callable) -> SGLDState:
        step_size = jnp.asarray(self.schedule(state.i), dtype=state.potential_energy.dtype)
        G = None
        if state.preconditioner is not None:
            G = jax.tree.map(lambda v: 1.0 / (self.rmsprop_eps + jnp.sqrt(v)), state.preconditioner)
        key, z, energy, grad, ok = sgld_transition(state.rng_key, state.z, state.potential_energy, state.z_grad,
                                                   potential, step_size, self.temperature, 1.0, G)
        precond = state.preconditioner
        if precond is not None:
            a = self.rmsprop_decay
            precond = jax.tree.map(lambda v, g: jnp.where(ok, a * v + (1 - a) * g * g, v), precond, grad)
        moments = state.moments
        if moments is not None:
            moments = _welford(moments, z, state.i >= self._num_warmup)
        return SGLDState(state.i + 1, z, energy, grad, step_size, precond, moments,
                         state.num_nans + jnp.where(ok, 0, 1), key)


def _welford(moments: RunningMoments, z, active) -> RunningMoments:
    count = moments.count + jnp.where(active, 1, 0)
    safe = jnp.maximum(count, 1)
    mean = jax.tree.map(lambda m, x: jnp.where(active, m + (x - m) / safe, m), moments.mean, z)
    m2 = jax.tree.map(lambda s, m_old, m_new, x: jnp.where(active, s + (x - m_old) * (x - m_new), s),
                      moments.m2, moments.mean, mean, z)
    return RunningMoments(count, mean, m2)
