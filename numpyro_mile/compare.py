"""The DE / BDE / MILE comparison harness as reusable steps (used by ``numpyro-mile demo`` and benchmarks/).

Each ``run_*`` function returns a :class:`MethodResult` with test metrics and costs, so a script
only chooses data and budgets.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import jax
import numpy as np
from numpyro.infer import MCMC

from .baselines import bde, bde_mcmc, chain_init_params, chains_per_device
from .diagnostics import _nanmean, chainwise_rhat, ess
from .ensemble import DeepEnsemble
from .kernels import ICSGLD, MILE
from .kernels.icsgld import importance_weights
from .evaluation import evaluate_regression


class MethodResult(NamedTuple):
    """Test metrics and costs of one method on one split.

    :ivar rmse: RMSE of the posterior predictive mean (standardised units).
    :ivar lppd: mean test log pointwise predictive density (standardised units).
    :ivar seconds: sampler wall time in seconds, after compilation (0 for DE).
    :ivar compile_seconds: time of a compile-only run (0 for DE).
    :ivar grad_evals: gradient evaluations of the sampler, all chains.
    :ivar ess: mean over parameters of the per-chain rank-normalised ESS (NaN for DE).
    :ivar crhat: mean chainwise split R-hat, as the MILE reference code computes it
        (``chainwise_rhat(method="mile")``; NaN for DE).
    :ivar num_nans: rejected non-finite steps (MILE), divergences (NUTS).
    :ivar cpu_seconds: process CPU seconds (all threads) of the timed run; less sensitive than
        ``seconds`` to other jobs on a shared machine.
    :ivar warmup_seconds: wall seconds of the warmup part of ``seconds`` (BDE; NaN where not split).
    :ivar projected_seconds: ``seconds`` projected to a larger budget from the measured cost per step
        (MILE) or per warmup iteration and per draw (BDE); see :func:`run_mile` and :func:`run_bde`.
        Equal to ``seconds`` when not projected.
    """

    method: str
    rmse: float
    lppd: float
    seconds: float
    compile_seconds: float
    grad_evals: int
    ess: float
    crhat: float
    num_nans: int
    cpu_seconds: float = float("nan")
    warmup_seconds: float = float("nan")
    projected_seconds: float = float("nan")


def _mixing(samples_by_chain: dict) -> tuple[float, float]:
    flat = {k: np.asarray(v) for k, v in samples_by_chain.items()}
    if next(iter(flat.values())).shape[1] < 16:  # too few draws for ESS and a 4-split R-hat
        return float("nan"), float("nan")
    ess_values = np.concatenate([np.ravel(v) for v in ess(flat, per_chain=True).values()])
    # cR-hat as the MILE reference code computes it (benchmarks/uci.py records crhat_method="mile")
    crhat_values = np.concatenate([np.ravel(v) for v in chainwise_rhat(flat, method="mile").values()])
    return _nanmean(ess_values), _nanmean(crhat_values)


def _timed(fn: Callable) -> tuple[object, float, float]:
    """Run ``fn`` (returning an MCMC) to completion; (result, wall seconds, process CPU seconds)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    out = fn()
    jax.block_until_ready(out.get_samples())
    return out, time.perf_counter() - start, time.process_time() - cpu_start


def _wall(fn: Callable) -> tuple[object, float]:
    out, wall, _ = _timed(fn)
    return out, wall


def run_de(model, ensemble: DeepEnsemble, X_test, y_test, **model_kwargs) -> MethodResult:
    """The DE baseline: the members themselves as an equally weighted mixture."""
    rmse, lppd = evaluate_regression(model, ensemble.samples, X_test, y_test, **model_kwargs)
    return MethodResult("DE", rmse, lppd, 0.0, 0.0, 0, float("nan"), float("nan"), 0)


def run_mile(
    model,
    ensemble: DeepEnsemble,
    train,
    X_test,
    y_test,
    *,
    rng_key,
    num_warmup: int,
    num_samples: int,
    thinning: int = 1,
    progress_bar: bool = False,
    kernel_options: dict | None = None,
    projected_steps: int | None = None,
    **model_kwargs,
) -> MethodResult:
    """MILE from the ensemble's members (vectorized chains).

    ``seconds`` is the wall time of the run (start-up and compilation included);
    ``compile_seconds`` the wall time of a 20-step run with the same shapes, i.e. mostly compilation.
    Every MILE step costs the same (two gradient evaluations per chain), so with ``projected_steps``
    (e.g. the paper's 60_000) the time of that many steps is projected linearly:
    ``compile + (seconds - compile) * projected_steps / (num_warmup + num_samples)``.
    """
    num_chains = int(jax.tree.leaves(ensemble.init_params)[0].shape[0])
    options = kernel_options or {}

    def go(nw, ns, kernel):
        mcmc = MCMC(
            kernel,
            num_warmup=nw,
            num_samples=ns,
            num_chains=num_chains,
            thinning=thinning,
            chain_method="vectorized",
            progress_bar=progress_bar,
        )
        mcmc.run(rng_key, *train, extra_fields=("num_nans",), init_params=ensemble.init_params, **model_kwargs)
        return mcmc

    # a tiny run with the same shapes measures start-up and compilation
    _, compile_seconds = _wall(lambda: go(20, thinning, MILE(model, **{**options, "phase_split": (0.4, 0.1, 0.5)})))
    warm, seconds, cpu_seconds = _timed(lambda: go(num_warmup, num_samples, MILE(model, **options)))
    rmse, lppd = evaluate_regression(model, warm.get_samples(), X_test, y_test, **model_kwargs)
    ess_mean, crhat = _mixing(warm.get_samples(group_by_chain=True))
    nans = int(np.asarray(warm.get_extra_fields(group_by_chain=True)["num_nans"])[:, -1].sum())
    grads = MILE.num_grad_evals(num_warmup, num_samples, num_chains)
    projected = seconds
    if projected_steps is not None:
        net = max(seconds - compile_seconds, 0.0)
        projected = min(seconds, compile_seconds) + net * projected_steps / (num_warmup + num_samples)
    return MethodResult(
        "MILE",
        rmse,
        lppd,
        seconds,
        compile_seconds,
        grads,
        ess_mean,
        crhat,
        nans,
        cpu_seconds=cpu_seconds,
        projected_seconds=projected,
    )


def run_bde(
    model,
    ensemble: DeepEnsemble,
    train,
    X_test,
    y_test,
    *,
    rng_key,
    num_warmup: int,
    num_samples: int,
    thinning: int = 1,
    chain_method: str = "auto",
    progress_bar: bool = False,
    label: str = "BDE",
    projected_samples: int | None = None,
    projected_warmup: int | None = None,
    projected_chains: int | None = None,
    **model_kwargs,
) -> MethodResult:
    """BDE (NUTS from the members); times measured as for :func:`run_mile`.

    Warmup and sampling are timed separately (``mcmc.warmup`` then ``mcmc.run``), so that a short
    run projects the time of a longer one (e.g. the paper's 100 or 1000 warmup + 1000 draws): each
    part less one ``compile_seconds`` (NumPyro compiles each run) scales with its length,
    ``projected_samples / num_samples`` for the draws and ``projected_warmup / num_warmup`` for the
    warmup, and both with the ratio of chains each device runs one after another (``projected_chains /
    num_chains`` for sequential chains, which cost the same each; see
    :func:`numpyro_mile.baselines.chains_per_device`).
    After warmup the tree sizes are stationary, so the time per draw is too, up to Monte Carlo
    noise; warmup iterations cost more than draws (smaller steps while adapting), so projecting a
    short warmup is rougher. With no projection arguments ``projected_seconds == seconds``.
    """

    def go(nw, ns):
        return bde(
            model,
            ensemble.init_params,
            *train,
            rng_key=rng_key,
            num_warmup=nw,
            num_samples=ns,
            thinning=thinning,
            chain_method=chain_method,
            progress_bar=progress_bar,
            extra_fields=("num_steps", "diverging"),
            **model_kwargs,
        )

    num_chains = int(jax.tree.leaves(ensemble.init_params)[0].shape[0])
    _, compile_seconds = _wall(lambda: go(2, thinning))
    mcmc = bde_mcmc(
        model,
        num_chains,
        num_warmup=num_warmup,
        num_samples=num_samples,
        thinning=thinning,
        chain_method=chain_method,
        progress_bar=progress_bar,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    mcmc.warmup(rng_key, *train, init_params=chain_init_params(ensemble.init_params), **model_kwargs)
    jax.block_until_ready(mcmc.post_warmup_state)
    warmup_seconds = time.perf_counter() - start
    mcmc.run(mcmc.post_warmup_state.rng_key, *train, extra_fields=("num_steps", "diverging"), **model_kwargs)
    jax.block_until_ready(mcmc.get_samples())
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    rmse, lppd = evaluate_regression(model, mcmc.get_samples(), X_test, y_test, **model_kwargs)
    ess_mean, crhat = _mixing(mcmc.get_samples(group_by_chain=True))
    fields = mcmc.get_extra_fields()
    # collected steps only: warmup gradients are estimated at the sampling phase's mean tree size
    steps = np.asarray(fields["num_steps"])
    grads = int(steps.sum() * thinning * (num_warmup + num_samples) / max(num_samples, 1))
    # the sampling run compiles again (about compile_seconds): only its net time scales with draws
    chain_factor = chains_per_device(projected_chains or num_chains, mcmc.chain_method) / chains_per_device(
        num_chains, mcmc.chain_method
    )
    net_sampling = max(seconds - warmup_seconds - compile_seconds, 0.0)
    net_warmup = max(warmup_seconds - compile_seconds, 0.0)
    projected = (
        seconds
        - net_sampling
        - net_warmup
        + net_warmup * chain_factor * (projected_warmup or num_warmup) / max(num_warmup, 1)
        + net_sampling * chain_factor * (projected_samples or num_samples) / max(num_samples, 1)
    )
    return MethodResult(
        label,
        rmse,
        lppd,
        seconds,
        compile_seconds,
        grads,
        ess_mean,
        crhat,
        int(np.sum(fields["diverging"])),
        cpu_seconds=cpu_seconds,
        warmup_seconds=warmup_seconds,
        projected_seconds=projected,
    )


def run_minibatch(
    label: str,
    kernel,
    model,
    ensemble: DeepEnsemble,
    train,
    X_test,
    y_test,
    *,
    rng_key,
    num_warmup: int,
    num_samples: int,
    subsample_size: int,
    grads_per_step: int,
    thinning: int = 1,
    progress_bar: bool = False,
    **model_kwargs,
) -> MethodResult:
    """A minibatch kernel (SMILE, SGLD, ...) from the ensemble's members (vectorized chains, ``subsample_size``
    rows per gradient), timed as :func:`run_mile` (``compile_seconds``: a 20-step run of the same shapes).

    ``grad_evals`` counts **full-data gradient equivalents**: ``chains x steps x grads_per_step x
    subsample_size / N`` (``grads_per_step``: 2 for SMILE, 1 for SGLD and ICSGLD), comparable with
    full-batch MILE's gradient count. ICSGLD's draws are evaluated with their importance weights.
    """
    weighted = isinstance(kernel, ICSGLD)
    num_chains = int(jax.tree.leaves(ensemble.init_params)[0].shape[0])
    num_rows = int(np.shape(train[0])[0])

    def go(nw, ns):
        mcmc = MCMC(
            kernel,
            num_warmup=nw,
            num_samples=ns,
            num_chains=num_chains,
            thinning=thinning,
            chain_method="vectorized",
            progress_bar=progress_bar,
        )
        mcmc.run(
            rng_key,
            *train,
            extra_fields=("num_nans", "bin") if weighted else ("num_nans",),
            init_params=ensemble.init_params,
            subsample_size=subsample_size,
            **model_kwargs,
        )
        return mcmc

    _, compile_seconds = _wall(lambda: go(20, thinning))
    mcmc, seconds, cpu_seconds = _timed(lambda: go(num_warmup, num_samples))
    weights = importance_weights(mcmc) if weighted else None
    rmse, lppd = evaluate_regression(model, mcmc.get_samples(), X_test, y_test, weights=weights, **model_kwargs)
    ess_mean, crhat = _mixing(mcmc.get_samples(group_by_chain=True))
    nans = int(np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_nans"])[:, -1].sum())
    grads = int(round(num_chains * (num_warmup + num_samples) * grads_per_step * subsample_size / num_rows))
    return MethodResult(
        label,
        rmse,
        lppd,
        seconds,
        compile_seconds,
        grads,
        ess_mean,
        crhat,
        nans,
        cpu_seconds=cpu_seconds,
        projected_seconds=seconds,
    )


def format_table(results: list[MethodResult]) -> str:
    """A markdown table of results."""
    lines = [
        "| method | RMSE | LPPD | sampler s | compile s | grad evals | ESS/chain | cR-hat | NaN/div |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.method} | {r.rmse:.3f} | {r.lppd:.3f} | {r.seconds:.1f} | {r.compile_seconds:.1f} | "
            f"{r.grad_evals:,} | {r.ess:.1f} | {r.crhat:.3f} | {r.num_nans} |"
        )
    return "\n".join(lines)
