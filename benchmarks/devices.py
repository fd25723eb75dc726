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

from _machine import cpu_model  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "benchmarks" / "devices.md"
RAW = REPORT.with_suffix(".json")
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "uci"
HIDDEN = (16, 16)
BATCH = 32


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--chains", type=int, default=8)
    p.add_argument("--mile-steps", type=int, default=300, help="MILE steps per timed loop")
    p.add_argument("--sgld-steps", type=int, default=3000, help="SGLD / ICSGLD steps per timed loop")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=os.environ.get("NUMPYRO_MILE_DATA") or str(DEFAULT_DATA))
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--from-json", default=None, help="rewrite the report from a saved devices.json, run nothing")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def machine() -> str:
    cpu = cpu_model()
    return f"{cpu}, {os.cpu_count()} logical cores ({len(os.sched_getaffinity(0))} usable)"


# ---------------------------------------------------------------------------------------------- worker
def load_data(data_dir):
    import jax.numpy as jnp

    from numpyro_mile.datasets import load_uci, split, standardize, toy_regression

    try:
        X, y = load_uci("airfoil", data_dir=data_dir)
    except (FileNotFoundError, ValueError):
        X, y = toy_regression(1052, seed=1)
        return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32), "generated 1-d regression, N = 1052"
    parts, _ = standardize(split(X, y, seed=1))
    X_train, y_train = parts.train
    return (jnp.asarray(X_train, jnp.float32), jnp.asarray(y_train, jnp.float32),
            f"UCI airfoil training split, N = {len(y_train)}")


def timed_loop(kernel, state, steps: int, model_args, model_kwargs, repeats: int):
    """``steps`` calls of ``kernel.sample`` in one jitted ``fori_loop`` on the (sharded) ``state``.

    Returns ``(compile s, best wall s, CPU s of that repeat)``; the output keeps the state's sharding.
    """
    import jax

    def loop(s):
        return jax.lax.fori_loop(0, steps, lambda i, s: kernel.sample(s, model_args, model_kwargs), s)

    start = time.perf_counter()
    compiled = jax.jit(loop).lower(state).compile()
    compile_s = time.perf_counter() - start
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(state))
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return compile_s, best[0], best[1]


def worker(args) -> dict:
    import warnings

    import jax
    import numpy as np
    from numpyro.infer import MCMC, init_to_uniform
    from numpyro.infer.util import initialize_model

    from numpyro_mile import ICSGLD, MILE, SGLD, run_distributed
    from numpyro_mile.models import mlp_regression

    warnings.simplefilter("ignore")
    X, y, data = load_data(args.data)
    K = args.chains
    info = initialize_model(jax.random.split(jax.random.PRNGKey(1), K), mlp_regression, model_args=(X, y),
                            model_kwargs=dict(hidden=HIDDEN), init_strategy=init_to_uniform(radius=0.1))
    init = info.param_info.z
    dim = int(sum(np.prod(v.shape[1:]) for v in init.values()))
    kernels = {
        "MILE (full batch)": (lambda: MILE(mlp_regression), dict(hidden=HIDDEN), args.mile_steps),
        f"SGLD (n={BATCH})": (lambda: SGLD(mlp_regression, 1e-5), dict(hidden=HIDDEN, subsample_size=BATCH),
                              args.sgld_steps),
        f"ICSGLD (n={BATCH})": (lambda: ICSGLD(mlp_regression, 1e-5, zeta=1.0, num_bins=100, bin_width=200.0,
                                               min_energy=-2000.0),
                                dict(hidden=HIDDEN, subsample_size=BATCH), args.sgld_steps),
    }
    rows = []
    for name, (make, kwargs, steps) in kernels.items():
        methods = ["run_distributed"] + (["mcmc.run (no sharding)"] if jax.device_count() == 1 else [])
        for method in methods:
            mcmc = MCMC(make(), num_warmup=100, num_samples=10, num_chains=K, chain_method="vectorized",
                        progress_bar=False)
            wall = time.perf_counter()
            if method == "run_distributed":
                run_distributed(mcmc, jax.random.PRNGKey(0), X, y, init_params=init, **kwargs)
            else:
                mcmc.run(jax.random.PRNGKey(0), X, y, init_params=init, **kwargs)
            jax.block_until_ready(mcmc.last_state)
            end_to_end = time.perf_counter() - wall
            state = mcmc.last_state
            specs = sorted({str(tuple(x.sharding.spec)) for x in jax.tree.leaves(state)
                            if hasattr(x.sharding, "spec")})
            compile_s, loop_wall, loop_cpu = timed_loop(mcmc.sampler, state, steps, (X, y), kwargs, args.repeats)
            rows.append(dict(kernel=name, method=method, steps=steps, wall=loop_wall, cpu=loop_cpu,
                             compile=compile_s, end_to_end=end_to_end, specs=specs,
                             chain_steps_per_s=K * steps / loop_wall))
    return dict(devices=jax.device_count(), backend=jax.default_backend(), data=data, dim=dim, rows=rows,
                jax=jax.__version__)


# ---------------------------------------------------------------------------------------------- driver
def run_worker(D: int, argv: list[str]) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={D}", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, __file__, "--worker", str(D), *argv], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker with {D} devices failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(args, argv: list[str], results: list[dict], load: tuple, elapsed: float, cpu_children: float) -> str:
    first = results[0]
    lines = [
        "# Chains per second against the number of devices",
        "",
        f"Generated by `{' '.join(['python benchmarks/devices.py', *argv])}` on {date.today().isoformat()}.",
        "",
        f"Machine: {machine()}; JAX {first['jax']}, backend {first['backend']} with *virtual* CPU devices "
        "(`--xla_force_host_platform_device_count=D`), which share the machine's physical cores. "
        f"Load average (1 min) {load[0]:.1f} at the start and {load[1]:.1f} at the end: other jobs shared the CPU, "
        f"so times are indicative. Whole benchmark: {elapsed:.0f} s wall, {cpu_children:.0f} s CPU.",
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
        "| kernel | devices | method | chains per device | loop wall (s) | loop CPU (s) | chain-steps / s | speedup | "
        "CPU vs 1 device | loop compile (s) | end to end (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r["kernel"]: r["chain_steps_per_s"] for r in first["rows"] if r["method"] == "run_distributed"}
    base_cpu = {r["kernel"]: r["cpu"] for r in first["rows"] if r["method"] == "run_distributed"}
    by_kernel: dict[str, list] = {}
    for res in results:
        for r in res["rows"]:
            by_kernel.setdefault(r["kernel"], []).append((res["devices"], r))
    for kernel, entries in by_kernel.items():
        for D, r in entries:
            per_device = -(-args.chains // D)
            lines.append(
                f"| {kernel} | {D} | {r['method']} | {per_device} | {r['wall']:.2f} | {r['cpu']:.2f} | "
                f"{r['chain_steps_per_s']:.0f} | {r['chain_steps_per_s'] / base[kernel]:.2f}x | "
                f"{r['cpu'] / base_cpu[kernel]:.2f}x | {r['compile']:.1f} | "
                f"{r['end_to_end']:.1f} |"
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
        REPORT.write_text(report(parse_args(raw["argv"]), raw["argv"], raw["results"], tuple(raw["loads"]),
                                 raw["elapsed"], raw["cpu_children"]))
        print(f"wrote {REPORT}")
        return
    passthrough = [a for a in argv if a != "--no-write"]
    load_start = os.getloadavg()
    start, cpu_start = time.perf_counter(), os.times()
    results = []
    for D in args.devices:
        res = run_worker(D, passthrough)
        results.append(res)
        for r in res["rows"]:
            print(f"D={D} {r['kernel']:<18} {r['method']:<24} wall {r['wall']:.2f}s cpu {r['cpu']:.2f}s "
                  f"{r['chain_steps_per_s']:.0f} chain-steps/s (compile {r['compile']:.1f}s, end to end "
                  f"{r['end_to_end']:.1f}s, specs {r['specs']})", flush=True)
    end = os.times()
    cpu_children = (end.children_user + end.children_system) - (cpu_start.children_user + cpu_start.children_system)
    loads, elapsed = (load_start[0], os.getloadavg()[0]), time.perf_counter() - start
    text = report(args, passthrough, results, loads, elapsed, cpu_children)
    if args.no_write:
        print(text)
    else:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(text)
        RAW.write_text(json.dumps(dict(argv=passthrough, results=results, loads=loads, elapsed=elapsed,
                                       cpu_children=cpu_children), indent=1))
        print(f"wrote {REPORT} and {RAW}")


if __name__ == "__main__":
    main()
