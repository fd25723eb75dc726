"""ArviZ ``InferenceData`` from a NumPyro MCMC run of any kernel, with test-set groups.

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
  ``L``, ``energy_change`` keep their names);
* ``observed_data``: the observed sites of the training call (all rows, even with a
  subsampled plate);
* with ``test=(X_test, y_test)``: ``log_likelihood`` holds the *test* pointwise
  log-likelihood, shape ``(chains, draws, N_test)``, and ``predictions`` the model outputs on
  ``X_test`` (the model called without ``y``: ``mu``/``sigma``/``y`` draws for regression,
  ``logits``/``y`` draws for classification), both streamed over chunks of samples
  (:mod:`numpyro_mile.predictive`) with subsampled plates evaluated on all rows.

Any kernel whose ``sample_field`` holds the unconstrained latent values (``"z"``: NUTS, HMC,
MILE, SGLD, ICSGLD) works, since only ``get_samples`` / ``get_extra_fields`` are used.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import jax
import numpy as np

from . import _model_utils as mu
from .predictive import full_plate_model, log_likelihood, predict

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # ArviZ 0.23 announces its 1.0 refactor
    import arviz as az

__all__ = ["SAMPLE_STATS_NAMES", "to_inference_data"]

#: NumPyro extra-field names -> ArviZ ``sample_stats`` names (as ``arviz.from_numpyro``)
SAMPLE_STATS_NAMES = {
    "potential_energy": "lp",
    "adapt_state.step_size": "step_size",
    "num_steps": "n_steps",
    "accept_prob": "acceptance_rate",
}


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
            stats["tree_depth"] = (np.log2(np.maximum(value, 1)).astype(int) + 1)
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

    **Example**::

        mcmc.run(key, X, y, hidden=(16, 16), extra_fields=("potential_energy",))
        idata = to_inference_data(mcmc, test=(X_test, y_test))
        az.loo(idata)                      # on the test log-likelihood
        idata.predictions["mu"]            # (chain, draw, N_test)
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
    chain_draw = next(iter(samples.values())).shape[:2]

    trace_args = train_args or test_args
    trace = None
    if trace_args:
        full = full_plate_model(model, trace_args, kwargs)
        trace = mu.trace_model(full, trace_args, kwargs)
    if trace is not None:
        latent = [name for name in mu.latent_sites(trace) if name in samples]
        per_obs = {
            name for name, site in trace.items()
            if site["type"] == "deterministic" and site.get("cond_indep_stack")
        }
        missing = [name for name in mu.latent_sites(trace) if name not in samples]
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
    stats = _sample_stats(mcmc.get_extra_fields(group_by_chain=True), chain_draw)
    if stats:
        groups["sample_stats"] = stats
    if train_args and trace is not None:
        observed = {
            name: np.asarray(site["value"])
            for name, site in trace.items()
            if site["type"] == "sample" and site["is_observed"]
        }
        if observed:
            groups["observed_data"] = observed

    if test_args:
        latent_samples = {name: samples[name] for name in latent}
        groups["log_likelihood"] = log_likelihood(
            model, latent_samples, *test_args, batch_size=batch_size, chain_axis=True, **kwargs
        )
        if prediction_sites is None or len(prediction_sites) > 0:
            preds = predict(
                model, latent_samples, *test_args[:-1], batch_size=batch_size,
                return_sites=None if prediction_sites is None else list(prediction_sites),
                rng_key=rng_key if rng_key is not None else jax.random.PRNGKey(0),
                chain_axis=True, **kwargs,
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
    return idata
