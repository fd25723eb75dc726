"""Command line: ``numpyro-mile demo`` runs MILE vs BDE vs DE on generated data (no download)."""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time

import jax


def demo(args: argparse.Namespace) -> int:
    """DE, MILE and BDE on the 1-D toy regression with a gap; prints a markdown table."""
    from .datasets import split, standardize, toy_regression
    from .ensemble import deep_ensemble
    from .experiments import format_table, run_bde, run_de, run_mile
    from .models import mlp_regression

    X, y = toy_regression(args.n, seed=args.seed)
    data, _ = standardize(split(X, y, seed=args.seed))
    (X_train, y_train), val, (X_test, y_test) = data
    model_kwargs = {"hidden": tuple(args.hidden)}
    key_de, key_mile, key_bde = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    progress = not args.quiet

    print(f"toy regression: {len(y_train)} train / {len(val[1])} val / {len(y_test)} test rows, "
          f"MLP {args.hidden}, {args.chains} chains", file=sys.stderr)
    start = time.perf_counter()
    ensemble = deep_ensemble(mlp_regression, key_de, args.chains, X_train, y_train, validation=val,
                             progress_bar=progress, **model_kwargs)
    de_seconds = time.perf_counter() - start
    print(f"deep ensemble trained in {de_seconds:.1f} s (epochs {ensemble.num_epochs.tolist()})", file=sys.stderr)
    results = [run_de(mlp_regression, ensemble, X_test, y_test, **model_kwargs)]
    print("MILE ...", file=sys.stderr)
    results.append(run_mile(mlp_regression, ensemble, (X_train, y_train), X_test, y_test, rng_key=key_mile,
                            num_warmup=args.mile_warmup, num_samples=args.samples, thinning=args.thinning,
                            progress_bar=progress, **model_kwargs))
    print("BDE (NUTS from the same members) ...", file=sys.stderr)
    results.append(run_bde(mlp_regression, ensemble, (X_train, y_train), X_test, y_test, rng_key=key_bde,
                           num_warmup=args.bde_warmup, num_samples=args.bde_samples, progress_bar=progress,
                           **model_kwargs))
    print(format_table(results))
    mile, nuts = results[1], results[2]
    print(f"\nDE fit {de_seconds:.1f} s; MILE sampler {mile.seconds:.1f} s vs BDE {nuts.seconds:.1f} s "
          f"({nuts.seconds / mile.seconds:.1f}x); machine: {platform.machine()}, {jax.device_count()} "
          f"{jax.default_backend()} device(s), jax {jax.__version__}.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="numpyro-mile", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="MILE vs BDE vs DE on a generated 1-D regression (a few minutes on 2 cores)")
    p.add_argument("--n", type=int, default=300, help="number of generated rows")
    p.add_argument("--chains", type=int, default=4, help="ensemble members = chains")
    p.add_argument("--hidden", type=int, nargs="+", default=[16, 16])
    p.add_argument("--mile-warmup", type=int, default=4000)
    p.add_argument("--samples", type=int, default=1000, help="MILE samples per chain (before thinning)")
    p.add_argument("--thinning", type=int, default=2)
    p.add_argument("--bde-warmup", type=int, default=200)
    p.add_argument("--bde-samples", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
