"""Model introspection shared by the kernels and the deep ensemble.

Everything here uses NumPyro's public handlers only (``trace``, ``seed``, ``substitute``), so it
does not break when NumPyro renames its private helpers.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn

#: name of the plate that holds the observations in this package's models
DATA_PLATE = "data"
#: NumPyro's warning when a plate's bound indices differ in number from its ``subsample_size``
SUBSAMPLE_MISMATCH = "subsample_size does not match"


class PlateInfo(NamedTuple):
    """A plate of the model: ``size`` rows, ``subsample_size`` per call (``None``: all)."""

    name: str
    size: int
    subsample_size: int | None


def trace_model(
    model: Callable, model_args: tuple, model_kwargs: dict, rng_key=None, init_strategy: Callable = init_to_uniform
) -> dict:
    """One execution trace of ``model`` for its structure (sites, plates, shapes, supports).

    As NumPyro's own kernels do, no latent site is sampled from its distribution: every latent
    value comes from ``init_strategy`` (default :func:`~numpyro.infer.initialization.init_to_uniform`,
    uniform in ``(-2, 2)`` in unconstrained space), so improper sites (``ImproperUniform``) and
    distributions without a sampler trace as well as any other. A subsampled plate gets its first
    ``subsample_size`` rows rather than a random draw (NumPyro's draw runs a loop that JAX compiles
    again on every eager call). ``rng_key`` seeds the init strategy and anything else the model draws.
    """
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    subsampled: list[PlateInfo] = []

    def substitute_fn(site):
        if site["type"] == "plate":
            if site.get("value") is not None:  # bound by an inner handler (e.g. to all rows)
                return None
            size, subsample_size = site["args"]
            if subsample_size is None or subsample_size >= size:
                return None
            subsampled.append(PlateInfo(site["name"], size, subsample_size))
            return jnp.arange(subsample_size)
        return init_strategy(site)

    seeded = handlers.substitute(handlers.seed(model, rng_key), substitute_fn=substitute_fn)
    try:
        return handlers.trace(seeded).get_trace(*model_args, **model_kwargs)
    except (ValueError, TypeError, IndexError) as err:
        if not subsampled:
            raise
        plate = subsampled[0]  # e.g. obs=y or Normal(X @ w) with all N rows under a plate of n: shapes do not broadcast
        raise ValueError(
            f"The model failed on a minibatch of {plate.subsample_size} of the {plate.size} rows of plate "
            f"{plate.name!r} ({type(err).__name__}: {err}). " + indexing_advice(plate.name)
        ) from err


def indexing_advice(plate_name: str, site_name: str = "obs") -> str:
    """How to write a subsampled plate's observations (the end of every minibatch error)."""
    return (
        f"A subsampled plate must index the data it observes: `with numpyro.plate({plate_name!r}, N, "
        f"subsample_size=n) as idx: numpyro.sample({site_name!r}, d, obs=y[idx])` (or numpyro.subsample(y, "
        "event_dim=0)). Or call the model with subsample_size=None for full-batch gradients."
    )


def latent_sites(trace: dict) -> dict:
    """The unobserved sample sites of a trace, in order."""
    return {
        name: site
        for name, site in trace.items()
        if site["type"] == "sample" and not site["is_observed"] and not site.get("infer", {}).get("is_auxiliary", False)
    }


def observed_sites(trace: dict) -> dict:
    """The observed sample sites of a trace (the data), in order; ``numpyro.factor`` sites are not data."""
    return {
        name: site
        for name, site in trace.items()
        if site["type"] == "sample" and site["is_observed"] and not site.get("infer", {}).get("is_auxiliary")
    }


def unconstrained_shapes(trace: dict) -> dict[str, tuple[int, ...]]:
    """Shape of every latent site in unconstrained space (e.g. ``(K - 1,)`` for a ``Dirichlet`` of size ``K``)."""
    return {
        name: tuple(jnp.shape(biject_to(site["fn"].support).inv(site["value"])))
        for name, site in latent_sites(trace).items()
    }


def plates(trace: dict) -> dict[str, PlateInfo]:
    """The plates of a trace by name."""
    out = {}
    for name, site in trace.items():
        if site["type"] == "plate":
            size, subsample_size = site["args"]
            out[name] = PlateInfo(name, int(size), None if subsample_size is None else int(subsample_size))
    return out


def observation_plate(trace: dict, preferred: str = DATA_PLATE) -> PlateInfo | None:
    """The plate that holds the observations, or ``None``.

    The plate named ``preferred`` when the model has one; otherwise the plate shared by every
    observed sample site, when there is exactly one such plate; otherwise ``None`` (no observed
    site, e.g. a ``numpyro.factor`` target, or observations in no plate or in several;
    ``numpyro.factor`` sites are not observations here).
    """
    found = plates(trace)
    if preferred in found:
        return found[preferred]
    common = None
    for site in observed_sites(trace).values():
        names = {frame.name for frame in site.get("cond_indep_stack", ())}
        common = names if common is None else common & names
    if common is None or len(common) != 1:
        return None
    return found.get(common.pop())


def check_continuous(trace: dict, kernel_name: str) -> None:
    """Raise when the model has discrete latent sites, which gradient-based kernels cannot sample."""
    discrete = [name for name, site in latent_sites(trace).items() if site["fn"].support.is_discrete]
    if discrete:
        raise ValueError(
            f"{kernel_name} samples continuous latent variables only, but the model has discrete latent "
            f"site(s) {discrete}. Marginalise them out (e.g. with numpyro.contrib.funsor's enumeration and "
            "NUTS), or make them observed."
        )


def check_full_batch(trace: dict, kernel_name: str) -> None:
    """Raise when the model subsamples a plate: a full-batch kernel would sample the wrong posterior."""
    for info in plates(trace).values():
        if info.subsample_size is not None and info.subsample_size != info.size:
            raise ValueError(
                f"{kernel_name} is a full-batch kernel, but plate {info.name!r} subsamples "
                f"{info.subsample_size} of {info.size} rows per step, which would make every step use a "
                "different posterior. Call the model with subsample_size=None for "
                f"{kernel_name}, or use numpyro_mile.SGLD / numpyro_mile.ICSGLD for minibatch sampling."
            )


def constrain(trace: dict, unconstrained: dict) -> dict:
    """Map unconstrained latent values to the supports of their sites (no Jacobian)."""
    sites = latent_sites(trace)
    return constrain_to({name: site["fn"].support for name, site in sites.items()}, unconstrained)


def constrain_to(supports: dict, unconstrained: dict) -> dict:
    """Map unconstrained latent values to ``supports`` (site name -> constraint; no Jacobian)."""
    return {name: biject_to(supports[name])(value) for name, value in unconstrained.items()}


def data_free_supports(trace: dict) -> dict | None:
    """The supports of the latent sites of ``trace`` (site name -> constraint) when mapping a position to the
    model's values needs none of its arguments: no deterministic site, and no support holding an array (a
    ``Uniform(0, X.max())`` prior's does). ``None`` otherwise; then ``constrain_fn`` on the model's arguments is
    the way. A collection that needs no data keeps the data out of NumPyro's compiled sampling loop (no
    constants of them in it: a second run on new data of the same shapes finds the loop in JAX's cache)."""
    if any(site["type"] == "deterministic" for site in trace.values()):
        return None
    supports = {name: site["fn"].support for name, site in latent_sites(trace).items()}
    return supports if all(_holds_no_array(c) for c in supports.values()) else None


def constrain_draws(model: Callable, supports: dict | None, model_args: tuple, model_kwargs: dict) -> Callable:
    """``z -> constrained values`` of the latent (and deterministic) sites of ``model``: on ``supports``
    (:func:`data_free_supports`) alone when they are given, so that the model's arguments stay out of the
    program that collects the draws; otherwise NumPyro's ``constrain_fn`` on those arguments."""
    if supports is not None:
        return partial(constrain_to, supports)
    return partial(constrain_fn, model, model_args, model_kwargs, return_deterministic=True)


def _holds_no_array(value, depth: int = 0) -> bool:
    """Whether a constraint (or a value inside one) holds no array or traced value (nested constraints too)."""
    if isinstance(value, (jax.Array, jax.core.Tracer, np.ndarray)):
        return False
    if depth > 4 or not hasattr(value, "__dict__"):
        return True
    return all(_holds_no_array(v, depth + 1) for v in vars(value).values())


def bind_plates(model: Callable, indices: dict) -> Callable:
    """``model`` with each plate named in ``indices`` bound to those row indices (shape ``(n,)`` each).

    NumPyro then scales the plate's sites by ``size / n``: ``arange(size)`` evaluates every row once, a
    minibatch's indices give an unbiased estimate of the full-data terms. NumPyro's warning that ``n``
    differs from the plate's ``subsample_size`` is silenced (intended here). The one place where this
    package binds plates (minibatch kernels, full-data evaluation, prediction, the approximations).
    """
    if not indices:
        return model

    def bound(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=SUBSAMPLE_MISMATCH)
            return handlers.substitute(model, data=indices)(*args, **kwargs)

    return bound


def observed_log_likelihood(
    model: Callable, model_args: tuple, model_kwargs: dict, values: dict, plate_indices: dict | None = None
) -> jax.Array:
    """Scaled log-likelihood of the observed sites given constrained latent ``values``.

    ``plate_indices`` substitutes row indices into plates by name, so a full-batch model is
    evaluated on a minibatch; the plate scales the result by ``size / len(indices)``, which
    makes it an unbiased estimate of the full-data log-likelihood.
    """
    conditioned = bind_plates(
        handlers.substitute(handlers.seed(model, jax.random.PRNGKey(0)), data=values), plate_indices or {}
    )
    trace = handlers.trace(conditioned).get_trace(*model_args, **model_kwargs)
    total = jnp.zeros(())
    for site in trace.values():
        if site["type"] == "sample" and site["is_observed"]:
            log_prob = site["fn"].log_prob(site["value"])
            scale = site.get("scale")
            total = total + (log_prob.sum() if scale is None else scale * log_prob.sum())
    return total
