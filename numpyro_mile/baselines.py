"""Baselines started from a deep ensemble: BDE (NumPyro NUTS, one chain per member) and DE."""

from __future__ import annotations

import warnings
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
    chain_method: str | Callable = "auto",
    progress_bar: bool = True,
    extra_fields: tuple = ("num_steps",),
    **model_kwargs,
) -> MCMC:
    """Bayesian Deep Ensemble: NumPyro's NUTS started from each deep-ensemble member.

    One chain per member (``num_chains`` = leading size of ``init_params``), diagonal mass matrix,
    maximum tree depth 10 and target acceptance 0.8 by default, as in the BDE/MILE papers.
    ``chain_method="auto"`` (default) runs the chains over every local device
    (:class:`ChainsOverDevices`: on a CPU, call ``numpyro.set_host_device_count(os.cpu_count())``
    before JAX starts to make every core a device), and one after another on a single device.
    ``"sequential"`` and ``"parallel"`` are NumPyro's; with ``"vectorized"`` NumPyro advances all
    chains in lockstep, so every iteration costs the deepest tree of any chain.

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
    mcmc = bde_mcmc(
        model,
        int(jax.tree.leaves(init_params)[0].shape[0]),
        num_warmup=num_warmup,
        num_samples=num_samples,
        thinning=thinning,
        max_tree_depth=max_tree_depth,
        target_accept_prob=target_accept_prob,
        dense_mass=dense_mass,
        chain_method=chain_method,
        progress_bar=progress_bar,
    )
    mcmc.run(
        rng_key, *model_args, init_params=chain_init_params(init_params), extra_fields=extra_fields, **model_kwargs
    )
    return mcmc


def chain_init_params(init_params: dict) -> dict:
    """Member-stacked parameters as ``MCMC.run`` expects them: NumPyro reads a single chain's
    ``init_params`` without the chain axis, so one member loses its leading axis of size 1."""
    if int(jax.tree.leaves(init_params)[0].shape[0]) == 1:
        return jax.tree.map(lambda x: x[0], init_params)
    return init_params


def bde_mcmc(
    model: Callable,
    num_chains: int,
    *,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    thinning: int = 1,
    max_tree_depth: int = 10,
    target_accept_prob: float = 0.8,
    dense_mass: bool = False,
    chain_method: str | Callable = "auto",
    progress_bar: bool = True,
) -> MCMC:
    """The :class:`~numpyro.infer.MCMC` that :func:`bde` runs, not yet run (to time warmup and sampling apart)."""
    kernel = NUTS(model, max_tree_depth=max_tree_depth, target_accept_prob=target_accept_prob, dense_mass=dense_mass)
    if chain_method == "auto":
        chain_method = ChainsOverDevices() if num_chains > 1 and jax.local_device_count() > 1 else "sequential"
    with warnings.catch_warnings():  # NumPyro turns the bar off for any callable; ours keeps it (see below)
        warnings.filterwarnings("ignore", message="Disabling progress bar", category=UserWarning)
        mcmc = MCMC(
            kernel,
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            thinning=thinning,
            chain_method=chain_method,
            progress_bar=progress_bar,
        )
    if isinstance(chain_method, ChainsOverDevices):
        mcmc.progress_bar = progress_bar  # a bar per chain, updated from the compiled loop as for "parallel"
    return mcmc


class ChainsOverDevices:
    """A ``chain_method`` for :class:`numpyro.infer.MCMC`: independent chains over several devices.

    The chains are split into equal blocks, one per device, over the largest number of devices that
    divides the number of chains (12 chains on 8 devices: 6 devices with 2 chains each, which takes
    as long as 8 devices would); the devices run their blocks at the same time (``jax.pmap``) and
    each device runs its chains one after another (``jax.lax.map``), so no chain waits for another's
    trees, unlike ``"vectorized"``. Each chain gets the key and start it gets under ``"sequential"``,
    so the draws are those of a sequential run up to float rounding. Use it for kernels whose chains
    are independent (NUTS, HMC), not for ensemble kernels or MILE (whose ``vectorized`` chains shard
    over devices by themselves).

    :param devices: the devices to use (default: every local device).
    """

    def __init__(self, devices=None):
        self.devices = list(devices) if devices is not None else jax.local_devices()

    def __call__(self, single_chain: Callable) -> Callable:
        def run(map_args):
            num_chains = int(jax.tree.leaves(map_args)[0].shape[0])
            per_device = self.chains_per_device(num_chains)
            num_devices = num_chains // per_device
            out = jax.pmap(lambda block: jax.lax.map(single_chain, block), devices=self.devices[:num_devices])(
                jax.tree.map(lambda x: x.reshape(num_devices, per_device, *x.shape[1:]), map_args)
            )
            return jax.tree.map(lambda x: x.reshape(num_chains, *x.shape[2:]), out)

        return run

    def chains_per_device(self, num_chains: int) -> int:
        """How many chains each device runs one after another (the cost of a run in single-chain runs)."""
        return num_chains // max(d for d in range(1, len(self.devices) + 1) if num_chains % d == 0)


def chains_per_device(num_chains: int, chain_method) -> int:
    """The chains whose cost adds up on the busiest device, to project a run's time to other chain counts: the
    block size of a :class:`ChainsOverDevices`, 1 for ``"parallel"`` with a device per chain, else ``num_chains``
    (``"sequential"`` chains one after another; ``"vectorized"`` ones together, at a cost that grows with them)."""
    if isinstance(chain_method, ChainsOverDevices):
        return chain_method.chains_per_device(num_chains)
    if chain_method == "parallel" and num_chains <= jax.local_device_count():
        return 1
    return num_chains
