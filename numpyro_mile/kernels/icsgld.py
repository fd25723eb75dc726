"""ICSGLD: interacting contour stochastic-gradient Langevin dynamics as a NumPyro ensemble kernel.

``P`` chains (NumPyro's ``num_chains``) run SGLD on a *flattened* target and share one
histogram ``theta`` over ``m`` energy bins (Deng, Liang, Lin et al., ICLR 2022; the
single-chain CSGLD of Deng et al., NeurIPS 2020, with ``csgld=True``). The bin of an energy
``u`` is ``J(u) = clip(floor((u - u_min) / du + 1), 1, m - 1)``: bin 0 is never used, bin
``m - 1`` takes every energy from ``u_min + (m - 2) du`` up (the overflow bin). One iteration,
all chains in parallel, each on its own minibatch (``U~``: NumPyro's minibatch potential)::

    mult_p  = 1 + zeta * tau * (log theta[J_p] - log theta[max(J_p - 1, 1)]) / du
              (= 1 in the overflow bin; clipped to ``multiplier_clip``)
    x_p    <- x_p - eps * mult_p * grad U~(x_p) + sqrt(2 eps tau) xi_p
    J_p    <- J(U~(x_p))                         (energy of the new position, fresh minibatch)
    H       = (1/P) sum_p theta[J_p] * (onehot(J_p) - theta)       (ICSGLD's interacting field;
              theta[J_p]^zeta with ``csgld=True``)
    theta  <- theta + omega_k * H
    log_w_p = zeta * log theta[J_p]              (-inf in the overflow bin)

Two details differ in form from a literal reading of the reference notes, and follow the
papers' Algorithm 1: (i) the field is evaluated at the *new* positions ``x_{k+1}`` (CSGLD's
``theta_{k+1} = theta_k + omega H(theta_k, x_{k+1})``), so each collected sample is paired
with its own energy, bin and weight, at one gradient evaluation per chain and step; (ii) the
lowest bin uses ``(J - 1) v 1``, i.e. ``mult = 1`` in bin 1, so the never-visited bin 0 (whose
``theta`` decays to 0) never enters the dynamics. Both leave the fixed point unchanged:
with ICSGLD's field ``theta`` converges to a vector ``∝ (bin mass)^(1/zeta)`` (with CSGLD's to
the bin masses), the density of states is :meth:`ICSGLD.density_of_states`, and posterior
expectations are importance-weighted with ``theta[J]^zeta``
(:func:`numpyro_mile.importance_weights`).

Accuracy: the multiplier interpolates ``theta`` inside each bin, so the fixed point matches the
bin masses up to ``O(bin_width)``; keep bins narrow compared with each mode's energy spread, and
cover every energy the chains will see (energies above the regular bins are not flattened and get
weight 0). The measurements are in ``docs/methods/icsgld.md`` ("Choosing the bins").

The module reads as the other kernels do: :class:`ICSGLDState`, :class:`ICSGLDConfig` (built by ``init``),
the pure :func:`icsgld_init` / :func:`icsgld_step` of all walkers, and the thin :class:`ICSGLD` class.

Walkers on several devices (:func:`numpyro_mile.run_distributed`): the mean in ``H`` runs over
the real walkers (``state.active``; padding copies are masked out) and becomes one cross-device
all-reduce of the ``m`` bin values per step; positions and gradients never leave their device.

With ``zeta = 0`` the multiplier is exactly 1 and the chains are SGLD's: the same key use
(:func:`numpyro_mile.kernels._langevin.sgld_transition`), so ``ICSGLD(zeta=0)`` reproduces
:class:`~numpyro_mile.SGLD` bit for bit with the same keys.

Importance weights (:func:`importance_weights`): a posterior expectation is the weighted average
``E[f] ≈ sum_k w_k f(x_k) / sum_k w_k`` with ``w_k = theta[J(x_k)]^zeta``; the weights are
normalised and aligned with ``mcmc.get_samples()`` (chains concatenated, the order of NumPyro's
flattened samples), so they plug into the ``weights=`` argument of :mod:`numpyro_mile.metrics`::

    w = importance_weights(mcmc)                        # (P * draws,)
    mean = np.einsum("s,s...->...", w, mcmc.get_samples()["w0"])
    metrics.lppd(log_lik, weights=w)
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.initialization import init_to_uniform
from numpyro.util import is_prng_key

from ._langevin import sgld_transition
from ._minibatch_kernel import MinibatchKernel

__all__ = [
    "ICSGLD",
    "ICSGLDConfig",
    "ICSGLDState",
    "default_sa_schedule",
    "energy_bins",
    "gradient_multiplier",
    "icsgld_init",
    "icsgld_step",
    "importance_weights",
    "log_weight",
]


class _ICSGLDFields(NamedTuple):
    i: jax.Array
    z: dict
    potential_energy: jax.Array
    z_grad: dict
    bin: jax.Array
    log_weight: jax.Array
    multiplier: jax.Array
    num_nans: jax.Array
    active: jax.Array
    theta: jax.Array
    energy_min: jax.Array
    energy_max: jax.Array
    rng_key: jax.Array
    data: tuple | None = None


class ICSGLDState(_ICSGLDFields):
    """State of an ICSGLD ensemble of ``P`` chains.

    Per chain (leading axis ``P``; collectable as extra fields):

    :ivar z: unconstrained positions (NumPyro's ``sample_field``).
    :ivar potential_energy: minibatch energy ``U~`` of each position.
    :ivar z_grad: its gradient.
    :ivar bin: energy bin ``J`` of each position.
    :ivar log_weight: ``zeta * log theta[J]`` with the ``theta`` of that iteration (``-inf`` in
        the overflow bin): the chain's log importance weight.
    :ivar multiplier: gradient multiplier of the step that produced ``z``.
    :ivar num_nans: steps rejected (NaN/inf energy, gradient or position; the chain stayed).
    :ivar active: whether the walker is real (``True``) or a padding copy that keeps out of the
        histogram update and the energy range (walker axes padded for sharding,
        :func:`numpyro_mile.run_distributed`).
    :ivar rng_key: one PRNG key per chain.

    Shared (no chain axis; read them from ``mcmc.last_state``):

    :ivar i: iteration counter.
    :ivar theta: the histogram ``theta``, shape ``(m,)``, summing to 1.
    :ivar energy_min: lowest finite energy seen (all chains, all iterations).
    :ivar energy_max: highest finite energy seen.
    :ivar data: the model's array arguments (no chain axis), carried so that they are arguments of the
        compiled sampling loop (:meth:`~numpyro_mile.kernels._base.ChainKernel.model_data`); ``None`` inside a step.

    NumPyro's MCMC resumes an ensemble (``post_warmup_state``, or ``warmup`` then ``run``) by
    replacing ``rng_key`` with a single key; ``_replace`` then splits it into ``P`` chain keys.
    """

    __slots__ = ()

    def _replace(self, **kwargs):
        key = kwargs.get("rng_key")
        if key is not None and is_prng_key(key) and not is_prng_key(self.rng_key):
            kwargs["rng_key"] = jax.random.split(key, jnp.shape(self.potential_energy)[0])
        return super()._replace(**kwargs)


def default_sa_schedule(k):
    """``omega_k = 1 / (k^0.6 + 100)``: the SA step size of the ICSGLD reference simulation (``k >= 1``)."""
    return 1.0 / (k**0.6 + 100.0)


def _constant_sa_step(value: float, k):
    return value


def _as_sa_schedule(sa_schedule) -> Callable:
    if sa_schedule is None:
        return default_sa_schedule
    if callable(sa_schedule):
        return sa_schedule
    if isinstance(sa_schedule, (int, float, np.floating)) and 0 < sa_schedule < 1:
        return functools.partial(_constant_sa_step, float(sa_schedule))  # fingerprints show the value
    raise ValueError(
        f"sa_schedule must be None (1 / (k^0.6 + 100)), a constant in (0, 1) or a callable k -> omega_k, "
        f"got {sa_schedule!r}."
    )


def _as_clip(multiplier_clip):
    if multiplier_clip is None:
        return None
    if isinstance(multiplier_clip, (int, float, np.floating)):
        if not multiplier_clip > 0:
            raise ValueError(f"multiplier_clip must be positive, got {multiplier_clip}.")
        return (-float(multiplier_clip), float(multiplier_clip))
    lo, hi = multiplier_clip
    if not lo < hi:
        raise ValueError(f"multiplier_clip=(low, high) needs low < high, got {multiplier_clip}.")
    return (float(lo), float(hi))


def _bins_message(low, high, u_min, u_max, iteration) -> str | None:
    """The warning for energies seen outside the regular bins, or ``None``."""
    if low < u_min or high >= u_max:
        return (
            f"ICSGLD: energies seen up to iteration {int(iteration)} span [{float(low):.4g}, {float(high):.4g}], "
            f"but the regular bins cover [{u_min:.4g}, {u_max:.4g}). Energies below min_energy fall into bin 1 "
            "and energies above into the overflow bin, which gets importance weight 0. Choose min_energy below "
            "the lowest energy and num_bins * bin_width wide enough (see kernel.energy_range(state))."
        )
    return None


class ICSGLDConfig(NamedTuple):
    """Settings of one ICSGLD run (fixed when ``init`` runs; see :class:`ICSGLD` for their meaning).

    :ivar num_active_chains: real walkers when the walker axis is padded for sharding (the first ones);
        ``None``: all.
    """

    step_size: float
    zeta: float
    num_bins: int
    bin_width: float
    min_energy: float
    sa_schedule: Callable
    temperature: float
    multiplier_clip: tuple[float, float] | None
    csgld: bool
    num_active_chains: int | None = None


def energy_bins(energy, config: ICSGLDConfig) -> jax.Array:
    """Bin ``J(u) = clip(floor((u - u_min) / du + 1), 1, m - 1)`` of each energy (non-finite: the overflow bin)."""
    m = config.num_bins
    scaled = jnp.floor((energy - config.min_energy) / config.bin_width + 1)
    return jnp.clip(jnp.where(jnp.isfinite(energy), scaled, m - 1), 1, m - 1).astype(jnp.int32)


def log_weight(log_theta, bins, config: ICSGLDConfig) -> jax.Array:
    """Log importance weight ``zeta * log theta[J]`` of each bin (``-inf`` in the overflow bin)."""
    log_w = config.zeta * log_theta[bins]
    return jnp.where(bins == config.num_bins - 1, -jnp.inf, log_w)


def gradient_multiplier(log_theta, bins, config: ICSGLDConfig) -> jax.Array:
    """The flattening multiplier of each walker's gradient (1 in the overflow bin; clipped when asked)."""
    lower = jnp.maximum(bins - 1, 1)
    mult = 1 + config.zeta * config.temperature * (log_theta[bins] - log_theta[lower]) / config.bin_width
    mult = jnp.where(bins == config.num_bins - 1, 1.0, mult)
    if config.multiplier_clip is not None:
        mult = jnp.clip(mult, *config.multiplier_clip)
    return mult


def icsgld_init(z, energy, grad, keys, config: ICSGLDConfig) -> ICSGLDState:
    """The ensemble's initial state from the walkers' positions ``z``, energies, gradients and keys (a leading
    walker axis each): ``theta`` decreasing linearly over the bins, the first ``num_active_chains`` walkers active."""
    m, dtype = config.num_bins, energy.dtype
    theta = jnp.arange(m, 0, -1, dtype=dtype)
    theta = theta / theta.sum()
    J = energy_bins(energy, config)
    finite = jnp.isfinite(energy)
    if config.num_active_chains is None:
        active = jnp.ones(energy.shape, bool)
    else:  # jit: the mask is laid out like the (sharded) walkers
        num_active = int(config.num_active_chains)
        active = jax.jit(lambda e: jnp.arange(e.shape[0]) < num_active)(energy)
    return ICSGLDState(
        i=jnp.asarray(0, jnp.int32),
        z=z,
        potential_energy=energy,
        z_grad=grad,
        bin=J,
        log_weight=log_weight(jnp.log(theta), J, config),
        multiplier=jnp.ones_like(energy),
        num_nans=jnp.zeros(energy.shape, jnp.int32),
        active=active,
        theta=theta,
        energy_min=jnp.min(jnp.where(finite, energy, jnp.inf)),
        energy_max=jnp.max(jnp.where(finite, energy, -jnp.inf)),
        rng_key=keys,
    )


def icsgld_step(
    state: ICSGLDState, potential: Callable, config: ICSGLDConfig, draw_minibatch: Callable | None = None
) -> ICSGLDState:
    """One ICSGLD iteration of all walkers (the module docstring's algorithm); ``potential(z, minibatch)`` is the
    minibatch potential energy of one walker on ``minibatch = draw_minibatch(key)`` (``None``: the key itself)."""
    theta = state.theta
    log_theta = jnp.log(theta)
    mult = gradient_multiplier(log_theta, state.bin, config)
    dtype = state.potential_energy.dtype
    step_size = jnp.asarray(config.step_size, dtype)

    def chain(z, energy, grad, rng_key, multiplier):
        return sgld_transition(
            rng_key,
            z,
            energy,
            grad,
            potential,
            step_size,
            config.temperature,
            multiplier,
            draw_minibatch=draw_minibatch,
        )

    keys, z, energy, grad, ok = jax.vmap(chain)(state.z, state.potential_energy, state.z_grad, state.rng_key, mult)
    J = energy_bins(energy, config)
    weight = theta[J] if not config.csgld else jnp.exp(config.zeta * log_theta[J])
    onehot = jax.nn.one_hot(J, config.num_bins, dtype=dtype)
    # mean over the real walkers; with the walker axis sharded over devices this is one all-reduce of
    # m numbers (and one of a count), never of positions
    active = state.active.astype(dtype)
    H = jnp.sum(active[:, None] * weight[:, None] * (onehot - theta[None, :]), axis=0) / jnp.sum(active)
    omega = jnp.asarray(config.sa_schedule(state.i + 1), dtype)
    theta_new = theta + omega * H
    finite = jnp.isfinite(energy) & state.active
    return ICSGLDState(
        i=state.i + 1,
        z=z,
        potential_energy=energy,
        z_grad=grad,
        bin=J,
        log_weight=log_weight(jnp.log(theta_new), J, config),
        multiplier=mult,
        num_nans=state.num_nans + jnp.where(ok, 0, 1),
        active=state.active,
        theta=theta_new,
        energy_min=jnp.minimum(state.energy_min, jnp.min(jnp.where(finite, energy, jnp.inf))),
        energy_max=jnp.maximum(state.energy_max, jnp.max(jnp.where(finite, energy, -jnp.inf))),
        rng_key=keys,
    )


class ICSGLD(MinibatchKernel):
    """Interacting contour SGLD: ``P`` interacting chains sharing one energy histogram.

    An ensemble kernel (like NumPyro's AIES/ESS): run it with ``chain_method="vectorized"`` and
    ``num_chains = P >= 2``; every collected field has a leading chain axis, so
    ``mcmc.get_samples(group_by_chain=True)`` has shape ``(P, draws, ...)``. Samples are from
    the flattened target: weight them with :func:`numpyro_mile.importance_weights` (aligned
    with ``mcmc.get_samples()``). The algorithm is in the module docstring.

    :param model: a NumPyro model with continuous latent sites; minibatches come from a plate
        with ``subsample_size`` (see :class:`~numpyro_mile.SGLD`), else energies are exact.
    :param step_size: SGLD step size ``eps`` (constant).
    :param zeta: flattening strength (``0``: plain SGLD). Deep nets use large values (1e4 and
        more) with a wide ``bin_width``; weights are kept in log space.
    :param num_bins: ``m``; bins ``1 .. m-2`` cover ``[min_energy, min_energy + (m-2) bin_width)``,
        bin ``m-1`` everything above (multiplier 1, weight 0), bin 0 is unused.
    :param bin_width: ``du``.
    :param min_energy: ``u_min``, below every energy the chains will see.
    :param sa_schedule: SA step size ``omega_k`` (``k = 1, 2, ...``): ``None`` for
        ``1 / (k^0.6 + 100)``, a constant (0.003-0.03 in the reference deep-learning runs), or a
        callable ``k -> omega_k``.
    :param temperature: ``tau``.
    :param multiplier_clip: ``None``, ``c`` for ``[-c, c]`` (deep nets used 5), or ``(low, high)``.
    :param csgld: use CSGLD's field ``theta[J]^zeta (onehot(J) - theta)`` (averaged over the
        chains) instead of ICSGLD's ``theta[J] (onehot(J) - theta)``.
    :param init_strategy: NumPyro init strategy when no ``init_params`` are given.
    :param num_active_chains: the walkers that take part (the first ones), when the walker axis is padded to
        fill devices; the others move but enter no shared statistic. ``None``: all.
        :func:`numpyro_mile.run_distributed` sets it on a copy of the kernel
        (:meth:`~numpyro_mile.kernels._base.ChainKernel.replace`) when it pads.

    Extra fields (per chain): ``potential_energy``, ``bin``, ``log_weight``, ``multiplier``,
    ``num_nans``; ``bin`` and ``log_weight`` are always collected.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro.infer import MCMC
        >>> from numpyro_mile import ICSGLD, importance_weights
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> kernel = ICSGLD(mlp_regression, 1e-4, zeta=1.0, num_bins=100, bin_width=100.0, min_energy=-500.0)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=50, num_chains=4,
        ...             chain_method="vectorized", progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(8,), subsample_size=20)
        >>> mcmc.get_samples(group_by_chain=True)["w0"].shape
        (4, 50, 1, 8)
        >>> importance_weights(mcmc).shape
        (200,)
    """

    kernel_name = "ICSGLD"

    def __init__(
        self,
        model: Callable,
        step_size: float,
        *,
        zeta: float,
        num_bins: int,
        bin_width: float,
        min_energy: float,
        sa_schedule=None,
        temperature: float = 1.0,
        multiplier_clip=None,
        csgld: bool = False,
        init_strategy: Callable = init_to_uniform,
        num_active_chains: int | None = None,
    ):
        super().__init__(model, init_strategy)
        if not (isinstance(step_size, (int, float, np.floating)) and step_size > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        if not zeta >= 0:
            raise ValueError(f"zeta must be >= 0, got {zeta}.")
        if int(num_bins) != num_bins or num_bins < 3:
            raise ValueError(f"num_bins must be an integer >= 3 (bin 0 unused, bin m-1 overflow), got {num_bins}.")
        if not bin_width > 0:
            raise ValueError(f"bin_width must be positive, got {bin_width}.")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}.")
        self.step_size = float(step_size)
        self.zeta = float(zeta)
        self.num_bins = int(num_bins)
        self.bin_width = float(bin_width)
        self.min_energy = float(min_energy)
        self.sa_schedule = _as_sa_schedule(sa_schedule)
        self.temperature = float(temperature)
        self.multiplier_clip = _as_clip(multiplier_clip)
        self.csgld = bool(csgld)
        if num_active_chains is not None and not (int(num_active_chains) == num_active_chains >= 2):
            raise ValueError(f"num_active_chains must be None or an integer >= 2, got {num_active_chains}.")
        self.num_active_chains = None if num_active_chains is None else int(num_active_chains)

    # ------------------------------------------------------------------ NumPyro interface
    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z", "bin", "log_weight")

    @property
    def is_ensemble_kernel(self) -> bool:
        return True

    @property
    def max_energy(self) -> float:
        """Upper end of the regular bins, ``min_energy + (num_bins - 2) * bin_width``."""
        return self.min_energy + (self.num_bins - 2) * self.bin_width

    def diagnostics_str(self, state: ICSGLDState) -> str:
        return "U~ {:.4g}. bins {}-{}. nans {}".format(
            float(jnp.mean(state.potential_energy)),
            int(jnp.min(state.bin)),
            int(jnp.max(state.bin)),
            int(jnp.sum(state.num_nans)),
        )

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        if is_prng_key(rng_key) or jnp.shape(rng_key)[0] < 2:
            raise ValueError(
                "ICSGLD is an ensemble kernel: its chains share one energy histogram, so they must run together. "
                "Use MCMC(..., num_chains=P, chain_method='vectorized') with P >= 2 "
                "(sequential and parallel chains cannot interact)."
            )
        self._config = config = self.config(ICSGLDConfig)
        keys = self.start_run(rng_key)  # vectorized: one key per walker
        state = self._init_chains(
            keys,
            init_params,
            model_args,
            model_kwargs,
            lambda z, energy, grad, keys: icsgld_init(z, energy, grad, keys, config),
        )
        return self.finish_init(state)

    def sample(self, state: ICSGLDState, model_args, model_kwargs) -> ICSGLDState:
        config, draw = self._config, self._mb.indices
        return self._step_on_data(
            state, model_args, model_kwargs, lambda s, potential: icsgld_step(s, potential, config, draw)
        )

    def run_warnings(self, state: ICSGLDState) -> list[str]:
        """Rejected steps, and energies seen outside the regular bins (from ``mcmc.last_state``)."""
        bins = _bins_message(
            float(state.energy_min), float(state.energy_max), self.min_energy, self.max_energy, state.i
        )
        return super().run_warnings(state) + ([] if bins is None else [bins])

    # ------------------------------------------------------------------ results
    weight_fields = ("bin",)
    weights_note = (
        "importance_weight: normalised ICSGLD importance weights theta[J]^zeta of the draws (theta: the "
        "energy histogram at the end of the run, J: the draw's energy bin; 0 in the overflow bin), summing to 1 "
        "over all chains and draws. The draws target a flattened distribution: unweighted ESS, R-hat, LOO and "
        "means describe that distribution, not the posterior; weight posterior expectations with importance_weight."
    )

    def sample_weights(self, mcmc) -> np.ndarray:
        """:func:`importance_weights` of ``mcmc`` with the final histogram, shape ``(chains, draws)``."""
        if getattr(mcmc.last_state, "theta", None) is None:
            raise ValueError("mcmc.last_state holds no histogram (theta); convert the MCMC object after its run.")
        return importance_weights(mcmc, group_by_chain=True)

    def density_of_states(self, state: ICSGLDState) -> np.ndarray:
        """Estimated probability mass of each energy bin, shape ``(num_bins,)``, summing to 1.

        ``theta^zeta / sum theta^zeta`` (ICSGLD) or ``theta / sum theta`` (``csgld=True``) over
        bins ``1 .. m-1``; entry 0 (the unused bin) is 0, entry ``m-1`` is the mass above
        :attr:`max_energy`. Warns when the energies seen left the regular bins.
        """
        self._check_range(state)
        log_theta = np.log(np.asarray(state.theta, np.float64))
        log_dos = log_theta if self.csgld else self.zeta * log_theta
        out = np.zeros(self.num_bins)
        out[1:] = np.exp(log_dos[1:] - log_dos[1:].max())
        return out / out.sum()

    def log_weights(self, state: ICSGLDState, bins) -> np.ndarray:
        """Log importance weights ``zeta * log theta[J]`` of samples in ``bins`` under ``state.theta``
        (``-inf`` in the overflow bin)."""
        bins = np.asarray(bins)
        log_w = self.zeta * np.log(np.asarray(state.theta, np.float64))[bins]
        return np.where(bins == self.num_bins - 1, -np.inf, log_w)

    def energy_range(self, state: ICSGLDState) -> tuple[float, float]:
        """``(lowest, highest)`` finite energy the chains have seen."""
        return float(state.energy_min), float(state.energy_max)

    def _check_range(self, state: ICSGLDState) -> None:
        message = _bins_message(
            float(state.energy_min), float(state.energy_max), self.min_energy, self.max_energy, state.i
        )
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def importance_weights(mcmc, *, final_theta: bool = True, group_by_chain: bool = False) -> np.ndarray:
    """Normalised importance weights of the samples of an ICSGLD run.

    :param mcmc: a ``numpyro.infer.MCMC`` that ran :class:`~numpyro_mile.ICSGLD`.
    :param final_theta: weight every sample with the histogram at the end of the run
        (``mcmc.last_state.theta``: the most accurate estimate, the default); ``False`` uses
        the ``log_weight`` recorded when the sample was drawn.
    :param group_by_chain: return shape ``(P, draws)`` (aligned with
        ``get_samples(group_by_chain=True)``) instead of ``(P * draws,)``.
    :returns: non-negative float64 weights summing to 1 (over all chains and draws).
    :raises ValueError: for a run of another kernel, or when every sample has weight 0 (all in
        the overflow bin).
    """
    kernel = mcmc.sampler
    if not hasattr(kernel, "log_weights") or not hasattr(kernel, "density_of_states"):
        raise ValueError(
            f"importance_weights needs an MCMC run of ICSGLD, got a {type(kernel).__name__} kernel; "
            "samples of other kernels are equally weighted."
        )
    fields = mcmc.get_extra_fields(group_by_chain=True)
    state = mcmc.last_state
    if state is None or "bin" not in fields:
        raise ValueError("run the MCMC first (importance_weights reads the collected 'bin' field).")
    kernel._check_range(state)
    if final_theta:
        log_w = kernel.log_weights(state, fields["bin"])
    else:
        log_w = np.asarray(fields["log_weight"], np.float64)
    if not np.isfinite(log_w).any():
        raise ValueError(
            "every sample lies in the overflow bin (importance weight 0): widen the bins "
            "(num_bins * bin_width) or raise min_energy's range to cover the energies seen."
        )
    top = np.max(log_w[np.isfinite(log_w)])
    w = np.where(np.isfinite(log_w), np.exp(log_w - top), 0.0)
    w = w / w.sum()
    ess = 1.0 / np.sum(w**2)
    if ess < 0.01 * w.size:
        warnings.warn(
            f"the importance weights are degenerate: effective sample size {ess:.1f} of {w.size} samples.",
            RuntimeWarning,
            stacklevel=2,
        )
    return w if group_by_chain else w.reshape(-1)
