"""ICSGLD vs SGLD on a two-mode Gaussian mixture with known mode weights.

The target is ``0.8 N((-4.5, 0), I) + 0.2 N((4.5, 0), I)`` in 2-D: two modes separated by an
energy barrier of 8.5 nats (seen from the minor mode) to 10 nats (from the main one). Half of
the chains start in each mode. SGLD chains stay where they start (crossings are rare), so SGLD's
estimate of the left mode's weight stays near the fraction of chains started there, 0.5.
ICSGLD's chains share one energy histogram, flatten the barrier and cross it; importance weights
(``numpyro_mile.importance_weights``) turn their samples of the flattened target into an
estimate of the true weight 0.8. (Started all in the minor mode, ICSGLD needs a few times longer
runs before its histogram, and so its weights, settle.)

Run: ``python examples/icsgld_multimodal.py`` (about a minute on 2 CPU cores);
``--smoke`` runs the same code with tiny budgets (seconds), as the tests do.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_mile import ICSGLD, SGLD, importance_weights

# every CPU core a JAX device (before JAX starts), so that vectorized chains run over all of them
numpyro.set_host_device_count(os.cpu_count())

WEIGHT, SHIFT = 0.8, 4.5  # weight of the left mode, distance of each mode from 0
LOCS = jnp.array([[-SHIFT, 0.0], [SHIFT, 0.0]])


def mixture():
    """The target as a NumPyro model with one 2-D latent site ``x`` (no data)."""
    modes = dist.Categorical(probs=jnp.array([WEIGHT, 1 - WEIGHT]))
    numpyro.sample("x", dist.MixtureSameFamily(modes, dist.Normal(LOCS, 1.0).to_event(1)))


def run(kernel, num_chains: int, num_warmup: int, num_samples: int) -> MCMC:
    half = (jnp.arange(num_chains) < num_chains // 2)[:, None]
    start = {"x": jnp.where(half, LOCS[0], LOCS[1])}  # half of the chains in each mode
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), init_params=start)
    return mcmc


def main(num_chains: int = 8, num_warmup: int = 3_000, num_samples: int = 30_000) -> dict[str, float]:
    step_size = 0.02
    # U = -log p(x) is about 2.06 at the main mode's centre (its minimum) and 3.45 at the minor one's;
    # 40 bins of width 0.5 from 2.0 cover energies up to 21, the barrier included
    icsgld = ICSGLD(mixture, step_size, zeta=1.0, num_bins=40, bin_width=0.5, min_energy=2.0)
    estimates = {}

    sgld = run(SGLD(mixture, step_size), num_chains, num_warmup, num_samples)
    estimates["SGLD"] = float(np.mean(np.asarray(sgld.get_samples()["x"][:, 0]) < 0))

    mcmc = run(icsgld, num_chains, num_warmup, num_samples)
    left = np.asarray(mcmc.get_samples()["x"][:, 0]) < 0
    weights = importance_weights(mcmc)  # normalised, aligned with mcmc.get_samples()
    estimates["ICSGLD, unweighted"] = float(left.mean())
    estimates["ICSGLD, importance-weighted"] = float(np.sum(weights * left))
    effective = 1.0 / np.sum(weights**2)

    print(f"weight of the left mode (true {WEIGHT}), {num_chains} chains, half started in each mode:")
    for name, value in estimates.items():
        print(f"  {name:28s} {value:.3f}")
    print(f"importance weights: effective sample size {effective:.0f} of {weights.size}")
    low, high = icsgld.energy_range(mcmc.last_state)
    print(f"energies seen: {low:.2f} .. {high:.2f} (regular bins up to {icsgld.max_energy:.2f})")
    return estimates


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: checks that the example runs")
    args = parser.parse_args()
    main(**(dict(num_chains=4, num_warmup=100, num_samples=400) if args.smoke else {}))
