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

The pure building blocks (:func:`~numpyro_mile.kernels._langevin.chain_keys`,
:func:`~numpyro_mile.kernels._langevin.sgld_transition`, ...) live in
:mod:`numpyro_mile.kernels._langevin`, shared with :mod:`numpyro_mile.kernels.icsgld`, which is
why ICSGLD with ``zeta=0`` reproduces this kernel bit for bit. The step of all chains is the pure
:func:`sgld_step`; the kernel class holds NumPyro's interface.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.initialization import init_to_uniform

from .._moments import Moments, merge_moments
from ._langevin import RunningMoments, as_schedule, langevin_move, polynomial_schedule, sgld_transition, welford
from ._base import chain_axes
from ._minibatch_kernel import MinibatchKernel

__all__ = [
    "SGLD",
    "SGLDConfig",
    "SGLDState",
    "RunningMoments",
    "Moments",
    "langevin_move",
    "polynomial_schedule",
    "sgld_step",
    "sgld_transition",
]


# ---------------------------------------------------------------------------------------------- state
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
    :ivar data: the model's array arguments (no chain axis), carried so that they are arguments of the
        compiled sampling loop (:meth:`~numpyro_mile.kernels._base.ChainKernel.model_data`); ``None`` inside a step.
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
    data: tuple | None = None


class SGLDConfig(NamedTuple):
    """Settings of one SGLD run (fixed when ``init`` runs).

    :ivar schedule: step size ``k -> eps_k`` (``k`` from 0, warmup included).
    :ivar temperature: ``tau``.
    :ivar rmsprop_decay: RMSprop decay ``a`` of ``V`` (pSGLD; unused without a preconditioner).
    :ivar rmsprop_eps: ``lambda`` in ``G = 1 / (lambda + sqrt(V))``.
    :ivar num_warmup: burn-in steps (running moments start after them).
    """

    schedule: Callable
    temperature: float
    rmsprop_decay: float
    rmsprop_eps: float
    num_warmup: int


#: vmap axes of a vectorized state: the iteration counter and the data are shared by all chains
_STATE_AXES = chain_axes(SGLDState)


def sgld_step(
    state: SGLDState, potential: Callable, config: SGLDConfig, draw_minibatch: Callable | None = None
) -> SGLDState:
    """One (p)SGLD step of one chain: ``potential(z, minibatch)`` is the minibatch potential energy on
    ``minibatch = draw_minibatch(key)`` (the plates' row indices; ``None``: the key itself).

    A non-finite energy, gradient or position is rejected (the chain stays; ``num_nans`` counts it).
    """
    step_size = jnp.asarray(config.schedule(state.i), dtype=state.potential_energy.dtype)
    G = None
    if state.preconditioner is not None:
        G = jax.tree.map(lambda v: 1.0 / (config.rmsprop_eps + jnp.sqrt(v)), state.preconditioner)
    key, z, energy, grad, ok = sgld_transition(
        state.rng_key,
        state.z,
        state.potential_energy,
        state.z_grad,
        potential,
        step_size,
        config.temperature,
        1.0,
        G,
        draw_minibatch,
    )
    precond = state.preconditioner
    if precond is not None:
        a = config.rmsprop_decay
        precond = jax.tree.map(lambda v, g: jnp.where(ok, a * v + (1 - a) * g * g, v), precond, grad)
    moments = state.moments
    if moments is not None:
        moments = welford(moments, z, state.i >= config.num_warmup)
    return SGLDState(
        state.i + 1, z, energy, grad, step_size, precond, moments, state.num_nans + jnp.where(ok, 0, 1), key
    )


# ---------------------------------------------------------------------------------------------- kernel
class SGLD(MinibatchKernel):
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

    kernel_name = "SGLD"
    state_axes = _STATE_AXES

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
        super().__init__(model, init_strategy)
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}.")
        if preconditioner not in (None, "rmsprop"):
            raise ValueError(f"preconditioner must be None or 'rmsprop', got {preconditioner!r}.")
        if not 0 <= rmsprop_decay < 1 or not rmsprop_eps > 0:
            raise ValueError("rmsprop_decay must lie in [0, 1) and rmsprop_eps be positive.")
        self.step_size = step_size
        self.schedule = as_schedule(step_size, schedule)
        self.temperature = float(temperature)
        self.preconditioner = preconditioner
        self.rmsprop_decay, self.rmsprop_eps = float(rmsprop_decay), float(rmsprop_eps)
        self._running_moments = bool(running_moments)
        self._config: SGLDConfig | None = None

    # ------------------------------------------------------------------ NumPyro interface
    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z",)

    def diagnostics_str(self, state: SGLDState) -> str:
        return "step size {:.2e}. U~ {:.4g}. nans {}".format(
            float(jnp.mean(state.step_size)), float(jnp.mean(state.potential_energy)), int(jnp.sum(state.num_nans))
        )

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        self._config = self.config(SGLDConfig, num_warmup=int(num_warmup))
        return self._init_independent(rng_key, init_params, model_args, model_kwargs)

    def sample(self, state: SGLDState, model_args, model_kwargs) -> SGLDState:
        draw = self._mb.indices  # the plates' row indices of a step's minibatch
        return self._sample_independent(
            state, model_args, model_kwargs, lambda s, potential, config: sgld_step(s, potential, config, draw)
        )

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
        # pool chains: Chan et al.'s merge, one chain at a time
        pooled_mean, pooled_var = {}, {}
        for k in mean:
            n, m, s2 = count[0], mean[k][0], m2[k][0]
            for c in range(1, count.shape[0]):
                n, m, s2 = merge_moments(n, m, s2, count[c], mean[k][c], m2[k][c])
            pooled_mean[k], pooled_var[k] = m, s2 / n
        return Moments(pooled_mean, pooled_var, int(count[0]))

    # ------------------------------------------------------------------ internals
    def _init_state(self, z, energy, grad, key) -> SGLDState:
        dtype = energy.dtype
        precond = None
        if self.preconditioner == "rmsprop":
            precond = jax.tree.map(jnp.square, grad)
        moments = None
        if self._running_moments:
            moments = RunningMoments(
                jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, z), jax.tree.map(jnp.zeros_like, z)
            )
        return SGLDState(
            i=jnp.asarray(0, jnp.int32),
            z=z,
            potential_energy=energy,
            z_grad=grad,
            step_size=jnp.asarray(self.schedule(0), dtype=dtype),
            preconditioner=precond,
            moments=moments,
            num_nans=jnp.asarray(0, jnp.int32),
            rng_key=key,
        )
