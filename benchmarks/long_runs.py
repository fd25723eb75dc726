"""Long runs: predicted vs measured cost, peak memory streamed vs in memory, storage precision vs LPPD.

Three parts, each written to ``docs/benchmarks/long_runs.md`` (plus ``long_runs.png``):

1. **cost** — for each width ``w`` of ``mlp_regression(hidden=(w, w))`` on synthetic data
   (``--rows`` x 8 inputs, ``--chains`` vectorized chains): ``MILE.estimate_cost`` with
   ``method="gradient"`` (two timed gradient evaluations per step) and ``method="step"`` (MILE's
   compiled step, timed), against two measurements of the same run:

   * (A) :func:`numpyro_mile.run_chunked` in 10 chunks: the first chunk pays the compilation, the
     other nine are timed (wall and process CPU time); the median chunk's cost per step, times the
     steps of the run, is the measurement (the range over chunks shows the noise). Its draws are
     bit-identical to ``MCMC.run``'s (tested), so this is the cost of ``MCMC.run``'s steps without
     its compilation.
   * (B) ``MCMC.run`` itself: wall time minus the tracing+compilation time that JAX reports
     (``jax.monitoring``) during the call; CPU time is shown with compilation included.

   The run length is chosen per width so that the measured steps take about ``--target-seconds``
   of CPU time (from a pilot gradient estimate). Pretraining is not part of the comparison
   (``init_params`` are given: small random weights).
2. **memory** — peak resident memory (``ru_maxrss``) of subprocesses that run the same MILE run
   (``--memory-width``, 4 chains, thinning 1) with ``MCMC.run`` + ``get_samples()`` (in memory) and
   with ``run_chunked`` (streamed, ``--chunk-size`` steps per chunk), each for two run lengths,
   beside ``estimate_cost``'s memory prediction (``predicted_bytes``: data + state +
   Phase III's positions and ESS work space + draws held; rows measured before that estimate counted the
   larger of Phase III's positions and the draws).
   The peak is ``VmHWM`` after resetting it just before the run (``ru_maxrss`` is useless in a
   subprocess: Linux carries the parent's peak across ``exec``).
3. **precision** — MILE on UCI energy (or a toy set when the UCI file is missing): deep-ensemble
   start, ``run_chunked`` with float32 draws; test LPPD and RMSE of the same draws stored as
   float32, bfloat16 and float16 (the store rounds to nearest even: ``round_to_dtype``).

The machine is shared with other jobs: wall times are inflated unevenly by other processes; the load
average is recorded with each measurement, and CPU-time ratios are shown beside wall-time ratios.

Usage::

    python benchmarks/long_runs.py                       # all parts, writes docs/benchmarks/long_runs.md
    python benchmarks/long_runs.py --parts cost --widths 16 64 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from _common import (
    ROOT,
    CompileClock,
    Stopwatch,
    add_common_options,
    argument_parser,
    command_line,
    data_dir,
    finished,
    load_average,
    machine_info,
    markdown_table,
    pyplot,
)

REPORT = ROOT / "docs" / "benchmarks" / "long_runs.md"
FEATURES = 8
CHUNKS = 10


def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument(
        "--parts", nargs="+", default=["cost", "memory", "precision"], choices=["cost", "memory", "precision"]
    )
    p.add_argument("--widths", nargs="+", type=int, default=[16, 64, 128, 256])
    p.add_argument("--rows", type=int, default=512, help="rows of the synthetic data (cost part)")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--target-seconds", type=float, default=10.0, help="CPU seconds of measured steps per width")
    p.add_argument("--estimate-seconds", type=float, default=2.0, help="min_seconds of estimate_cost")
    p.add_argument("--memory-width", type=int, default=128)
    p.add_argument("--memory-samples", nargs=2, type=int, default=[800, 1600])
    p.add_argument("--chunk-size", type=int, default=100)
    p.add_argument("--precision-warmup", type=int, default=4000)
    p.add_argument("--precision-samples", type=int, default=2000)
    add_common_options(p, data="energy.data", output=REPORT, no_write="print the report, write no files")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON config of a memory subprocess
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- helpers
def synthetic(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    y = (np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(rows)).astype(np.float32)
    return X, y


def small_init(X, y, hidden, chains, seed=1):
    """Small random weights (scale 0.1) for every site, with a chain axis (no pretraining)."""
    import jax
    from numpyro.infer import init_to_uniform
    from numpyro.infer.util import initialize_model

    from numpyro_mile.models import mlp_regression

    keys = jax.random.split(jax.random.PRNGKey(seed), chains)
    z = jax.jit(
        lambda k: (
            initialize_model(
                k,
                mlp_regression,
                init_strategy=init_to_uniform(radius=0.1),
                model_args=(X, y),
                model_kwargs=dict(hidden=hidden),
            ).param_info.z
        )
    )(keys)
    return {k: np.asarray(v) for k, v in z.items()}


# ---------------------------------------------------------------------------------------------- part 1: cost
def cost_part(args) -> list[dict]:
    import jax
    from numpyro.infer import MCMC

    from numpyro_mile import MILE, run_chunked
    from numpyro_mile.models import mlp_regression

    X, y = synthetic(args.rows)
    clock = CompileClock.get()
    rows = []
    for width in args.widths:
        hidden = (width, width)
        key = jax.random.PRNGKey(0)
        kernel = MILE(mlp_regression, pretrain=False)
        load0 = load_average()
        pilot = kernel.estimate_cost(
            key, X, y, hidden=hidden, num_warmup=1000, num_samples=1000, num_chains=args.chains
        )
        steps = int(np.clip(args.target_seconds / (2.0 * pilot.cpu_seconds_per_step), 400, 40_000))
        steps = CHUNKS * (steps // CHUNKS)
        W = int(0.75 * steps)
        S = steps - W
        thinning = max(1, S // 200)
        settings = dict(num_warmup=W, num_samples=S, num_chains=args.chains)
        est = {
            m: kernel.estimate_cost(
                key, X, y, hidden=hidden, thinning=thinning, method=m, min_seconds=args.estimate_seconds, **settings
            )
            for m in ("gradient", "step")
        }
        init = small_init(X, y, hidden, args.chains)

        # (A) run_chunked: CHUNKS chunks, the first compiles; the median chunk of the others is the per-step cost
        progress = []
        with tempfile.TemporaryDirectory() as tmp:
            mcmc = MCMC(
                MILE(mlp_regression), thinning=thinning, chain_method="vectorized", progress_bar=False, **settings
            )
            run_chunked(
                mcmc,
                jax.random.PRNGKey(2),
                X,
                y,
                hidden=hidden,
                init_params=init,
                checkpoint_path=Path(tmp) / "run.ckpt",
                chunk_size=steps // CHUNKS,
                callback=progress.append,
            )
        sizes = np.diff([0] + [p.step for p in progress])[1:]
        wall_per_step = np.array([p.seconds for p in progress[1:]]) / sizes
        cpu_per_step = np.array([p.cpu_seconds for p in progress[1:]]) / sizes
        a_wall, a_cpu = float(np.median(wall_per_step)) * steps, float(np.median(cpu_per_step)) * steps
        a_cpu_range = (float(cpu_per_step.min()) * steps, float(cpu_per_step.max()) * steps)

        # (B) MCMC.run, compile time reported by JAX subtracted (wall only)
        mcmc = MCMC(MILE(mlp_regression), thinning=thinning, chain_method="vectorized", progress_bar=False, **settings)
        with clock.measure(), Stopwatch() as b:
            mcmc.run(jax.random.PRNGKey(2), X, y, hidden=hidden, init_params=init)
            finished(mcmc)
        rows.append(
            dict(
                width=width,
                d=est["step"].num_params,
                steps=steps,
                W=W,
                S=S,
                thinning=thinning,
                grad_wall=est["gradient"].predicted_seconds,
                grad_cpu=est["gradient"].predicted_cpu_seconds,
                step_wall=est["step"].predicted_seconds,
                step_cpu=est["step"].predicted_cpu_seconds,
                step_compile=est["step"].compile_seconds,
                a_wall=a_wall,
                a_cpu=a_cpu,
                a_first=progress[0].seconds,
                a_cpu_range=a_cpu_range,
                b_wall=b.wall - clock.total,
                b_total=b.wall,
                b_cpu=b.cpu,
                b_compile=clock.total,
                load=(load0, load_average()),
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


# ---------------------------------------------------------------------------------------------- part 2: memory
def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset this process's peak resident memory (Linux >= 4.0: ``/proc/self/clear_refs``).

    ``ru_maxrss`` cannot be used in a subprocess: Linux keeps the parent's peak across ``exec``."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident memory since the last reset (``VmHWM``), else ``ru_maxrss``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_child(config: dict) -> dict:
    """Runs in a subprocess: one MILE run in memory or streamed; returns peak RSS and times."""
    import jax
    from numpyro.infer import MCMC

    from numpyro_mile import MILE, run_chunked
    from numpyro_mile.models import mlp_regression

    X, y = synthetic(config["rows"])
    hidden = (config["width"],) * 2
    init = small_init(X, y, hidden, config["chains"])
    mcmc = MCMC(
        MILE(mlp_regression),
        num_warmup=config["warmup"],
        num_samples=config["samples"],
        num_chains=config["chains"],
        chain_method="vectorized",
        progress_bar=False,
    )
    reset_peak_rss()
    before = rss_now()
    with Stopwatch() as clock:
        if config["mode"] == "memory":
            mcmc.run(jax.random.PRNGKey(2), X, y, hidden=hidden, init_params=init)
            samples = mcmc.get_samples()
            jax.block_until_ready(samples)
            held = sum(int(v.nbytes) for v in samples.values())
        else:
            with tempfile.TemporaryDirectory() as tmp:
                out = run_chunked(
                    mcmc,
                    jax.random.PRNGKey(2),
                    X,
                    y,
                    hidden=hidden,
                    init_params=init,
                    checkpoint_path=Path(tmp) / "run.ckpt",
                    chunk_size=config["chunk_size"],
                )
                samples = out.get_samples(group_by_chain=True)  # memory-mapped: not read
                held = sum(int(v.nbytes) for v in samples.values())
    peak = peak_rss()
    return dict(config, rss_before=before, peak=peak, samples_bytes=held, wall=clock.wall, cpu=clock.cpu)


def memory_part(args) -> list[dict]:
    import jax

    from numpyro_mile import MILE
    from numpyro_mile.models import mlp_regression

    rows_data = 256
    X, y = synthetic(rows_data)
    hidden = (args.memory_width,) * 2
    results = []
    for samples in args.memory_samples:
        for mode in ("memory", "stream"):
            config = dict(
                mode=mode,
                width=args.memory_width,
                rows=rows_data,
                chains=args.chains,
                warmup=200,
                samples=samples,
                chunk_size=args.chunk_size,
            )
            est = MILE(mlp_regression).estimate_cost(
                jax.random.PRNGKey(0),
                X,
                y,
                hidden=hidden,
                num_warmup=200,
                num_samples=samples,
                num_chains=args.chains,
                chunk_size=args.chunk_size if mode == "stream" else None,
                min_seconds=0.1,
            )
            load0 = load_average()
            proc = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(config)],
                capture_output=True,
                text=True,
                env=dict(os.environ, CI="1"),
                timeout=3600,
            )
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result.update(
                predicted=est.predicted_bytes,
                predicted_samples=est.sample_bytes,
                predicted_state=est.state_bytes,
                d=est.num_params,
                load=(load0, load_average()),
            )
            results.append(result)
            print(json.dumps(result), flush=True)
    return results


# ---------------------------------------------------------------------------------------------- part 3: precision
def precision_part(args) -> dict:
    import jax
    from numpyro.infer import MCMC

    from numpyro_mile import MILE, deep_ensemble, log_likelihood, predict, run_chunked
    from numpyro_mile.datasets import load_uci, split, standardize, toy_regression
    from numpyro_mile.metrics import lppd, rmse
    from numpyro_mile.models import mlp_regression
    from numpyro_mile._arrays import round_to_dtype

    folder = data_dir(args.data)
    try:
        X, y = load_uci("energy", data_dir=folder)
        source = f"UCI energy from {folder}, split seed 1 (70/10/20), standardised with training statistics"
    except FileNotFoundError:
        X, y = toy_regression(500)
        source = "toy_regression(500) (FALLBACK: energy.data not found), split seed 1"
    parts, _ = standardize(split(X, y, seed=1))
    (Xtr, ytr), (Xte, yte) = parts.train, parts.test
    Xtr, ytr, Xte, yte = (np.asarray(a, np.float32) for a in (Xtr, ytr, Xte, yte))
    with Stopwatch() as de_clock:
        de = deep_ensemble(mlp_regression, jax.random.PRNGKey(1), args.chains, Xtr, ytr, progress_bar=False)
    thinning = 10
    mcmc = MCMC(
        MILE(mlp_regression),
        num_warmup=args.precision_warmup,
        num_samples=args.precision_samples,
        num_chains=args.chains,
        chain_method="vectorized",
        thinning=thinning,
        progress_bar=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        with Stopwatch() as run_clock:
            out = run_chunked(
                mcmc,
                jax.random.PRNGKey(2),
                Xtr,
                ytr,
                init_params=de.init_params,
                checkpoint_path=Path(tmp) / "run.ckpt",
                chunk_size=1000,
                store_dtype="float32",
            )
        samples32 = {k: np.array(v) for k, v in out.get_samples().items()}
    rows = []
    ref_ll = None
    for name in ("float32", "bfloat16", "float16"):
        samples = {k: round_to_dtype(v, name).astype(np.float32) for k, v in samples32.items()}
        ll = log_likelihood(mlp_regression, samples, Xte, yte)["y"]
        mu = predict(mlp_regression, samples, Xte, reduce="moments")["mu"].mean
        value, pointwise = lppd(ll, pointwise=True)
        ref_ll = pointwise if ref_ll is None else ref_ll
        weights_err = max(
            float(np.max(np.abs(samples[k] - samples32[k]) / (np.abs(samples32[k]) + 1e-30))) for k in samples
        )
        rows.append(
            dict(
                dtype=name,
                bytes=int(sum(v.size for v in samples32.values()) * (4 if name == "float32" else 2)),
                lppd=float(value),
                rmse=float(rmse(yte, mu)),
                max_pointwise_change=float(np.max(np.abs(pointwise - ref_ll))),
                max_rel_weight_error=weights_err,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return dict(
        rows=rows,
        source=source,
        n_train=len(ytr),
        n_test=len(yte),
        draws=len(samples32["w0"]),
        de_seconds=de_clock.wall,
        run_seconds=run_clock.wall,
        warmup=args.precision_warmup,
        samples=args.precision_samples,
        thinning=thinning,
        chains=args.chains,
    )


# ---------------------------------------------------------------------------------------------- report
def fmt_bytes(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _load(row: dict) -> str:
    """The load averages at the start and end of a measurement, ``a -> b``."""
    return f"{row['load'][0]:.1f} -> {row['load'][1]:.1f}"


def write_plot(cost_rows, memory_rows, path: Path) -> bool:
    try:
        plt = pyplot()
    except ImportError:
        return False
    panels = (1 if cost_rows else 0) + (1 if memory_rows else 0)
    if panels == 0:
        return False
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    ax_i = 0
    if cost_rows:
        ax = axes[0, ax_i]
        ax_i += 1
        measured = np.array([r["a_cpu"] / r["steps"] * 1e3 for r in cost_rows])
        for key, label, marker in (
            ("step_cpu", "estimate_cost(method='step')", "o"),
            ("grad_cpu", "estimate_cost(method='gradient')", "s"),
        ):
            pred = np.array([r[key] / r["steps"] * 1e3 for r in cost_rows])
            ax.loglog(measured, pred, marker, label=label)
            for r, m, p in zip(cost_rows, measured, pred):
                ax.annotate(f"w={r['width']}", (m, p), fontsize=7, xytext=(3, 3), textcoords="offset points")
        lims = np.array([measured.min() / 2, measured.max() * 2])
        ax.loglog(lims, lims, "k-", lw=0.8, label="predicted = measured")
        ax.fill_between(lims, lims * 0.8, lims * 1.2, color="grey", alpha=0.2, label="±20 %")
        ax.set_xlabel("measured CPU ms per step (run_chunked, compiled)")
        ax.set_ylabel("predicted CPU ms per step")
        ax.set_title("MILE cost: prediction vs measurement")
        ax.legend(fontsize=7)
    if memory_rows:
        ax = axes[0, ax_i]
        labels = [f"{r['mode']}\nS={r['samples']}" for r in memory_rows]
        growth = [(r["peak"] - r["rss_before"]) / 2**20 for r in memory_rows]
        pred = [r["predicted"] / 2**20 for r in memory_rows]
        xs = np.arange(len(labels))
        ax.bar(xs - 0.2, growth, 0.4, label="measured: peak RSS - RSS before the run")
        ax.bar(xs + 0.2, pred, 0.4, label="estimate_cost predicted_bytes")
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_ylabel("MiB")
        ax.set_title("Memory: in memory vs streamed")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def _provenance(saved: dict, part: str) -> list[str]:
    entry = saved[part]
    return [
        f"Command: `{entry['command']}`. Machine: " + "; ".join(f"{k}: {v}" for k, v in entry["info"].items()) + ".",
        "",
    ]


def report(saved, cost_rows, memory_rows, precision, plot_name) -> str:
    lines = [
        "# Long runs: cost prediction, streaming memory, storage precision",
        "",
        "Generated by `benchmarks/long_runs.py` (see its docstring for the method; each part records the "
        "command and machine it was run with; raw numbers in `long_runs.json`).",
        "",
        "The machine is shared with other jobs (see the load averages, on "
        f"{os.cpu_count()} CPUs): wall times are inflated by other processes, unevenly; CPU times much less, "
        "so ratios are given for both.",
        "",
    ]
    if plot_name:
        lines += [f"![prediction vs measurement; memory]({plot_name})", ""]
    if cost_rows:
        args = argparse.Namespace(**saved["cost"]["args"])
        lines += (
            ["## 1. Predicted vs measured run time", ""]
            + _provenance(saved, "cost")
            + [
                f"`mlp_regression(hidden=(w, w))` on synthetic data ({args.rows} x {FEATURES}), {args.chains} "
                "vectorized chains, no pretraining. Predictions: `MILE(model).estimate_cost(..., method=...)`"
                ".predicted_seconds / .predicted_cpu_seconds (timed for "
                f"{args.estimate_seconds:g} s). (A): `run_chunked` in {CHUNKS} chunks; the median cost per step of "
                "chunks 2-10 (no compilation), times the steps; CPU range over those chunks in brackets; (B): "
                "`MCMC.run` wall time minus the compile "
                "time JAX reports (its CPU column includes compilation).",
                "",
            ]
        )
        rows = [
            [
                r["width"],
                r["d"],
                f"{r['steps']} ({r['W']}+{r['S']})",
                f"{r['step_wall']:.2f}",
                f"{r['step_cpu']:.2f}",
                f"{r['grad_cpu']:.2f}",
                f"{r['a_wall']:.2f}",
                f"{r['a_cpu']:.2f} [{r['a_cpu_range'][0]:.2f}-{r['a_cpu_range'][1]:.2f}]",
                f"{r['b_wall']:.2f}",
                f"{r['b_cpu']:.2f}",
                f"{r['step_wall'] / r['a_wall']:.2f}",
                f"{r['step_cpu'] / r['a_cpu']:.2f}",
                f"{r['grad_cpu'] / r['a_cpu']:.2f}",
                f"{r['step_wall'] / r['b_wall']:.2f}",
                _load(r),
            ]
            for r in cost_rows
        ]
        lines += markdown_table(
            [
                "w",
                "d",
                "steps (W+S)",
                "pred. step wall s",
                "pred. step CPU s",
                "pred. gradient CPU s",
                "(A) wall s",
                "(A) CPU s",
                "(B) wall s",
                "(B) CPU s incl. compile",
                "step/(A) wall",
                "step/(A) CPU",
                "gradient/(A) CPU",
                "step/(B) wall",
                "load",
            ],
            rows,
            "rrlrrrrrrrrrrrl",
            compact=True,
        )
        within = [abs(r["step_cpu"] / r["a_cpu"] - 1) <= 0.2 for r in cost_rows]
        within_wall = [abs(r["step_wall"] / r["a_wall"] - 1) <= 0.2 for r in cost_rows]
        grad_ratio = [r["grad_cpu"] / r["a_cpu"] for r in cost_rows]
        lines += [
            "",
            f"- `method='step'` within 20 % of (A): {sum(within)}/{len(within)} widths in CPU time, "
            f"{sum(within_wall)}/{len(within_wall)} in wall time.",
            f"- `method='gradient'` (2 gradient evaluations per step, the floor) predicts "
            f"{min(grad_ratio):.2f}-{max(grad_ratio):.2f} of the measured CPU time: MILE's non-gradient "
            "work per step (integrator, tuning bookkeeping, O(d)) matters most for small networks.",
            "- Compilation (not in the predictions): "
            + "; ".join(
                f"w={r['width']}: `MCMC.run` {r['b_compile']:.1f} s, first chunk of (A) {r['a_first']:.1f} s, "
                f"estimate's step compile {r['step_compile']:.1f} s"
                for r in cost_rows
            )
            + ".",
            "",
        ]
    if memory_rows:
        m0 = memory_rows[0]
        args = argparse.Namespace(**saved["memory"]["args"])
        lines += (
            ["## 2. Peak memory: streamed vs in memory", ""]
            + _provenance(saved, "memory")
            + [
                f"MILE on `mlp_regression(hidden=({m0['width']}, {m0['width']}))` (d = {m0['d']}), "
                f"{m0['rows']} rows, {m0['chains']} chains, num_warmup {m0['warmup']}, thinning 1; one subprocess "
                "per row. In memory: `MCMC.run` then `get_samples()`; streamed: `run_chunked(chunk_size="
                f"{m0['chunk_size']})` (draws memory-mapped afterwards, not read). Peak = `VmHWM`, reset just "
                "before the run; growth = peak - resident memory just before the run (imports, data and initial "
                "values loaded).",
                "",
            ]
        )
        rows = [
            [
                r["mode"],
                r["samples"],
                fmt_bytes(r["samples_bytes"]),
                fmt_bytes(r["peak"]),
                fmt_bytes(r["peak"] - r["rss_before"]),
                fmt_bytes(r["predicted"]),
                f"{r['wall']:.1f}",
                f"{r['cpu']:.1f}",
                _load(r),
            ]
            for r in memory_rows
        ]
        lines += markdown_table(
            [
                "mode",
                "num_samples",
                "draws size",
                "peak RSS",
                "growth",
                "predicted (`predicted_bytes`)",
                "wall s",
                "CPU s",
                "load",
            ],
            rows,
            "lrrrrrrrl",
            compact=True,
        )
        by = {(r["mode"], r["samples"]): r for r in memory_rows}
        s1, s2 = args.memory_samples
        if all((m, s) in by for m in ("memory", "stream") for s in (s1, s2)):
            grow = lambda r: r["peak"] - r["rss_before"]  # noqa: E731
            lines += [
                "",
                f"- Doubling num_samples ({s1} -> {s2}) grows the in-memory peak by "
                f"{fmt_bytes(grow(by['memory', s2]) - grow(by['memory', s1]))} and the streamed peak by "
                f"{fmt_bytes(grow(by['stream', s2]) - grow(by['stream', s1]))}.",
                f"- At num_samples={s2}: streamed peak growth / in-memory peak growth = "
                f"{grow(by['stream', s2]) / grow(by['memory', s2]):.2f}; in-memory growth / size of the draws = "
                f"{grow(by['memory', s2]) / by['memory', s2]['samples_bytes']:.2f} (NumPyro holds the collection, "
                "a chain-major copy and the flattened `get_samples()` copy at once); the growth also contains "
                "XLA's compilation memory, in both modes.",
            ]
        lines.append("")
    if precision:
        p = precision
        lines += (
            ["## 3. Storage precision and test LPPD", ""]
            + _provenance(saved, "precision")
            + [
                f"{p['source']}: {p['n_train']} training / {p['n_test']} test rows; deep ensemble of {p['chains']} "
                f"members ({p['de_seconds']:.0f} s), MILE num_warmup {p['warmup']}, num_samples {p['samples']}, "
                f"thinning {p['thinning']} ({p['draws']} draws in all, {p['run_seconds']:.0f} s with "
                "`run_chunked`). The same draws, rounded to each storage dtype (what `store_dtype` writes), "
                "evaluated on the test split:",
                "",
            ]
        )
        rows = [
            [
                r["dtype"],
                fmt_bytes(r["bytes"]),
                f"{r['lppd']:.5f}",
                f"{r['rmse']:.5f}",
                f"{r['max_pointwise_change']:.2e}",
                f"{r['max_rel_weight_error']:.1e}",
            ]
            for r in p["rows"]
        ]
        lines += markdown_table(
            [
                "storage",
                "size of the draws",
                "test LPPD",
                "test RMSE",
                "max change of a pointwise LPPD",
                "max relative weight error",
            ],
            rows,
            compact=True,
        )
        base = p["rows"][0]
        lines += [
            "",
            "- LPPD change vs float32: "
            + ", ".join(f"{r['dtype']} {r['lppd'] - base['lppd']:+.2e}" for r in p["rows"][1:])
            + ".",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.simplefilter("ignore")
    if args.child:
        print(json.dumps(memory_child(json.loads(args.child))))
        return 0
    info = machine_info()
    start_load = load_average()
    out = Path(args.output)
    saved_path = out.with_suffix(".json")
    saved = json.loads(saved_path.read_text()) if saved_path.exists() and not args.no_write else {}
    command = command_line(__file__, argv)
    runners = {"cost": cost_part, "memory": memory_part, "precision": precision_part}
    for part in args.parts:
        result = runners[part](args)
        saved[part] = {
            "result": result,
            "command": command,
            "info": dict(info, **{"load average at start/end": f"{start_load:.1f} / {load_average():.1f}"}),
            "args": vars(args),
        }
    cost_rows = saved.get("cost", {}).get("result", [])
    memory_rows = saved.get("memory", {}).get("result", [])
    precision = saved.get("precision", {}).get("result")
    plot = out.with_suffix(".png")
    plot_name = None
    if not args.no_write:
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_name = plot.name if write_plot(cost_rows, memory_rows, plot) else None
    text = report(saved, cost_rows, memory_rows, precision, plot_name)
    if args.no_write:
        print(text)
    else:
        saved_path.write_text(json.dumps(saved, indent=1, default=str))
        out.write_text(text)
        print(f"wrote {out} and {saved_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
