"""Cost per step of SGLD (minibatch and full batch) and ICSGLD against MILE per gradient evaluation.

Setting: the MILE benchmark BNN (``mlp_regression``, hidden layers (16, 16), 402 parameters)
on the standardised training split (seed 1, 70 %) of UCI airfoil, ``K = 4`` chains vectorised
on one device. For each kernel the script builds its state with ``kernel.init`` (all kernels
from the same random start, ``init_to_uniform(radius=0.1)``; MILE with ``pretrain=False``) and
times ``T`` calls of ``kernel.sample`` inside one jitted ``lax.fori_loop`` -- the kernel's own
step, compiled ahead of time (``jit(...).lower(...).compile()``); all loops are compiled
first and then timed in ``--repeats`` interleaved rounds (minimum per loop), so that a change
of the machine's load hits every kernel alike. MILE is timed during its tuning phase (``T < num_warmup``), whose
per-step cost
includes the step-size adaptation; one MILE step costs two gradient evaluations. The raw
gradient floor (``vmap(value_and_grad(potential))`` for all chains, full batch and on 32 rows,
the latter including the draw of the indices) and SGLD's random numbers alone (key split and
one Gaussian per coordinate) are timed the same way.

A second table runs each kernel end to end in ``numpyro.infer.MCMC`` (``num_warmup=W``,
``num_samples=S``, ``progress_bar=False``): wall time of one ``run`` including NumPyro's
tracing and compilation, which it repeats on every ``run``.

Usage::

    python benchmarks/sgmcmc.py                       # writes docs/benchmarks/sgmcmc.md
    python benchmarks/sgmcmc.py --steps 500 --no-write
"""

from __future__ import annotations

import sys
from datetime import date

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, init_to_uniform

from _common import (
    ROOT,
    Stopwatch,
    add_common_options,
    argument_parser,
    command_line,
    compile_ahead,
    data_dir,
    fastest,
    finished,
    load_average,
    load_span,
    machine_summary,
    markdown_table,
)

REPORT = ROOT / "docs" / "benchmarks" / "sgmcmc.md"
HIDDEN = (16, 16)
BATCH = 32


def parse_args(argv=None):
    p = argument_parser(__doc__)
    add_common_options(p, data="airfoil.data")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--steps", type=int, default=500, help="steps T per timed kernel loop")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mcmc-warmup", type=int, default=250)
    p.add_argument("--mcmc-samples", type=int, default=250)
    add_common_options(p, no_write="print the report, write no files")
    return p.parse_args(argv)


def load_airfoil(folder):
    from numpyro_mile.datasets import load_uci, split, standardize

    X, y = load_uci("airfoil", data_dir=folder)
    parts, _ = standardize(split(X, y, seed=1))
    X_train, y_train = parts.train
    return jnp.asarray(X_train, jnp.float32), jnp.asarray(y_train, jnp.float32)


def kernel_loop(kernel, key, num_chains, steps, X, y, kwargs, init_params):
    """``T`` calls of ``kernel.sample`` in one ``fori_loop``, compiled; returns ``(compiled, state, compile s)``."""
    keys = jax.random.split(key, num_chains)
    state = kernel.init(keys, steps + 10, init_params, (X, y), kwargs)

    def loop(s):
        return jax.lax.fori_loop(0, steps, lambda i, s: kernel.sample(s, (X, y), kwargs), s)

    compiled, compile_s = compile_ahead(loop, state)
    return compiled, state, compile_s


def floor_loop(potential, z, key, steps, minibatch):
    """``T`` vectorised value-and-grad evaluations; each moves z a little so none can be hoisted."""
    vg = jax.vmap(jax.value_and_grad(potential))
    num_chains = jax.tree.leaves(z)[0].shape[0]

    def loop(carry):
        def body(i, c):
            z, acc = c
            keys = jax.random.split(jax.random.fold_in(key, i), num_chains)
            energy, grad = vg(z, keys) if minibatch else vg(z)
            z = jax.tree.map(lambda a, g: a - 1e-8 * g, z, grad)
            return z, acc + energy.sum()

        return jax.lax.fori_loop(0, steps, body, carry)

    arg = (z, jnp.zeros(()))
    compiled, compile_s = compile_ahead(loop, arg)
    return compiled, arg, compile_s


def noise_loop(keys, dim, steps):
    """``T`` rounds of SGLD's key use and Gaussian noise (split into 3, one normal per coordinate) for all chains."""

    def loop(carry):
        def body(i, c):
            keys, acc = c
            split = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
            noise = jax.vmap(lambda k: jax.random.normal(k, (dim,)))(split[:, 2])
            return split[:, 0], acc + noise.sum()

        return jax.lax.fori_loop(0, steps, body, carry)

    arg = (keys, jnp.zeros(()))
    compiled, compile_s = compile_ahead(loop, arg)
    return compiled, arg, compile_s


def mcmc_seconds(kernel, key, num_chains, warmup, samples, X, y, kwargs, init_params):
    mcmc = MCMC(
        kernel,
        num_warmup=warmup,
        num_samples=samples,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    with Stopwatch() as clock:
        mcmc.run(key, X, y, init_params=init_params, **kwargs)
        finished(mcmc)
    return clock.wall


def main(argv=None):
    args = parse_args(argv)
    from numpyro_mile import ICSGLD, MILE, SGLD
    from numpyro_mile.minibatch import MinibatchModel
    from numpyro_mile.models import mlp_regression

    load_start = load_average()
    X, y = load_airfoil(data_dir(args.data))
    K = args.chains
    key = jax.random.PRNGKey(0)
    init = init_to_uniform(radius=0.1)
    mb_kwargs = dict(hidden=HIDDEN, subsample_size=BATCH)
    full_kwargs = dict(hidden=HIDDEN)
    mb = MinibatchModel(mlp_regression, (X, y), mb_kwargs)
    init_params = mb.init_positions(jax.random.split(jax.random.PRNGKey(1), K), init_strategy=init)
    dim = sum(int(np.prod(s)) for s in mb.latent_shapes.values())
    machine = machine_summary()
    print(f"airfoil train: N={X.shape[0]}, d={dim}, K={K}; {machine}", flush=True)

    eps = 1e-5
    kernels = [
        ("SGLD, minibatch n=32", lambda: SGLD(mlp_regression, eps), mb_kwargs, 1),
        ("SGLD, full batch", lambda: SGLD(mlp_regression, eps), full_kwargs, 1),
        ("pSGLD (RMSprop), minibatch n=32", lambda: SGLD(mlp_regression, eps, preconditioner="rmsprop"), mb_kwargs, 1),
        (
            "ICSGLD, minibatch n=32",
            lambda: ICSGLD(mlp_regression, eps, zeta=1.0, num_bins=200, bin_width=50.0, min_energy=-2000.0),
            mb_kwargs,
            1,
        ),
        ("MILE (tuning phase), full batch", lambda: MILE(mlp_regression, pretrain=False), full_kwargs, 2),
    ]
    loops = []  # (name, compiled, arg, gradient evaluations per step, compile seconds)
    full_potential = MinibatchModel(mlp_regression, (X, y), full_kwargs).full_potential_fn((X, y), full_kwargs)
    compiled, arg, compile_s = floor_loop(full_potential, init_params, key, args.steps, False)
    loops.append(("gradient floor, full batch", compiled, arg, 1, compile_s))
    compiled, arg, compile_s = floor_loop(mb.potential_fn((X, y), mb_kwargs), init_params, key, args.steps, True)
    loops.append(("gradient floor, minibatch n=32", compiled, arg, 1, compile_s))
    compiled, arg, compile_s = noise_loop(jax.random.split(key, K), dim, args.steps)
    loops.append(("key split + Gaussian noise only (no gradient)", compiled, arg, 0, compile_s))
    for name, make, kwargs, grads in kernels:
        compiled, state, compile_s = kernel_loop(make(), key, K, args.steps, X, y, kwargs, init_params)
        loops.append((name, compiled, state, grads, compile_s))
        print(f"compiled {name} in {compile_s:.1f} s", flush=True)
    timings = fastest([lambda c=c, a=a: c(a) for _, c, a, _, _ in loops], args.repeats)
    rows = [(name, t.wall / args.steps, grads, compile_s) for (name, _, _, grads, compile_s), t in zip(loops, timings)]
    for row in rows:
        print(row, flush=True)

    e2e = []
    for name, make, kwargs, grads in kernels:
        if name.startswith("pSGLD"):
            continue
        seconds = mcmc_seconds(make(), key, K, args.mcmc_warmup, args.mcmc_samples, X, y, kwargs, init_params)
        e2e.append((name, seconds))
        print(e2e[-1], flush=True)
    load_end = load_average()

    full_step = dict((r[0], r[1]) for r in rows)["SGLD, full batch"]
    epoch = X.shape[0] / BATCH
    lines = [
        "# SG-MCMC cost per step: SGLD, pSGLD, ICSGLD and MILE",
        "",
        f"Generated by `{command_line(__file__, argv)}` on {date.today()}.",
        "",
        f"Machine: {machine}. {load_span(load_start, load_end)}"
        + (
            ": the machine was shared with other jobs, so times are indicative."
            if max(load_start, load_end) > 1.5
            else "."
        ),
        "",
        f"Setting: `mlp_regression`, hidden layers {HIDDEN} (d = {dim}), UCI airfoil training split "
        f"(N = {X.shape[0]} rows, seed 1, standardised), K = {K} chains vectorised, float32. Every kernel starts "
        "from the same `init_to_uniform(radius=0.1)` positions; MILE with `pretrain=False`.",
        "",
        f"## Kernel step, compiled (T = {args.steps} steps in one jitted `fori_loop`, minimum of {args.repeats} "
        "interleaved rounds)",
        "",
    ]
    table = []
    for name, per_step, grads, compile_s in rows:
        passes = epoch if "n=32" in name else 1.0
        per_grad = f"{1e3 * per_step / grads:.3f}" if grads else "-"
        table.append(
            [
                name,
                f"{1e3 * per_step:.3f}",
                grads,
                per_grad,
                f"{passes:.1f}",
                f"{1e3 * per_step * passes:.2f}",
                f"{compile_s:.1f}",
            ]
        )
    lines += markdown_table(
        [
            "kernel",
            "ms per step (all chains)",
            "gradient evals per step",
            "ms per gradient eval",
            "steps per data pass",
            "ms per data pass",
            "compile (s)",
        ],
        table,
        compact=True,
    )
    per_step = dict((r[0], r[1]) for r in rows)
    mile_per_grad = per_step["MILE (tuning phase), full batch"] / 2
    mb_step = per_step["SGLD, minibatch n=32"]
    mb_floor = per_step["gradient floor, minibatch n=32"]
    noise = per_step["key split + Gaussian noise only (no gradient)"]
    lines += [
        "",
        f"A minibatch SGLD step costs {mb_step / full_step:.2f}x a full-batch SGLD step and "
        f"{mb_step / mile_per_grad:.2f}x one MILE gradient evaluation; per pass over the data "
        f"({epoch:.1f} minibatch steps) minibatch SGLD costs {mb_step * epoch / full_step:.1f}x a full-batch step. "
        f"MILE costs {mile_per_grad / full_step:.2f}x a full-batch SGLD step per gradient evaluation "
        "(its step also carries the step-size tuning and the MCLMC momentum update).",
        "",
        f"## End to end in `numpyro.infer.MCMC` (W = {args.mcmc_warmup}, S = {args.mcmc_samples}, wall time of one "
        "`run`, compilation included)",
        "",
    ]
    lines += markdown_table(
        ["kernel", "seconds"],
        [[name.replace(" (tuning phase)", ""), f"{seconds:.1f}"] for name, seconds in e2e],
        compact=True,
    )
    lines += [
        "",
        f"Reading: at this size (N = {X.shape[0]}, d = {dim}) a gradient on 32 rows is cheap on CPU and a step's "
        f"fixed costs matter. The minibatch SGLD step costs {mb_step / mb_floor:.1f}x its gradient floor; drawing "
        f"the Gaussian noise ({K} x {dim} normals from JAX's threefry generator, plus the key split) alone takes "
        f"{1e3 * noise:.3f} ms, {noise / mb_floor:.1f}x the 32-row gradient. Drawing the 32 indices (Floyd's "
        "algorithm, `numpyro_mile.minibatch`) is part of the minibatch floor. End-to-end times on this machine "
        "are dominated by NumPyro's tracing and XLA compilation of the sampling loop (several seconds per `run`, "
        "repeated on every `run`, even for the same MCMC object).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(text)
        print(f"wrote {REPORT}")


if __name__ == "__main__":
    main(sys.argv[1:] or None)
