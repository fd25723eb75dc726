"""Classification with calibration: MILE vs DE vs approximate posteriors on scikit-learn digits.

One MLP classifier (``numpyro_mile.models.mlp_classification``, 64 -> 16 -> 16 -> 10) is fitted
by a deep ensemble (DE), MILE from the ensemble's members, and three BayesDLL-style approximations
(``numpyro_mile.approx``: MAP, mean-field VI, diagonal Laplace). For each, the example prints test
accuracy, NLL, ECE and MCE of the posterior predictive mean, before and after temperature scaling
fitted on the validation split, and ``--plot FILE`` saves reliability diagrams.

Run: ``python examples/classification_calibration.py`` (a few minutes on 2 CPU cores);
``--smoke`` runs the same code with tiny budgets (seconds), as the tests do.
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np
import numpyro
from numpyro.infer import MCMC

from numpyro_mile import MILE, approx, deep_ensemble, metrics
from numpyro_mile.datasets import digits
from numpyro_mile.models import mlp_classification
from numpyro_mile.evaluation import predictive_probs

# every CPU core a JAX device (before JAX starts), so that vectorized chains run over all of them
numpyro.set_host_device_count(os.cpu_count())

OPTIONS = dict(num_classes=10, hidden=(16, 16))


def posterior_samples(
    train, *, members: int, max_epochs: int, num_warmup: int, num_samples: int, approx_steps: int, num_draws: int
) -> dict[str, dict]:
    """Constrained samples of every method, dict method -> dict site -> (S, ...)."""
    key = jax.random.PRNGKey(0)
    de = deep_ensemble(mlp_classification, key, members, *train, max_epochs=max_epochs, **OPTIONS)
    mcmc = MCMC(
        MILE(mlp_classification),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=members,
        chain_method="vectorized",
    )
    mcmc.run(jax.random.PRNGKey(1), *train, init_params=de.init_params, **OPTIONS)
    out = {"DE": de.samples, "MILE": mcmc.get_samples()}
    batch = dict(subsample_size=64, **OPTIONS)
    fits = {"MAP": approx.fit_map, "VI": approx.fit_vi, "Laplace": approx.fit_laplace}
    for k, (name, fit) in enumerate(fits.items()):
        posterior = fit(mlp_classification, jax.random.PRNGKey(10 + k), *train, num_steps=approx_steps, **batch)
        out[name] = posterior.sample(jax.random.PRNGKey(20 + k), 0 if name == "MAP" else num_draws)
    return out


def evaluate(probs_test: np.ndarray, probs_val: np.ndarray, y_test, y_val) -> dict[str, float]:
    """Test metrics of the predictive mean, and NLL / ECE after temperature scaling fitted on validation."""
    T = metrics.fit_temperature(np.log(probs_val), y_val)  # log predictive probabilities as logits
    scaled = metrics.apply_temperature(np.log(probs_test), T)
    return dict(
        accuracy=metrics.accuracy(probs_test, y_test),
        nll=metrics.nll(probs_test, y_test),
        ece=metrics.ece(probs_test, y_test),
        mce=metrics.mce(probs_test, y_test),
        T=T,
        nll_T=metrics.nll(scaled, y_test),
        ece_T=metrics.ece(scaled, y_test),
    )


def main(
    members: int = 4,
    max_epochs: int = 500,
    num_warmup: int = 2_000,
    num_samples: int = 500,
    approx_steps: int = 5_000,
    num_draws: int = 100,
    plot: str | None = None,
) -> dict[str, dict[str, float]]:
    train, (X_val, y_val), (X_test, y_test) = digits(seed=0)
    samples = posterior_samples(
        train,
        members=members,
        max_epochs=max_epochs,
        num_warmup=num_warmup,
        num_samples=num_samples,
        approx_steps=approx_steps,
        num_draws=num_draws,
    )
    probs = {name: predictive_probs(mlp_classification, s, X_test, **OPTIONS) for name, s in samples.items()}
    results = {
        name: evaluate(probs[name], predictive_probs(mlp_classification, s, X_val, **OPTIONS), y_test, y_val)
        for name, s in samples.items()
    }
    print(f"digits: {train[0].shape[0]} training images, {len(y_test)} test images; predictive mean of each method")
    print("method   accuracy   NLL    ECE    MCE  |  T     NLL(T)  ECE(T)")
    for name, r in results.items():
        print(
            f"{name:8s} {r['accuracy']:8.3f} {r['nll']:6.3f} {r['ece']:6.3f} {r['mce']:6.3f} | {r['T']:5.2f} "
            f"{r['nll_T']:7.3f} {r['ece_T']:7.3f}"
        )
    if plot:
        from numpyro_mile import plots

        fig = plots.reliability_grid(probs, y_test)
        fig.savefig(plot, dpi=120, bbox_inches="tight")
        print(f"reliability diagrams: {plot}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", default=None, help="save reliability diagrams to this image file")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: checks that the example runs")
    args = parser.parse_args()
    smoke = dict(members=2, max_epochs=3, num_warmup=100, num_samples=10, approx_steps=20, num_draws=4)
    main(**(smoke if args.smoke else {}), plot=args.plot)
