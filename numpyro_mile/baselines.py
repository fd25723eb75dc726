"""Baselines started from a deep ensemble: BDE (NumPyro NUTS, one chain per member) and DE."""

from __future__ import annotations

from typing import Callable

import jax
from numpyro.infer import MCMC, NUTS


def bde(
    model: Callable,
    init_params: dict,
    *model_args,
    rng_key,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    thinning: int = 1,
    max_tree_depth: int = 10,
    target_accept_prob: float = 0.8,
    dense_mass: bool = False,
    chain_method: str = "sequential",
    progress_bar: bool = True,
    extra_fields: tuple = ("num_steps",),
    **model_kwargs,
) -> MCMC:
    """Bayesian Deep Ensemble: NumPyro's NUTS started from each deep-ensemble member.

    One chain per member (``num_chains`` = leading size of ``init_params``), diagonal mass matrix,
    maximum tree depth 10 and target acceptance 0.8 by default, as in the BDE/MILE papers.
    ``chain_method="sequential"`` runs chains one after another; with ``"vectorized"`` NumPyro
    advances all chains in lockstep, so every iteration costs the deepest tree of any chain.

    :param init_params: unconstrained parameters with a leading member axis
        (``deep_ensemble(...).init_params``).
    :return: the finished :class:`numpyro.infer.MCMC` (``extra_fields`` collected, by default the
        number of leapfrog steps per iteration, from which the gradient evaluations follow).

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile import bde, deep_ensemble
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(60)
        >>> de = deep_ensemble(mlp_regression, jax.random.PRNGKey(0), 2, X, y, hidden=(4,), max_epochs=10,
        ...                    progress_bar=False)
        >>> mcmc = bde(mlp_regression, de.init_params, X, y, rng_key=jax.random.PRNGKey(1), num_warmup=10,
        ...            num_samples=10, progress_bar=False, hidden=(4,))
        >>> mcmc.get_samples()["w0"].shape
        (20, 1, 4)
    """
    mcmc = bde_mcmc(model, int(jax.tree.leaves(init_params)[0].shape[0]), num_warmup=num_warmup,
                    num_samples=num_samples, thinning=thinning, max_tree_depth=max_tree_depth,
                    target_accept_prob=target_accept_prob, dense_mass=dense_mass, chain_method=chain_method,
                    progress_bar=progress_bar)
    mcmc.run(rng_key, *model_args, init_params=chain_init_params(init_params), extra_fields=extra_fields,
             **model_kwargs)
    return mcmc


def chain_init_params(init_params: dict) -> dict:
    """Member-stacked parameters as ``MCMC.run`` expects them: NumPyro reads a single chain's
    ``init_params`` without the chain axis, so one member loses its leading axis of size 1."""
    if int(jax.tree.leaves(init_params)[0].shape[0]) == 1:
        return jax.tree.map(lambda x: x[0], init_params)
    return init_params


def bde_mcmc(model: Callable, num_chains: int, *, num_warmup: int = 1000, num_samples: int = 1000, thinning: int = 1,
             max_tree_depth: int = 10, target_accept_prob: float = 0.8, dense_mass: bool = False,
             chain_method: str = "sequential", progress_bar: bool = True) -> MCMC:
    """The :class:`~numpyro.infer.MCMC` that :func:`bde` runs, not yet run (to time warmup and sampling apart)."""
    kernel = NUTS(model, max_tree_depth=max_tree_depth, target_accept_prob=target_accept_prob, dense_mass=dense_mass)
    return MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                thinning=thinning, chain_method=chain_method, progress_bar=progress_bar)
