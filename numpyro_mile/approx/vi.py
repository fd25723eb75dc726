"""Mean-field Gaussian variational inference on NumPyro's SVI (BayesDLL's VI baseline).

The guide is NumPyro's :class:`~numpyro.infer.autoguide.AutoNormal` (one Normal per unconstrained
coordinate), with the standard deviation parameterised either through softplus (NumPyro's default)
or through exp (BayesDLL clamps a raw value instead; both links keep it positive with a smooth
gradient). The objective is BayesDLL's data-size-normalised ELBO with a KL discount factor ``kappa``:

    loss(q) = - E_q[log p(y | theta)] / N + kappa * KL(q || p) / N,

obtained by scaling the observed sites of the model by ``1 / N`` and the latent sites of model and
guide by ``kappa / N`` (``kappa = 1``: the ordinary ELBO divided by ``N``, same optimum).
``kappa < 1`` weakens the prior, e.g. to account for data augmentation. Minibatches come from the
model's own subsample plate, which NumPyro's SVI draws at every step. The KL is analytic
(:class:`~numpyro.infer.TraceMeanField_ELBO`) when the prior is Normal, as in BayesDLL.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import optax
from numpyro.distributions import constraints
from numpyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.initialization import init_to_value

from ._common import ApproxPosterior, Problem, ScaleSites, check_positive, check_steps

_LINKS = ("softplus", "exp")


class _AutoNormalExp(AutoNormal):
    """AutoNormal with ``scale = exp(rho)`` instead of ``softplus(rho)``."""

    scale_constraint = constraints.positive


def fit_vi(
    model: Callable,
    rng_key,
    *model_args,
    init_params: dict | None = None,
    init_scale: float = 1e-3,
    scale_link: str = "softplus",
    kl_discount: float = 1.0,
    optimizer: optax.GradientTransformation | None = None,
    num_steps: int = 5000,
    num_particles: int = 1,
    analytic_kl: bool = True,
    progress_bar: bool = False,
    plate_name: str = "data",
    **model_kwargs,
) -> ApproxPosterior:
    """Fit a mean-field Gaussian ``q(theta) = N(m, diag(s^2))`` to ``model``'s posterior with SVI.

    :param model: a NumPyro model with observations in ``numpyro.plate(plate_name, N)``; any prior
        (the prior mean, e.g. pretrained weights through ``prior_mean``, enters through the KL).
    :param rng_key: a JAX PRNG key.
    :param model_args: training data as passed to the model, e.g. ``X, y``.
    :param init_params: unconstrained initial means, dict site -> array (BayesDLL starts at the
        pretrained weights when there are any); default LeCun-normal weights and zero biases.
    :param init_scale: initial standard deviation of every coordinate (BayesDLL: 1e-6; small
        values start VI at the point estimate).
    :param scale_link: ``"softplus"`` or ``"exp"``: how the unconstrained parameter maps to ``s``.
    :param kl_discount: the factor ``kappa > 0`` on the KL term (BayesDLL's ``kld``).
    :param optimizer: an optax optimizer; default Adam with learning rate 1e-3.
    :param num_steps: SVI steps.
    :param num_particles: Monte Carlo draws of ``theta`` per step.
    :param analytic_kl: use the closed-form KL where available (``TraceMeanField_ELBO``), else the
        sampled ``Trace_ELBO``.
    :param progress_bar: show NumPyro's SVI progress bar.
    :param plate_name: name of the observation plate.
    :param model_kwargs: model keyword arguments; ``subsample_size=n`` gives minibatches of ``n`` rows.
    :return: an :class:`ApproxPosterior` with ``method="vi"``, ``loc = m`` and ``scale = s``
        (unconstrained); ``info["losses"]`` holds the per-datum negative ELBO per step.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile.approx import fit_vi
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> q = fit_vi(mlp_regression, jax.random.PRNGKey(0), X, y, num_steps=200, hidden=(8,), subsample_size=32)
        >>> q.sample(jax.random.PRNGKey(1), 10)["w1"].shape
        (10, 8, 2)
    """
    problem = Problem(model, model_args, model_kwargs, "fit_vi", plate_name)
    if scale_link not in _LINKS:
        raise ValueError(f"scale_link must be one of {_LINKS}, got {scale_link!r}.")
    kl_discount = check_positive("kl_discount", kl_discount)
    init_scale = check_positive("init_scale", init_scale)
    num_steps = check_steps(num_steps)
    if int(num_particles) != num_particles or num_particles < 1:
        raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}.")
    init_key, run_key = jax.random.split(rng_key)
    start = problem.constrain(problem.init_params(init_key, init_params))
    guide_cls = _AutoNormalExp if scale_link == "exp" else AutoNormal
    guide = guide_cls(model, init_loc_fn=init_to_value(values=start), init_scale=init_scale)
    n = problem.num_data
    scaled_model = ScaleSites(model, observed=1.0 / n, latent=kl_discount / n)
    scaled_guide = ScaleSites(guide, latent=kl_discount / n)
    elbo = (TraceMeanField_ELBO if analytic_kl else Trace_ELBO)(num_particles=int(num_particles))
    optimizer = optax.adam(1e-3) if optimizer is None else optimizer
    svi = SVI(scaled_model, scaled_guide, optimizer, loss=elbo)
    wall, cpu = time.perf_counter(), time.process_time()
    result = svi.run(run_key, num_steps, *problem.args, progress_bar=progress_bar, **problem.kwargs)
    jax.block_until_ready(result.params)
    seconds, cpu = time.perf_counter() - wall, time.process_time() - cpu
    loc = {name: result.params[f"{name}_{guide.prefix}_loc"] for name in problem.sites}
    scale = {name: result.params[f"{name}_{guide.prefix}_scale"] for name in problem.sites}
    info = dict(
        losses=jax.device_get(result.losses),
        seconds=seconds,
        cpu_seconds=cpu,
        kl_discount=kl_discount,
        scale_link=scale_link,
        svi_params=result.params,
    )
    return ApproxPosterior("vi", loc, scale, None, None, problem.constrain, info)
