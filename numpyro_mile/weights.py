"""Importance weights of ICSGLD (and CSGLD) samples.

ICSGLD samples a flattened version of the posterior; a posterior expectation is the weighted
average ``E[f] ≈ sum_k w_k f(x_k) / sum_k w_k`` with ``w_k = theta[J(x_k)]^zeta``. The weights
returned here are normalised and aligned with ``mcmc.get_samples()`` (chains concatenated, the
order of NumPyro's flattened samples), so they plug into the ``weights=`` argument of the
functions in :mod:`numpyro_mile.metrics`::

    w = importance_weights(mcmc)                        # (P * draws,)
    mean = np.einsum("s,s...->...", w, mcmc.get_samples()["w0"])
    metrics.lppd(log_lik, weights=w)
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["importance_weights"]


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
