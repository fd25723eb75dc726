"""Command line: ``numpyro-mile demo`` runs DE vs MILE vs BDE on real data (UCI airfoil, shipped with the package)."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import numpy as np
import numpyro
from numpyro.infer import MCMC

from . import metrics
from .baselines import bde
from .datasets import Split, load_uci, split, standardize, toy_regression
from .ensemble import deep_ensemble
from .kernels import MILE
from .models import mlp_classification, mlp_regression
from .predictive import log_likelihood, predict
from .runs.chunked import run_chunked

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class _CompileSeconds:
    """Trace + lower + XLA compile seconds reported by JAX while ``active``."""

    def __init__(self):
        self.seconds, self.active = 0.0, False
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event, duration, **kwargs):
        if self.active and event in _COMPILE_EVENTS:
            self.seconds += duration

    def timed(self, fn):
        """``fn()`` blocked until ready; returns (result, wall seconds, compile seconds)."""
        self.seconds, self.active = 0.0, True
        start = time.perf_counter()
        try:
            out = fn()
            jax.block_until_ready(out.get_samples())
        finally:
            self.active = False
        return out, time.perf_counter() - start, self.seconds


class _Task(NamedTuple):
    """A demo data set: its split (standardised), description, model, model arguments and score name."""

    data: Split
    description: str
    model: Callable
    model_kwargs: dict
    score: str  # "accuracy" (classification) or "RMSE" (regression)


def _load(name: str, seed: int, hidden: tuple[int, ...]) -> _Task:
    if name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        raw = load_breast_cancer()
        data, _ = standardize(
            split(np.asarray(raw.data, np.float32), np.asarray(raw.target, np.int32), seed=seed), standardize_y=False
        )
        return _Task(
            data,
            "scikit-learn's breast cancer data (UCI Breast Cancer Wisconsin (Diagnostic): 569 tumours, "
            "30 features, 2 classes; real data)",
            mlp_classification,
            {"hidden": hidden, "num_classes": 2},
            "accuracy",
        )
    if name == "airfoil":
        X, y = load_uci("airfoil")
        desc = (
            "UCI airfoil self-noise (NASA wind-tunnel tests: 1,503 rows, 5 features, sound pressure in dB; real "
            "data, ships with this package; one of the MILE paper's UCI sets)"
        )
    elif name == "diabetes":
        from sklearn.datasets import load_diabetes

        raw = load_diabetes()
        X, y, desc = raw.data, raw.target, "scikit-learn's diabetes data (442 patients, 10 features; real data)"
    else:  # "toy"
        X, y = toy_regression(300, seed=seed)
        desc = "generated 1-D regression with a gap (300 rows)"
    data, _ = standardize(split(np.asarray(X, np.float32), np.asarray(y, np.float32), seed=seed))
    return _Task(data, desc, mlp_regression, {"hidden": hidden}, "RMSE")


def _pointwise(task: _Task, samples: dict, X, y) -> tuple[float, np.ndarray]:
    """(the task's score of the posterior predictive, pointwise LPPD of the test rows, shape ``(N,)``)."""
    latent = {k: v for k, v in samples.items() if k not in ("mu", "sigma", "y", "logits")}
    ll = np.asarray(log_likelihood(task.model, latent, X, y, **task.model_kwargs)["y"])
    pointwise = metrics.lppd(ll, pointwise=True)[1]
    if task.score == "accuracy":
        logits = np.asarray(predict(task.model, latent, X, return_sites=["logits"], **task.model_kwargs)["logits"])
        return metrics.accuracy(np.asarray(jax.nn.softmax(logits, axis=-1)), y), pointwise
    mu = np.asarray(predict(task.model, latent, X, return_sites=["mu"], **task.model_kwargs)["mu"])
    return metrics.rmse(y, mu), pointwise


def _two_digits(x: float) -> str:
    """``x`` with two significant digits (``0.047``, ``1.0``, ``12``), never ``0.0``."""
    return f"{x:#.2g}".rstrip(".") if abs(x) < 100 else f"{x:.0f}"


def _verdict(lppd_diff: float, lppd_se: float, time_ratio: float, projected_ratio: float, bde_draws: int) -> str:
    """The demo's verdict on the MILE paper's claim (MILE's LPPD equal to BDE's or better, in a fraction of BDE's
    time) from the paired LPPD difference MILE - BDE and its standard error, BDE's wall time over MILE's in this
    run (``time_ratio``) and with BDE at the paper's 1,000 draws per chain (``projected_ratio``, projected), and
    BDE's draws per chain in this run."""
    equal = (
        f"MILE's LPPD is above BDE's (by {lppd_diff:.3f} ± {lppd_se:.3f})"
        if lppd_diff > lppd_se
        else "MILE's LPPD is equal to BDE's (within one standard error)"
    )
    short = bde_draws < 1000
    if lppd_diff < -lppd_se:
        errors = f" ({-lppd_diff / lppd_se:.1f} standard errors)" if lppd_se > 0 else ""
        return (
            f"MILE's LPPD is below BDE's by {-lppd_diff:.3f}{errors}: the MILE paper's claim (equal or better "
            "LPPD) does not hold on this data and budget. (On the paper's UCI regression data sets it does "
            "here: docs/benchmarks/uci_paper.)"
        )
    if time_ratio > 1:
        return f"{equal} in {_two_digits(1 / time_ratio)}x BDE's wall time: the MILE paper's claim holds here" + (
            ", against BDE's short run (the paper's speed-up is against BDE's 1,000 draws: projected below)."
            if short
            else "."
        )
    if short and projected_ratio > 1:
        return (
            f"{equal}, but BDE's short run here was faster: the MILE paper's claim (equal LPPD in a fraction of "
            "BDE's time) holds only against BDE at the paper's 1,000 draws, projected below."
        )
    return (
        f"{equal}, but MILE took longer than BDE"
        + (", also against BDE's projected 1,000 draws" if short else "")
        + ": the MILE paper's claim (equal LPPD in a fraction of BDE's time) does not hold on this data and "
        "budget."
    )


def _ensemble_verdict(
    lppd_diff: float, lppd_se: float, score_name: str, mile_score: float, de_score: float, de_seconds: float
) -> str:
    """What MILE adds to its own deep ensemble, from the paired test-LPPD difference MILE - DE and its standard
    error, and the two scores (``score_name``: ``"accuracy"``, higher is better, or ``"RMSE"``, lower is better)."""
    better = mile_score > de_score if score_name == "accuracy" else mile_score < de_score
    scores = f"{score_name} {mile_score:.3f} against the ensemble's {de_score:.3f}" + (
        ", better" if better else ", not better" if mile_score != de_score else ", the same"
    )
    if lppd_diff < -lppd_se:
        return (
            f"The deep ensemble alone ({de_seconds:.1f} s) has the higher LPPD here: MILE - DE "
            f"{lppd_diff:+.3f} ± {lppd_se:.3f}; MILE's {scores}. On this data and budget the ensemble alone is "
            "the better buy; MILE's gains show on the regression sets of docs/benchmarks/uci_paper."
        )
    word, within = ("above", "") if lppd_diff > lppd_se else ("equal to", ", within one standard error")
    return f"MILE's LPPD is {word} its deep ensemble's (MILE - DE {lppd_diff:+.3f} ± {lppd_se:.3f}{within}); {scores}."


def demo(args: argparse.Namespace) -> int:
    """DE, MILE and BDE from the same ensemble; prints a markdown table, the time ratio and a verdict."""
    task = _load(args.data, args.seed, tuple(args.hidden))
    ((X_train, y_train), val, (X_test, y_test)), model, model_kwargs = task.data, task.model, task.model_kwargs
    key_de, key_mile, key_bde = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    # bars only on a terminal: in a captured log (CI, a cluster job) every redraw would be a line of its own
    progress = not args.quiet and sys.stderr.isatty()
    clock = _CompileSeconds()
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731

    say(
        f"{task.description}: {len(y_train)} train / {len(val[1])} validation / {len(y_test)} test rows; "
        f"MLP {args.hidden}, {args.chains} members = chains"
    )
    start = time.perf_counter()
    ensemble = deep_ensemble(
        model,
        key_de,
        args.chains,
        X_train,
        y_train,
        validation=val,
        early_stopping="mile",
        progress_bar=progress,
        **model_kwargs,
    )
    de_seconds = time.perf_counter() - start
    say(f"deep ensemble trained in {de_seconds:.1f} s (epochs {np.asarray(ensemble.num_epochs).tolist()})")

    # MILE through run_chunked: the same draws as mile_mcmc.run, with the progress bar moved after each compiled
    # chunk of steps instead of NumPyro's per-step launch from Python (what that launch costs:
    # docs/benchmarks/defaults.md); on several devices BDE's bars already update from inside its compiled loops
    say(
        f"MILE: {args.mile_warmup:,} warmup + {args.mile_samples:,} steps per chain (thinned by {args.thinning}), "
        "run_chunked ..."
    )
    mile_mcmc = MCMC(
        MILE(model),
        num_warmup=args.mile_warmup,
        num_samples=args.mile_samples,
        num_chains=args.chains,
        thinning=args.thinning,
        chain_method="vectorized",
        progress_bar=progress,
    )
    with tempfile.TemporaryDirectory() as folder:
        mile_run, mile_wall, mile_compile = clock.timed(
            lambda: run_chunked(
                mile_mcmc,
                key_mile,
                X_train,
                y_train,
                checkpoint_path=Path(folder) / "mile.ckpt",
                init_params=ensemble.init_params,
                **model_kwargs,
            )
        )
        mile_samples = {k: np.array(v) for k, v in mile_run.get_samples().items()}  # read before the folder goes
    say(f"BDE: NUTS from the same members, {args.bde_warmup} warmup + {args.bde_samples} draws per chain ...")
    bde_mcmc, bde_wall, bde_compile = clock.timed(
        lambda: bde(
            model,
            ensemble.init_params,
            X_train,
            y_train,
            rng_key=key_bde,
            num_warmup=args.bde_warmup,
            num_samples=args.bde_samples,
            progress_bar=progress,
            **model_kwargs,
        )
    )

    rows = []
    de_score, de_pw = _pointwise(task, ensemble.samples, X_test, y_test)
    rows.append(("DE (the members)", de_score, de_pw, de_seconds, float("nan"), 0))
    mile_score, mile_pw = _pointwise(task, mile_samples, X_test, y_test)
    rows.append(
        (
            "MILE",
            mile_score,
            mile_pw,
            mile_wall,
            mile_compile,
            MILE.num_grad_evals(args.mile_warmup, args.mile_samples, args.chains),
        )
    )
    bde_score, bde_pw = _pointwise(task, bde_mcmc.get_samples(), X_test, y_test)
    leapfrogs = int(np.sum(bde_mcmc.get_extra_fields()["num_steps"]))
    bde_grads = int(leapfrogs * (args.bde_warmup + args.bde_samples) / max(args.bde_samples, 1))
    rows.append(("BDE (NUTS)", bde_score, bde_pw, bde_wall, bde_compile, bde_grads))

    n_test = len(y_test)
    print(f"| method | {task.score} | LPPD (± s.e.) | wall s | of which compile s | gradient evaluations |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, score, pw, wall, compile_s, grads in rows:
        compile_text = "–" if np.isnan(compile_s) else f"{compile_s:.1f}"
        print(
            f"| {name} | {score:.3f} | {pw.mean():.3f} ± {pw.std(ddof=1) / np.sqrt(n_test):.3f} | {wall:.1f} | "
            f"{compile_text} | {grads:,} |"
        )

    diff = mile_pw - bde_pw
    d, se = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(n_test))
    ratio, ratio_net = bde_wall / mile_wall, (bde_wall - bde_compile) / max(mile_wall - mile_compile, 1e-9)
    projected = bde_compile + (bde_wall - bde_compile) * (args.bde_warmup + 1000) / (args.bde_warmup + args.bde_samples)
    print()
    print(
        f"MILE vs BDE: LPPD difference {d:+.3f} ± {se:.3f} (paired over the {n_test} test rows); "
        f"BDE took {_two_digits(ratio)}x MILE's wall time ({_two_digits(ratio_net)}x without compilation), with "
        f"{_two_digits(bde_grads / max(rows[1][5], 1))}x its gradient evaluations."
    )
    print(_verdict(d, se, ratio, projected / mile_wall, args.bde_samples))
    gain = mile_pw - de_pw
    print(
        _ensemble_verdict(
            float(gain.mean()), float(gain.std(ddof=1) / np.sqrt(n_test)), task.score, mile_score, de_score, de_seconds
        )
    )
    print(
        f"BDE ran {args.bde_samples} draws per chain; the paper's 1,000 would take about {projected:.0f} s "
        f"(projected linearly from this run, {_two_digits(projected / mile_wall)}x MILE's time). Machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {jax.device_count()} {jax.default_backend()} device(s), "
        f"jax {jax.__version__}; deep ensemble {de_seconds:.1f} s (shared by MILE and BDE)."
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    # every CPU core a JAX device (it only takes effect before JAX starts), so that the chains run over all of them
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        numpyro.set_host_device_count(os.cpu_count() or 1)
    parser = argparse.ArgumentParser(prog="numpyro-mile", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "demo", help="DE vs MILE vs BDE (NUTS) on UCI airfoil data (ships with this package; ~2.5 min on 2 cores)"
    )
    p.add_argument(
        "--data",
        choices=["airfoil", "breast_cancer", "diabetes", "toy"],
        default="airfoil",
        help="airfoil (UCI regression, one of the MILE paper's data sets, shipped with this package), "
        "breast_cancer (UCI classification) or diabetes (regression), both shipped with scikit-learn, "
        "or toy (generated 1-D regression with a gap)",
    )
    p.add_argument("--chains", type=int, default=12, help="ensemble members = chains (the paper's 12)")
    p.add_argument("--hidden", type=int, nargs="+", default=[16, 16])
    p.add_argument(
        "--mile-warmup",
        type=int,
        default=10_000,
        help="MILE warmup steps (the budget of bde's examples; the paper's: 50,000)",
    )
    p.add_argument(
        "--mile-samples",
        type=int,
        default=2_000,
        help="MILE sampling steps (the budget of bde's examples; the paper's: 10,000)",
    )
    p.add_argument("--thinning", type=int, default=10, help="MILE thinning (the paper's 10)")
    p.add_argument("--bde-warmup", type=int, default=100, help="NUTS warmup (the paper: 100 or 1,000)")
    p.add_argument(
        "--bde-samples",
        type=int,
        default=50,
        help="NUTS draws per chain (the paper: 1,000; the time of 1,000 is projected from this run)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars (there are none when stderr is not a terminal: the phases are reported one line each)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
