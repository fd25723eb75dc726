"""SMILE and pSMILE: stochastic-gradient microcanonical Langevin dynamics as a NumPyro MCMC kernel.

MILE's MCLMC step with minibatch gradients (Sommer et al., "Can Microcanonical Langevin Dynamics
Leverage Mini-Batch Gradient Noise?", ICML 2026). One step of one chain, on a fresh minibatch
``B`` drawn through the model's subsample plate, is one isokinetic McLachlan step::

    kick(b1 eps, g)  drift(eps/2)  [l, g] <- value_and_grad log p~_B  kick((1 - 2 b1) eps, g)
    drift(eps/2)     [l, g] <- value_and_grad log p~_B                kick(b1 eps, g)

with ``b1 = 0.1932`` (BlackJAX's ESH velocity update for the kicks, so ``|u| = 1``). The first
kick uses the gradient stored at the end of the previous step (previous minibatch), so a step
costs exactly **two minibatch gradient evaluations**. Gradients are sanitised (NaN -> 0, clipped
to ``[-1e6, 1e6]``). There is no explicit momentum refresh by default (``L=None``): the minibatch
gradient noise is the only source of randomness. When that noise is isotropic it acts as a
partial refresh and leaves the target unbiased; anisotropic noise biases the draws (directions
with more noise are over-dispersed).

**pSMILE** (``precondition=True``) runs the dynamics in coordinates scaled by a per-coordinate
estimate of the gradient-noise standard deviation ``s`` (moving averages of the gradient's mean
and variance along the trajectory, rate 0.01; ``s`` clipped to ``[1e-2, 1e4]``, normalised to
RMS 1 and floored at ``min_scale``, default 0.1): kicks use ``g / s``, drifts move ``u / s``
(BlackJAX's diagonal inverse mass matrix ``1 / s^2``), which makes diagonal noise isotropic and
removes most of the bias. The floor departs from the reference code (which has none): coordinates
the data hardly touch would otherwise drift ``100-1000 eps`` per step (``docs/methods/smile.md``,
"pSMILE", has the protein run that lost a chain this way).

The energy error of a step compares minibatch log densities of two batches,
``dE = dK + l_B(t-1)(x_t) - l_B(t)(x_t+1)``, so it is dominated by minibatch noise; the step-size
tuner and the reset guardrail work with quantiles of each chain's own recent ``|dE|``
(:mod:`numpyro_mile.kernels._smile_tuning`, which also lists where this implementation departs
from the released reference code and why).

Defaults a NumPyro user would expect (a departure from the reference code, which adapts during
sampling too): the step size and the preconditioner adapt during warmup only and are fixed
while sampling (``adapt_during_sampling=False``), so the sampling phase is a stationary Markov
chain; the reset guardrail stays on throughout. The velocity starts at zero (the first kick
aligns it with the gradient).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.initialization import init_to_uniform

from .. import _model_utils as model_utils
from . import _mclmc as mclmc
from . import _smile_tuning as tuner
from ._base import Pretraining, chain_axes
from ._minibatch_kernel import MinibatchKernel, as_jax_args

__all__ = ["SMILE", "SMILEConfig", "SMILEState", "smile_step"]

GRAD_CLIP = 1e6
#: rate of pSMILE's moving averages of the gradient's mean and variance
NOISE_RATE = 0.01
#: pSMILE's default floor of the normalised noise scale (a coordinate drifts at most ``eps / MIN_SCALE``)
MIN_SCALE = 0.1
#: a chain whose step size ends this many times below the initial one is reported as stuck (on protein a chain
#: that the minibatches kept resetting fell 1e4-fold in 5,000 steps; healthy chains ended 16-56 times above it)
COLLAPSE_FACTOR = 1e3


class SMILEState(NamedTuple):
    """State of one SMILE chain (in ``vectorized`` mode every field but ``i`` has a chain axis).

    :ivar i: iteration counter (scalar, shared by all chains); ``i < num_warmup`` is warmup.
    :ivar z: unconstrained position (NumPyro's ``sample_field``), a dict of arrays.
    :ivar momentum: unit velocity ``u``, flattened, shape ``(d,)`` (zero at the start and after a reset).
    :ivar logdensity: minibatch log density ``l~`` at ``z`` (the batch of the step that reached it).
    :ivar logdensity_grad: its sanitised gradient, flattened, shape ``(d,)``.
    :ivar step_size: step size ``eps``.
    :ivar stats: moving averages of ``|dE|`` (:class:`~numpyro_mile.kernels._smile_tuning.EnergyStats`).
    :ivar energy_change: ``dE`` of the last step (``nan`` if it was not finite).
    :ivar reset: whether the last step was reset (position, log density and gradient reverted, ``u = 0``).
    :ivar num_resets: resets so far.
    :ivar num_nans: steps whose energy error was not finite (each also reset).
    :ivar grad_mean: pSMILE: moving average of the gradient, shape ``(d,)``; else ``None``.
    :ivar grad_var: pSMILE: moving average of its squared deviation, shape ``(d,)``; else ``None``.
    :ivar rng_key: PRNG key of the chain.
    :ivar data: the model's array arguments (no chain axis), carried so that they are arguments of the
        compiled sampling loop (:meth:`~numpyro_mile.kernels._base.ChainKernel.model_data`); ``None`` inside a step.
    """

    i: jax.Array
    z: dict
    momentum: jax.Array
    logdensity: jax.Array
    logdensity_grad: jax.Array
    step_size: jax.Array
    stats: tuner.EnergyStats
    energy_change: jax.Array
    reset: jax.Array
    num_resets: jax.Array
    num_nans: jax.Array
    grad_mean: jax.Array | None
    grad_var: jax.Array | None
    rng_key: jax.Array
    data: tuple | None = None

    @property
    def potential_energy(self) -> jax.Array:
        """Minibatch potential energy ``-l~`` at ``z``."""
        return -self.logdensity

    @property
    def z_grad(self) -> jax.Array:
        """Gradient of the minibatch potential at ``z``, flattened."""
        return -self.logdensity_grad


#: vmap axes of a vectorized state: the iteration counter and the data are shared by all chains
_STATE_AXES = chain_axes(SMILEState)


class SMILEConfig(NamedTuple):
    """Settings of one SMILE run (fixed when ``init`` runs).

    :ivar num_warmup: warmup steps.
    :ivar tuner: :class:`~numpyro_mile.kernels._smile_tuning.TunerSettings`.
    :ivar precondition: pSMILE's gradient-noise preconditioner.
    :ivar adapt_during_sampling: keep adapting the step size and preconditioner after warmup.
    :ivar L: momentum decoherence length of an explicit partial refresh per step (``None``: none).
    :ivar min_scale: pSMILE's floor of the normalised noise scale ``s`` (see :func:`noise_scale`).
    """

    num_warmup: int
    tuner: tuner.TunerSettings
    precondition: bool
    adapt_during_sampling: bool
    L: float | None
    min_scale: float = MIN_SCALE


def _sanitise(g):
    return jnp.clip(jnp.nan_to_num(g, nan=0.0, posinf=GRAD_CLIP, neginf=-GRAD_CLIP), -GRAD_CLIP, GRAD_CLIP)


def noise_scale(grad_var, min_scale: float = MIN_SCALE) -> jax.Array:
    """pSMILE's per-coordinate scale ``s``, shape ``(d,)``: the noise standard deviation
    ``sqrt(grad_var)`` clipped to ``[1e-2, 1e4]``, divided by its root mean square, then floored at
    ``min_scale`` (so no coordinate drifts more than ``eps / min_scale`` per unit velocity)."""
    s = jnp.clip(jnp.sqrt(grad_var), 1e-2, 1e4)
    return jnp.maximum(s / jnp.sqrt(jnp.mean(jnp.square(s))), min_scale)


def smile_step(
    state: SMILEState, potential: Callable, config: SMILEConfig, draw_minibatch: Callable | None = None
) -> SMILEState:
    """One SMILE step of one chain; ``potential(z, minibatch)`` is the minibatch potential energy.

    Two evaluations of ``value_and_grad(potential)``, both on this step's ``minibatch =
    draw_minibatch(key)`` (drawn once; e.g. the plates' row indices). ``draw_minibatch=None``: the
    key itself is passed, for a potential that draws its minibatch or noise from a key.
    """
    key, batch_key, refresh_key = jax.random.split(state.rng_key, 3)
    minibatch = batch_key if draw_minibatch is None else draw_minibatch(batch_key)
    x, unravel = ravel_pytree(state.z)
    adapting = (state.i < config.num_warmup) | config.adapt_during_sampling

    def value_grad(position):
        neg, grad = jax.value_and_grad(lambda p: potential(unravel(p), minibatch))(position)
        return -neg, _sanitise(-grad)

    inverse_mass = 1.0 / jnp.square(noise_scale(state.grad_var, config.min_scale)) if config.precondition else 1.0
    eps = state.step_size
    u = state.momentum
    if config.L is not None:
        u = mclmc.partially_refresh_momentum(u, refresh_key, eps, config.L)
        u = jnp.where(jnp.any(state.momentum != 0), u, state.momentum)  # a zero velocity stays zero
    x2, u, logdensity, g2, kinetic_change = mclmc.minibatch_mclachlan(
        x, u, state.logdensity_grad, value_grad, eps, inverse_mass
    )
    energy_change = kinetic_change + state.logdensity - logdensity

    x_abs = jnp.abs(energy_change)
    finite = jnp.isfinite(x_abs) & jnp.all(jnp.isfinite(x2))
    new_step_size, reset, stats = tuner.tune(state.stats, jnp.where(finite, x_abs, jnp.inf), eps, config.tuner)
    step_size = jnp.where(adapting, new_step_size, eps)

    keep = ~reset
    position = jnp.where(keep, x2, x)
    new_grad = jnp.where(keep, g2, state.logdensity_grad)
    grad_mean, grad_var = state.grad_mean, state.grad_var
    if config.precondition:
        update = adapting & keep
        mean = jnp.clip((1 - NOISE_RATE) * grad_mean + NOISE_RATE * new_grad, -GRAD_CLIP, GRAD_CLIP)
        var = jnp.maximum((1 - NOISE_RATE) * grad_var + NOISE_RATE * jnp.square(new_grad - mean), 1e-14)
        grad_mean, grad_var = jnp.where(update, mean, grad_mean), jnp.where(update, var, grad_var)
    return SMILEState(
        i=state.i + 1,
        z=unravel(position),
        momentum=jnp.where(keep, u, jnp.zeros_like(u)),
        logdensity=jnp.where(keep, logdensity, state.logdensity),
        logdensity_grad=new_grad,
        step_size=step_size,
        stats=stats,
        energy_change=jnp.where(finite, energy_change, jnp.nan),
        reset=reset,
        num_resets=state.num_resets + reset.astype(state.num_resets.dtype),
        num_nans=state.num_nans + (~finite).astype(state.num_nans.dtype),
        grad_mean=grad_mean,
        grad_var=grad_var,
        rng_key=key,
    )


class SMILE(MinibatchKernel, Pretraining):
    """Stochastic-gradient microcanonical Langevin dynamics (SMILE; pSMILE with ``precondition=True``).

    Write the model with ``numpyro.plate("data", N, subsample_size=n)`` (as
    :func:`numpyro_mile.models.mlp_regression` does with ``subsample_size=n``): every step draws
    a fresh minibatch of ``n`` rows and takes two gradients of NumPyro's scaled minibatch
    potential on it. As MILE, the chains start from a deep ensemble trained here (one member per
    chain; the members are kept in ``kernel.ensembles``) unless ``init_params`` are given or
    ``pretrain=False`` (then from ``init_strategy``). Chains never interact:
    ``sequential``, ``vectorized`` and ``parallel`` all work. The algorithm, the tuner and their
    defaults are in the module docstrings of :mod:`numpyro_mile.kernels.smile` and
    :mod:`numpyro_mile.kernels._smile_tuning`.

    :param model: a NumPyro model with continuous latent sites (at least 2 unconstrained dimensions).
    :param step_size: initial step size ``eps``.
    :param precondition: pSMILE: scale the dynamics by the estimated per-coordinate gradient-noise
        standard deviation.
    :param min_scale: pSMILE only: floor of the noise scale after it is normalised to RMS 1 (a
        coordinate moves at most ``step_size / min_scale`` per unit velocity; ``0``: no floor, as
        the reference code).
    :param reset_quantile: ``r``: a step whose ``|dE|`` exceeds this quantile of the chain's recent
        ``|dE|`` (Gamma model) is reset: position, log density and gradient reverted, velocity
        set to 0. ``1``: never.
    :param adapt_prob: ``a``: tail mass of ``|dE|`` that changes the step size: below the ``a/3``
        quantile it grows, above the ``1 - 2a/3`` quantile it shrinks (the reference code's split; a
        symmetric split over-dispersed exact posteriors 2.6-4.9-fold, ``docs/methods/smile.md``).
        ``0``: fixed step size, the SMILE paper's setting for small UCI sets
        (``adapt_prob=0, reset_quantile=1``).
    :param adapt_strength: ``d``: relative step-size change (``eps (1 +- d)``).
    :param smoothing: rate ``beta`` of the moving averages of ``|dE|``.
    :param adapt_during_sampling: keep adapting the step size and the preconditioner after warmup
        (the reference code does; the sampling phase is then not a stationary chain).
    :param L: momentum decoherence length of an optional explicit partial refresh per step
        (a safety net when the minibatch noise is weak, e.g. batches close to the full data);
        ``None`` (default): the gradient noise is the only randomness.
    :param pretrain: train a deep ensemble (one member per chain) as the start when no
        ``init_params`` are given and the model has an observation plate
        (:func:`numpyro_mile.deep_ensemble`; its minibatches are its own, ``subsample_size`` does
        not change them).
    :param ensemble_options: keyword arguments of :func:`numpyro_mile.deep_ensemble`
        (``optimizer``, ``batch_size``, ``max_epochs``, ``validation``, ``early_stopping``, ...).
    :param init_strategy: NumPyro init strategy when not pretraining.

    Extra fields: ``step_size``, ``energy_change``, ``reset``, ``num_resets``, ``num_nans``,
    ``potential_energy`` (minibatch).

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import SMILE
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(200)
        >>> kernel = SMILE(mlp_regression, 1e-3, precondition=True,
        ...                ensemble_options=dict(max_epochs=20, progress_bar=False))
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=50, num_chains=2, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(8,), subsample_size=32)
        >>> mcmc.get_samples(group_by_chain=True)["w0"].shape
        (2, 50, 1, 8)
    """

    kernel_name = "SMILE"
    state_axes = _STATE_AXES
    nan_advice = "Each such step was reset; start from trained weights (a deep ensemble) or a smaller step_size."

    def __init__(
        self,
        model: Callable,
        step_size: float = 1e-3,
        *,
        precondition: bool = False,
        min_scale: float = MIN_SCALE,
        reset_quantile: float = 0.98,
        adapt_prob: float = 0.1,
        adapt_strength: float = 0.02,
        smoothing: float = 0.01,
        adapt_during_sampling: bool = False,
        L: float | None = None,
        pretrain: bool = True,
        ensemble_options: dict | None = None,
        init_strategy: Callable = init_to_uniform,
    ):
        super().__init__(model, init_strategy)
        if not (isinstance(step_size, (int, float, np.floating)) and step_size > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        if not 0 < reset_quantile <= 1:
            raise ValueError(f"reset_quantile must lie in (0, 1] (1: never reset), got {reset_quantile}.")
        if not 0 <= adapt_prob < 1 or not 0 <= adapt_strength < 1:
            raise ValueError(f"adapt_prob and adapt_strength must lie in [0, 1), got {adapt_prob}, {adapt_strength}.")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must lie in (0, 1], got {smoothing}.")
        if not 0 <= min_scale <= 1:
            raise ValueError(f"min_scale must lie in [0, 1] (0: no floor), got {min_scale}.")
        if L is not None and not L > 0:
            raise ValueError(f"L must be None (no refresh) or positive, got {L}.")
        self.step_size = float(step_size)
        self.precondition = bool(precondition)
        self.min_scale = float(min_scale)
        self.reset_quantile, self.adapt_prob = float(reset_quantile), float(adapt_prob)
        self.adapt_strength, self.smoothing = float(adapt_strength), float(smoothing)
        self.adapt_during_sampling = bool(adapt_during_sampling)
        self.L = None if L is None else float(L)
        self.init_pretraining(pretrain, ensemble_options)
        self._config: SMILEConfig | None = None

    # ------------------------------------------------------------------ NumPyro interface
    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z",)

    def diagnostics_str(self, state: SMILEState) -> str:
        return "step size {:.2e}. resets {}. nans {}".format(
            float(jnp.mean(state.step_size)), int(jnp.sum(state.num_resets)), int(jnp.sum(state.num_nans))
        )

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        tuning = tuner.TunerSettings(self.reset_quantile, self.adapt_prob, self.adapt_strength, self.smoothing)
        self._config = self.config(SMILEConfig, num_warmup=int(num_warmup), tuner=tuning)
        if init_params is None and self.pretrain:
            init_params = self._pretrained(rng_key, model_args, model_kwargs)
        return self._init_independent(rng_key, init_params, model_args, model_kwargs)

    def sample(self, state: SMILEState, model_args, model_kwargs) -> SMILEState:
        draw = self._mb.indices  # one draw of the plates' rows per step, for both gradients
        return self._sample_independent(
            state, model_args, model_kwargs, lambda s, potential, config: smile_step(s, potential, config, draw)
        )

    def run_warnings(self, state: SMILEState) -> list[str]:
        """Non-finite energy errors, a reset rate above 20 %, and step sizes the tuner drove to its
        bounds or more than ``COLLAPSE_FACTOR``-fold below the initial one (from ``mcmc.last_state``)."""
        messages = super().run_warnings(state)
        steps = int(np.max(np.asarray(state.i)))
        step_sizes = np.atleast_1d(np.asarray(state.step_size, np.float64))
        low, high = tuner.STEP_SIZE_MIN, tuner.STEP_SIZE_MAX
        floor = max(1.01 * low, self.step_size / COLLAPSE_FACTOR)
        at_bound = np.flatnonzero((step_sizes <= floor) | (step_sizes >= 0.99 * high))
        if at_bound.size:
            messages.append(
                f"SMILE's step size ended at its bound ({low:g} or {high:g}) or more than {COLLAPSE_FACTOR:g} times "
                f"below the initial {self.step_size:g} in chain(s) {at_bound.tolist()}: those chains either stopped "
                "moving (a chain the minibatches keep resetting: its step size shrinks with every reset) or ran "
                "away, unless the initial step size was far too large; drop them from the draws, or rerun with a "
                "fixed step size (adapt_prob=0) or, for pSMILE, a larger min_scale."
            )
        resets = np.atleast_1d(np.asarray(state.num_resets))
        if steps > 0 and np.any(resets > 0.2 * steps):
            messages.append(
                f"SMILE reset {resets.tolist()} of {steps} steps per chain (more than 20 %): the step size is "
                "probably too large for this posterior; lower step_size or let the tuner shrink it "
                "(adapt_prob > 0, a longer warmup)."
            )
        return messages

    # ------------------------------------------------------------------ internals
    def _pretrained(self, rng_key, model_args, model_kwargs):
        """:meth:`pretrained_members` for these chains (a chain axis when vectorized), or ``None``."""
        keys, batched = self.split_chains(rng_key)
        model_args, model_kwargs = as_jax_args(model_args, model_kwargs)
        trace = model_utils.trace_model(self._model, model_args, model_kwargs, keys[0], self.init_strategy)
        member_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)  # chain k's member depends on its key only
        params = self.pretrained_members(trace, member_keys, model_args, model_kwargs)
        return params if params is None or batched else jax.tree.map(lambda x: x[0], params)

    def _init_state(self, z, energy, grad, key) -> SMILEState:
        flat, _ = ravel_pytree(z)
        if flat.shape[0] < 2:
            raise ValueError("SMILE (isokinetic dynamics) needs at least 2 latent dimensions; use SGLD or NUTS.")
        g = _sanitise(-ravel_pytree(grad)[0])
        dtype = flat.dtype
        ones = jnp.ones_like(flat) if self.precondition else None
        return SMILEState(
            i=jnp.asarray(0, jnp.int32),
            z=z,
            momentum=jnp.zeros_like(flat),
            logdensity=-energy,
            logdensity_grad=g,
            step_size=jnp.asarray(self.step_size, dtype),
            stats=tuner.init_stats(dtype),
            energy_change=jnp.zeros((), dtype),
            reset=jnp.asarray(False),
            num_resets=jnp.asarray(0, jnp.int32),
            num_nans=jnp.asarray(0, jnp.int32),
            grad_mean=ones,
            grad_var=ones,
            rng_key=key,
        )
