"""The one ArviZ conversion: ``InferenceData`` from a NumPyro MCMC run of any kernel (with test-set
groups), or from a sample store on disk (:func:`load_inference_data`).

``arviz.from_numpyro(mcmc, log_likelihood=True)`` evaluates the log-likelihood with the
training call of the model; with a subsampled ``"data"`` plate (SGLD, ICSGLD) that is a
random minibatch, scaled, and it fails or misleads. :func:`to_inference_data` builds the
groups itself:

* ``posterior``: the latent sites of ``mcmc.get_samples(group_by_chain=True)``, plus the
  deterministic sites outside every plate (per-observation deterministic sites, such as
  ``mu`` when ``record_outputs=True``, only when named in ``var_names``);
* ``sample_stats``: ``mcmc.get_extra_fields(group_by_chain=True)`` with ArviZ's names
  (``potential_energy`` becomes ``lp = -potential_energy``, ``num_steps`` ``n_steps``,
  ``accept_prob`` ``acceptance_rate``; kernel-specific fields such as MILE's ``step_size``,
  ``L``, ``energy_change`` keep their names); for an ICSGLD run also ``importance_weight``,
  the normalised importance weights of the draws (what they are: the kernel's ``weights_note``, stored in
  the group's attributes);
* ``observed_data``: the observed sites of the training call (all rows, even with a
  subsampled plate);
* with ``test=(X_test, y_test)``: ``log_likelihood`` holds the *test* pointwise
  log-likelihood, shape ``(chains, draws, N_test)``, and ``predictions`` the model outputs on
  ``X_test`` (the model called without ``y``: ``mu``/``sigma``/``y`` draws for regression,
  ``logits``/``y`` draws for classification), both streamed over chunks of samples
  (:mod:`numpyro_mile.predictive`) with subsampled plates evaluated on all rows.

Any kernel whose ``sample_field`` holds the unconstrained latent values (``"z"``: NUTS, HMC,
MILE, SGLD, ICSGLD) works, since only ``get_samples`` / ``get_extra_fields`` are used.

ICSGLD's draws come from a *flattened* version of the posterior: unweighted summaries of its
``InferenceData`` (``az.ess``, ``az.rhat``, ``az.loo``, plain means) describe that flattened
distribution. Posterior expectations weight the draws with ``sample_stats.importance_weight``
(:func:`numpyro_mile.importance_weights` with ``group_by_chain=True``: the histogram at the end
of the run, weights summing to 1 over all chains and draws), which the conversion asks the kernel
for (its ``sample_weights`` hook). They are computed from the collected ``bin`` field (one of ICSGLD's default
fields) and ``mcmc.last_state.theta``; when
either is missing the conversion warns (naming the ``extra_fields`` to pass to ``mcmc.run``)
and leaves the variable out.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Sequence

import jax
import numpy as np

from . import _model_utils as model_utils
from .predictive import full_plate_model, log_likelihood, predict
from .sample_store import GROUPS, SampleStore

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # ArviZ 0.23 announces its 1.0 refactor
    import arviz as az

__all__ = ["SAMPLE_STATS_NAMES", "load_inference_data", "to_inference_data"]

#: NumPyro extra-field names -> ArviZ ``sample_stats`` names (as ``arviz.from_numpyro``)
SAMPLE_STATS_NAMES = {
    "potential_energy": "lp",
    "adapt_state.step_size": "step_size",
    "num_steps": "n_steps",
    "accept_prob": "acceptance_rate",
}


def _sample_weights(mcmc, extra_fields: dict, chain_draw: tuple[int, int]) -> np.ndarray | None:
    """The kernel's weights of the draws (``sample_weights`` hook, e.g. ICSGLD's importance weights), or ``None``
    for equally weighted draws, or with a warning when they cannot be computed."""
    kernel = mcmc.sampler
    needed = tuple(getattr(kernel, "weight_fields", ()))
    if not needed:
        return None
    name = getattr(kernel, "kernel_name", type(kernel).__name__)
    missing = [field for field in needed if field not in extra_fields]
    if missing or getattr(mcmc, "last_state", None) is None:
        what = f"the extra field(s) {missing} were not collected" if missing else "mcmc.last_state is not available"
        warnings.warn(
            f"to_inference_data: this is an {name} run, whose draws carry weights, but {what}, so "
            f"sample_stats.importance_weight is left out and the InferenceData describes the unweighted draws "
            f"only. Run it with mcmc.run(..., extra_fields={needed!r}) and "
            "convert the MCMC object after the run.",
            UserWarning,
            stacklevel=3,
        )
        return None
    try:
        weights = kernel.sample_weights(mcmc)
    except ValueError as err:  # every draw in the overflow bin: no weights to report, the draws still convert
        warnings.warn(
            f"to_inference_data: sample_stats.importance_weight is left out: {err}", RuntimeWarning, stacklevel=3
        )
        return None
    weights = np.asarray(weights, np.float64)
    if weights.shape != chain_draw:
        raise ValueError(f"the {name} sample weights have shape {weights.shape}, the draws {chain_draw} (chain, draw).")
    return weights


def _sample_stats(extra_fields: dict, chain_draw: tuple[int, int]) -> dict[str, np.ndarray]:
    stats = {}
    for field, value in extra_fields.items():
        if isinstance(value, (dict, tuple, list)):  # e.g. a whole adapt_state
            continue
        value = np.asarray(value)
        if value.shape[:2] != chain_draw:  # not one value per draw
            continue
        name = SAMPLE_STATS_NAMES.get(field, field)
        stats[name] = -value if field == "potential_energy" else value
        if field == "num_steps":
            stats["tree_depth"] = np.log2(np.maximum(value, 1)).astype(int) + 1
    return stats


def _as_args(name: str, data) -> tuple:
    if data is None:
        return ()
    if not isinstance(data, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of model arguments such as (X, y), got {type(data).__name__}.")
    return tuple(data)


def to_inference_data(
    mcmc,
    *,
    train: Sequence | None = None,
    test: Sequence | None = None,
    var_names: Sequence[str] | None = None,
    batch_size: int = 100,
    model_kwargs: dict | None = None,
    model: Callable | None = None,
    prediction_sites: Sequence[str] | None = None,
    rng_key=None,
) -> "az.InferenceData":
    """ArviZ ``InferenceData`` of a finished ``numpyro.infer.MCMC`` run.

    :param mcmc: an ``MCMC`` object after ``run`` (any kernel with ``sample_field="z"``).
    :param train: positional model arguments of the training data, e.g. ``(X, y)``, for
        ``observed_data``; default: the arguments of ``mcmc.run``.
    :param test: positional model arguments with the observations last, e.g.
        ``(X_test, y_test)``: adds the ``log_likelihood`` group (the model called with all of
        ``test``) and the ``predictions`` group (called with ``test[:-1]``, i.e. ``y=None``).
    :param var_names: posterior sites to keep (default: all latent sites and the deterministic
        sites outside plates). Naming a per-observation deterministic site keeps it.
    :param batch_size: posterior samples per chunk when computing the test groups.
    :param model_kwargs: keyword arguments of the model; they update those of ``mcmc.run``
        (e.g. ``hidden=(4,)`` need not be repeated). A ``subsample_size`` is allowed: the
        test groups and ``observed_data`` use every row of the plate anyway.
    :param model: the model (default ``mcmc.sampler.model``).
    :param prediction_sites: sites of the ``predictions`` group (default: every site the
        model returns without ``y`` apart from the latent ones; ``()`` to skip the group).
    :param rng_key: key of the predictive draws (default ``PRNGKey(0)``).
    :returns: ``arviz.InferenceData`` with groups ``posterior``, ``sample_stats`` (when
        there are extra fields), ``observed_data`` (when training data are known) and, with
        ``test``, ``log_likelihood`` and ``predictions``. The test groups carry the attribute
        ``data="test"``; their observation axis has ``N_test`` entries, not ``N_train``.
        For an ICSGLD run ``sample_stats`` also holds ``importance_weight``, dims
        ``(chain, draw)``: the normalised importance weights of
        :func:`numpyro_mile.importance_weights` (final histogram), **summing to 1 over all
        chains and draws together** (not per chain), as the group's
        ``attrs["importance_weight"]`` says. The kernel's end-of-run warnings (rejected steps,
        collapsed step sizes, reset storms: ``mcmc.sampler.run_warnings``) are warned again and kept
        in ``posterior.attrs["run_warnings"]``, one per line. Unweighted ESS / R-hat / LOO of an ICSGLD run
        describe the flattened distribution, not the posterior. When the ``bin`` extra field
        (an ICSGLD default) or ``mcmc.last_state`` is missing, a ``UserWarning`` names the
        ``extra_fields`` to pass to ``mcmc.run`` and the weights are left out.

    **Example**::

        mcmc.run(key, X, y, hidden=(16, 16), extra_fields=("potential_energy",))
        idata = to_inference_data(mcmc, test=(X_test, y_test))
        az.loo(idata)                      # on the test log-likelihood
        idata.predictions["mu"]            # (chain, draw, N_test)
        # ICSGLD: posterior mean of w0, reweighted (unweighted means describe the flattened target)
        w = idata.sample_stats["importance_weight"]
        (w * idata.posterior["w0"]).sum(("chain", "draw"))
    """
    model = mcmc.sampler.model if model is None else model
    kwargs = {**(getattr(mcmc, "_kwargs", None) or {}), **(model_kwargs or {})}
    train_args = _as_args("train", train) or tuple(getattr(mcmc, "_args", None) or ())
    test_args = _as_args("test", test)
    if test is not None and len(test_args) < 2:
        raise ValueError(
            "test must hold the model inputs and the observations last, e.g. (X_test, y_test); "
            f"got {len(test_args)} argument(s)."
        )

    samples = {name: np.asarray(value) for name, value in mcmc.get_samples(group_by_chain=True).items()}
    if not samples:
        raise ValueError("the MCMC run has no samples; call mcmc.run first.")
    last_state = getattr(mcmc, "last_state", None)
    run_warnings = []
    if last_state is not None and hasattr(mcmc.sampler, "run_warnings"):
        run_warnings = list(mcmc.sampler.run_warnings(last_state))
        for message in run_warnings:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
    chain_draw = next(iter(samples.values())).shape[:2]

    trace_args = train_args or test_args
    trace = None
    if trace_args:
        full = full_plate_model(model, trace_args, kwargs)
        trace = model_utils.trace_model(full, trace_args, kwargs)
    if trace is not None:
        latent = [name for name in model_utils.latent_sites(trace) if name in samples]
        per_obs = {
            name for name, site in trace.items() if site["type"] == "deterministic" and site.get("cond_indep_stack")
        }
        missing = [name for name in model_utils.latent_sites(trace) if name not in samples]
        if missing:
            raise ValueError(f"the samples lack the latent site(s) {missing} of the model.")
    else:
        latent, per_obs = list(samples), set()

    if var_names is None:
        posterior = {name: value for name, value in samples.items() if name not in per_obs}
    else:
        unknown = [name for name in var_names if name not in samples]
        if unknown:
            raise ValueError(f"var_names {unknown} are not sites of the samples; available: {sorted(samples)}.")
        posterior = {name: samples[name] for name in var_names}

    groups: dict = {"posterior": posterior}
    extra_fields = mcmc.get_extra_fields(group_by_chain=True)
    stats = _sample_stats(extra_fields, chain_draw)
    weights = _sample_weights(mcmc, extra_fields, chain_draw)
    if weights is not None:
        stats["importance_weight"] = weights
    if stats:
        groups["sample_stats"] = stats
    if train_args and trace is not None:
        observed = {name: np.asarray(site["value"]) for name, site in model_utils.observed_sites(trace).items()}
        if observed:
            groups["observed_data"] = observed

    if test_args:
        latent_samples = {name: samples[name] for name in latent}
        groups["log_likelihood"] = log_likelihood(
            model, latent_samples, *test_args, batch_size=batch_size, chain_axis=True, **kwargs
        )
        if prediction_sites is None or len(prediction_sites) > 0:
            preds = predict(
                model,
                latent_samples,
                *test_args[:-1],
                batch_size=batch_size,
                return_sites=None if prediction_sites is None else list(prediction_sites),
                rng_key=rng_key if rng_key is not None else jax.random.PRNGKey(0),
                chain_axis=True,
                **kwargs,
            )
            preds = {name: value for name, value in preds.items() if name not in latent_samples}
            if preds:
                groups["predictions"] = preds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.from_dict(**groups)
    for group in ("log_likelihood", "predictions"):
        if group in groups:
            idata[group].attrs["data"] = "test"
    if weights is not None:
        note = getattr(mcmc.sampler, "weights_note", "importance_weight: normalised weights of the draws.")
        idata.sample_stats.attrs["importance_weight"] = note
        idata.sample_stats["importance_weight"].attrs["note"] = note
    if run_warnings:  # what went wrong travels with the draws (a string: netCDF attributes hold no lists)
        idata.posterior.attrs["run_warnings"] = "\n".join(run_warnings)
    return idata


def load_inference_data(sample_dir: str | os.PathLike, *, upcast: bool = False):
    """An ArviZ ``InferenceData`` over the memory-mapped files of a :class:`SampleStore`.

    ``posterior`` holds the collected sample field (constrained sites), ``sample_stats`` the
    extra fields (``potential_energy`` becomes ``lp = -potential_energy`` as in
    :func:`numpyro_mile.to_inference_data`; that one field is computed in memory). Dimensions
    are ``chain``, ``draw`` and ``{name}_dim_{k}`` as in ``arviz.from_numpyro``. The arrays are
    ``numpy.memmap`` views: ArviZ reads from disk what a computation touches.

    :param sample_dir: the store's directory.
    :param upcast: convert 16-bit floats to float32 (reads them into memory; some ArviZ
        functions do not accept ``bfloat16``).

    **Example**

    >>> idata = load_inference_data("run.samples")    # doctest: +SKIP
    >>> idata.posterior["w0"].dims                    # doctest: +SKIP
    ('chain', 'draw', 'w0_dim_0', 'w0_dim_1')
    """
    import xarray as xr

    store = SampleStore(sample_dir)
    groups = {}
    for group in GROUPS:
        values = store.read(group, upcast=upcast)
        if not values:
            continue
        data = {}
        for name, value in values.items():
            if group == "sample_stats":
                if name == "potential_energy":
                    value = -np.asarray(value)
                name = SAMPLE_STATS_NAMES.get(name, name)
            dims = ["chain", "draw"] + [f"{name}_dim_{k}" for k in range(value.ndim - 2)]
            data[name] = xr.Variable(dims, value)
        coords = {"chain": np.arange(store.meta["num_chains"]), "draw": np.arange(store.num_written)}
        groups[group] = xr.Dataset(data, coords=coords, attrs=dict(store.meta.get("attrs", {})))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return az.InferenceData(**groups)
