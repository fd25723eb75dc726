"""MC-dropout as BayesDLL defines it: dropout of parameters towards the prior mean.

The variational family is a spiky two-component mixture per coordinate,

    q(theta_i) = (1 - p) delta(theta_i - m_i) + p delta(theta_i - theta0_i),

where ``theta0`` is the prior mean (zero, or pretrained weights through the models'
``prior_mean``) and ``p`` the dropout probability: a draw keeps each learned value ``m_i`` with
probability ``1 - p`` and otherwise resets it to the prior mean. With ``theta0 = 0`` this is
dropout on the weights (DropConnect) without rescaling. The spikes have an infinitesimal width, so
the entropy of ``q`` does not depend on ``m`` and, up to constants, the KL to the prior is the
expected negative log prior,

    KL(q || p) = (1 - p) * (-log p(m)) + const,   for a N(theta0, sigma^2) prior:
               = (1 - p) ||m - theta0||^2 / (2 sigma^2) + const.

The loss per step is BayesDLL's data-size-normalised negative ELBO with one dropout mask,

    loss(m) = - log p(y_batch | z * m + (1 - z) * theta0) / N + kappa * KL / N,   z_i ~ Bernoulli(1 - p),

with the minibatch likelihood scaled by ``N / n`` by the model's subsample plate and ``kappa`` the KL
discount factor. Bias sites (by default the sites of rank <= 1) follow one of three options:

* ``"uninformative"``: never dropped and no prior term (an improper flat prior; BayesDLL's ``ignore``);
* ``"gaussian"``: never dropped, a point-mass posterior with the full prior term
  ``||m - theta0||^2 / (2 sigma^2)`` (the original MC-dropout; BayesDLL's ``gaussian``);
* ``"spikymix"``: dropped like the weights (BayesDLL's ``spikymix``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from ._common import ApproxPosterior, Problem, check_positive, check_steps, optimize

BIAS_OPTIONS = ("uninformative", "gaussian", "spikymix")


def _check_real(problem: Problem) -> None:
    from numpyro.distributions import constraints

    for name, site in problem.sites.items():
        support = site["fn"].support
        base = support.base_constraint if isinstance(support, constraints.independent) else support
        if base is not constraints.real:
            raise ValueError(
                f"fit_mc_dropout drops parameters to their prior mean and needs real-valued latent sites; site "
                f"{name!r} has support {support}. Reparameterise it (e.g. sample log sigma) or use fit_vi."
            )


def dropout_plan(problem: Problem, drop_prob: float, bias: str, bias_sites: Sequence[str] | None):
    """Per-site dropout probability and KL weight.

    :return: ``(drop, kl_weight)``, dicts site -> float: ``drop`` is the dropout probability of the
        site's coordinates, ``kl_weight`` the factor on its ``-log p(m)`` (``1 - p`` for dropped
        sites, 1 for Gaussian biases, 0 for uninformative ones).
    """
    if bias not in BIAS_OPTIONS:
        raise ValueError(f"bias must be one of {BIAS_OPTIONS}, got {bias!r}.")
    if bias_sites is None:
        biases = {name for name, site in problem.sites.items() if jnp.ndim(site["value"]) <= 1}
    else:
        biases = set(bias_sites)
        unknown = biases - set(problem.sites)
        if unknown:
            raise ValueError(f"bias_sites {sorted(unknown)} are not latent sites of the model {sorted(problem.sites)}.")
    drop, kl_weight = {}, {}
    for name in problem.sites:
        if name in biases and bias != "spikymix":
            drop[name], kl_weight[name] = 0.0, (0.0 if bias == "uninformative" else 1.0)
        else:
            drop[name], kl_weight[name] = drop_prob, 1.0 - drop_prob
    return drop, kl_weight


def fit_mc_dropout(
    model: Callable,
    rng_key,
    *model_args,
    drop_prob: float = 0.1,
    bias: str = "gaussian",
    bias_sites: Sequence[str] | None = None,
    kl_discount: float = 1.0,
    init_params: dict | None = None,
    optimizer: optax.GradientTransformation | None = None,
    num_steps: int = 5000,
    plate_name: str = "data",
    **model_kwargs,
) -> ApproxPosterior:
    """Fit BayesDLL's MC-dropout posterior (see the module docstring for the family and the loss).

    :param model: a NumPyro model with real-valued latent sites and observations in
        ``numpyro.plate(plate_name, N)``; each site's prior mean (``prior_mean`` of the models) is
        where its dropped coordinates go, and its prior density gives the KL term.
    :param rng_key: a JAX PRNG key.
    :param model_args: training data as passed to the model, e.g. ``X, y``.
    :param drop_prob: dropout probability ``p`` in ``[0, 1)``.
    :param bias: treatment of bias sites: ``"uninformative"``, ``"gaussian"`` or ``"spikymix"``.
    :param bias_sites: names of the bias sites; default every site of rank <= 1 (``b0, b1, ...``).
    :param kl_discount: factor ``kappa > 0`` on the KL term (BayesDLL's ``kld``).
    :param init_params: initial ``m``, dict site -> array (unconstrained = constrained here);
        default LeCun-normal weights and zero biases.
    :param optimizer: an optax optimizer; default Adam with learning rate 1e-3.
    :param num_steps: optimisation steps (one dropout mask per step).
    :param plate_name: name of the observation plate.
    :param model_kwargs: model keyword arguments; ``subsample_size=n`` gives minibatches of ``n`` rows.
    :return: an :class:`ApproxPosterior` with ``method="mc_dropout"``, ``loc = m``,
        ``anchor = theta0`` and ``drop_prob`` per site.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile.approx import fit_mc_dropout
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> q = fit_mc_dropout(mlp_regression, jax.random.PRNGKey(0), X, y, drop_prob=0.2, num_steps=200, hidden=(8,))
        >>> q.drop_prob["w0"], q.drop_prob["b0"]
        (0.2, 0.0)
    """
    problem = Problem(model, model_args, model_kwargs, "fit_mc_dropout", plate_name)
    _check_real(problem)
    if not 0.0 <= drop_prob < 1.0:
        raise ValueError(f"drop_prob must lie in [0, 1), got {drop_prob!r}.")
    drop_prob = float(drop_prob)
    kl_discount = check_positive("kl_discount", kl_discount)
    num_steps = check_steps(num_steps)
    drop, kl_weight = dropout_plan(problem, drop_prob, bias, bias_sites)
    anchor = problem.prior_mean()
    n = problem.num_data

    def loss(m, rng_key):
        mask_key, batch_key = jax.random.split(rng_key)
        keys = dict(zip(m, jax.random.split(mask_key, len(m))))
        theta = {k: jnp.where(jax.random.bernoulli(keys[k], drop[k], v.shape), anchor[k], v) for k, v in m.items()}
        nll = -problem.log_likelihood(theta, batch_key) / n
        log_priors = problem.site_log_priors(m)
        kl = -sum(kl_weight[k] * log_priors[k] for k in m)
        return nll + kl_discount * kl / n

    init_key, run_key = jax.random.split(rng_key)
    params = problem.init_params(init_key, init_params)
    optimizer = optax.adam(1e-3) if optimizer is None else optimizer
    params, losses, seconds, cpu = optimize(loss, params, optimizer, num_steps, run_key)
    return ApproxPosterior(
        "mc_dropout",
        params,
        jax.tree.map(jnp.zeros_like, params),
        anchor,
        drop,
        problem.constrain,
        dict(losses=losses, seconds=seconds, cpu_seconds=cpu, bias=bias, kl_discount=kl_discount, kl_weight=kl_weight),
    )
