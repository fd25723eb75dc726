"""Compile time and per-step cost of MILE on CPU, against the gradient floor and BlackJAX's own loop.

Two parts, in one script run (timed work runs alone; nothing else of the script runs beside it):

**1. Compilation** (the issue's "small job": ``toy_regression(300)``, ``mlp_regression`` hidden
(16, 16), 4 vectorized chains, ``num_warmup=1000``, ``num_samples=500``, deep-ensemble pretraining
with MILE's defaults). Each measurement runs in a fresh Python process that does two runs: the
first, then a second with a new ``MCMC`` object, a new key and new data values (``y + 0.01``) of the
same shapes. Reported per run: wall and CPU seconds and the trace + lower + XLA compile seconds
JAX reports (``jax.monitoring``). Processes: (a) no persistent cache; (b) with
``numpyro_mile.enable_compilation_cache(D)`` on an empty folder ``D`` ("first process"); (c) the
same again, ``D`` now filled ("second process"); and with ``--before REV``, (a) for the code at
git revision ``REV`` (a worktree), for the before/after comparison.

**2. Per step** (UCI airfoil training split, d = 402, ``K`` = 12 chains; ``toy_regression(1000)``
when the file is absent). Loops of ``--steps`` steps, each compiled ahead of time, then timed in
``--rounds`` interleaved rounds (the fastest round reported, wall and process CPU time):

- floor: two ``vmap(value_and_grad(potential))`` evaluations per step for all chains;
- sequential: the same two gradients for one chain, looped one chain after the other (12 loops);
- BlackJAX: ``blackjax.mclmc`` (isokinetic McLachlan, MILE's integrator) vmapped, fixed step size
  and L (MILE's tuned values);
- MILE step: ``MILE.sample`` for the vectorized state in a ``fori_loop``;
- MILE via ``MCMC``: ``MCMC(MILE(model), chain_method="vectorized")`` as a user runs it, from the
  ensemble's ``init_params``: two-point estimates ``(run(big) - run(small)) / (steps of big - steps of
  small)``, each size run once untimed first and then timed in ``--rounds`` interleaved rounds (the
  fastest kept), with the persistent cache on (so that NumPyro's re-traced loop is not compiled
  again). Three pairs: W = S (``--mcmc-steps`` and a tenth of it, half warmup each), warmup steps
  only (W = N vs N/10, S = 10) and sampling steps only (W = 1000, S = N vs N/10).

**3. The reference implementations' setting** (issue #17, point 4): airfoil, ``K = 12``, deep
ensemble (MILE's early stopping), MILE 10,000 warmup + 2,000 steps thinned by 10, seeds 1-3, with
the persistent cache on as a user would have it after a first run (each seed's run is preceded by
a 20-step run of the same shapes, which fills it). Reported: sampler wall/CPU seconds with and
without trace + compile, and test LPPD. The reference implementations were not run here: their
figures (MILE authors' code 67-135 s wall, scikit-learn-contrib ``bde`` 77-112 s wall, LPPD
0.580 +- 0.014 and 0.576 +- 0.021) are quoted from issue #17's measurement on this machine type.

Usage::

    python benchmarks/overhead.py                        # writes docs/benchmarks/overhead.md
    python benchmarks/overhead.py --before a1fcdbf       # adds the before column (git worktree)
    python benchmarks/overhead.py --no-write --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    ROOT,
    CompileClock,
    add_common_options,
    argument_parser,
    command_line,
    compile_ahead,
    data_dir,
    finished,
    load_average,
    machine_lines,
    make_kernel,
    markdown_table,
    timed,
)

REPORT = ROOT / "docs" / "benchmarks" / "overhead.md"
HIDDEN = (16, 16)


def parse_args(argv=None):
    parser = argument_parser(__doc__)
    parser.add_argument("--chains", type=int, default=12, help="chains K of the per-step part (default 12)")
    parser.add_argument("--steps", type=int, default=500, help="steps per timed loop (default 500)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--mcmc-steps", type=int, default=2000, help="W + S of the MCMC two-point run (default 2000)")
    parser.add_argument("--no-reference-budget", action="store_true", help="skip part 3")
    parser.add_argument("--before", default=None, help="git revision to measure part 1 (a) for, as 'before'")
    add_common_options(parser, data="airfoil.data", output=REPORT, no_write="print the report only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--kernel", default="MILE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ============================================================================ part 1: compilation
def child_compile(cache: str | None, kernel_name: str = "MILE") -> dict:
    """The small job twice in this process; returns wall/CPU/compile per run (printed as JSON)."""
    import jax
    import numpy as np
    from numpyro.infer import MCMC

    import numpyro_mile
    from numpyro_mile.datasets import toy_regression

    if cache:
        numpyro_mile.enable_compilation_cache(cache)
    clock = CompileClock.get()
    X, y = toy_regression(300)
    out = {}
    batch = {} if kernel_name == "MILE" else {"subsample_size": 32}
    for run, (key, shift) in enumerate([(0, 0.0), (1, 0.01)]):
        kernel = make_kernel(kernel_name)
        mcmc = MCMC(
            kernel, num_warmup=1000, num_samples=500, num_chains=4, chain_method="vectorized", progress_bar=False
        )
        with clock.measure():
            _, t = timed(
                lambda: (
                    mcmc.run(jax.random.PRNGKey(key), X, np.asarray(y) + shift, hidden=HIDDEN, **batch),
                    mcmc.get_samples(),
                )[1]
            )
        out["module"] = numpyro_mile.__file__
        ensembles = getattr(kernel, "ensembles", [])
        out[f"run{run + 1}"] = {
            "wall": t.wall,
            "cpu": t.cpu,
            **clock.parts(),
            "largest": clock.largest(),
            "pretrain": float(ensembles[0].fit_seconds) if ensembles else 0.0,
        }
    return out


def spawn_child(cache: str | None, pythonpath: Path | None = None, kernel: str = "MILE") -> dict:
    env = dict(os.environ, CI="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--kernel", kernel] + (
        ["--cache", cache] if cache else []
    )
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=pythonpath or ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def before_worktree(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="overhead-before-")) / "repo"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True, capture_output=True)
    return path


# ============================================================================ part 2: per step
def load_data(data_arg):
    import numpy as np

    from numpyro_mile.datasets import load_uci, split, standardize, toy_regression

    folder = data_dir(data_arg)
    try:
        X, y = load_uci("airfoil", data_dir=folder)
    except FileNotFoundError:
        X, y = toy_regression(1000)
        desc = f"toy_regression(1000) (FALLBACK: airfoil.data not found in {folder})"
    else:
        parts, _ = standardize(split(X, y, seed=0))
        X, y = parts.train
        desc = "UCI airfoil, standardised training split (seed 0, 70 %)"
    return np.asarray(X, np.float32), np.asarray(y, np.float32), desc


def per_step(args) -> dict:
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax import lax
    from numpyro.infer import MCMC
    from numpyro.infer.util import potential_energy

    import numpyro_mile
    from numpyro_mile import MILE, deep_ensemble
    from numpyro_mile.models import mlp_regression

    X, y, desc = load_data(args.data)
    K, steps = args.chains, args.steps
    de = deep_ensemble(mlp_regression, jax.random.PRNGKey(0), K, X, y, hidden=HIDDEN, max_epochs=20, progress_bar=False)
    z0 = de.init_params
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def potential(z, X, y):
        return potential_energy(mlp_regression, (X, y), {"hidden": HIDDEN}, z)

    grad = jax.value_and_grad(potential)

    def two_grads(z, X, y):  # each evaluation moves z a little, so that none can be hoisted out of the loop
        for _ in range(2):
            _, g = grad(z, X, y)
            z = jax.tree.map(lambda a, b: a - 1e-9 * b, z, g)
        return z

    floor, c_floor = compile_ahead(
        lambda z, X, y: lax.fori_loop(0, steps, lambda _, z: jax.vmap(two_grads, (0, None, None))(z, X, y), z),
        z0,
        Xj,
        yj,
    )
    one = jax.tree.map(lambda a: a[0], z0)
    single, c_single = compile_ahead(
        lambda z, X, y: lax.fori_loop(0, steps, lambda _, z: two_grads(z, X, y), z), one, Xj, yj
    )

    # MILE: a short vectorized run for tuned step size / L, and its state for the step loop
    numpyro_mile.enable_compilation_cache(tempfile.mkdtemp(prefix="overhead-cache-"))
    kernel = MILE(mlp_regression)
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=10, num_chains=K, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, y, hidden=HIDDEN, init_params=z0)
    state = mcmc.last_state
    step_size, L = float(jnp.mean(state.step_size)), float(jnp.mean(state.L))
    mile_loop, c_mile = compile_ahead(
        lambda s: lax.fori_loop(0, steps, lambda _, s: kernel.sample(s, (X, y), {"hidden": HIDDEN}), s), state
    )

    algorithm = blackjax.mclmc(lambda z: -potential(z, Xj, yj), L=L, step_size=step_size)
    keys = jax.random.split(jax.random.PRNGKey(2), K)
    bj_state = jax.vmap(algorithm.init)(z0, keys)

    def bj_loop(s, k):
        def body(_, carry):
            s, k = carry
            k, sub = jax.vmap(lambda kk: tuple(jax.random.split(kk)), out_axes=(0, 0))(k)
            s, _ = jax.vmap(algorithm.step)(sub, s)
            return s, k

        return lax.fori_loop(0, steps, body, (s, k))

    blackjax_loop, c_bj = compile_ahead(bj_loop, bj_state, keys)

    contenders = {
        "floor: 2 vmapped gradients": lambda: floor(z0, Xj, yj),
        "sequential: 12 single-chain 2-gradient loops": lambda: [
            single(jax.tree.map(lambda a: a[k], z0), Xj, yj) for k in range(K)
        ],
        "BlackJAX mclmc loop (vmapped)": lambda: blackjax_loop(bj_state, keys),
        "MILE step (fori_loop)": lambda: mile_loop(state),
    }
    compile_s = dict(zip(contenders, [c_floor, c_single * 1.0, c_bj, c_mile]))
    best = {name: None for name in contenders}
    loads = [load_average()]
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            jax.block_until_ready(fn())
            _, t = timed(fn)
            if best[name] is None or t.wall < best[name].wall:
                best[name] = t
        loads.append(load_average())

    # MILE through MCMC, two-point estimates; each size run once untimed (same shapes), then the fastest of
    # `rounds` interleaved runs per size
    def mcmc_run(warmup, samples):
        m = MCMC(
            MILE(mlp_regression),
            num_warmup=warmup,
            num_samples=samples,
            num_chains=K,
            chain_method="vectorized",
            progress_bar=False,
        )
        _, t = timed(lambda: (m.run(jax.random.PRNGKey(3), X, y, hidden=HIDDEN, init_params=z0), m.get_samples())[1])
        return t

    big, small = args.mcmc_steps, max(200, args.mcmc_steps // 10)
    mcmc_sizes = {  # name: ((W, S) of the big run, (W, S) of the small run)
        "MILE via MCMC (two-point, W = S)": ((big // 2, big - big // 2), (small // 2, small - small // 2)),
        "MILE via MCMC (two-point, warmup steps)": ((big, 10), (small, 10)),
        "MILE via MCMC (two-point, sampling steps)": ((1000, big), (1000, small)),
    }
    clock = CompileClock.get()
    mcmc_best, mcmc_compile = {}, {}
    for sizes in mcmc_sizes.values():
        for size in sizes:
            mcmc_run(*size)
    for _ in range(args.rounds):
        for name, sizes in mcmc_sizes.items():
            for size in sizes:
                with clock.measure():
                    t = mcmc_run(*size)
                if size not in mcmc_best or t.wall < mcmc_best[size].wall:
                    mcmc_best[size] = t
                if size == sizes[0]:
                    mcmc_compile[name] = clock.total
        loads.append(load_average())
    per = {name: (t.wall / steps * 1e3, t.cpu / steps * 1e3) for name, t in best.items()}
    for name, (a, b) in mcmc_sizes.items():
        n = sum(a) - sum(b)
        per[name] = ((mcmc_best[a].wall - mcmc_best[b].wall) / n * 1e3, (mcmc_best[a].cpu - mcmc_best[b].cpu) / n * 1e3)
        compile_s[name] = mcmc_compile[name]
    return {
        "desc": desc,
        "X": X.shape,
        "d": int(sum(a[0].size for a in jax.tree.leaves(z0))),
        "K": K,
        "steps": steps,
        "per": per,
        "compile": compile_s,
        "loads": loads,
        "step_size": step_size,
        "L": L,
    }


# ============================================================================ part 3: reference setting
REFERENCE_QUOTED = {
    "MILE authors' code": ("67-135", "0.580 ± 0.014"),
    "scikit-learn-contrib bde": ("77-112", "0.576 ± 0.021"),
}


def reference_budget(args) -> list[dict]:
    import jax
    from numpyro.infer import MCMC

    from numpyro_mile import MILE, deep_ensemble
    from numpyro_mile.datasets import load_uci, split, standardize
    from numpyro_mile.evaluation import evaluate_regression
    from numpyro_mile.models import mlp_regression

    X, y = load_uci("airfoil", data_dir=data_dir(args.data))
    clock = CompileClock.get()
    rows = []
    for seed in (1, 2, 3):
        (train, val, test), _ = standardize(split(X, y, seed=seed))
        key_de, key_mile = jax.random.split(jax.random.PRNGKey(seed))
        de = deep_ensemble(
            mlp_regression, key_de, 12, *train, validation=val, early_stopping="mile", progress_bar=False, hidden=HIDDEN
        )

        def run(num_warmup, num_samples):
            kernel = MILE(mlp_regression, phase_split=(0.8, 0.1, 0.1) if num_warmup >= 100 else (0.4, 0.1, 0.5))
            mcmc = MCMC(
                kernel,
                num_warmup=num_warmup,
                num_samples=num_samples,
                num_chains=12,
                thinning=10,
                chain_method="vectorized",
                progress_bar=False,
            )
            mcmc.run(key_mile, *train, init_params=de.init_params, hidden=HIDDEN)
            return mcmc

        timed(lambda: finished(run(20, 10)))  # the same shapes: fills the persistent cache
        with clock.measure():  # blocked on the draws: MCMC.run returns before the computation ends
            mcmc, t = timed(lambda: finished(run(10_000, 2_000)))
        compile_s = clock.total
        _, lppd = evaluate_regression(mlp_regression, mcmc.get_samples(), *test, hidden=HIDDEN)
        rows.append(
            {
                "seed": seed,
                "wall": t.wall,
                "cpu": t.cpu,
                "compile": compile_s,
                "lppd": float(lppd),
                "load": load_average(),
            }
        )
        print(f"[reference setting] seed {seed}: {t.wall:.1f} s wall, LPPD {lppd:.3f}", file=sys.stderr)
    return rows


# ============================================================================ report
def compile_seconds(run: dict) -> float:
    """Trace + lower + XLA compile seconds of one run."""
    return run["trace"] + run["lower"] + run["compile"]


def report(args, compile_runs: dict, kernels: dict, step: dict, reference: list | None, seconds: float) -> str:
    lines = [
        "# MILE: compilation and per-step cost on CPU",
        "",
        "Generated by `benchmarks/overhead.py` (method in its docstring); command:",
        "",
        "```",
        command_line(),
        "```",
        "",
        "## 1. Compilation: first run, second run, second process",
        "",
        "The small job: `toy_regression(300)`, `mlp_regression` hidden (16, 16), 4 vectorized chains, "
        "1,000 warmup + 500 sampling steps, deep-ensemble pretraining (MILE's defaults). Each row is one "
        "fresh process doing two runs (the second: new `MCMC`, new key, new data values, same shapes). "
        "Trace + compile = JAX's tracing, lowering and XLA compile seconds (`jax.monitoring`).",
        "",
    ]
    header = ["process", "run", "wall s", "CPU s", "trace + compile s", "of wall", "XLA compiles", "longest compiles"]
    rows = []
    for label, runs in compile_runs.items():
        for run in ("run1", "run2"):
            r = runs[run]
            total = r["trace"] + r["lower"] + r["compile"]
            rows.append(
                [
                    label,
                    run[-1],
                    f"{r['wall']:.1f}",
                    f"{r['cpu']:.1f}",
                    f"{total:.1f}",
                    f"{100 * total / r['wall']:.0f} %",
                    r["count"],
                    r["largest"],
                ]
            )
    lines += markdown_table(header, rows, "llrrrrrl") + [""]
    now = compile_runs.get("this commit, no persistent cache")
    if now:
        first = sum(now["run1"][k] for k in ("trace", "lower", "compile"))
        second = sum(now["run2"][k] for k in ("trace", "lower", "compile"))
        lines.append(
            f"- Second run in the same process, no persistent cache: trace + compile {second:.1f} s = "
            f"{100 * second / first:.0f} % of the first run's {first:.1f} s (pretraining and init programs "
            "reused; NumPyro re-traces and re-compiles its own sampling loop on every `MCMC.run`, for NUTS "
            "as well)."
        )
    cached = compile_runs.get("this commit, cache: first process")
    if cached:
        first = sum(cached["run1"][k] for k in ("trace", "lower", "compile"))
        second = sum(cached["run2"][k] for k in ("trace", "lower", "compile"))
        lines.append(
            f"- With `enable_compilation_cache()`: second run {second:.2f} s = {100 * second / first:.0f} % "
            f"of the first run's {first:.1f} s (target <= 10 %)."
        )
    again = compile_runs.get("this commit, cache: second process")
    if again and cached:
        first = sum(cached["run1"][k] for k in ("trace", "lower", "compile"))
        proc2 = sum(again["run1"][k] for k in ("trace", "lower", "compile"))
        lines.append(
            f"- A second process (cache filled by the first): its first run {proc2:.1f} s trace + compile "
            f"= {100 * proc2 / first:.0f} % of the first process's; what remains is tracing and lowering "
            "(NumPyro's loop, the model) and reading the cache."
        )
    before = next((v for k, v in compile_runs.items() if k.startswith("before")), None)
    if before and now:
        b1 = sum(before["run1"][k] for k in ("trace", "lower", "compile"))
        n1 = sum(now["run1"][k] for k in ("trace", "lower", "compile"))
        b2 = sum(before["run2"][k] for k in ("trace", "lower", "compile"))
        n2 = sum(now["run2"][k] for k in ("trace", "lower", "compile"))
        lines.append(
            f"- Before/after (no cache): first run {b1:.1f} -> {n1:.1f} s trace + compile, second run "
            f"{b2:.1f} -> {n2:.1f} s."
        )
    lines += [
        "",
        "### Every kernel: a second run on new data of the same shapes",
        "",
        "The same small job with each kernel's defaults (SGLD, ICSGLD: step size 1e-4; ICSGLD 50 bins of "
        "width 5; SGLD, ICSGLD and SMILE on batches of 32 rows), one fresh process per kernel with the "
        "persistent cache on an empty folder: run 2 has a new `MCMC`, a new key and new data values. The "
        "data travel in each kernel's state, so they are arguments of the compiled loop, not constants.",
        "",
    ]
    rows = []
    for name, runs in kernels.items():
        first, second = compile_seconds(runs["run1"]), compile_seconds(runs["run2"])
        rows.append(
            [
                name,
                f"{runs['run1']['wall']:.1f}",
                f"{first:.2f}",
                f"{runs['run2']['wall']:.1f}",
                f"{second:.2f}",
                f"{100 * second / first:.0f} %",
                runs["run2"]["largest"] or "-",
            ]
        )
    lines += markdown_table(
        [
            "kernel",
            "run 1 wall s",
            "run 1 trace + compile s",
            "run 2 wall s",
            "run 2 trace + compile s",
            "run 2 / run 1",
            "run 2's longest compiles",
        ],
        rows,
        "lrrrrrl",
    ) + [""]
    worst = max(compile_seconds(r["run2"]) / compile_seconds(r["run1"]) for r in kernels.values())
    lines += [
        f"- Largest run 2 / run 1 ratio: {100 * worst:.0f} % (target <= 25 % for every kernel). "
        "Progress bar on vs off and one device vs every core: `docs/benchmarks/defaults.md` "
        "(`benchmarks/defaults.py`).",
        "",
    ]
    lines += [
        "",
        "## 2. Per step",
        "",
        f"- data: {step['desc']}; X {step['X'][0]} x {step['X'][1]}; d = {step['d']} parameters; "
        f"K = {step['K']} chains; {step['steps']} steps per timed loop, fastest of {args.rounds} interleaved "
        "rounds",
        f"- MILE's tuned values used by the BlackJAX loop: step size {step['step_size']:.4f}, L {step['L']:.3f}",
        f"- load average (1 min) during the timings: {' -> '.join(f'{x:.1f}' for x in step['loads'])} on "
        f"{os.cpu_count()} CPUs",
        "",
    ]
    per = step["per"]
    floor = per["floor: 2 vmapped gradients"]
    seq = per["sequential: 12 single-chain 2-gradient loops"]
    bj = per["BlackJAX mclmc loop (vmapped)"]
    rows = []
    for name, (wall, cpu) in per.items():
        rows.append(
            [
                name,
                f"{wall:.3f}",
                f"{cpu:.3f}",
                f"{wall / floor[0]:.2f}",
                f"{wall / seq[0]:.2f}",
                f"{wall / bj[0]:.2f}",
                f"{step['compile'][name]:.1f}",
            ]
        )
    lines += markdown_table(
        ["all chains, one step", "wall ms", "CPU ms", "/ floor", "/ sequential", "/ BlackJAX", "compile s"], rows
    ) + [""]
    mile = per["MILE via MCMC (two-point, W = S)"]
    warm = per["MILE via MCMC (two-point, warmup steps)"]
    draw = per["MILE via MCMC (two-point, sampling steps)"]
    lines += [
        f"- Targets: MILE via `MCMC` / sequential single-chain loops = {mile[0] / seq[0]:.2f} over W = S runs "
        f"({warm[0] / seq[0]:.2f} for warmup steps, {draw[0] / seq[0]:.2f} for sampling steps; target <= 1.2); "
        f"MILE / BlackJAX loop = {mile[0] / bj[0]:.2f} ({warm[0] / bj[0]:.2f} warmup, {draw[0] / bj[0]:.2f} "
        "sampling; target <= 1). CPU / wall of the floor = "
        f"{floor[1] / floor[0]:.2f}: XLA's CPU backend already spreads the vmapped gradients over the cores.",
        "- Compile column: the ahead-of-time compile of each loop (for MCMC: trace + compile of the timed "
        "run, with the persistent cache on).",
        "",
    ]
    if reference:
        import numpy as np

        walls = np.array([r["wall"] for r in reference])
        nets = np.array([r["wall"] - r["compile"] for r in reference])
        lppds = np.array([r["lppd"] for r in reference])
        lines += [
            "## 3. The reference implementations' setting",
            "",
            "Airfoil, K = 12, MILE 10,000 warmup + 2,000 steps thinned by 10, seeds 1-3, persistent cache "
            "filled by a 20-step run of the same shapes. The reference implementations were not run here: their "
            "figures are quoted from issue #17 (same machine type, three seeds).",
            "",
        ]
        rows = [
            [
                f"numpyro_mile (seed {r['seed']})",
                f"{r['wall']:.1f}",
                f"{r['cpu']:.1f}",
                f"{r['wall'] - r['compile']:.1f}",
                f"{r['lppd']:.3f}",
                f"{r['load']:.1f}",
            ]
            for r in reference
        ]
        rows.append(
            [
                "numpyro_mile, mean ± sd",
                f"{walls.mean():.1f} ± {walls.std(ddof=1):.1f}",
                "",
                f"{nets.mean():.1f} ± {nets.std(ddof=1):.1f}",
                f"{lppds.mean():.3f} ± {lppds.std(ddof=1):.3f}",
                "",
            ]
        )
        for name, (wall, lppd) in REFERENCE_QUOTED.items():
            rows.append([f"{name} (quoted)", wall, "", "", lppd, ""])
        lines += markdown_table(
            ["implementation", "sampler wall s", "CPU s", "wall s without trace + compile", "test LPPD", "load after"],
            rows,
        ) + [""]
        lines.append(
            f"- Our mean sampler wall time / the fastest quoted reference run (67 s): "
            f"{walls.mean() / 67:.2f} (target <= 0.5 at equal LPPD); / the slowest (135 s): "
            f"{walls.mean() / 135:.2f}."
        )
        lines.append("")
    lines += ["## Machine", ""]
    lines += machine_lines() + ["", f"Script wall time: {seconds:.0f} s.", ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child_compile(args.cache, args.kernel)))
        return
    start = time.perf_counter()
    runs = {}
    if args.before:
        tree = before_worktree(args.before)
        try:
            runs[f"before ({args.before}), no cache"] = spawn_child(None, pythonpath=tree)
            if not runs[f"before ({args.before}), no cache"]["module"].startswith(str(tree)):
                raise RuntimeError("the 'before' process imported this checkout's numpyro_mile, not the worktree's")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    runs["this commit, no persistent cache"] = spawn_child(None)
    cache = tempfile.mkdtemp(prefix="overhead-cache-")
    runs["this commit, cache: first process"] = spawn_child(cache)
    runs["this commit, cache: second process"] = spawn_child(cache)
    kernels = {
        name: spawn_child(tempfile.mkdtemp(prefix="overhead-cache-"), kernel=name)
        for name in ("SGLD", "ICSGLD", "SMILE")
    }
    kernels["MILE"] = runs["this commit, cache: first process"]
    step = per_step(args)
    reference = None if args.no_reference_budget else reference_budget(args)
    text = report(args, runs, kernels, step, reference, time.perf_counter() - start)
    print(text)
    if not args.no_write:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
