"""Overhead of MILE's NumPyro kernel over the raw gradient floor and over BlackJAX's own MCLMC loop.

Setting: the MILE benchmark BNN (``mlp_regression``, hidden layers (16, 16)) on the standardised
training split of UCI airfoil (falls back to ``toy_regression(1000)`` when the file is absent),
``K`` chains vectorised on one device. Every timed quantity is measured after a warm-up call of
the same shapes, in one script run:

(a) ``MILE``: ``numpyro.infer.MCMC(MILE(model), num_warmup=W, num_samples=S, num_chains=K,
    chain_method="vectorized", progress_bar=False).run(...)`` started from a 20-epoch deep
    ensemble. The run is done twice with the same shapes and the second call is timed. NumPyro
    calls ``MILE.init`` again on every run (re-jitting the chain initialisation), and JAX may
    re-trace and re-compile the sampling loop; the script counts the compile time JAX reports
    during the timed call, and, when there is any, also times a tiny run (``num_warmup=20`` with
    ``phase_split=(0.4, 0.1, 0.5)``, ``num_samples=thinning``) on a fresh ``MCMC`` object as
    "compile + startup" and subtracts it.
(b) raw floor: ``2 (W + S)`` evaluations of ``jit(vmap(value_and_grad(potential_fn)))`` for all
    ``K`` chains in one ``lax.fori_loop`` (each evaluation moves the position by ``-1e-8 * grad``
    so that none can be hoisted): the same number of gradient evaluations as (a).
(c) BlackJAX: ``blackjax.mclmc(logdensity_fn, L, step_size)`` (isokinetic McLachlan, the
    integrator MILE uses) with the step size and L MILE tuned, ``vmap``-ed over the ``K`` chains,
    ``W + S`` steps in one ``lax.fori_loop``, no tuning.
(d) (a) again with NumPyro's progress bar on (``$CI`` and ``$PYTEST_XDIST_WORKER`` removed from the
    environment for that measurement, since NumPyro disables the bar when either is set).

Usage::

    python benchmarks/overhead.py                       # W=S=2000, K=12; writes docs/benchmarks/overhead.md
    python benchmarks/overhead.py --warmup 500 --samples 500 --chains 4 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "benchmarks" / "overhead.md"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "uci"
HIDDEN = (16, 16)
FLOOR_TARGET = 1.3

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileClock:
    """Sums the tracing, lowering and XLA compile time JAX reports while active."""

    def __init__(self):
        self.seconds = 0.0
        self.count = 0
        self.active = False

    def __call__(self, event, duration, **kwargs):
        if self.active and event in _COMPILE_EVENTS:
            self.seconds += duration
            if event == _COMPILE_EVENTS[-1]:
                self.count += 1

    @contextlib.contextmanager
    def measure(self):
        self.seconds, self.count, self.active = 0.0, 0, True
        try:
            yield self
        finally:
            self.active = False


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=2000, help="num_warmup W (default 2000)")
    parser.add_argument("--samples", type=int, default=2000, help="num_samples S (default 2000)")
    parser.add_argument("--chains", type=int, default=12, help="number of chains K (default 12)")
    parser.add_argument("--thinning", type=int, default=1, help="MCMC thinning (default 1)")
    parser.add_argument("--data", default=None,
                        help="folder with airfoil.data (default: $NUMPYRO_MILE_DATA, else ../shared/data/uci "
                             "relative to the repository root)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed repetitions of each measurement; the minimum is reported (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="skip measurement (d)")
    parser.add_argument("--output", default=str(REPORT), help="markdown report path")
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    return parser.parse_args(argv)


def load_data(data_arg):
    """Standardised airfoil training split, or ``toy_regression(1000)``; returns (X, y, description)."""
    import numpy as np

    from numpyro_mile.datasets import load_uci, split, standardize, toy_regression

    data_dir = data_arg or os.environ.get("NUMPYRO_MILE_DATA") or str(DEFAULT_DATA)
    try:
        X, y = load_uci("airfoil", data_dir=data_dir)
    except FileNotFoundError:
        X, y = toy_regression(1000)
        desc = f"toy_regression(1000) (airfoil.data not found in {data_dir})"
    else:
        parts, _ = standardize(split(X, y, seed=0))
        X, y = parts.train
        desc = f"UCI airfoil, standardised training split (seed 0, 70 %), from {data_dir}"
    return np.asarray(X, np.float32), np.asarray(y, np.float32), desc


def machine_info():
    import blackjax
    import jax
    import numpyro

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = f"{cpu} ({line.split(':', 1)[1].strip()})"
                break
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "processor": cpu,
        "os.cpu_count()": f"{os.cpu_count()} (usable by this process: {affinity})",
        "python": platform.python_version(),
        "jax / jaxlib": f"{jax.__version__} / {jax.lib.__version__ if hasattr(jax.lib, '__version__') else '?'}",
        "numpyro": numpyro.__version__,
        "blackjax": blackjax.__version__,
        "jax.default_backend()": jax.default_backend(),
        "devices": ", ".join(str(d) for d in jax.devices()),
    }


def timed(fn, repeats=1):
    """Minimum wall time of ``fn()`` over ``repeats`` calls (``fn`` must block until done)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


# ---------------------------------------------------------------------------------------------- (a), (d)
def make_mcmc(num_warmup, num_samples, num_chains, thinning, progress_bar, **mile_options):
    from numpyro.infer import MCMC

    from numpyro_mile import MILE
    from numpyro_mile.models import mlp_regression

    kernel = MILE(mlp_regression, **mile_options)
    return MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=progress_bar, thinning=thinning)


def run_mcmc(mcmc, key, X, y, init_params):
    import jax

    mcmc.run(key, X, y, init_params=init_params, hidden=HIDDEN)
    jax.block_until_ready(mcmc.last_state)
    return mcmc


@contextlib.contextmanager
def progress_bar_env():
    """Remove the variables that make NumPyro disable its progress bar; restore them afterwards."""
    saved = {k: os.environ.pop(k) for k in ("CI", "PYTEST_XDIST_WORKER") if k in os.environ}
    try:
        yield saved
    finally:
        os.environ.update(saved)


def measure_mile(args, key, X, y, init_params, clock, progress_bar=False):
    """Warm-up run, then the timed run with the same shapes; returns a dict of seconds."""
    import jax

    mcmc = make_mcmc(args.warmup, args.samples, args.chains, args.thinning, progress_bar)
    with clock.measure():
        first, _ = timed(lambda: run_mcmc(mcmc, key, X, y, init_params))
    first_compile = clock.seconds
    with clock.measure():
        second, _ = timed(lambda: run_mcmc(mcmc, jax.random.fold_in(key, 1), X, y, init_params), args.repeats)
    return {"first": first, "first_compile": first_compile, "second": second,
            "second_compile": clock.seconds, "second_compiles": clock.count, "mcmc": mcmc}


def measure_tiny(args, key, X, y, init_params, clock):
    """Compile + startup: an MCMC with num_warmup=20, phase_split=(0.4, 0.1, 0.5), num_samples=thinning.

    Like (a) it is run twice on the same object and the second call is timed, so that it pays the
    same re-tracing and re-compilation as the timed MILE run.
    """
    mcmc = make_mcmc(20, args.thinning, args.chains, args.thinning, False, phase_split=(0.4, 0.1, 0.5))
    run_mcmc(mcmc, key, X, y, init_params)
    with clock.measure():
        seconds, _ = timed(lambda: run_mcmc(mcmc, key, X, y, init_params))
    return {"seconds": seconds, "compile": clock.seconds, "compiles": clock.count}


# ---------------------------------------------------------------------------------------------- (b)
def potential(X, y, key):
    from numpyro.infer.util import initialize_model

    from numpyro_mile.models import mlp_regression

    info = initialize_model(key, mlp_regression, model_args=(X, y), model_kwargs={"hidden": HIDDEN})
    return info.potential_fn


def measure_floor(num_evals, potential_fn, init_params, repeats):
    import jax
    from jax import lax

    grad_fn = jax.vmap(jax.value_and_grad(potential_fn))

    @jax.jit
    def loop(z):
        def body(_, carry):
            z, acc = carry
            value, grad = grad_fn(z)
            z = jax.tree.map(lambda a, g: a - 1e-8 * g, z, grad)
            return z, acc + value

        return lax.fori_loop(0, num_evals, body, (z, jax.numpy.zeros(jax.tree.leaves(z)[0].shape[0])))

    start = time.perf_counter()
    compiled = loop.lower(init_params).compile()
    first = time.perf_counter() - start
    seconds, _ = timed(lambda: jax.block_until_ready(compiled(init_params)), repeats)

    single = jax.jit(grad_fn)
    jax.block_until_ready(single(init_params))
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        out = single(init_params)
    jax.block_until_ready(out)
    dispatch = (time.perf_counter() - start) / n
    return {"first": first, "seconds": seconds, "single_call": dispatch}


# ---------------------------------------------------------------------------------------------- (c)
def measure_blackjax(num_steps, potential_fn, init_params, step_size, L, key, repeats):
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax import lax

    def logdensity(z):
        return -potential_fn(z)

    num_chains = jax.tree.leaves(init_params)[0].shape[0]

    def chain_loop(z, step_size, L, key):
        algorithm = blackjax.mclmc(logdensity, L=L, step_size=step_size,
                                   integrator=blackjax.mcmc.integrators.isokinetic_mclachlan)
        init_key, key = jax.random.split(key)
        state = algorithm.init(z, init_key)

        def body(_, carry):
            state, key = carry
            key, step_key = jax.random.split(key)
            state, _ = algorithm.step(step_key, state)
            return state, key

        return lax.fori_loop(0, num_steps, body, (state, key))[0]

    run = jax.jit(jax.vmap(chain_loop))
    step_size = jnp.broadcast_to(jnp.asarray(step_size, jnp.float32), (num_chains,))
    L = jnp.broadcast_to(jnp.asarray(L, jnp.float32), (num_chains,))
    keys = jax.random.split(key, num_chains)
    start = time.perf_counter()
    compiled = run.lower(init_params, step_size, L, keys).compile()
    first = time.perf_counter() - start
    seconds, state = timed(lambda: jax.block_until_ready(compiled(init_params, step_size, L, keys)), repeats)
    return {"first": first, "seconds": seconds, "finite": bool(jnp.all(jnp.isfinite(state.logdensity)))}


# ---------------------------------------------------------------------------------------------- report
def fmt(x, digits=2):
    return f"{x:.{digits}f}"


def main(argv=None):
    args = parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]) \
        if argv is None else "python benchmarks/overhead.py " + " ".join(shlex.quote(a) for a in argv)
    total_start = time.perf_counter()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from numpyro_mile import MILE, deep_ensemble
    from numpyro_mile.models import mlp_regression

    clock = CompileClock()
    jax.monitoring.register_event_duration_secs_listener(clock)
    W, S, K = args.warmup, args.samples, args.chains
    X, y, data_desc = load_data(args.data)
    key = jax.random.PRNGKey(args.seed)
    ens_key, mcmc_key, pot_key, bj_key = jax.random.split(key, 4)
    print(f"data: {data_desc}; X {X.shape}; K={K}, W={W}, S={S}", flush=True)

    start = time.perf_counter()
    ensemble = deep_ensemble(mlp_regression, ens_key, K, X, y, max_epochs=20, progress_bar=False, hidden=HIDDEN)
    init_params = jax.tree.map(jnp.asarray, ensemble.init_params)
    jax.block_until_ready(init_params)
    ensemble_seconds = time.perf_counter() - start
    dim = sum(int(np.prod(v.shape[1:])) for v in init_params.values())
    print(f"deep ensemble (20 epochs): {ensemble_seconds:.1f} s; d = {dim}", flush=True)

    # (a)
    mile = measure_mile(args, mcmc_key, X, y, init_params, clock)
    print(f"(a) MILE: first run {mile['first']:.2f} s (tracing+compilation {mile['first_compile']:.2f} s), "
          f"second run {mile['second']:.2f} s (tracing+compilation during it: {mile['second_compile']:.2f} s, "
          f"{mile['second_compiles']} XLA compiles)", flush=True)
    recompiled = mile["second_compile"] > 0.05
    mile_mon = mile["second"] - mile["second_compile"]
    if recompiled:
        tiny = measure_tiny(args, mcmc_key, X, y, init_params, clock)
        mile_net = mile["second"] - tiny["seconds"]
        method = (f"NumPyro re-traces and re-compiles on every `mcmc.run`, even with the same MCMC object and shapes "
                  f"(`jax.monitoring` reported {fmt(mile['second_compile'])} s of tracing+compilation and "
                  f"{mile['second_compiles']} XLA compiles during the timed second run). MILE time = second run "
                  f"({fmt(mile['second'])} s) - compile+startup, where compile+startup = the second of two runs of a tiny "
                  f"MCMC (num_warmup=20, phase_split=(0.4, 0.1, 0.5), num_samples={args.thinning}): "
                  f"{fmt(tiny['seconds'])} s, of which {fmt(tiny['compile'])} s tracing+compilation "
                  f"({tiny['compiles']} XLA compiles). Cross-check: second run - its own reported tracing+compilation "
                  f"= {fmt(mile_mon)} s")
        print(f"    tiny run (compile + startup): {tiny['seconds']:.2f} s -> MILE {mile_net:.2f} s "
              f"(cross-check {mile_mon:.2f} s)", flush=True)
    else:
        tiny = None
        mile_net = mile["second"]
        method = ("no compilation was reported during the timed second run (same MCMC object, same shapes), "
                  "so MILE time = wall time of the second `mcmc.run`")
    state = mile["mcmc"].last_state
    step_size = float(jnp.mean(state.step_size))
    L = float(jnp.mean(state.L))
    num_nans = int(jnp.sum(state.num_nans))
    del mile["mcmc"]

    # (b)
    potential_fn = potential(X, y, pot_key)
    floor = measure_floor(2 * (W + S), potential_fn, init_params, args.repeats)
    print(f"(b) floor: {floor['seconds']:.2f} s for {2 * (W + S)} vmapped value_and_grad evaluations "
          f"(first call incl. compile {floor['first']:.2f} s)", flush=True)

    # (c)
    bj = measure_blackjax(W + S, potential_fn, init_params, step_size, L, bj_key, args.repeats)
    print(f"(c) BlackJAX MCLMC loop: {bj['seconds']:.2f} s (first call {bj['first']:.2f} s)", flush=True)

    # (d)
    prog = None
    if not args.no_progress:
        with progress_bar_env() as removed:
            prog = measure_mile(args, mcmc_key, X, y, init_params, clock, progress_bar=True)
        del prog["mcmc"]
        prog_mon = prog["second"] - prog["second_compile"]
        print(f"(d) MILE with progress bar: second run {prog['second']:.2f} s (tracing+compilation during it "
              f"{prog['second_compile']:.2f} s, {prog['second_compiles']} XLA compiles); "
              f"removed env vars: {sorted(removed) or 'none'}", flush=True)

    total = time.perf_counter() - total_start
    grads = MILE.num_grad_evals(W, S, K)
    per_step = lambda seconds: fmt(1e3 * seconds / (W + S), 3)  # noqa: E731
    rows = [
        ("(a) MILE, `MCMC(..., progress_bar=False)`", mile_net,
         f"second run {fmt(mile['second'])} s" + (f" - compile+startup (tiny run) {fmt(tiny['seconds'])} s" if tiny else "")),
    ]
    if tiny:
        rows.append(("(a') same, minus its own reported tracing+compilation", mile_mon,
                     f"second run {fmt(mile['second'])} s - {fmt(mile['second_compile'])} s (`jax.monitoring`)"))
    rows += [
        ("(b) raw floor: fori_loop of vmapped `value_and_grad`", floor["seconds"], f"{2 * (W + S)} evaluations"),
        ("(c) BlackJAX `mclmc` step, vmapped, fori_loop", bj["seconds"], f"{W + S} steps, fixed step size and L"),
    ]
    if prog is not None:
        rows.append(("(d) MILE, `MCMC(..., progress_bar=True)`, minus its own tracing+compilation", prog_mon,
                     f"second run {fmt(prog['second'])} s - {fmt(prog['second_compile'])} s (`jax.monitoring`)"))
    ratios = [
        ("MILE (a) / raw floor (b)", mile_net / floor["seconds"], f"target <= {FLOOR_TARGET}"),
        ("MILE (a') / raw floor (b)", mile_mon / floor["seconds"], "cross-check"),
        ("MILE (a) / BlackJAX loop (c)", mile_net / bj["seconds"], ""),
        ("BlackJAX loop (c) / raw floor (b)", bj["seconds"] / floor["seconds"], ""),
    ]
    if not tiny:
        ratios.pop(1)
    if prog is not None:
        ratios.append(("progress bar on (d) / off (a')", prog_mon / mile_mon, "same subtraction method"))
        ratios.append(("progress bar on / off, wall time of the second runs", prog["second"] / mile["second"],
                       "compilation included"))

    lines = [
        "# MILE sampling overhead",
        "",
        "Generated by `benchmarks/overhead.py`; command:",
        "",
        "```",
        command,
        "```",
        "",
        f"- model: `mlp_regression`, hidden {HIDDEN}, d = {dim} parameters",
        f"- data: {data_desc}; X {X.shape[0]} x {X.shape[1]}",
        f"- K = {K} chains (`chain_method=\"vectorized\"`), num_warmup W = {W}, num_samples S = {S}, "
        f"thinning {args.thinning}: {W + S} steps, {2 * (W + S)} gradient evaluations per chain "
        f"({grads} in all, with init)",
        f"- initial positions: `deep_ensemble(..., max_epochs=20)` ({fmt(ensemble_seconds, 1)} s, not timed below)",
        f"- tuned by MILE (mean over chains): step size {step_size:.3g}, L {L:.3g}; rejected (NaN) steps: {num_nans};"
        f" used as the fixed step size and L of (c)",
        f"- timing: minimum of {args.repeats} call(s), each after a warm-up/compile call of the same shapes",
        f"- MILE method: {method}",
        "",
        "| measurement | seconds | per step (ms) | notes |",
        "|---|---:|---:|---|",
    ]
    for name, seconds, note in rows:
        lines.append(f"| {name} | {fmt(seconds)} | {per_step(seconds)} | {note} |")
    lines += ["", "| ratio | value | |", "|---|---:|---|"]
    for name, value, note in ratios:
        lines.append(f"| {name} | {fmt(value)} | {note} |")
    lines += [
        "",
        "Compile and first-call times (not in the tables above):",
        "",
        f"- (a) first `mcmc.run`: {fmt(mile['first'])} s, of which {fmt(mile['first_compile'])} s tracing+compilation"
        f" (`jax.monitoring`); second run: {fmt(mile['second_compile'])} s tracing+compilation,"
        f" {mile['second_compiles']} XLA compiles",
        f"- (b) first call: {fmt(floor['first'])} s; one jitted vmapped `value_and_grad` call dispatched from Python: "
        f"{fmt(1e3 * floor['single_call'], 3)} ms (x2 per step = {fmt(2e3 * floor['single_call'], 3)} ms)",
        f"- (c) first call: {fmt(bj['first'])} s",
    ]
    if prog is not None:
        lines.append(f"- (d) first run: {fmt(prog['first'])} s; second run: {fmt(prog['second_compile'])} s "
                     f"tracing+compilation, {prog['second_compiles']} XLA compiles")
    lines += ["", "Machine:", ""]
    lines += [f"- {k}: {v}" for k, v in machine_info().items()]
    lines += ["", f"Script wall time: {fmt(total, 1)} s.", ""]
    report = "\n".join(lines)
    print()
    print(report)
    if not args.no_write:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
