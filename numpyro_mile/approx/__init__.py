"""BayesDLL-style approximate posteriors as baselines beside the samplers.

Four methods with one interface, ``fit_*(model, rng_key, *model_args, ..., **model_kwargs)
-> ApproxPosterior``, on ordinary NumPyro models whose observations live in ``numpyro.plate("data", N)``:

* :func:`fit_map` — the MAP ("vanilla"),
* :func:`fit_vi` — mean-field Gaussian VI on NumPyro's SVI (data-size-normalised ELBO, KL discount),
* :func:`fit_mc_dropout` — MC-dropout as parameter dropout towards the prior mean,
* :func:`fit_laplace` — diagonal Laplace at the MAP with the empirical Fisher.

Pretrained weights enter every method as the prior mean (the models' ``prior_mean`` keyword);
minibatches come from the model's subsample plate (``subsample_size``). Prediction has one path:
``posterior.sample(rng_key, nst)`` returns ``nst`` draws of the constrained latent sites (``nst = 0``:
the posterior mean as one draw), for :func:`numpyro_mile.predict` or
:func:`numpyro_mile.evaluation.predictive_probs`.

**Example**

.. doctest::

    >>> import jax
    >>> from numpyro_mile import approx
    >>> from numpyro_mile.evaluation import predictive_probs
    >>> from numpyro_mile.datasets import digits
    >>> from numpyro_mile.models import mlp_classification
    >>> (X, y), _, (X_test, y_test) = digits(seed=0)
    >>> q = approx.fit_vi(mlp_classification, jax.random.PRNGKey(0), X, y, num_classes=10, num_steps=300,
    ...                   subsample_size=64)
    >>> probs = predictive_probs(mlp_classification, q.sample(jax.random.PRNGKey(1), 20), X_test, num_classes=10)
    >>> probs.shape
    (361, 10)
"""

from ._common import ApproxPosterior
from .dropout import fit_mc_dropout
from .laplace import empirical_fisher_diag, fit_laplace, prior_precision_diag
from .map import fit_map
from .vi import fit_vi

__all__ = [
    "ApproxPosterior",
    "empirical_fisher_diag",
    "fit_laplace",
    "fit_map",
    "fit_mc_dropout",
    "fit_vi",
    "prior_precision_diag",
]
