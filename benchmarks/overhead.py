"""Overhead of MILE's NumPyro kernel over the raw gradient floor and over BlackJAX's own MCLMC loop.

Setting: the MILE benchmark BNN (``mlp_regression``, hidden layers (16, 16)) on the standardised
training split of UCI airfoil (falls back to ``toy_regression(1000)`` when the file is absent),
``K`` chains vectorised on one device. Measured in one script run, each after a warm-up/compile
call of the same shapes:

(a) MILE: ``numpyro.infer.MCMC(MILE(model), num_warmup=W, num_samples=S, num_chains=K,
    chain_method="vectorized", progress_bar=False).run(...)`` started from a 20-epoch deep
    ensemble. The run is done twice with the same shapes and the second call is timed. NumPyro
    re-traces and re-compiles its sampling loop on every ``run`` (and ``MILE.init`` re-jits the
    chain initialisation), so the script records the tracing+compile time JAX reports
    (``jax.monitoring``) during the timed call and times a tiny MCMC (``num_warmup=20``,
    ``phase_split=(0.4, 0.1, 0.5)``, ``num_samples=thinning``; also run twice, the second call
    timed) as "compile + startup":

    (a) = second run - its own reported tracing+compilation - the tiny run's non-compile
    startup. The plain "second run - tiny run" is shown as (a'); it is off by the difference of
    the two runs' compile times, which vary from run to run by seconds (more on a loaded machine).

    (a'') two-point estimate: the same MCMC with ``num_warmup=max(100, W // 10)``,
    ``num_samples=max(1, S // 10)`` (run twice, second call timed) pays the same fixed costs, so
    (full second run - small second run), rescaled to ``W + S`` steps, is the cost of the steps,
    in wall and in process CPU time (``time.process_time``), which other processes on the machine
    inflate far less than wall time.

(b) raw floor: ``2 (W + S)`` evaluations of ``vmap(value_and_grad(potential_fn))`` for all ``K``
    chains in one jitted ``lax.fori_loop`` (each evaluation moves the position by
    ``-1e-8 * grad`` so that none can be hoisted): the gradient count of (a). Compiled ahead of
    time (``jit(...).lower(...).compile()``), then timed.
(c) BlackJAX: ``blackjax.mclmc(logdensity_fn, L, step_size)`` (isokinetic McLachlan, MILE's
    integrator) with the step size and L MILE tuned, ``vmap``-ed over the ``K`` chains, ``W + S``
    steps in one jitted ``lax.fori_loop``, no tuning; compiled ahead of time, then timed.
(d) (a) with NumPyro's progress bar on (``$CI`` and ``$PYTEST_XDIST_WORKER`` removed from the
    environment for that measurement: NumPyro disables the bar when either is set); timed like (a).

``--profile`` adds a per-step breakdown (interleaved, minimum over ``--profile-repeats``, short
loops of ``--profile-steps`` steps): the floor, the BlackJAX step, ``MILE._step`` in a plain
``fori_loop``, the same inside a replica of NumPyro's collecting loop, ``MILE._step`` jitted alone
and called once per step from Python (what NumPyro does when the progress bar is on), and the
non-gradient cost of the MCLMC step's parts measured on a nearly free potential.

Usage::

    python benchmarks/overhead.py                     # W=S=2000, K=12; writes docs/benchmarks/overhead.md
    python benchmarks/overhead.py --profile           # plus the per-step breakdown
    python benchmarks/overhead.py --warmup 500 --samples 500 --chains 4 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

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
    """Sums the tracing, lowering and XLA compile (wall) time JAX reports while active."""

    def __init__(self):
        self.seconds = 0.0
        self.count = 0
        self.names: list[str] = []
        self.active = False

    def __call__(self, event, duration, **kwargs):
        if self.active and event in _COMPILE_EVENTS:
            self.seconds += duration
            if event == _COMPILE_EVENTS[-1]:
                self.count += 1
                if duration > 0.5:
                    self.names.append(f"{kwargs.get('fun_name', '?')} {duration:.1f} s")

    @contextlib.contextmanager
    def measure(self):
        self.seconds, self.count, self.names, self.active = 0.0, 0, [], True
        try:
            yield self
        finally:
            self.active = False

    def describe(self) -> str:
        return f"{self.count} XLA compiles; > 0.5 s: {', '.join(self.names) or 'none'}"


class Timing(NamedTuple):
    """Wall time and process CPU time of one call, in seconds."""

    wall: float
    cpu: float


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
                        help="timed repetitions of each measurement; the fastest is reported (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="skip measurement (d)")
    parser.add_argument("--no-two-point", action="store_true", help="skip the two-point estimate (a'')")
    parser.add_argument("--profile", action="store_true", help="add the per-step breakdown")
    parser.add_argument("--profile-steps", type=int, default=300, help="steps per profiled loop (default 300)")
    parser.add_argument("--profile-repeats", type=int, default=5, help="interleaved rounds (default 5)")
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
        desc = f"toy_regression(1000) (FALLBACK: airfoil.data not found in {data_dir})"
    else:
        parts, _ = standardize(split(X, y, seed=0))
        X, y = parts.train
        desc = f"UCI airfoil, standardised training split (seed 0, 70 %), from {data_dir}"
    return np.asarray(X, np.float32), np.asarray(y, np.float32), desc


def machine_info():
    import blackjax
    import jax
    import jaxlib
    import numpyro

    cpu = platform.processor() or "(empty)"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = f"{cpu}; {platform.machine()}, {line.split(':', 1)[1].strip()}"
                break
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or commit
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "numpyro_mile"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if dirty:
            commit += " (numpyro_mile/ has uncommitted changes)"
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "platform.processor()": cpu,
        "os.cpu_count()": f"{os.cpu_count()} (usable by this process: {affinity})",
        "python": platform.python_version(),
        "jax / jaxlib": f"{jax.__version__} / {jaxlib.__version__}",
        "numpyro": numpyro.__version__,
        "blackjax": blackjax.__version__,
        "jax.default_backend()": jax.default_backend(),
        "devices": ", ".join(str(d) for d in jax.devices()),
        "repository commit": commit,
    }


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def timed(fn, repeats=1):
    """Fastest (by wall time) of ``repeats`` calls of ``fn`` (which must block until done)."""
    best, out = Timing(float("inf"), float("inf")), None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn()
        t = Timing(time.perf_counter() - wall, time.process_time() - cpu)
        best = min(best, t)
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


def measure_runs(mcmc, key, X, y, init_params, clock, repeats):
    """A warm-up ``run``, then ``repeats`` timed runs of the same MCMC object; keeps the fastest."""
    import jax

    with clock.measure():
        first, _ = timed(lambda: run_mcmc(mcmc, key, X, y, init_params))
    out = {"first": first, "first_compile": clock.seconds, "second": Timing(float("inf"), float("inf"))}
    for r in range(repeats):
        with clock.measure():
            t, _ = timed(lambda: run_mcmc(mcmc, jax.random.fold_in(key, r + 1), X, y, init_params))
        if t < out["second"]:
            out.update(second=t, compile=clock.seconds, compiles=clock.describe())
    out["last_state"] = mcmc.last_state
    return out


# ---------------------------------------------------------------------------------------------- (b)
def potential(X, y, key):
    from numpyro.infer.util import initialize_model

    from numpyro_mile.models import mlp_regression

    info = initialize_model(key, mlp_regression, model_args=(X, y), model_kwargs={"hidden": HIDDEN})
    return info.potential_fn


def floor_loop(potential_fn, num_evals):
    import jax
    import jax.numpy as jnp
    from jax import lax

    grad_fn = jax.vmap(jax.value_and_grad(potential_fn))

    def loop(z):
        def body(_, carry):
            z, acc = carry
            value, grad = grad_fn(z)
            return jax.tree.map(lambda a, g: a - 1e-8 * g, z, grad), acc + value

        return lax.fori_loop(0, num_evals, body, (z, jnp.zeros(jax.tree.leaves(z)[0].shape[0])))

    return jax.jit(loop)


def measure_floor(num_evals, potential_fn, init_params, repeats):
    import jax

    start = time.perf_counter()
    compiled = floor_loop(potential_fn, num_evals).lower(init_params).compile()
    compile_seconds = time.perf_counter() - start
    t, _ = timed(lambda: jax.block_until_ready(compiled(init_params)), repeats)

    single = jax.jit(jax.vmap(jax.value_and_grad(potential_fn)))
    jax.block_until_ready(single(init_params))
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        out = single(init_params)
    jax.block_until_ready(out)
    return {"compile": compile_seconds, "time": t, "single_call": (time.perf_counter() - start) / n}


# ---------------------------------------------------------------------------------------------- (c)
def blackjax_loop(potential_fn, num_steps):
    import blackjax
    import jax
    from jax import lax

    def chain_loop(z, step_size, L, key):
        algorithm = blackjax.mclmc(lambda p: -potential_fn(p), L=L, step_size=step_size,
                                   integrator=blackjax.mcmc.integrators.isokinetic_mclachlan)
        init_key, key = jax.random.split(key)
        state = algorithm.init(z, init_key)

        def body(_, carry):
            state, key = carry
            key, step_key = jax.random.split(key)
            state, _ = algorithm.step(step_key, state)
            return state, key

        return lax.fori_loop(0, num_steps, body, (state, key))[0]

    return jax.jit(jax.vmap(chain_loop))


def blackjax_args(init_params, step_size, L, key):
    import jax
    import jax.numpy as jnp

    num_chains = jax.tree.leaves(init_params)[0].shape[0]
    step_size = jnp.full((num_chains,), step_size, jnp.float32)
    L = jnp.full((num_chains,), L, jnp.float32)
    return init_params, step_size, L, jax.random.split(key, num_chains)


def measure_blackjax(num_steps, potential_fn, init_params, step_size, L, key, repeats):
    import jax
    import jax.numpy as jnp

    call_args = blackjax_args(init_params, step_size, L, key)
    start = time.perf_counter()
    compiled = blackjax_loop(potential_fn, num_steps).lower(*call_args).compile()
    compile_seconds = time.perf_counter() - start
    t, state = timed(lambda: jax.block_until_ready(compiled(*call_args)), repeats)
    return {"compile": compile_seconds, "time": t, "finite": bool(jnp.all(jnp.isfinite(state.logdensity)))}


# ---------------------------------------------------------------------------------------------- --profile
def profile(args, X, y, init_params, potential_fn, step_size, L, key, W):
    """Per-step cost of the pieces of a MILE step; returns markdown lines."""
    import jax
    import jax.numpy as jnp
    from blackjax.mcmc import integrators
    from blackjax.mcmc import mclmc as bj_mclmc
    from blackjax.util import generate_unit_vector
    from jax import lax
    from numpyro.infer.mcmc import _collect_and_postprocess

    n = args.profile_steps
    K = jax.tree.leaves(init_params)[0].shape[0]

    # a MILE kernel initialised by NumPyro, started in its tuning phase
    mcmc = make_mcmc(W, n, K, 1, False)
    run_mcmc(mcmc, key, X, y, init_params)
    kernel = mcmc.sampler
    state0 = mcmc.last_state._replace(i=jnp.asarray(0))
    sample_fn, postprocess_fn = mcmc._get_cached_fns()
    transform = _collect_and_postprocess(postprocess_fn, ("z",), ())

    def mile_plain(potential):
        return jax.jit(lambda s: lax.fori_loop(0, n, lambda i, s: kernel._step(s, potential), s))

    def mile_numpyro(s):
        # the loop of numpyro.util.fori_collect (progress_bar=False): step, postprocess, collect
        val = (s,)
        collection = jax.tree.map(lambda x: jnp.zeros((n, *jnp.shape(x)), x.dtype), transform(val))

        def body(i, carry):
            val, collection = carry
            val = sample_fn(val)
            collection = jax.tree.map(
                lambda c, v: lax.cond(i >= 0, lambda c: c.at[i].set(v), lambda c: c, c), collection, transform(val))
            return val, collection

        return lax.fori_loop(0, n, body, (val, collection))

    def free_potential(p):
        return 0.5 * sum(jnp.sum(v ** 2) for v in jax.tree.leaves(p))

    def mclmc_parts(part):
        logdensity = lambda p: -free_potential(p)  # noqa: E731
        kernel_fn = bj_mclmc.build_kernel(integrator=integrators.isokinetic_mclachlan)
        noisy = integrators.with_isokinetic_maruyama(integrators.isokinetic_mclachlan(logdensity))
        plain = integrators.isokinetic_mclachlan(logdensity)
        steps = {
            "kernel": lambda k, s: kernel_fn(k, s, logdensity, 1.0, L, step_size)[0],
            "maruyama": lambda k, s: noisy(s, step_size, L, k)[0],
            "deterministic": lambda k, s: plain(s, step_size)[0],
            "unit_vector": lambda k, s: s._replace(momentum=generate_unit_vector(k, s.position)),
        }
        step = steps[part]

        def chain(z, k):
            s = bj_mclmc.init(z, logdensity, k)

            def body(_, carry):
                s, k = carry
                k, sk = jax.random.split(k)
                return step(sk, s), k

            return lax.fori_loop(0, n, body, (s, k))[0]

        return jax.jit(jax.vmap(chain))

    keys = jax.random.split(key, K)
    bj_call = blackjax_args(init_params, step_size, L, key)
    cases = {
        "floor: 2 vmapped `value_and_grad` (b)": (floor_loop(potential_fn, 2 * n), (init_params,)),
        "BlackJAX `mclmc` step (c)": (blackjax_loop(potential_fn, n), bj_call),
        "`MILE._step` in a plain `fori_loop`": (mile_plain(potential_fn), (state0,)),
        "`MILE._step` in NumPyro's collecting loop (a)": (jax.jit(mile_numpyro), (state0,)),
        "free potential: `MILE._step`": (mile_plain(free_potential), (state0,)),
        "free potential: BlackJAX `mclmc.build_kernel` step": (mclmc_parts("kernel"), (init_params, keys)),
        "free potential: `with_isokinetic_maruyama(isokinetic_mclachlan)` only": (mclmc_parts("maruyama"),
                                                                                  (init_params, keys)),
        "free potential: `isokinetic_mclachlan` only (no noise)": (mclmc_parts("deterministic"), (init_params, keys)),
        "one `generate_unit_vector` (K x d Gaussians)": (mclmc_parts("unit_vector"), (init_params, keys)),
    }
    single_name = "`MILE._step` jitted alone, called once per step from Python (NumPyro's progress-bar path)"
    single_step = jax.jit(lambda s: kernel._step(s, potential_fn))

    def step_by_step(s):
        for _ in range(n):
            s = single_step(s)
        return s

    compiled = {}
    for name, (fn, fn_args) in cases.items():
        compiled[name] = fn.lower(*fn_args).compile()
    jax.block_until_ready(single_step(state0))
    compiled[single_name] = step_by_step
    cases[single_name] = (None, (state0,))
    best = {name: Timing(float("inf"), float("inf")) for name in cases}
    loads = [load_average()]
    for _ in range(args.profile_repeats):
        for name, (_, fn_args) in cases.items():
            t, _ = timed(lambda: jax.block_until_ready(compiled[name](*fn_args)))
            best[name] = Timing(min(best[name].wall, t.wall), min(best[name].cpu, t.cpu))
    loads.append(load_average())
    floor = best["floor: 2 vmapped `value_and_grad` (b)"]

    lines = [
        "## Per-step breakdown (`--profile`)",
        "",
        f"Loops of {n} steps, K = {K}, each compiled ahead of time, run {args.profile_repeats} times "
        f"interleaved; minimum wall and CPU time per step. \"Free potential\" rows use "
        f"`0.5 * sum(z**2)` instead of the BNN, so they show the step's cost without the gradient. "
        f"Load average {fmt(loads[0], 1)} -> {fmt(loads[1], 1)}.",
        "",
        "| loop | wall ms/step | CPU ms/step | CPU / floor |",
        "|---|---:|---:|---:|",
    ]
    for name, t in best.items():
        lines.append(f"| {name} | {fmt(1e3 * t.wall / n, 3)} | {fmt(1e3 * t.cpu / n, 3)} | {fmt(t.cpu / floor.cpu)} |")
    return lines


# ---------------------------------------------------------------------------------------------- report
def fmt(x, digits=2):
    return "n/a" if x != x else f"{x:.{digits}f}"


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
    loads = {}

    # (a)
    loads["a"] = [load_average()]
    mile = measure_runs(make_mcmc(W, S, K, args.thinning, False), mcmc_key, X, y, init_params, clock, args.repeats)
    loads["a"].append(load_average())
    print(f"(a) MILE: first run {fmt(mile['first'].wall)} s ({fmt(mile['first_compile'])} s tracing+compilation), "
          f"second run {fmt(mile['second'].wall)} s wall / {fmt(mile['second'].cpu)} s CPU "
          f"({fmt(mile['compile'])} s tracing+compilation: {mile['compiles']})", flush=True)
    recompiled = mile["compile"] > 0.05
    if recompiled:
        tiny_mcmc = make_mcmc(20, args.thinning, K, args.thinning, False, phase_split=(0.4, 0.1, 0.5))
        tiny = measure_runs(tiny_mcmc, mcmc_key, X, y, init_params, clock, args.repeats)
        loads["a"].append(load_average())
        startup = tiny["second"].wall - tiny["compile"]
        mile_net = mile["second"].wall - mile["compile"] - startup
        mile_plain = mile["second"].wall - tiny["second"].wall
        method = (
            f"NumPyro re-traces and re-compiles on every `mcmc.run`, even for the same MCMC object and shapes: "
            f"`jax.monitoring` reported {fmt(mile['compile'])} s of tracing+compilation ({mile['compiles']}) "
            f"during the timed second run. A tiny MCMC (num_warmup=20, phase_split=(0.4, 0.1, 0.5), "
            f"num_samples={args.thinning}), run twice like (a) with the second call timed, took "
            f"{fmt(tiny['second'].wall)} s wall / {fmt(tiny['second'].cpu)} s CPU, of which {fmt(tiny['compile'])} s "
            f"tracing+compilation ({tiny['compiles']}) and {fmt(startup)} s other startup. "
            f"(a) = second run - its own reported tracing+compilation - the tiny run's other startup. "
            f"(a') = second run - whole tiny run, the plain method: it is off by the difference of the two runs' "
            f"compile times, which differ (see the compile lists)"
        )
        print(f"    tiny run: {fmt(tiny['second'].wall)} s wall / {fmt(tiny['second'].cpu)} s CPU "
              f"({fmt(tiny['compile'])} s tracing+compilation) -> MILE {fmt(mile_net)} s "
              f"(plain subtraction: {fmt(mile_plain)} s)", flush=True)
    else:
        tiny, startup = None, 0.0
        mile_net = mile_plain = mile["second"].wall
        method = ("no compilation was reported during the timed second run (same MCMC object, same shapes), "
                  "so MILE time = time of the second `mcmc.run`")
    # two-point estimate: a run with the same structure and ~1/10 of the steps pays the same fixed costs
    # (startup, tracing, compilation), so the difference of the two runs is the cost of the extra steps
    W_small, S_small = max(100, W // 10), max(1, S // 10)
    small_steps = W_small + S_small
    two_point = None
    if not args.no_two_point and W + S - small_steps >= (W + S) / 2:
        small = measure_runs(make_mcmc(W_small, S_small, K, args.thinning, False), mcmc_key, X, y, init_params,
                             clock, args.repeats)
        loads["a"].append(load_average())
        scale = (W + S) / (W + S - small_steps)
        two_point = Timing((mile["second"].wall - small["second"].wall) * scale,
                           (mile["second"].cpu - small["second"].cpu) * scale)
        method += (
            f". Two-point estimate (a''): a run with num_warmup={W_small}, num_samples={S_small} (run twice, second "
            f"timed: {fmt(small['second'].wall)} s wall / {fmt(small['second'].cpu)} s CPU; "
            f"{fmt(small['compile'])} s tracing+compilation) pays the same fixed costs, so "
            f"(second full run - second small run) x {W + S}/{W + S - small_steps} is the cost of {W + S} steps; "
            f"it is the only MILE figure here in process CPU time, which other processes on the machine inflate "
            f"far less than wall time"
        )
        print(f"    two-point (W={W_small}, S={S_small}): MILE {fmt(two_point.wall)} s wall / {fmt(two_point.cpu)} s CPU",
              flush=True)
    last = mile["last_state"]
    step_size, L = float(jnp.mean(last.step_size)), float(jnp.mean(last.L))
    num_nans = int(jnp.sum(last.num_nans))

    # (b)
    potential_fn = potential(X, y, pot_key)
    loads["b"] = [load_average()]
    floor = measure_floor(2 * (W + S), potential_fn, init_params, args.repeats)
    loads["b"].append(load_average())
    print(f"(b) floor: {fmt(floor['time'].wall)} s wall / {fmt(floor['time'].cpu)} s CPU for {2 * (W + S)} "
          f"vmapped value_and_grad evaluations (AOT compile {fmt(floor['compile'])} s)", flush=True)

    # (c)
    loads["c"] = [load_average()]
    bj = measure_blackjax(W + S, potential_fn, init_params, step_size, L, bj_key, args.repeats)
    loads["c"].append(load_average())
    print(f"(c) BlackJAX MCLMC loop: {fmt(bj['time'].wall)} s wall / {fmt(bj['time'].cpu)} s CPU "
          f"(AOT compile {fmt(bj['compile'])} s; final states finite: {bj['finite']})", flush=True)

    # (d)
    prog = None
    if not args.no_progress:
        loads["d"] = [load_average()]
        with progress_bar_env() as removed:
            prog = measure_runs(make_mcmc(W, S, K, args.thinning, True), mcmc_key, X, y, init_params, clock,
                                args.repeats)
        loads["d"].append(load_average())
        prog_net = prog["second"].wall - prog["compile"] - startup
        print(f"(d) MILE with progress bar: second run {fmt(prog['second'].wall)} s wall / "
              f"{fmt(prog['second'].cpu)} s CPU ({fmt(prog['compile'])} s tracing+compilation: {prog['compiles']}); "
              f"environment variables removed: {sorted(removed) or 'none'}", flush=True)

    profile_lines = []
    if args.profile:
        print("profiling ...", flush=True)
        profile_lines = profile(args, X, y, init_params, potential_fn, step_size, L, mcmc_key, W)

    total = time.perf_counter() - total_start
    steps = W + S
    nan = float("nan")
    rows = [("(a) MILE, `MCMC(..., progress_bar=False)`", Timing(mile_net, nan), "a",
             f"second run {fmt(mile['second'].wall)} s ({fmt(mile['second'].cpu)} s CPU) - its compile "
             f"{fmt(mile['compile'])} s - startup {fmt(startup)} s")]
    if tiny:
        rows.append(("(a') same, plain tiny-run subtraction", Timing(mile_plain, nan), "a",
                     f"second run {fmt(mile['second'].wall)} s - tiny run {fmt(tiny['second'].wall)} s"))
    if two_point:
        rows.append(("(a'') same, two-point estimate", two_point, "a", "full run - run with 1/10 of the steps, rescaled"))
    rows += [
        ("(b) raw floor: `fori_loop` of vmapped `value_and_grad`", floor["time"], "b", f"{2 * steps} evaluations"),
        ("(c) BlackJAX `mclmc` step, vmapped, `fori_loop`", bj["time"], "c", f"{steps} steps, fixed step size and L"),
    ]
    if prog is not None:
        rows.append(("(d) MILE, `MCMC(..., progress_bar=True)`", Timing(prog_net, nan), "d",
                     f"second run {fmt(prog['second'].wall)} s ({fmt(prog['second'].cpu)} s CPU) - its compile "
                     f"{fmt(prog['compile'])} s - startup {fmt(startup)} s"))

    def ratio(a, b):
        return Timing(a.wall / b.wall, a.cpu / b.cpu)

    mile_t = Timing(mile_net, two_point.cpu if two_point else nan)
    ratios = [("MILE (a) / raw floor (b)", ratio(mile_t, floor["time"]),
               f"target <= {FLOOR_TARGET}" + ("; CPU column: (a'')" if two_point else ""))]
    if tiny:
        ratios.append(("MILE (a') / raw floor (b)", ratio(Timing(mile_plain, nan), floor["time"]),
                       "plain tiny-run subtraction"))
    if two_point:
        ratios.append(("MILE (a'') / raw floor (b)", ratio(two_point, floor["time"]), "two-point estimate"))
    ratios += [
        ("MILE (a) / BlackJAX loop (c)", ratio(mile_t, bj["time"]), "CPU column: (a'')" if two_point else ""),
        ("BlackJAX loop (c) / raw floor (b)", ratio(bj["time"], floor["time"]), ""),
    ]
    if prog is not None:
        ratios.append(("progress bar on (d) / off (a)", Timing(prog_net / mile_net, nan), ""))
        ratios.append(("progress bar on / off, whole second runs", ratio(prog["second"], mile["second"]),
                       "compilation included"))

    lines = [
        "# MILE sampling overhead",
        "",
        "Generated by `benchmarks/overhead.py` (see its docstring for the method); command:",
        "",
        "```",
        command,
        "```",
        "",
        f"- model: `mlp_regression`, hidden {HIDDEN}, d = {dim} parameters",
        f"- data: {data_desc}; X {X.shape[0]} x {X.shape[1]}",
        f"- K = {K} chains (`chain_method=\"vectorized\"`), num_warmup W = {W}, num_samples S = {S}, "
        f"thinning {args.thinning}: {steps} steps, {2 * steps} gradient evaluations per chain "
        f"({MILE.num_grad_evals(W, S, K)} in all, with init)",
        f"- initial positions: `deep_ensemble(..., max_epochs=20)` ({fmt(ensemble_seconds, 1)} s, not timed below)",
        f"- tuned by MILE (mean over chains): step size {step_size:.3g}, L {L:.3g}; rejected (NaN) steps: {num_nans}; "
        f"used as the fixed step size and L of (c)",
        f"- timing: wall time (`time.perf_counter`) and process CPU time (`time.process_time`), fastest of "
        f"{args.repeats} call(s), each after a warm-up/compile call of the same shapes. The compile subtraction of "
        f"(a), (a') and (d) works on wall time only (JAX reports compile durations, not CPU time); (a'') cancels "
        f"compilation by differencing and so has both",
        f"- MILE method: {method}",
        f"- load average (1 min): {fmt(loads['a'][0], 1)} at the start, {fmt(load_average(), 1)} at the end, on "
        f"{os.cpu_count()} CPUs. Above the CPU count, other processes shared the machine and inflated the "
        f"wall times unevenly: then trust the CPU columns, and `--profile`'s interleaved per-step comparison",
        "",
        "| measurement | wall s | CPU s | wall ms/step | CPU ms/step | load avg during | notes |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, t, tag, note in rows:
        span = " -> ".join(fmt(v, 1) for v in loads.get(tag, []))
        lines.append(f"| {name} | {fmt(t.wall)} | {fmt(t.cpu)} | {fmt(1e3 * t.wall / steps, 3)} | "
                     f"{fmt(1e3 * t.cpu / steps, 3)} | {span} | {note} |")
    lines += ["", "| ratio | wall | CPU | |", "|---|---:|---:|---|"]
    for name, r, note in ratios:
        lines.append(f"| {name} | {fmt(r.wall)} | {fmt(r.cpu)} | {note} |")
    lines += [
        "",
        "Compile and warm-up times (not in the tables above):",
        "",
        f"- (a) first `mcmc.run`: {fmt(mile['first'].wall)} s, of which {fmt(mile['first_compile'])} s "
        f"tracing+compilation (`jax.monitoring`); second run: {fmt(mile['compile'])} s ({mile['compiles']})",
        f"- (b) ahead-of-time compile: {fmt(floor['compile'])} s; one jitted vmapped `value_and_grad` call "
        f"dispatched from Python: {fmt(1e3 * floor['single_call'], 3)} ms",
        f"- (c) ahead-of-time compile: {fmt(bj['compile'])} s",
    ]
    if prog is not None:
        lines.append(f"- (d) first run: {fmt(prog['first'].wall)} s; second run: {fmt(prog['compile'])} s "
                     f"tracing+compilation ({prog['compiles']})")
    if profile_lines:
        lines += [""] + profile_lines
    lines += ["", "## Machine", ""]
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
