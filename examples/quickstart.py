"""Quickstart: MILE on a 1-D regression with a gap, in ten lines.

Run: ``python examples/quickstart.py`` (under a minute on 2 CPU cores);
``--smoke`` runs the same code with tiny budgets (seconds), as the tests do.
"""

import argparse
import os

import jax
import numpyro
from numpyro.infer import MCMC

from numpyro_mile import MILE, predict
from numpyro_mile.datasets import toy_regression, toy_regression_grid
from numpyro_mile.models import mlp_regression

# every CPU core a JAX device (before JAX starts), so that vectorized chains run over all of them
numpyro.set_host_device_count(os.cpu_count())


def main(num_warmup: int = 5_000, num_samples: int = 1_000, thinning: int = 10, max_epochs: int = 500) -> None:
    X, y = toy_regression(200)
    kernel = MILE(mlp_regression, ensemble_options=dict(max_epochs=max_epochs))
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        thinning=thinning,
        num_chains=4,
        chain_method="vectorized",
    )
    mcmc.run(jax.random.PRNGKey(0), X, y)  # deep-ensemble pretraining + MCLMC tuning + sampling
    grid = toy_regression_grid(50)
    band = predict(mlp_regression, mcmc.get_samples(), grid, reduce="moments")["mu"]
    for x, m, v in zip(grid[::7, 0], band.mean[::7], band.var[::7]):
        print(f"x = {x:+.2f}: mean {m:+.2f}, sd of the mean {v**0.5:.2f}")  # wider in the gap and outside the data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: checks that the example runs")
    args = parser.parse_args()
    main(**(dict(num_warmup=100, num_samples=20, thinning=1, max_epochs=5) if args.smoke else {}))
