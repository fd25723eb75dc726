"""UCI regression: MILE vs BDE (NUTS) vs DE from one deep ensemble, on one data set and split.

Run: ``python examples/uci_regression.py --dataset yacht`` (a few minutes on 2 CPU cores; the
paper's full budget is ``--members 12 --warmup 50000 --samples 10000``). The data file
``{dataset}.data`` is looked up in ``--data``, ``$NUMPYRO_MILE_DATA`` and the per-user cache
(``numpyro_mile.datasets.download_uci(name)`` fetches it); without it the example falls back to
generated data and says so. ``--smoke`` runs the same code with tiny budgets (seconds).

Every method starts from the same ensemble members; the table reports test RMSE and LPPD in
standardised units, sampler seconds (after compilation), gradient evaluations, ESS per chain
and the chainwise R-hat. This is ``benchmarks/uci.py`` in miniature: the benchmark pages are made
by that script.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np
import numpyro

from numpyro_mile import deep_ensemble
from numpyro_mile.compare import format_table, run_bde, run_de, run_mile
from numpyro_mile.datasets import load_uci, split, standardize, toy_regression
from numpyro_mile.models import mlp_regression

# every CPU core a JAX device (before JAX starts), so that vectorized chains run over all of them
numpyro.set_host_device_count(os.cpu_count())


def load(dataset: str, data_dir: str | None):
    """``(X, y, label)``: the UCI set, or generated data when its file is not found."""
    try:
        X, y = load_uci(dataset, data_dir)
        return X, y, dataset
    except FileNotFoundError as err:
        print(f"note: {str(err).splitlines()[0]}\n      using generated toy data instead.")
        X, y = toy_regression(300, seed=1)
        return X, y, "toy"


def main(
    dataset: str = "yacht",
    data_dir: str | None = None,
    seed: int = 1,
    members: int = 4,
    max_epochs: int = 500,
    warmup: int = 5_000,
    samples: int = 1_000,
    thinning: int = 10,
    bde_warmup: int = 100,
    bde_samples: int = 100,
) -> None:
    X, y, label = load(dataset, data_dir)
    (train, _val, test), _ = standardize(split(X, y, seed=seed))
    print(
        f"{label}: {train[0].shape[0]} training rows, {train[0].shape[1]} features; load average "
        f"{os.getloadavg()[0]:.1f}"
    )

    start = time.perf_counter()
    de = deep_ensemble(mlp_regression, jax.random.PRNGKey(seed), members, *train, max_epochs=max_epochs)
    print(f"deep ensemble of {members}: {time.perf_counter() - start:.1f} s, epochs {de.num_epochs.tolist()}")

    key_mile, key_bde = jax.random.split(jax.random.PRNGKey(seed + 100))
    results = [
        run_de(mlp_regression, de, *test),
        run_mile(
            mlp_regression,
            de,
            train,
            *test,
            rng_key=key_mile,
            num_warmup=warmup,
            num_samples=samples,
            thinning=thinning,
        ),
        run_bde(mlp_regression, de, train, *test, rng_key=key_bde, num_warmup=bde_warmup, num_samples=bde_samples),
    ]
    print(format_table(results))
    mile = results[1]
    if np.isfinite(mile.crhat) and mile.crhat > 1.1:
        print("MILE's cR-hat is above 1.1: the warmup is too short for this data set.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="yacht", help="UCI data set (airfoil, concrete, energy, yacht, ...)")
    parser.add_argument("--data", default=None, help="folder holding {dataset}.data")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--members", type=int, default=4, help="ensemble members = chains")
    parser.add_argument("--warmup", type=int, default=5_000, help="MILE warmup steps")
    parser.add_argument("--samples", type=int, default=1_000, help="MILE sampling steps")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: checks that the example runs")
    args = parser.parse_args()
    budget = (
        dict(members=2, max_epochs=5, warmup=100, samples=40, thinning=1, bde_warmup=5, bde_samples=5)
        if args.smoke
        else dict(members=args.members, warmup=args.warmup, samples=args.samples)
    )
    main(args.dataset, args.data, args.seed, **budget)
