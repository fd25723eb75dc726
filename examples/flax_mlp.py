"""MILE on a Flax network wrapped with ``numpyro.contrib.module.random_flax_module``.

Run: ``python examples/flax_mlp.py`` (about a minute on 2 CPU cores);
``--smoke`` runs the same code with tiny budgets (seconds), as the tests do.
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from flax import linen as nn
from numpyro.contrib.module import random_flax_module
from numpyro.infer import MCMC

from numpyro_mile import MILE, metrics
from numpyro_mile import log_likelihood
from numpyro_mile.datasets import split, standardize, toy_regression

# every CPU core a JAX device (before JAX starts), so that vectorized chains run over all of them
numpyro.set_host_device_count(os.cpu_count())


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(16)(x))
        x = nn.relu(nn.Dense(16)(x))
        return nn.Dense(2)(x)


def model(X, y=None):
    net = random_flax_module("net", MLP(), dist.Normal(0.0, 1.0), input_shape=(1, X.shape[1]))
    # index the data through the plate, so pretraining and minibatch kernels can subsample it
    with numpyro.plate("data", X.shape[0]):
        out = net(numpyro.subsample(X, event_dim=1))
        sigma = jnp.clip(jnp.exp(out[:, 1]), 1e-6, 1e6)
        obs = None if y is None else numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(out[:, 0], sigma), obs=obs)


def main(num_warmup=2000, num_samples=500, max_epochs=500):
    X, y = toy_regression(200, seed=0)
    (train, val, test), _ = standardize(split(X, y, seed=0))
    kernel = MILE(model, ensemble_options=dict(max_epochs=max_epochs))
    mcmc = MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, thinning=5, num_chains=4, chain_method="vectorized"
    )
    mcmc.run(jax.random.PRNGKey(0), *train)
    samples = mcmc.get_samples()
    print("sites:", sorted(samples))
    print("test LPPD:", metrics.lppd(log_likelihood(model, samples, *test)["y"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: checks that the example runs")
    args = parser.parse_args()
    main(**(dict(num_warmup=100, num_samples=20, max_epochs=5) if args.smoke else {}))
