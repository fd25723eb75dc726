"""Chains per second against the number of devices: MILE, SGLD and ICSGLD with ``run_distributed``.

Setting: the MILE benchmark BNN (``mlp_regression``, hidden layers (16, 16), 402 parameters) on
the standardised training split (seed 1, 70 %) of UCI airfoil (a generated 1-d regression set
of the same size when the UCI files are missing), ``K`` chains (default 8), float32. For each
device count ``D`` a fresh Python process starts with ``D`` virtual CPU devices
(``--xla_force_host_platform_device_count=D``) and runs each kernel through
:func:`numpyro_mile.run_distributed` twice with the same key: the first call compiles, the
second is timed (wall and process CPU time), so the table holds the cost of the sampling loop
itself. ``D = 1`` also times a plain ``mcmc.run`` (no sharding) as the baseline.

Virtual devices share the machine's physical cores: on a 2-core machine at most a 2x speedup
is possible, whatever ``D``. On several GPUs or hosts the same code runs one block of chains per
device. The report records the load average, since other jobs may share the CPU.

Usage::

    python benchmarks/devices.py                         # writes docs/benchmarks/devices.md
    python benchmarks/devices.py --devices 1 2 --chains 4 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from _common import (
    ROOT,
    Stopwatch,
    add_common_options,
    argument_parser,
    command_line,
    compile_ahead,
    data_dir,
    fastest,
    load_average,
    load_span,
    machine_summary,
    markdown_table,
)

REPORT = ROOT / "docs" / "benchmarks" / "devices.md"
RAW = REPORT.with_suffix(".json")
HIDDEN = (16, 16)
BATCH = 32


def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--chains", type=int, default=8)
    p.add_argument("--mile-steps", type=int, default=300, help="MILE steps per timed loop")
    p.add_argument("--sgld-steps", type=int, default=3000, help="SGLD / ICSGLD steps per timed loop")
    p.add_argument("--repeats", type=int, default=3)
    add_common_options(p, data="airfoil.data", no_write="print the report, write no files")
    p.add_argument("--from-json", default=None, help="rewrite the report from a saved devices.json, run nothing")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- worker
def load_data(folder):
    import jax.numpy as jnp

    from numpyro_mile.datasets import load_uci, split, standardize, toy_regression

    try:
        X, y = load_uci("airfoil", data_dir=folder)
    except (FileNotFoundError, ValueError):
        X, y = toy_regression(1052, seed=1)
        return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32), "generated 1-d regression, N = 1052"
    parts, _ = standardize(split(X, y, seed=1))
    X_train, y_train = parts.train
    return (
        jnp.asarray(X_train, jnp.float32),
        jnp.asarray(y_train, jnp.float32),
        f"UCI airfoil training split, N = {len(y_train)}",
    )


def timed_loop(kernel, state, steps: int, model_args, model_kwargs, repeats: int):
    """``steps`` calls of ``kernel.sample`` in one jitted ``fori_loop`` on the (sharded) ``state``.

    Returns ``(compile s, best wall s, CPU s of that repeat)``; the output keeps the state's sharding.
    """
    import jax

    def loop(s):
        return jax.lax.fori_loop(0, steps, lambda i, s: kernel.sample(s, model_args, model_kwargs), s)

    compiled, compile_s = compile_ahead(loop, state)
    (best,) = fastest([lambda: compiled(state)], repeats)
    return compile_s, best.wall, best.cpu


def worker(args) -> dict:
    import warnings

    import jax
    import numpy as np
    from numpyro.infer import MCMC, init_to_uniform
    from numpyro.infer.util import initialize_model

    from numpyro_mile import ICSGLD, MILE, SGLD, run_distributed
    from numpyro_mile.models import mlp_regression

    warnings.simplefilter("ignore")
    X, y, data = load_data(data_dir(args.data))
    K = args.chains
    info = initialize_model(
        jax.random.split(jax.random.PRNGKey(1), K),
        mlp_regression,
        model_args=(X, y),
        model_kwargs=dict(hidden=HIDDEN),
        init_strategy=init_to_uniform(radius=0.1),
    )
    init = info.param_info.z
    dim = int(sum(np.prod(v.shape[1:]) for v in init.values()))
    kernels = {
        "MILE (full batch)": (lambda: MILE(mlp_regression), dict(hidden=HIDDEN), args.mile_steps),
        f"SGLD (n={BATCH})": (
            lambda: SGLD(mlp_regression, 1e-5),
            dict(hidden=HIDDEN, subsample_size=BATCH),
            args.sgld_steps,
        ),
        f"ICSGLD (n={BATCH})": (
            lambda: ICSGLD(mlp_regression, 1e-5, zeta=1.0, num_bins=100, bin_width=200.0, min_energy=-2000.0),
            dict(hidden=HIDDEN, subsample_size=BATCH),
            args.sgld_steps,
        ),
    }
    rows = []
    for name, (make, kwargs, steps) in kernels.items():
        methods = ["run_distributed"] + (["mcmc.run (no sharding)"] if jax.device_count() == 1 else [])
        for method in methods:
            mcmc = MCMC(
                make(), num_warmup=100, num_samples=10, num_chains=K, chain_method="vectorized", progress_bar=False
            )
            with Stopwatch() as end_to_end:
                if method == "run_distributed":
                    run_distributed(mcmc, jax.random.PRNGKey(0), X, y, init_params=init, **kwargs)
                else:
                    mcmc.run(jax.random.PRNGKey(0), X, y, init_params=init, **kwargs)
                jax.block_until_ready(mcmc.last_state)
            state = mcmc.last_state
            specs = sorted({str(tuple(x.sharding.spec)) for x in jax.tree.leaves(state) if hasattr(x.sharding, "spec")})
            compile_s, loop_wall, loop_cpu = timed_loop(mcmc.sampler, state, steps, (X, y), kwargs, args.repeats)
            rows.append(
                dict(
                    kernel=name,
                    method=method,
                    steps=steps,
                    wall=loop_wall,
                    cpu=loop_cpu,
                    compile=compile_s,
                    end_to_end=end_to_end.wall,
                    specs=specs,
                    chain_steps_per_s=K * steps / loop_wall,
                )
            )
    return dict(
        devices=jax.device_count(), backend=jax.default_backend(), data=data, dim=dim, rows=rows, jax=jax.__version__
    )


# ---------------------------------------------------------------------------------------------- driver
def run_worker(D: int, argv: list[str]) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={D}", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", str(D), *argv], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker with {D} devices failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(args, argv: list[str], results: list[dict], load: tuple, elapsed: float, cpu_children: float) -> str:
    first = results[0]
    lines = [
        "# Chains per second against the number of devices",
        "",
        f"Generated by `{command_line(__file__, argv)}` on {date.today().isoformat()}.",
        "",
        f"Machine: {machine_summary(software=False)}; JAX {first['jax']}, backend {first['backend']} with *virtual* "
        "CPU devices (`--xla_force_host_platform_device_count=D`), which share the machine's physical cores. "
        f"{load_span(*load)}: other jobs shared the CPU, so times are indicative. Whole benchmark: {elapsed:.0f} s "
        f"wall, {cpu_children:.0f} s CPU.",
        "",
        f"Setting: `mlp_regression`, hidden layers {HIDDEN} (d = {first['dim']}), {first['data']}, "
        f"K = {args.chains} chains, float32. Each kernel first runs through `numpyro_mile.run_distributed` "
        "(100 warmup + 10 samples; `end to end` is its wall time, tracing and compilation included, which NumPyro "
        "repeats on every `run`); then its sharded last state is advanced by "
        f"T steps of `kernel.sample` in one jitted `fori_loop` (MILE T = {args.mile_steps}, 2 gradients per "
        f"step, full batch; SGLD and ICSGLD T = {args.sgld_steps} on minibatches of {BATCH} rows), compiled "
        f"ahead and timed {args.repeats} times (best wall time, with the CPU time of that repeat). The loop keeps "
        "the chains sharded (checked: every per-chain array of the state is laid out over the `chains` axis). "
        "Chain-steps per second = K x T / wall time; speedup relative to `run_distributed` on 1 device.",
        "",
    ]
    base = {r["kernel"]: r["chain_steps_per_s"] for r in first["rows"] if r["method"] == "run_distributed"}
    base_cpu = {r["kernel"]: r["cpu"] for r in first["rows"] if r["method"] == "run_distributed"}
    by_kernel: dict[str, list] = {}
    for res in results:
        for r in res["rows"]:
            by_kernel.setdefault(r["kernel"], []).append((res["devices"], r))
    rows = [
        [
            kernel,
            D,
            r["method"],
            -(-args.chains // D),
            f"{r['wall']:.2f}",
            f"{r['cpu']:.2f}",
            f"{r['chain_steps_per_s']:.0f}",
            f"{r['chain_steps_per_s'] / base[kernel]:.2f}x",
            f"{r['cpu'] / base_cpu[kernel]:.2f}x",
            f"{r['compile']:.1f}",
            f"{r['end_to_end']:.1f}",
        ]
        for kernel, entries in by_kernel.items()
        for D, r in entries
    ]
    lines += markdown_table(
        [
            "kernel",
            "devices",
            "method",
            "chains per device",
            "loop wall (s)",
            "loop CPU (s)",
            "chain-steps / s",
            "speedup",
            "CPU vs 1 device",
            "loop compile (s)",
            "end to end (s)",
        ],
        rows,
        "lrlrrrrrrrr",
        compact=True,
    )
    lines += [
        "",
        "Reading the table: the devices here are threads of one process on the same 2 physical cores, so "
        "the ideal is a 2x speedup from 1 to 2 devices and nothing beyond; CPU time above wall time means "
        "several cores worked, wall time above CPU time that the process waited for a core (other jobs). "
        "`CPU vs 1 device` compares the work done for the same chain-steps: close to 1x means that sharding "
        "adds no computation. On real accelerators each "
        "device brings its own compute, and the only "
        "per-step traffic is a few scalars (MILE, SGLD) or ICSGLD's m-bin histogram update (see "
        "`docs/distributed.md`).",
        "",
    ]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args)))
        return
    if args.from_json:
        raw = json.loads(Path(args.from_json).read_text())
        REPORT.write_text(
            report(
                parse_args(raw["argv"]),
                raw["argv"],
                raw["results"],
                tuple(raw["loads"]),
                raw["elapsed"],
                raw["cpu_children"],
            )
        )
        print(f"wrote {REPORT}")
        return
    passthrough = [a for a in argv if a != "--no-write"]
    load_start = load_average()
    start, cpu_start = time.perf_counter(), os.times()
    results = []
    for D in args.devices:
        res = run_worker(D, passthrough)
        results.append(res)
        for r in res["rows"]:
            print(
                f"D={D} {r['kernel']:<18} {r['method']:<24} wall {r['wall']:.2f}s cpu {r['cpu']:.2f}s "
                f"{r['chain_steps_per_s']:.0f} chain-steps/s (compile {r['compile']:.1f}s, end to end "
                f"{r['end_to_end']:.1f}s, specs {r['specs']})",
                flush=True,
            )
    end = os.times()
    cpu_children = (end.children_user + end.children_system) - (cpu_start.children_user + cpu_start.children_system)
    loads, elapsed = (load_start, load_average()), time.perf_counter() - start
    text = report(args, passthrough, results, loads, elapsed, cpu_children)
    if args.no_write:
        print(text)
    else:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(text)
        RAW.write_text(
            json.dumps(
                dict(argv=passthrough, results=results, loads=loads, elapsed=elapsed, cpu_children=cpu_children),
                indent=1,
            )
        )
        print(f"wrote {REPORT} and {RAW}")


if __name__ == "__main__":
    main()
