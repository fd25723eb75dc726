"""Shared pieces of the approximate-posterior baselines: the result type, the model plumbing and
the optimisation loop.

Every method works on the unconstrained latent values of an ordinary NumPyro model whose
observations live in a plate named ``"data"`` (``N`` rows). Minibatches come from the model's own
subsample plate (``subsample_size=n`` in the model's keyword arguments): fresh rows are drawn for
each step with :func:`numpyro_mile.minibatch.draw_indices` and substituted as the plate's value,
so NumPyro scales the minibatch log-likelihood by ``N / n``.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import potential_energy
from numpyro.primitives import Messenger

from .. import _model_utils as model_utils
from .._validation import check_init_params
from ..ensemble import init_member_params
from ..minibatch import MinibatchModel, draw_indices


class ApproxPosterior(NamedTuple):
    """A fitted approximate posterior over the unconstrained latent values of a model.

    One family covers every method of :mod:`numpyro_mile.approx`: coordinate ``i`` of site ``k``
    is drawn as

        ``u = loc + scale * eps``, ``eps ~ N(0, 1)``; then, with probability ``drop_prob[k]``,
        ``u = anchor`` instead (MC-dropout's spike at the prior mean).

    MAP has ``scale = 0`` and no dropout, VI and Laplace a Gaussian ``scale``, MC-dropout
    ``scale = 0`` and a dropout probability per site. :meth:`sample` maps the draws to the
    constrained values of the model's latent sites.

    :ivar method: ``"map"``, ``"vi"``, ``"laplace"`` or ``"mc_dropout"``.
    :ivar loc: dict site -> unconstrained array (the site's shape): the Gaussian mean, or the
        kept component of MC-dropout.
    :ivar scale: dict site -> standard deviations, same shapes (zeros for MAP and MC-dropout).
    :ivar anchor: dict site -> value a dropped coordinate takes (the prior mean), or ``None``.
    :ivar drop_prob: dict site -> dropout probability of its coordinates (0 for sites that are
        never dropped), or ``None``.
    :ivar constrain: maps a dict of unconstrained values to the constrained latent values.
    :ivar info: method-specific diagnostics: ``losses`` (per-step objective, per datum),
        ``seconds`` and ``cpu_seconds`` of the fit, and for Laplace ``fisher``,
        ``prior_precision`` and ``precision`` (dicts like ``loc``).
    """

    method: str
    loc: dict
    scale: dict
    anchor: dict | None
    drop_prob: dict | None
    constrain: Callable
    info: dict

    def mean(self) -> dict:
        """Mean of the approximate posterior in unconstrained space, dict site -> array.

        For MC-dropout this is the mixture mean ``(1 - p) loc + p anchor`` (BayesDLL's
        ``nst = 0`` prediction uses ``loc`` itself, the mode of the kept component).
        """
        if self.drop_prob is None:
            return dict(self.loc)
        return {k: (1.0 - self.drop_prob[k]) * self.loc[k] + self.drop_prob[k] * self.anchor[k] for k in self.loc}

    def sample(self, rng_key, nst: int) -> dict:
        """Draw ``nst`` posterior samples of the constrained latent sites.

        :param rng_key: a JAX PRNG key.
        :param nst: number of samples; ``0`` returns the posterior mean (:meth:`mean`) as a single
            sample, so prediction has one path for both cases.
        :return: dict site -> array of shape ``(max(nst, 1), *site_shape)``, usable with
            :func:`numpyro_mile.predict`, :func:`numpyro_mile.log_likelihood` and
            :func:`numpyro_mile.evaluation.predictive_probs`.
        """
        if isinstance(nst, bool) or not isinstance(nst, (int, np.integer)) or nst < 0:
            raise ValueError(f"nst must be a non-negative integer (0 = posterior mean), got {nst!r}.")
        if nst == 0:
            return jax.vmap(self.constrain)(jax.tree.map(lambda x: jnp.asarray(x)[None], self.mean()))
        return jax.vmap(self.constrain)(_draw(rng_key, self.loc, self.scale, self.anchor, self.drop_prob, int(nst)))


def _draw(rng_key, loc: dict, scale: dict, anchor, drop_prob, nst: int) -> dict:
    """``nst`` unconstrained draws, from one random array over the flattened coordinates.

    Only the draws a family needs are made (Gaussian noise when some scale is positive, dropout masks
    when some probability is): on CPU each compiled random-number operation costs about a second of
    compilation, far more than the draws.
    """
    flat_loc, unravel = ravel_pytree(loc)
    flat = jnp.broadcast_to(flat_loc, (nst,) + flat_loc.shape)
    normal_key, mask_key = jax.random.split(rng_key)
    flat_scale = ravel_pytree(scale)[0]
    if bool(jnp.any(flat_scale > 0)):
        flat = flat + flat_scale * jax.random.normal(normal_key, flat.shape, flat.dtype)
    if drop_prob is not None:
        probs = ravel_pytree({k: jnp.full(jnp.shape(loc[k]), drop_prob[k]) for k in loc})[0]
        if bool(jnp.any(probs > 0)):
            dropped = jax.random.uniform(mask_key, flat.shape) < probs
            flat = jnp.where(
                dropped, ravel_pytree({k: jnp.broadcast_to(anchor[k], jnp.shape(loc[k])) for k in loc})[0], flat
            )
    return jax.vmap(unravel)(flat)


class ScaleSites(Messenger):
    """Multiply the log-density scale of observed sample sites by ``observed`` and of latent ones by
    ``latent`` (on top of any plate scale). Used for the data-size-normalised, KL-discounted ELBO
    and for the data-inflated MAP objective."""

    def __init__(self, fn=None, observed: float = 1.0, latent: float = 1.0):
        self.observed, self.latent = float(observed), float(latent)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample":
            return
        factor = self.observed if msg["is_observed"] else self.latent
        msg["scale"] = factor if msg.get("scale") is None else factor * msg["scale"]


def check_positive(name: str, value: float) -> float:
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def check_steps(num_steps: int) -> int:
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
    return int(num_steps)


class Problem:
    """A model with its data, prepared for the approximate methods.

    :param model: a NumPyro model with continuous latent sites and observations in
        ``numpyro.plate(plate_name, N)``.
    :param model_args: positional model arguments (the training data).
    :param model_kwargs: keyword arguments (``subsample_size`` selects minibatches).
    :param method: name used in error messages.
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple,
        model_kwargs: dict,
        method: str,
        plate_name: str = model_utils.DATA_PLATE,
    ):
        self.model, self.args, self.kwargs, self.method = model, tuple(model_args), dict(model_kwargs), method
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=model_utils.SUBSAMPLE_MISMATCH)
            self.trace = model_utils.trace_model(model, self.args, self.kwargs)
        plate = model_utils.plates(self.trace).get(plate_name)
        if plate is None:
            raise ValueError(
                f"{method} needs the observations in a plate named {plate_name!r} "
                f"(`with numpyro.plate({plate_name!r}, N): ...`) to know the data size N; the model has none."
            )
        model_utils.check_continuous(self.trace, method)
        self.plate_name = plate_name
        self.num_data = plate.size
        self.minibatch = MinibatchModel(model, self.args, self.kwargs, kernel_name=method)
        self.sites = model_utils.latent_sites(self.trace)
        if not self.sites:
            raise ValueError(f"{method}: the model has no latent sample sites.")
        self.transforms = {name: biject_to(site["fn"].support) for name, site in self.sites.items()}
        self.full_model = self.minibatch.full_model()

    # -- values -----------------------------------------------------------------------------
    def constrain(self, unconstrained: dict) -> dict:
        """Unconstrained -> constrained latent values (no Jacobian)."""
        return {name: self.transforms[name](value) for name, value in unconstrained.items()}

    def unconstrain(self, constrained: dict) -> dict:
        return {name: self.transforms[name].inv(jnp.asarray(value)) for name, value in constrained.items()}

    def prior_mean(self) -> dict:
        """Unconstrained image of each site's prior mean (the ``prior_mean`` of the models)."""
        out = {}
        for name, site in self.sites.items():
            mean = jnp.broadcast_to(site["fn"].mean, jnp.shape(site["value"]))
            out[name] = self.transforms[name].inv(mean)
        return out

    def init_params(self, rng_key, init_params: dict | None) -> dict:
        """User ``init_params`` (unconstrained, checked) or a LeCun-normal start as in the deep ensemble."""
        if init_params is None:
            return init_member_params(rng_key, self.trace)
        return check_init_params(
            init_params,
            self.minibatch.latent_shapes,
            dtype=jnp.result_type(float),
            hint="one member: index a deep ensemble's init_params, e.g. {k: v[0] for k, v in ...}",
        )

    # -- densities --------------------------------------------------------------------------
    def log_likelihood(self, unconstrained: dict, rng_key) -> jax.Array:
        """Log-likelihood of all observed sites, on a fresh minibatch when the plate subsamples
        (scaled by ``N / n``: an unbiased estimate of the full-data value)."""
        indices = draw_indices(self.minibatch.plates, rng_key)
        return model_utils.observed_log_likelihood(
            self.model, self.args, self.kwargs, self.constrain(unconstrained), indices or None
        )

    def row_log_likelihood(self, unconstrained: dict, index) -> jax.Array:
        """``log p(y_i | theta)`` of the single row ``index`` (an integer scalar)."""
        scaled = model_utils.observed_log_likelihood(
            self.model,
            self.args,
            self.kwargs,
            self.constrain(unconstrained),
            {self.plate_name: jnp.reshape(index, (1,))},
        )
        return scaled / self.num_data  # the plate scales one row by N

    def prior_potential(self, unconstrained: dict) -> jax.Array:
        """``-log p(theta)`` in unconstrained space (Jacobian included), observations left out."""
        prior_only = handlers.block(self.full_model, hide_fn=lambda site: site.get("is_observed", False))
        return potential_energy(prior_only, self.args, self.kwargs, unconstrained)

    def site_log_priors(self, constrained: dict) -> dict:
        """``log p(theta_k)`` of every latent site ``k`` at constrained values (summed over the site)."""
        conditioned = handlers.substitute(handlers.seed(self.full_model, jax.random.PRNGKey(0)), data=constrained)
        trace = handlers.trace(conditioned).get_trace(*self.args, **self.kwargs)
        return {name: jnp.sum(trace[name]["fn"].log_prob(trace[name]["value"])) for name in self.sites}


def optimize(
    loss_fn: Callable, params: dict, optimizer: optax.GradientTransformation, num_steps: int, rng_key
) -> tuple[dict, np.ndarray, float, float]:
    """Minimise ``loss_fn(params, key)`` with ``optimizer`` for ``num_steps`` steps (one jit-compiled scan).

    :return: ``(params, losses, wall seconds, CPU seconds)``; ``losses`` has shape ``(num_steps,)``.
    """
    wall, cpu = time.perf_counter(), time.process_time()

    @jax.jit
    def run(params, keys):
        def step(carry, key):
            p, state = carry
            loss, grads = jax.value_and_grad(loss_fn)(p, key)
            updates, state = optimizer.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), loss

        (p, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), keys)
        return p, losses

    params, losses = run(params, jax.random.split(rng_key, num_steps))
    losses = np.asarray(losses)
    return params, losses, time.perf_counter() - wall, time.process_time() - cpu
