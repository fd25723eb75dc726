"""NumPyro's kernel contract, for every kernel of the package: ``warmup()`` then ``run()``, a continuation from
``mcmc.post_warmup_state`` that neither calls ``init`` again nor pretrains again, the same draws as one run; and
models NUTS runs that MILE once refused (1-d models, models without latent dimensions)."""

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from numpyro_mile import ICSGLD, MILE, SGLD, SMILE

from _known_answers import check_posterior, conjugate_linear_regression, conjugate_regression

X, Y, _, _ = conjugate_regression("gaussian", n=200)
QUIET = dict(ensemble_options=dict(max_epochs=5, progress_bar=False))


def toy_kernel():
    """The toy kernel that ``docs/architecture.md`` shows (the code block after its ``toy-kernel`` marker)."""
    text = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    block = text.split("<!-- toy-kernel", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {"__name__": "architecture_toy_kernel"}
    exec(compile(block, "docs/architecture.md (toy kernel)", "exec"), namespace)
    return namespace["Toy"]


def kernels():
    """(id, kernel factory, model keyword arguments): each kernel at its defaults, pretraining where it has it,
    and the documentation's toy kernel."""
    return [
        ("Toy", lambda: toy_kernel()(conjugate_linear_regression), {}),
        ("MILE", lambda: MILE(conjugate_linear_regression, **QUIET), {}),
        ("SMILE", lambda: SMILE(conjugate_linear_regression, **QUIET), dict(subsample_size=50)),
        ("SGLD", lambda: SGLD(conjugate_linear_regression, 1e-4), dict(subsample_size=50)),
        (
            "ICSGLD",
            lambda: ICSGLD(conjugate_linear_regression, 1e-4, zeta=1.0, num_bins=50, bin_width=10.0, min_energy=0.0),
            dict(subsample_size=50),
        ),
    ]


class CountingInit:
    """Wraps a kernel's ``init`` to count NumPyro's calls."""

    def __init__(self, kernel):
        self.calls, self._init = 0, kernel.init
        kernel.init = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._init(*args, **kwargs)


@pytest.mark.parametrize("name, make, model_kwargs", kernels(), ids=[k[0] for k in kernels()])
def test_post_warmup_state_continues_without_init_or_pretraining(name, make, model_kwargs):
    kernel = make()
    counter = CountingInit(kernel)
    mcmc = MCMC(kernel, num_warmup=100, num_samples=50, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, Y, **model_kwargs)
    first = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    assert counter.calls == 1
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, X, Y, **model_kwargs)
    second = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    assert counter.calls == 1, f"{name}: NumPyro called init again for a continuation"
    assert len(getattr(kernel, "ensembles", [])) <= 1  # no second deep ensemble
    assert second.shape == first.shape == (2, 50, 4) and not np.array_equal(first, second)
    # the continuation starts where the first run stopped
    assert np.abs(second[:, 0] - first[:, -1]).max() < 0.5


@pytest.mark.parametrize("name, make, model_kwargs", kernels(), ids=[k[0] for k in kernels()])
def test_warmup_then_run_gives_the_draws_of_one_run(name, make, model_kwargs):
    """``mcmc.warmup(key, ...)`` then ``mcmc.run(post_warmup_state.rng_key, ...)``, NumPyro's two-step API, gives
    the draws of ``mcmc.run(key, ...)``: the same tuning, the same keys (up to float rounding). Except for an
    ensemble kernel (ICSGLD), to which NumPyro hands a key split from the one passed to ``run``: its sampling
    phase then starts where warmup stopped, with other keys."""
    whole = MCMC(make(), num_warmup=100, num_samples=50, num_chains=2, chain_method="vectorized", progress_bar=False)
    whole.run(jax.random.PRNGKey(1), X, Y, **model_kwargs)
    parts = MCMC(make(), num_warmup=100, num_samples=50, num_chains=2, chain_method="vectorized", progress_bar=False)
    parts.warmup(jax.random.PRNGKey(1), X, Y, **model_kwargs)
    warm = np.asarray(parts.post_warmup_state.z["w"])
    parts.run(parts.post_warmup_state.rng_key, X, Y, **model_kwargs)
    if parts.sampler.is_ensemble_kernel:
        draws = np.asarray(parts.get_samples(group_by_chain=True)["w"])
        assert draws.shape == (2, 50, 4) and np.abs(draws[:, 0] - warm).max() < 0.5
        return
    np.testing.assert_allclose(
        np.asarray(parts.get_samples()["w"]), np.asarray(whole.get_samples()["w"]), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("name, make, model_kwargs", kernels(), ids=[k[0] for k in kernels()])
def test_progress_bar_loop_compiles_the_step_once(name, make, model_kwargs, caplog):
    """With the progress bar on, NumPyro runs ``vectorized`` chains in a Python loop that calls the compiled step
    once per step. The state ``init`` makes must enter that step typed as it leaves it (dtype, weak type), or the
    second call compiles the step again (issue #29: SMILE's weak-typed counters made its bar-on run pay its 1.8 s
    compile twice on airfoil). One device here; placement over several: tests/test_distributed.py."""
    mcmc = MCMC(make(), num_warmup=100, num_samples=20, num_chains=2, chain_method="vectorized")
    mcmc.progress_bar = True  # NumPyro turns the bar off under pytest-xdist and CI
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        mcmc.run(jax.random.PRNGKey(2), X, Y, **model_kwargs)
    compiled = [r.getMessage() for r in caplog.records if "compilation of jit(_body_fn)" in r.getMessage()]
    assert len(compiled) == 1, f"{name}: the progress-bar loop compiled the step {len(compiled)} times"


# ---------------------------------------------------------------------------------------------- models NUTS runs
def normal_1d():
    numpyro.sample("x", dist.Normal(1.0, 2.0))


def normal_mean_1d(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0]) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def test_one_dimensional_models_are_sampled_exactly():
    """A 1-d model (NUTS runs it; MCLMC's unit-norm momentum needs 2 dimensions): MILE samples it with an auxiliary
    standard-normal coordinate that never reaches the draws. Moments within 5 Monte Carlo standard errors, with
    the exact setting; the second model pretrains on its data plate, as the default path does."""
    y = np.random.default_rng(0).normal(3.0, 1.0, 100).astype(np.float32)
    post_var = 1.0 / (1.0 / 100.0 + 100.0)
    for model, args, site, mean, var in [
        (normal_1d, (), "x", 1.0, 4.0),
        (normal_mean_1d, (y,), "mu", y.sum() * post_var, post_var),
    ]:
        kernel = MILE(model, target_energy_variance=(5e-4, 5e-4), ensemble_options=dict(progress_bar=False))
        mcmc = MCMC(
            kernel, num_warmup=1000, num_samples=4000, num_chains=4, chain_method="vectorized", progress_bar=False
        )
        mcmc.run(jax.random.PRNGKey(0), *args)
        samples = mcmc.get_samples(group_by_chain=True)
        assert list(samples) == [site]
        draws = np.asarray(samples[site], np.float64)
        assert draws.shape == (4, 4000)
        check_posterior(draws[..., None], np.array([mean]), np.array([[var]]), variance_bias=0.0, z=5.0)
        assert len(kernel.ensembles) == (1 if args else 0)


def empty_model():
    pass


def all_deterministic():
    numpyro.deterministic("x", 1.0)


def trivial_dirichlet():  # a latent site with no unconstrained dimension
    x = numpyro.sample("x", dist.Dirichlet(jnp.ones(1)))
    numpyro.sample("obs", dist.Normal(x, 1.0), obs=2.0)


@pytest.mark.parametrize("model", [empty_model, all_deterministic, trivial_dirichlet])
def test_models_without_latent_dimensions_return_what_nuts_returns(model):
    """NumPyro's ``test_empty_model``, ``test_all_deterministic`` and ``test_trivial_dirichlet``: MILE returns the
    same sites and shapes as NUTS (no site for an empty model, constants otherwise); num_warmup raised from
    NumPyro's 50 to 100, what MILE's three tuning phases need."""
    out = {}
    for name, kernel in [("mile", MILE(model)), ("nuts", NUTS(model))]:
        mcmc = MCMC(kernel, num_warmup=100, num_samples=20, num_chains=2, chain_method="vectorized", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0))
        out[name] = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    assert out["mile"].keys() == out["nuts"].keys()
    for site, value in out["nuts"].items():
        np.testing.assert_allclose(out["mile"][site], value)


def missing_plate(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], dim=-2) as idx:  # y's last dimension has no plate
        numpyro.sample("y", dist.Normal((X[idx] @ w)[:, None], 1.0).expand(y[idx].shape), obs=y[idx])


@pytest.mark.parametrize("pretrain", [True, False])
def test_numpyros_model_check_runs_also_when_pretraining(pretrain):
    """NumPyro's "Missing a plate statement" warning, which NUTS gives for this model, comes from MILE whether it
    pretrains or not, once, pointing at the user's ``mcmc.run`` line."""
    X_, Y_ = jnp.ones((40, 2)), jnp.zeros((40, 3))
    kernel = MILE(missing_plate, pretrain=pretrain, ensemble_options=dict(max_epochs=2, progress_bar=False))
    mcmc = MCMC(kernel, num_warmup=100, num_samples=10, progress_bar=False)
    with pytest.warns(UserWarning, match="Missing a plate statement") as record:
        mcmc.run(jax.random.PRNGKey(0), X_, Y_)
    caught = [w for w in record if "Missing a plate statement" in str(w.message)]
    assert len(caught) == 1 and caught[0].filename == __file__


def missing_plate_subsampled(X, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size, dim=-2) as idx:  # y's last axis: no plate
        numpyro.sample("y", dist.Normal((X[idx] @ w)[:, None], 1.0).expand(y[idx].shape), obs=y[idx])


@pytest.mark.parametrize("name", ["SMILE", "SGLD", "ICSGLD"])
def test_numpyros_model_check_runs_for_minibatch_kernels(name):
    """The same check for the minibatch kernels, on a subsampled plate: the warning points at the user's line."""
    X_, Y_ = jnp.ones((40, 2)), jnp.zeros((40, 3))
    kernel = {
        "SMILE": lambda: SMILE(missing_plate_subsampled, pretrain=False),
        "SGLD": lambda: SGLD(missing_plate_subsampled, 1e-4),
        "ICSGLD": lambda: ICSGLD(missing_plate_subsampled, 1e-4, zeta=1.0, num_bins=10, bin_width=10.0, min_energy=0.0),
    }[name]()
    mcmc = MCMC(kernel, num_warmup=100, num_samples=10, num_chains=2, chain_method="vectorized", progress_bar=False)
    with pytest.warns(UserWarning, match="Missing a plate statement") as record:
        mcmc.run(jax.random.PRNGKey(0), X_, Y_, subsample_size=10)
    caught = [w for w in record if "Missing a plate statement" in str(w.message)]
    assert caught and all(w.filename == __file__ for w in caught)


@pytest.mark.parametrize("name, make, model_kwargs", kernels(), ids=[k[0] for k in kernels()])
def test_bad_init_params_get_one_message_from_every_kernel(name, make, model_kwargs):
    """Every kernel checks ``init_params`` with the one helper: a wrong site name or a wrong shape raises
    the same error, naming the sites or the shape expected."""
    for bad, message in [
        ({"nope": jnp.zeros((2, X.shape[1]))}, r"one unconstrained array per latent site \['w'\]"),
        (
            {"w": jnp.zeros((2, 3))},
            r"init_params\['w'\] has shape \(2, 3\), expected \(2, 4\) "
            r"\(a leading axis of size num_chains",
        ),
    ]:
        mcmc = MCMC(make(), num_warmup=100, num_samples=5, num_chains=2, chain_method="vectorized", progress_bar=False)
        with pytest.raises(ValueError, match=message):
            mcmc.run(jax.random.PRNGKey(0), X, Y, init_params=bad, **model_kwargs)


def test_replace_makes_a_new_kernel_with_changed_settings():
    """``kernel.replace(...)``: the constructor's arguments with some changed, an uninitialised kernel; the settings
    hook (the checkpoint fingerprint's and the run configuration's source) shows the change."""
    kernel = ICSGLD(missing_plate_subsampled, 1e-3, zeta=1.0, num_bins=10, bin_width=1.0, min_energy=0.0)
    padded = kernel.replace(num_active_chains=3)
    assert type(padded) is ICSGLD and padded is not kernel
    assert padded.settings() == {**kernel.settings(), "num_active_chains": 3}
    assert kernel.num_active_chains is None
    with pytest.raises(TypeError, match="no constructor argument"):
        kernel.replace(num_walkers=3)
    with pytest.raises(ValueError, match="num_active_chains"):
        kernel.replace(num_active_chains=1)


def other_potential(z):
    return jnp.sum(z["w"] ** 2)


#: a second valid value of every constructor argument (but the model) of each kernel
OTHER_VALUES = {
    "common": dict(
        step_size=2e-3,
        init_strategy=numpyro.infer.init_to_median,
        pretrain=False,
        ensemble_options={"num_steps": 10},
        temperature=0.5,
    ),
    "MILE": dict(
        potential_fn=other_potential,
        phase_split=(0.7, 0.2, 0.1),
        target_energy_variance=(0.4, 0.1),
        target_schedule="linear",
        n_eff=50.0,
        trust=2.0,
        L_factor=0.5,
        initial_step_size=1e-2,
        initial_L=1.0,
        ess_num_coords=16,
        max_stored_samples=500,
        map_steps=10,
        map_learning_rate=0.1,
        shard_chains=False,
    ),
    "SGLD": dict(
        schedule=("polynomial", 1e-3, 1.0, 0.55),
        preconditioner="rmsprop",
        rmsprop_decay=0.9,
        rmsprop_eps=1e-4,
        running_moments=True,
    ),
    "ICSGLD": dict(
        zeta=2.0,
        num_bins=20,
        bin_width=2.0,
        min_energy=1.0,
        sa_schedule=0.3,
        multiplier_clip=5.0,
        csgld=True,
        num_active_chains=3,
    ),
    "SMILE": dict(
        precondition=True,
        min_scale=0.2,
        reset_quantile=0.99,
        adapt_prob=0.2,
        adapt_strength=0.05,
        smoothing=0.02,
        adapt_during_sampling=True,
        L=1.0,
    ),
    "Toy": {},
}


def test_a_constructor_argument_stored_nowhere_is_named():
    """A setting is declared by the constructor alone: one that ``__init__`` forgets to store would be left out
    of the run's config and of checkpoint fingerprints, so ``settings()`` names it instead of skipping it."""
    Toy = toy_kernel()

    class Forgetful(Toy):
        def __init__(self, model, step_size: float = 1e-4, temperature: float = 1.0, friction: float = 0.1):
            super().__init__(model, step_size, temperature)

    with pytest.raises(TypeError, match=r"no attribute for argument\(s\) \['friction'\]"):
        Forgetful(conjugate_linear_regression).settings()


@pytest.mark.parametrize("name, make, model_kwargs", kernels(), ids=[k[0] for k in kernels()])
def test_every_constructor_argument_is_a_setting(name, make, model_kwargs):
    """Changing any constructor argument changes the kernel's checkpoint fingerprint (``settings()``, as
    described there), also for a new value of the same kind (a schedule's constants): a run is never resumed
    under settings other than its own. A new argument without a value here fails the test."""
    import inspect

    from numpyro_mile.runs.checkpoint import _kernel_settings

    kernel = make()
    same = _kernel_settings(kernel.replace())
    assert same == _kernel_settings(kernel)
    others = {**OTHER_VALUES["common"], **OTHER_VALUES[name]}
    for argument in list(inspect.signature(type(kernel)).parameters)[1:]:
        assert argument in others, f"no second value of {name}'s {argument!r} in OTHER_VALUES"
        base = kernel
        if argument == "potential_fn":  # MILE takes a model or a potential function, not both
            base = MILE(potential_fn=lambda z: 0.5 * jnp.sum(z["w"] ** 2))
            changed = MILE(potential_fn=other_potential)
        elif argument == "schedule":  # a second value of the same kind: other constants
            base = kernel.replace(schedule=("polynomial", 2e-3, 1.0, 0.55))
            changed = kernel.replace(schedule=others[argument])
        elif argument == "sa_schedule":
            base = kernel.replace(sa_schedule=0.5)
            changed = kernel.replace(sa_schedule=others[argument])
        else:
            changed = kernel.replace(**{argument: others[argument]})
        assert _kernel_settings(changed) != _kernel_settings(base), f"{name}({argument}=...) leaves settings() as is"
