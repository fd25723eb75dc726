"""Memory-bounded posterior prediction: the posterior predictive and pointwise log-likelihood
streamed over chunks of posterior samples.

``numpyro.infer.Predictive`` returns an ``(S, ...)`` array per site for all ``S`` posterior
samples at once (``S x N`` floats per per-observation site), and with ``parallel=True`` it
also holds every intermediate of the network for all samples at once (``S x N x width``).
:func:`predict` and :func:`log_likelihood` run the same computation on ``batch_size``
samples at a time:

* the work per chunk is one jit-compiled function; the last chunk is padded to
  ``batch_size`` (and the padding dropped), so there is exactly one compilation;
* with ``reduce="moments"`` only running means and variances are kept, so memory is
  ``O(batch_size x N)`` whatever ``S``; without ``reduce`` the ``(S, ...)`` outputs are
  filled in place on the host;
* draws equal ``Predictive(model, samples)(rng_key, ...)`` exactly: sample ``s`` gets the
  key ``jax.random.split(rng_key, S)[s]``, as in ``Predictive``;
* a model with a subsampled plate (``numpyro.plate(..., subsample_size=m)``) is evaluated on
  the whole plate: the plate's indices are substituted by ``arange(size)``, so predictions
  and log-likelihoods cover every observation rather than a random minibatch.

Typical use with a model of :mod:`numpyro_mile.models`, whose outputs (``mu``/``sigma`` or
``logits``) are deterministic sites recorded when ``y is None``::

    samples = mcmc.get_samples()                       # dict site -> (S, ...)
    out = predict(mlp_regression, samples, X_test, hidden=(16, 16))
    out["mu"].shape                                    # (S, N_test)
    moments = predict(mlp_regression, samples, X_test, reduce="moments")
    moments["mu"].mean, moments["mu"].var              # (N_test,), (N_test,)
    ll = log_likelihood(mlp_regression, samples, X_test, y_test)["y"]   # (S, N_test)
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import Predictive
from numpyro.infer.util import log_likelihood as _numpyro_log_likelihood

from . import _model_utils as model_utils
from . import _programs
from ._moments import Moments, merge_moments

__all__ = ["Moments", "full_plate_model", "log_likelihood", "predict"]

_REDUCTIONS = (None, "moments")


def _on_trace() -> None:
    """Called each time a chunk function is traced (compiled); a hook for tests."""


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _split_dynamic(args: tuple, kwargs: dict):
    """Array arguments (traced by jit) apart from the others (static): ``(dynamic, rebuild, static_key)`` where
    ``rebuild(dynamic)`` gives back ``(args, kwargs)`` and ``static_key`` describes everything but the arrays (see
    :func:`numpyro_mile._programs.split_data`)."""
    split = _programs.split_data(args, kwargs)
    return split.arrays, lambda dynamic: _programs.join_data(split.key, dynamic), split.key


def full_plate_model(model: Callable, model_args: tuple = (), model_kwargs: dict | None = None) -> Callable:
    """``model`` with every subsampled plate evaluated on all of its rows.

    Traces ``model(*model_args, **model_kwargs)`` once (latent values from ``init_to_uniform``)
    and, when a plate has ``subsample_size`` smaller than its size, substitutes the indices
    ``arange(size)`` for that plate. NumPyro then sets the plate's scale to 1, so the
    log-likelihood and the outputs cover every observation exactly once. Models without a
    subsampled plate are returned unchanged.

    :param model: a NumPyro model.
    :param model_args: positional arguments of the model (the data to evaluate on).
    :param model_kwargs: keyword arguments of the model.
    :returns: a model with the same signature.
    """
    return _full_plate(model, model_args, model_kwargs)[0]


def _full_plate(model: Callable, model_args: tuple, model_kwargs: dict | None) -> tuple[Callable, dict]:
    """:func:`full_plate_model` and the trace of the original model used to decide."""
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    trace = model_utils.trace_model(model, model_args, model_kwargs)
    sizes = {
        info.name: info.size
        for info in model_utils.plates(trace).values()
        if info.subsample_size is not None and info.subsample_size != info.size
    }
    if not sizes:
        return model, trace

    def build():
        wrapped = model_utils.bind_plates(model, {name: jnp.arange(size) for name, size in sizes.items()})
        wrapped.__name__ = getattr(model, "__name__", "model") + "_full_plates"
        wrapped.__wrapped__ = model
        return wrapped

    # one wrapper per model and plate sizes, so that predictions with it reuse their compiled program
    return _programs.program(("full_plates", model, tuple(sorted(sizes.items()))), build), trace


def _flatten_samples(samples: Mapping, chain_axis: bool) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """Host arrays of shape ``(S, ...)`` and the batch shape ``(S,)`` or ``(C, D)``."""
    if not isinstance(samples, Mapping) or len(samples) == 0:
        raise ValueError(
            "samples must be a non-empty dict site -> array, e.g. mcmc.get_samples(); got "
            f"{type(samples).__name__}{' (empty)' if isinstance(samples, Mapping) else ''}."
        )
    ndims = 2 if chain_axis else 1
    flat, batch_shape, first = {}, None, None
    for name, value in samples.items():
        try:
            arr = np.asarray(value)
        except Exception as err:  # a tracer
            raise ValueError(f"samples[{name!r}] must be a concrete array, not a traced value.") from err
        if arr.ndim < ndims:
            layout = "(chains, draws, ...)" if chain_axis else "(S, ...)"
            raise ValueError(f"samples[{name!r}] must have shape {layout}, got {arr.shape}.")
        shape = arr.shape[:ndims]
        if batch_shape is None:
            batch_shape, first = shape, name
        elif shape != batch_shape:
            what = "chains and draws" if chain_axis else "samples (leading axis)"
            raise ValueError(
                f"samples[{name!r}] and samples[{first!r}] have different numbers of {what}: {shape} vs {batch_shape}."
            )
        flat[name] = arr.reshape((-1,) + arr.shape[ndims:])
    if math.prod(batch_shape) == 0:
        raise ValueError(f"samples hold no draws (batch shape {batch_shape}).")
    return flat, batch_shape


def _check_batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    return int(batch_size)


def _sample_keys(rng_key, num_samples: int) -> np.ndarray:
    """Per-sample raw keys ``(S, *key_shape)`` exactly as ``Predictive`` derives them."""
    if rng_key is None:
        rng_key = jax.random.PRNGKey(0)
    keys = jax.random.split(rng_key, num_samples) if num_samples > 1 else rng_key[None]
    if _is_typed_key(keys):
        keys = jax.random.key_data(keys)
    return np.asarray(keys)


def _is_typed_key(x) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _pad(arr: np.ndarray, size: int) -> np.ndarray:
    """Pad the leading axis to ``size`` by repeating the last row (valid, finite inputs)."""
    missing = size - arr.shape[0]
    if missing == 0:
        return arr
    return np.concatenate([arr, np.repeat(arr[-1:], missing, axis=0)], axis=0)


def _chunk_moments(values: jax.Array, num_valid: jax.Array):
    """Mean and sum of squared deviations over the first ``num_valid`` rows of a chunk."""
    x = values.astype(jnp.result_type(values.dtype, jnp.float32))
    mask = (jnp.arange(x.shape[0]) < num_valid).reshape((-1,) + (1,) * (x.ndim - 1))
    n = num_valid.astype(x.dtype)
    mean = jnp.sum(jnp.where(mask, x, 0.0), axis=0) / n
    m2 = jnp.sum(jnp.where(mask, (x - mean) ** 2, 0.0), axis=0)
    return mean, m2


class _Accumulator:
    """Chan et al.'s parallel update of mean and sum of squared deviations, in float64."""

    def __init__(self):
        self.n = 0
        self.mean = None
        self.m2 = None

    def add(self, n: int, mean, m2) -> None:
        mean = np.asarray(mean, dtype=np.float64)
        m2 = np.asarray(m2, dtype=np.float64)
        if self.n == 0:
            self.n, self.mean, self.m2 = n, mean, m2
            return
        self.n, self.mean, self.m2 = merge_moments(self.n, self.mean, self.m2, n, mean, m2)

    def result(self) -> Moments:
        return Moments(self.mean, self.m2 / self.n, self.n)


def _stream(
    per_chunk: Callable,
    samples: dict[str, np.ndarray],
    keys: np.ndarray | None,
    dynamic,
    batch_size: int,
    reduce: str | None,
    program_key,
) -> dict:
    """Run ``per_chunk(keys, chunk, dynamic) -> dict site -> (B, ...)`` over all samples.

    ``program_key`` names what ``per_chunk`` computes apart from its arguments (model, sites, static model
    arguments): calls with the same key reuse one compiled program (a key that cannot be hashed, e.g. an
    unhashable static argument, compiles afresh).

    :returns: dict site -> ``(S, ...)`` host array, or site -> :class:`~numpyro_mile._moments.Moments`.
    """
    num_samples = next(iter(samples.values())).shape[0]
    batch = min(batch_size, num_samples)

    def body(chunk_keys, chunk, num_valid, dyn):
        _on_trace()
        out = per_chunk(chunk_keys, chunk, dyn)
        if reduce == "moments":
            return {name: _chunk_moments(value, num_valid) for name, value in out.items()}
        return out

    compiled = _programs.program(("stream", program_key, reduce), lambda: jax.jit(body))
    outputs: dict = {}
    for start in range(0, num_samples, batch):
        stop = min(start + batch, num_samples)
        n = stop - start
        chunk = {name: _pad(value[start:stop], batch) for name, value in samples.items()}
        chunk_keys = None if keys is None else _pad(keys[start:stop], batch)
        result = compiled(chunk_keys, chunk, np.int32(n), dynamic)
        for name, value in result.items():
            if reduce == "moments":
                outputs.setdefault(name, _Accumulator()).add(n, *value)
            else:
                value = np.asarray(value)
                if name not in outputs:
                    outputs[name] = np.empty((num_samples,) + value.shape[1:], dtype=value.dtype)
                outputs[name][start:stop] = value[:n]
    if reduce == "moments":
        return {name: acc.result() for name, acc in outputs.items()}
    return outputs


def _resolve_parallel(parallel: bool | None) -> bool:
    if parallel is None:
        return jax.default_backend() != "cpu"
    return bool(parallel)


def _check_reduce(reduce) -> None:
    if reduce not in _REDUCTIONS:
        raise ValueError(f"reduce must be one of {_REDUCTIONS}, got {reduce!r}.")


# --------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------


def predict(
    model: Callable,
    samples: Mapping,
    *model_args,
    batch_size: int = 100,
    return_sites: Sequence[str] | None = None,
    reduce: str | None = None,
    rng_key=None,
    chain_axis: bool = False,
    parallel: bool | None = None,
    **model_kwargs,
) -> dict:
    """Posterior predictive of ``model``, streamed over chunks of ``batch_size`` samples.

    Equivalent to ``numpyro.infer.Predictive(model, samples, return_sites=return_sites)
    (rng_key, *model_args, **model_kwargs)`` (same random draws), but the model runs on
    ``batch_size`` samples at a time in one jit-compiled function, so memory does not grow
    with the number of samples when ``reduce`` is given.

    The model is called as given: to predict, pass the inputs only (e.g. ``X_test``), so
    that ``y`` is ``None`` and this package's models record ``mu``/``sigma`` or
    ``logits``. Subsampled plates are evaluated on all their rows (:func:`full_plate_model`).
    Array arguments are traced; other arguments (``hidden=(16, 16)``, functions) are
    compile-time constants.

    :param model: a NumPyro model.
    :param samples: dict site -> array of shape ``(S, ...)``, e.g. ``mcmc.get_samples()``;
        with ``chain_axis=True`` shape ``(chains, draws, ...)``, e.g.
        ``mcmc.get_samples(group_by_chain=True)``. Deterministic sites in ``samples`` are
        ignored (recomputed), as in ``Predictive``.
    :param model_args: positional arguments of the model.
    :param batch_size: number of samples per chunk (memory ``O(batch_size x outputs)``).
    :param return_sites: sites to return; default (``None``): the sample sites not in
        ``samples`` and all deterministic sites, as in ``Predictive``.
    :param reduce: ``None`` for every sample's output, or ``"moments"`` for the mean and
        variance over samples only (running accumulators in float64).
    :param rng_key: PRNG key of the predictive draws (default ``PRNGKey(0)``).
    :param chain_axis: ``samples`` have a leading ``(chains, draws)`` pair of axes; they are
        flattened for the computation and restored in the outputs (keys as in
        ``Predictive(..., batch_ndims=2)``).
    :param parallel: how a chunk is evaluated: ``True`` vectorises the model over the chunk's
        samples (``vmap``, fastest on GPU), ``False`` loops over them inside the compiled
        function (``lax.map``: memory of one sample's intermediates, and on CPU often faster,
        since vectorised activations outgrow the cache); ``None``: ``True`` on GPU/TPU,
        ``False`` on CPU. Results are the same up to floating-point rounding.
    :param model_kwargs: keyword arguments of the model.
    :returns: dict site -> ``np.ndarray`` of shape ``(S, ...)`` (``(chains, draws, ...)``
        with ``chain_axis``); with ``reduce="moments"`` dict site -> :class:`~numpyro_mile._moments.Moments`.

    **Example**

    .. doctest::

        >>> import jax, numpy as np
        >>> from numpyro.infer import MCMC, NUTS
        >>> from numpyro_mile.models import mlp_regression
        >>> from numpyro_mile.predictive import predict
        >>> X = np.linspace(-1, 1, 20)[:, None]; y = np.sin(3 * X[:, 0])
        >>> mcmc = MCMC(NUTS(mlp_regression), num_warmup=5, num_samples=7, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(4,))
        >>> out = predict(mlp_regression, mcmc.get_samples(), X[:3], batch_size=3, hidden=(4,))
        >>> out["mu"].shape, out["y"].shape
        ((7, 3), (7, 3))
        >>> predict(mlp_regression, mcmc.get_samples(), X[:3], reduce="moments", hidden=(4,))["mu"].mean.shape
        (3,)
    """
    _check_reduce(reduce)
    batch_size = _check_batch_size(batch_size)
    flat, batch_shape = _flatten_samples(samples, chain_axis)
    num_samples = math.prod(batch_shape)
    keys = _sample_keys(rng_key, num_samples)
    parallel = _resolve_parallel(parallel)
    model = full_plate_model(model, model_args, model_kwargs)
    dynamic, rebuild, static_key = _split_dynamic(model_args, model_kwargs)

    def per_chunk(chunk_keys, chunk, dyn):
        args, kwargs = rebuild(dyn)

        def one(key, sample):
            predictive = Predictive(model, posterior_samples=sample, return_sites=return_sites, batch_ndims=0)
            return predictive(key, *args, **kwargs)

        if parallel:
            return jax.vmap(one)(chunk_keys, chunk)
        return jax.lax.map(lambda key_sample: one(*key_sample), (chunk_keys, chunk))

    program_key = ("predict", model, None if return_sites is None else tuple(return_sites), parallel, static_key)
    out = _stream(per_chunk, flat, keys, dynamic, batch_size, reduce, program_key)
    if reduce is None and chain_axis:
        out = {name: value.reshape(batch_shape + value.shape[1:]) for name, value in out.items()}
    return out


def log_likelihood(
    model: Callable,
    samples: Mapping,
    *model_args,
    batch_size: int = 100,
    chain_axis: bool = False,
    parallel: bool | None = None,
    **model_kwargs,
) -> dict[str, np.ndarray]:
    """Pointwise log-likelihood of the observed sites, streamed over chunks of samples.

    Equivalent to ``numpyro.infer.util.log_likelihood(model, samples, *model_args,
    **model_kwargs)``, computed on ``batch_size`` samples at a time in one jit-compiled
    function. A subsampled plate (e.g. ``mlp_regression(X, y, subsample_size=10)``) is
    evaluated on all its rows, so the result has one column per observation rather than
    a random minibatch (see :func:`full_plate_model`); the values are unscaled
    ``log p(y_n | theta_s)``.

    :param model: a NumPyro model.
    :param samples: dict site -> ``(S, ...)`` (or ``(chains, draws, ...)`` with
        ``chain_axis=True``) holding every latent site.
    :param model_args: positional arguments of the model, including the observations
        (e.g. ``X_test, y_test``).
    :param batch_size: number of samples per chunk.
    :param chain_axis: ``samples`` have leading ``(chains, draws)`` axes, kept in the result.
    :param parallel: vectorise over a chunk's samples (``True``) or loop (``False``); see
        :func:`predict`.
    :param model_kwargs: keyword arguments of the model.
    :returns: dict observed site -> ``np.ndarray`` of shape ``(S, N)`` (the site's batch
        shape after ``S``), or ``(chains, draws, N)`` with ``chain_axis``.
    """
    batch_size = _check_batch_size(batch_size)
    flat, batch_shape = _flatten_samples(samples, chain_axis)
    parallel = _resolve_parallel(parallel)
    model, trace = _full_plate(model, model_args, model_kwargs)
    if not any(site["type"] == "sample" and site["is_observed"] for site in trace.values()):
        raise ValueError(
            "the model has no observed sample site for these arguments; pass the observations "
            "(e.g. log_likelihood(model, samples, X_test, y_test))."
        )
    dynamic, rebuild, static_key = _split_dynamic(model_args, model_kwargs)

    def per_chunk(_, chunk, dyn):
        args, kwargs = rebuild(dyn)
        return _numpyro_log_likelihood(model, chunk, *args, parallel=parallel, batch_ndims=1, **kwargs)

    out = _stream(per_chunk, flat, None, dynamic, batch_size, None, ("log_likelihood", model, parallel, static_key))
    if chain_axis:
        out = {name: value.reshape(batch_shape + value.shape[1:]) for name, value in out.items()}
    return out
