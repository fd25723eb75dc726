"""Minibatching through NumPyro's own subsample plates, shared by SGLD, ICSGLD and SMILE.

A model declares its observations in ``numpyro.plate("data", N, subsample_size=n)``. NumPyro
then scales the log-likelihood of the ``n`` rows the plate selects by ``N / n``, so the
potential energy of the model on those rows,

    U~(x) = -log p(x) - (N / n) sum_{i in batch} log p(y_i | x),

is an unbiased estimate of the full-data potential ``U(x)``. This module supplies the rows:
every evaluation of :meth:`MinibatchModel.potential_fn` draws fresh indices (``n`` of ``N``
without replacement, :func:`sample_without_replacement`) for every subsampled plate found in a
trace of the model and substitutes them as the plate's value,

    numpyro.handlers.substitute(model, data={plate_name: indices})

before calling NumPyro's public :func:`numpyro.infer.util.potential_energy`. Nothing here
uses a private NumPyro helper. Models without a subsampled plate get the full-data potential
(and full gradients); the key is then unused.

Postprocessing (unconstrained -> constrained values, deterministic sites included) runs the
model with every subsampled plate bound to ``arange(N)``, so replaying a model with a
deterministic site never needs the plate's random key, and the deterministic values cover all
rows.

Typical use (what the kernels do)::

    mb = MinibatchModel(model, model_args, model_kwargs, kernel_name="SGLD")
    potential = mb.potential_fn(model_args, model_kwargs)      # (params, rng_key) -> U~
    energy, grad = jax.value_and_grad(potential)(params, key)
    rows = mb.indices(key)                                     # SMILE: one draw per step, for
    on_rows = mb.indexed_potential_fn(model_args, model_kwargs) # both gradients: (params, rows) -> U~
    constrained = mb.postprocess_fn(model_args, model_kwargs)(params)
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import potential_energy

from . import _model_utils as model_utils
from ._validation import check_init_params, check_plates

__all__ = ["MinibatchModel", "draw_indices", "sample_without_replacement", "subsampled_plates"]


def subsampled_plates(trace: dict, kernel_name: str = "This kernel") -> tuple[model_utils.PlateInfo, ...]:
    """The plates of ``trace`` that draw a minibatch (``subsample_size < size``), checked.

    :raises ValueError: when a plate asks for more rows than it has.
    """
    out = []
    for info in model_utils.plates(trace).values():
        if info.subsample_size is None or info.subsample_size == info.size:
            continue
        if not 0 < info.subsample_size < info.size:
            raise ValueError(
                f"{kernel_name}: plate {info.name!r} has {info.size} rows but subsample_size="
                f"{info.subsample_size}; the minibatch size must be between 1 and {info.size} "
                "(use subsample_size=None for full batches)."
            )
        out.append(info)
    return tuple(out)


def check_observations_indexed(
    trace: dict, plates: tuple[model_utils.PlateInfo, ...], kernel_name: str = "This kernel"
) -> None:
    """Raise when an observed site in a subsampled plate has more rows along the plate than the minibatch.

    Such a site observes the full data instead of the plate's rows (``obs=y`` rather than
    ``obs=y[idx]``). With ``subsample_size > 1`` NumPyro fails on the shapes; with ``subsample_size=1``
    the full data broadcasts against the plate silently and the whole log-likelihood is scaled by
    ``N``, so this check is what catches it.
    """
    sizes = {plate.name: plate.subsample_size for plate in plates}
    for name, site in trace.items():
        if site["type"] != "sample" or not site.get("is_observed"):
            continue
        for frame in site["cond_indep_stack"]:
            if frame.name not in sizes:
                continue
            try:
                shape = jnp.shape(site["fn"].log_prob(site["value"]))
            except (ValueError, TypeError):  # shapes that do not broadcast: _check_minibatch reports it
                break
            if len(shape) >= -frame.dim and shape[frame.dim] != sizes[frame.name]:
                raise ValueError(
                    f"{kernel_name}: the observed site {name!r} has {shape[frame.dim]} rows along plate "
                    f"{frame.name!r}, whose minibatch has {sizes[frame.name]}: it observes the full data, not the "
                    "plate's rows. " + model_utils.indexing_advice(frame.name, name)
                )


def sample_without_replacement(rng_key, size: int, num: int) -> jax.Array:
    """``num`` distinct indices of ``range(size)``, every subset equally likely.

    On CPU this is Floyd's algorithm: ``num`` draws and an ``O(num^2)`` membership test, no
    ``O(size)`` work. That is about 15 us for 32 of 45,000 rows, where
    ``jax.random.choice(..., replace=False)`` (a full random permutation) takes over 100 ms
    on CPU. Its ``num`` uniform integers are 32 random bits modulo the range, which favours
    some values by a relative ``size / 2**32`` at most (1e-5 for 45,000 rows); this compiles
    much faster than ``jax.random.randint``'s exact method. The indices come in no particular
    (but not a uniformly random) order, which does not matter for a plate, whose
    log-likelihood is a sum. On other backends, where sorting is fast and sequential loops
    are not, ``jax.random.choice`` is used.
    """
    if not 0 < num <= size:
        raise ValueError(f"cannot draw {num} distinct indices out of {size}.")
    if jax.default_backend() != "cpu":
        return jax.random.choice(rng_key, size, (num,), replace=False)
    tops = jnp.arange(size - num, size, dtype=jnp.int32)
    draws = (jax.random.bits(rng_key, (num,), jnp.uint32) % (tops + 1).astype(jnp.uint32)).astype(jnp.int32)

    def body(k, chosen):
        t = draws[k]
        return chosen.at[k].set(jnp.where(jnp.any(chosen == t), tops[k], t))

    return jax.lax.fori_loop(0, num, body, jnp.full((num,), -1, jnp.int32))


def draw_indices(plates: tuple[model_utils.PlateInfo, ...], rng_key) -> dict:
    """Fresh row indices for every plate: ``subsample_size`` of ``size`` without replacement.

    One key per plate, split from ``rng_key`` in the order of ``plates`` (``rng_key`` itself
    when there is one plate)
    (:func:`sample_without_replacement`).
    """
    if not plates:
        return {}
    keys = [rng_key] if len(plates) == 1 else jax.random.split(rng_key, len(plates))
    return {
        info.name: sample_without_replacement(key, info.size, info.subsample_size) for info, key in zip(plates, keys)
    }


def _uniform_radius(init_strategy) -> float | None:
    """The radius of ``init_to_uniform`` / ``init_to_uniform(radius=r)``, else ``None``."""
    if init_strategy is init_to_uniform:
        return 2.0
    if isinstance(init_strategy, partial) and init_strategy.func is init_to_uniform and not init_strategy.args:
        return float(init_strategy.keywords.get("radius", 2.0))
    return None


class MinibatchModel:
    """A NumPyro model prepared for minibatch gradients through its subsample plates.

    :param model: a NumPyro model with continuous latent sites.
    :param model_args: positional arguments of the model (used for one trace).
    :param model_kwargs: keyword arguments of the model.
    :param kernel_name: name used in error messages.
    :param rng_key: key of the trace (prior draws and the plate's indices of that one trace).
    :raises ValueError: for discrete latent sites, or a plate whose ``subsample_size``
        exceeds its size.
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        *,
        kernel_name: str = "This kernel",
        rng_key=None,
    ):
        self.model = model
        self.kernel_name = kernel_name
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        found: dict = {}

        def inspect(key):
            # Traced abstractly (jax.eval_shape): no op is executed or compiled; only static
            # facts (plates, supports, shapes) leave this function.
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=model_utils.SUBSAMPLE_MISMATCH
                )  # reported below, more clearly
                trace = model_utils.trace_model(model, tuple(model_args), model_kwargs, key)
            found["plates"] = subsampled_plates(trace, kernel_name)
            check_observations_indexed(trace, found["plates"], kernel_name)
            model_utils.check_continuous(trace, kernel_name)
            check_plates(trace)  # NumPyro's own model check, as its kernels run it
            found["supports"] = model_utils.data_free_supports(trace)  # None: holds traced values, or data needed
            found["shapes"] = {
                name: tuple(jnp.shape(biject_to(site["fn"].support).inv(site["value"])))
                for name, site in model_utils.latent_sites(trace).items()
            }
            return jnp.zeros(())

        jax.eval_shape(inspect, rng_key)
        self.plates: tuple[model_utils.PlateInfo, ...] = found["plates"]
        #: unconstrained shape of every latent site, in model order
        self.latent_shapes: dict[str, tuple[int, ...]] = found["shapes"]
        #: the latent sites' supports when constraining needs no model arguments (else ``None``)
        self.supports: dict | None = found["supports"]
        if not self.latent_shapes:
            raise ValueError(f"{kernel_name}: the model has no latent sample sites to sample.")
        if self.plates:
            self._check_minibatch(tuple(model_args), model_kwargs, rng_key)

    def _check_minibatch(self, model_args: tuple, model_kwargs: dict, rng_key) -> None:
        """Raise a clear error when the model cannot be evaluated on a minibatch (abstractly: nothing runs)."""
        params = {name: jnp.zeros(shape) for name, shape in self.latent_shapes.items()}
        try:
            jax.eval_shape(self.potential_fn(model_args, model_kwargs), params, rng_key)
        except (ValueError, TypeError, IndexError) as err:
            plate = self.plates[0]
            raise ValueError(
                f"{self.kernel_name}: the model failed on a minibatch of {plate.subsample_size} of the "
                f"{plate.size} rows of plate {plate.name!r} ({type(err).__name__}: {err}). "
                + model_utils.indexing_advice(plate.name)
            ) from err

    @property
    def is_subsampled(self) -> bool:
        """Whether some plate draws a minibatch (else gradients are full-batch)."""
        return bool(self.plates)

    def indices(self, rng_key) -> dict:
        """Fresh indices for every subsampled plate (see :func:`draw_indices`)."""
        return draw_indices(self.plates, rng_key)

    def full_model(self) -> Callable:
        """The model with every subsampled plate bound to all of its rows (scale 1)."""
        return model_utils.bind_plates(self.model, {p.name: jnp.arange(p.size) for p in self.plates})

    def potential_fn(self, model_args: tuple = (), model_kwargs: dict | None = None) -> Callable:
        """``potential(params, rng_key) -> U~(params)`` on a fresh minibatch drawn from ``rng_key``.

        ``params`` are unconstrained values keyed by site. Without subsampled plates this is the
        full-data potential and ``rng_key`` is ignored.
        """
        on_rows, plates = self.indexed_potential_fn(model_args, model_kwargs), self.plates
        return lambda params, rng_key: on_rows(params, draw_indices(plates, rng_key))

    def indexed_potential_fn(self, model_args: tuple = (), model_kwargs: dict | None = None) -> Callable:
        """``potential(params, indices) -> U~(params)`` on given rows: ``indices`` maps each subsampled
        plate's name to its ``subsample_size`` row indices (as :meth:`indices` returns them). Two
        evaluations on one minibatch then draw its indices once."""
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        model = self.model

        def potential(params, indices):
            return potential_energy(model_utils.bind_plates(model, indices), model_args, model_kwargs, params)

        return potential

    def full_potential_fn(self, model_args: tuple = (), model_kwargs: dict | None = None) -> Callable:
        """``potential(params) -> U(params)`` on all rows (exact energy)."""
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        return partial(potential_energy, self.full_model(), model_args, model_kwargs)

    def postprocess_fn(self, model_args: tuple = (), model_kwargs: dict | None = None) -> Callable:
        """``z -> constrained values`` of the latent and deterministic sites (all rows); without the model's
        arguments when it needs none (:func:`~numpyro_mile._model_utils.data_free_supports`)."""
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        return model_utils.constrain_draws(self.full_model(), self.supports, model_args, model_kwargs)

    def init_positions(
        self, keys, model_args: tuple = (), model_kwargs: dict | None = None, init_strategy: Callable = init_to_uniform
    ) -> dict:
        """Unconstrained initial positions, one per key: a dict of arrays with a leading axis ``len(keys)``.

        The first attempt of NumPyro's ``initialize_model``: the full-data model is run under
        ``substitute(seed(model, key), substitute_fn=init_strategy)`` and the latent values are
        mapped to unconstrained space. For ``init_to_uniform`` (the default) the point is drawn
        directly, uniform in ``(-radius, radius)`` in every unconstrained coordinate (the same
        distribution, one random draw instead of two per site). No potential is evaluated and
        nothing is retried, which keeps the kernels' jit-compiled ``init`` small (random-number
        code dominates XLA's compile time on CPU); the kernels check the initial energies instead.
        """
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        radius = _uniform_radius(init_strategy)
        if radius is not None:
            flat, unravel = ravel_pytree({name: jnp.zeros(shape) for name, shape in self.latent_shapes.items()})
            return jax.vmap(lambda key: unravel(jax.random.uniform(key, flat.shape, flat.dtype, -radius, radius)))(keys)
        full = self.full_model()

        def one(key):
            _, subkey = jax.random.split(key)
            seeded = handlers.substitute(handlers.seed(full, subkey), substitute_fn=init_strategy)
            trace = handlers.trace(seeded).get_trace(*model_args, **model_kwargs)
            return {
                name: biject_to(site["fn"].support).inv(site["value"])
                for name, site in model_utils.latent_sites(trace).items()
            }

        return jax.vmap(one)(keys)

    def check_init_params(self, init_params, num_chains: int, batched: bool) -> dict:
        """Validate user ``init_params`` and return them with a leading chain axis."""
        lead = (num_chains,) if batched else ()
        checked = check_init_params(
            init_params,
            self.latent_shapes,
            lead,
            hint="a leading axis of size num_chains, then the site's shape" if batched else "",
        )
        return checked if batched else {name: value[None] for name, value in checked.items()}
