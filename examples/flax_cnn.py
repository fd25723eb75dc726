"""MILE on a small Flax CNN (``numpyro.contrib.module.random_flax_module``) for scikit-learn digits.

The 8x8 digit images (``numpyro_mile.datasets.digits(seed, images=True)``) go through two 3x3
convolutions and a dense layer; every weight gets a standard normal prior. MILE trains a deep
ensemble of the CNN with optax, tunes MCLMC from each member and samples; the example prints
test accuracy, NLL and calibration (ECE) of the members (DE) and of the posterior (MILE).

Run: ``python examples/flax_cnn.py`` (a few minutes on 2 CPU cores);
``--smoke`` runs the same code with tiny budgets (seconds), as the tests do.
"""

from __future__ import annotations

import argparse
import os

import jax
import numpyro
import numpyro.distributions as dist
from flax import linen as nn
from numpyro.contrib.module import random_flax_module
from numpyro.infer import MCMC

from numpyro_mile import MILE
from numpyro_mile.datasets import digits
from numpyro_mile.evaluation import evaluate_classification

# every CPU core a JAX device (before JAX starts), so that vectorized chains run over all of them
numpyro.set_host_device_count(os.cpu_count())

NUM_CLASSES = 10


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):  # x: (N, 8, 8, 1)
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (N, 4, 4, 8)
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (N, 2, 2, 16)
        return nn.Dense(NUM_CLASSES)(x.reshape(x.shape[0], -1))


def model(X, y=None):
    net = random_flax_module("cnn", CNN(), dist.Normal(0.0, 1.0), input_shape=(1, *X.shape[1:]))
    # index the images through the "data" plate, so MILE can pretrain the ensemble on minibatches
    with numpyro.plate("data", X.shape[0]):
        logits = net(numpyro.subsample(X, event_dim=3))
        if y is None:  # record the logits only for prediction, not for every posterior sample
            numpyro.deterministic("logits", logits)
        obs = None if y is None else numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Categorical(logits=logits), obs=obs)


def main(
    num_chains: int = 4,
    num_warmup: int = 1_000,
    num_samples: int = 200,
    thinning: int = 2,
    max_epochs: int = 200,
    max_rows: int | None = None,
) -> dict[str, dict[str, float]]:
    (X, y), _val, (X_test, y_test) = digits(seed=0, images=True)
    X, y = X[:max_rows], y[:max_rows]  # max_rows=None: all 1257 training images
    kernel = MILE(model, ensemble_options=dict(max_epochs=max_epochs))
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        thinning=thinning,
        num_chains=num_chains,
        chain_method="vectorized",
    )
    mcmc.run(jax.random.PRNGKey(0), X, y)
    members = kernel.ensembles[-1].samples  # the deep ensemble MILE trained, as DE "samples"
    results = {
        "DE": evaluate_classification(model, members, X_test, y_test),
        "MILE": evaluate_classification(model, mcmc.get_samples(), X_test, y_test),
    }
    num_params = sum(v[0].size for v in members.values())
    print(f"CNN with {num_params} parameters, {X.shape[0]} training images, {num_chains} chains")
    for name, r in results.items():
        print(f"{name:5s} accuracy {r['accuracy']:.3f}  NLL {r['nll']:.3f}  ECE {r['ece']:.3f}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: checks that the example runs")
    args = parser.parse_args()
    smoke = dict(num_chains=2, num_warmup=100, num_samples=10, thinning=1, max_epochs=2, max_rows=128)
    main(**(smoke if args.smoke else {}))
