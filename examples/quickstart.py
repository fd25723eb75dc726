"""Quickstart: MILE on a 1-D regression with a gap, in ten lines. ``python examples/quickstart.py``."""

import jax
from numpyro.infer import MCMC

from numpyro_mile import MILE, predict
from numpyro_mile.datasets import toy_regression, toy_regression_grid
from numpyro_mile.models import mlp_regression

X, y = toy_regression(200)
mcmc = MCMC(MILE(mlp_regression), num_warmup=5_000, num_samples=1_000, thinning=10, num_chains=4,
            chain_method="vectorized")
mcmc.run(jax.random.PRNGKey(0), X, y)  # deep-ensemble pretraining + MCLMC tuning + sampling
grid = toy_regression_grid(50)
band = predict(mlp_regression, mcmc.get_samples(), grid, reduce="moments")["mu"]
for x, m, v in zip(grid[::7, 0], band.mean[::7], band.var[::7]):
    print(f"x = {x:+.2f}: mean {m:+.2f}, sd of the mean {v ** 0.5:.2f}")  # wider in the gap and outside the data
