"""MAP estimation ("vanilla" in BayesDLL): the point estimate every other baseline is compared with,
and the mode the diagonal Laplace approximation is built around."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from ._common import ApproxPosterior, Problem, check_positive, check_steps, optimize


def map_objective(problem: Problem, data_inflation: float = 1.0) -> Callable:
    """The per-datum MAP loss ``-log p(y | theta) / N - log p(theta) / (N * data_inflation)``.

    Multiplied by ``N * data_inflation`` this is ``-data_inflation * log p(y | theta) - log p(theta)``:
    the likelihood counts as if the data were ``data_inflation`` times larger (BayesDLL's
    ``Ninflate``, a stand-in for data augmentation), the prior (centred on ``prior_mean``) once.
    On a minibatch the likelihood is the plate's unbiased estimate.

    :return: ``loss(unconstrained_params, rng_key) -> scalar``.
    """
    n_eff = problem.num_data * data_inflation

    def loss(params, rng_key):
        return -problem.log_likelihood(params, rng_key) / problem.num_data + problem.prior_potential(params) / n_eff

    return loss


def fit_map(
    model: Callable,
    rng_key,
    *model_args,
    init_params: dict | None = None,
    optimizer: optax.GradientTransformation | None = None,
    num_steps: int = 5000,
    data_inflation: float = 1.0,
    plate_name: str = "data",
    **model_kwargs,
) -> ApproxPosterior:
    """Maximum a posteriori estimate of ``model``'s latent sites (BayesDLL's "vanilla" baseline).

    Minimises :func:`map_objective` with ``optimizer`` for ``num_steps`` steps, on minibatches when
    the model is called with ``subsample_size``. A prior centred on pretrained weights (the models'
    ``prior_mean``) pulls the estimate towards them: for a Gaussian prior the objective is the data
    fit plus ``||theta - prior_mean||^2 / (2 prior_scale^2)``.

    :param model: a NumPyro model with observations in ``numpyro.plate(plate_name, N)``.
    :param rng_key: a JAX PRNG key (initialisation and minibatches).
    :param model_args: training data as passed to the model, e.g. ``X, y``.
    :param init_params: unconstrained start, dict site -> array (e.g. one deep-ensemble member);
        default: LeCun-normal weights and zero biases, as in :func:`~numpyro_mile.deep_ensemble`.
    :param optimizer: an optax optimizer; default Adam with learning rate 1e-3.
    :param num_steps: optimisation steps.
    :param data_inflation: factor on the data size (``>= 1`` weakens the prior); see :func:`map_objective`.
    :param plate_name: name of the observation plate.
    :param model_kwargs: keyword arguments of the model (``subsample_size``, ``prior_mean``, ...).
    :return: an :class:`ApproxPosterior` with ``method="map"`` and ``scale = 0``.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile.approx import fit_map
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> post = fit_map(mlp_regression, jax.random.PRNGKey(0), X, y, num_steps=200, hidden=(8,))
        >>> post.sample(jax.random.PRNGKey(1), 0)["w0"].shape
        (1, 1, 8)
    """
    problem = Problem(model, model_args, model_kwargs, "fit_map", plate_name)
    data_inflation = check_positive("data_inflation", data_inflation)
    num_steps = check_steps(num_steps)
    init_key, run_key = jax.random.split(rng_key)
    params = problem.init_params(init_key, init_params)
    optimizer = optax.adam(1e-3) if optimizer is None else optimizer
    params, losses, seconds, cpu = optimize(
        map_objective(problem, data_inflation), params, optimizer, num_steps, run_key
    )
    return ApproxPosterior(
        "map",
        params,
        jax.tree.map(jnp.zeros_like, params),
        None,
        None,
        problem.constrain,
        dict(losses=losses, seconds=seconds, cpu_seconds=cpu, data_inflation=data_inflation),
    )
