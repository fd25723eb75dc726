"""Diagonal Laplace approximation at the MAP with the empirical Fisher (BayesDLL's Laplace baseline).

Around the MAP ``theta*`` the posterior is approximated by ``N(theta*, diag(1 / lambda))`` with

    lambda_j = data_inflation * F_j + P_j,   F_j = sum_i (d/dtheta_j log p(y_i | theta*))^2,

``F`` the diagonal of the empirical Fisher (per-example squared gradients over all ``N`` training
rows) and ``P`` the diagonal of the prior's curvature ``-d^2 log p(theta) / d theta_j^2`` (``1 /
prior_scale^2`` for the Gaussian priors of the models). The empirical Fisher stands in for the
likelihood's Hessian: the two agree in expectation over the data at the true parameters, and for a
Gaussian likelihood with known noise ``sigma`` the Hessian is ``sum_i x_ij^2 / sigma^2`` while
``F_j = sum_i x_ij^2 r_i^2 / sigma^4`` with residuals ``r_i`` of variance ``sigma^2``.

Per-example gradients are computed ``chunk_size`` rows at a time and only their squares are summed,
so memory is ``O(chunk_size * d)``, i.e. ``O(d)`` for a fixed chunk. The prior curvature is one
Hessian-vector product with a vector of ones, which is the exact diagonal for a prior that
factorises over coordinates (every prior of :mod:`numpyro_mile.models`).

``data_inflation`` (BayesDLL's ``Ninflate``) counts the data as if it were that many times larger,
both in the MAP objective and here in the precision (BayesDLL's code uses it in the MAP only; using
it in both keeps the Gaussian the Laplace approximation of one and the same tempered posterior).
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._common import ApproxPosterior, Problem, check_positive, check_steps, optimize
from .map import map_objective


def empirical_fisher_diag(problem: Problem, params: dict, chunk_size: int = 256) -> dict:
    """Diagonal of the empirical Fisher ``sum_i g_i^2``, ``g_i = grad log p(y_i | theta)``, over all rows.

    :param problem: the model and its data.
    :param params: unconstrained parameters, dict site -> array.
    :param chunk_size: rows whose per-example gradients are held at once.
    :return: dict site -> array of the site's shape.
    """
    n = problem.num_data
    chunk = int(min(chunk_size, n))
    num_chunks = -(-n // chunk)
    rows = jnp.arange(num_chunks * chunk).reshape(num_chunks, chunk)
    per_example = jax.vmap(jax.grad(problem.row_log_likelihood), in_axes=(None, 0))

    @jax.jit
    def accumulate(params):
        def body(total, idx):
            valid = idx < n
            grads = per_example(params, jnp.where(valid, idx, 0))
            sq = jax.tree.map(
                lambda g: jnp.sum(jnp.where(valid.reshape((-1,) + (1,) * (g.ndim - 1)), g**2, 0.0), axis=0), grads
            )
            return jax.tree.map(jnp.add, total, sq), None

        total, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), rows)
        return total

    return accumulate(params)


def prior_precision_diag(problem: Problem, params: dict) -> dict:
    """Diagonal of ``-d^2 log p(theta)`` at ``params`` (exact for priors independent across coordinates).

    One Hessian-vector product of the prior potential with a vector of ones gives the row sums of the
    Hessian, which are its diagonal when the Hessian is diagonal.
    """
    ones = jax.tree.map(jnp.ones_like, params)
    _, hvp = jax.jvp(jax.grad(problem.prior_potential), (params,), (ones,))
    return hvp


def fit_laplace(
    model: Callable,
    rng_key,
    *model_args,
    data_inflation: float = 1.0,
    map_params: dict | None = None,
    init_params: dict | None = None,
    optimizer: optax.GradientTransformation | None = None,
    num_steps: int = 5000,
    chunk_size: int = 256,
    plate_name: str = "data",
    **model_kwargs,
) -> ApproxPosterior:
    """Diagonal Laplace approximation ``N(theta*, diag(1 / (data_inflation * F + P)))`` (module docstring).

    :param model: a NumPyro model with observations in ``numpyro.plate(plate_name, N)``; the prior
        (e.g. centred on pretrained weights through ``prior_mean``) shapes both the MAP and ``P``.
    :param rng_key: a JAX PRNG key.
    :param model_args: training data as passed to the model, e.g. ``X, y``.
    :param data_inflation: factor ``> 0`` on the data size in the MAP objective and on ``F``.
    :param map_params: an already fitted MAP (unconstrained dict, e.g. ``fit_map(...).loc``) to skip
        the optimisation; it must have been fitted with the same ``data_inflation``.
    :param init_params: start of the MAP optimisation (see :func:`~numpyro_mile.approx.fit_map`).
    :param optimizer: optax optimizer of the MAP; default Adam with learning rate 1e-3.
    :param num_steps: MAP optimisation steps.
    :param chunk_size: rows per chunk of per-example gradients (memory ``O(chunk_size * d)``).
    :param plate_name: name of the observation plate.
    :param model_kwargs: model keyword arguments; ``subsample_size`` gives minibatches for the MAP,
        the Fisher always sums over all rows.
    :return: an :class:`ApproxPosterior` with ``method="laplace"``, ``loc = theta*``,
        ``scale = lambda^(-1/2)`` and ``info`` holding ``fisher``, ``prior_precision`` and ``precision``.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile.approx import fit_laplace
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> la = fit_laplace(mlp_regression, jax.random.PRNGKey(0), X, y, num_steps=200, hidden=(8,))
        >>> bool((la.info["precision"]["w0"] >= 1.0).all())   # at least the prior precision 1 / 1^2
        True
    """
    problem = Problem(model, model_args, model_kwargs, "fit_laplace", plate_name)
    data_inflation = check_positive("data_inflation", data_inflation)
    if int(chunk_size) != chunk_size or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}.")
    init_key, run_key = jax.random.split(rng_key)
    info: dict = dict(data_inflation=data_inflation)
    if map_params is None:
        num_steps = check_steps(num_steps)
        params = problem.init_params(init_key, init_params)
        optimizer = optax.adam(1e-3) if optimizer is None else optimizer
        params, losses, seconds, cpu = optimize(
            map_objective(problem, data_inflation), params, optimizer, num_steps, run_key
        )
        info.update(losses=losses, map_seconds=seconds, map_cpu_seconds=cpu)
    else:
        params = problem.init_params(init_key, map_params)
        info.update(losses=np.zeros(0), map_seconds=0.0, map_cpu_seconds=0.0)
    wall, cpu = time.perf_counter(), time.process_time()
    fisher = empirical_fisher_diag(problem, params, chunk_size)
    prior = prior_precision_diag(problem, params)
    precision = jax.tree.map(lambda f, p: data_inflation * f + p, fisher, prior)
    jax.block_until_ready(precision)
    bad = [k for k, v in precision.items() if not bool(jnp.all(jnp.isfinite(v) & (v > 0)))]
    if bad:
        raise ValueError(
            f"fit_laplace: the precision of sites {bad} is not positive and finite; give every site a proper prior "
            "with positive curvature (e.g. a Normal prior) or check the MAP for NaNs."
        )
    info.update(
        fisher=fisher,
        prior_precision=prior,
        precision=precision,
        seconds=info["map_seconds"] + time.perf_counter() - wall,
        cpu_seconds=info["map_cpu_seconds"] + time.process_time() - cpu,
    )
    scale = jax.tree.map(lambda p: 1.0 / jnp.sqrt(p), precision)
    return ApproxPosterior("laplace", params, scale, None, None, problem.constrain, info)
