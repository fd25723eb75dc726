"""Compile once: a second run of the same model and shapes reuses MILE's compiled programs, the data
are arguments of those programs (never constants), and the persistent compilation cache serves
NumPyro's sampling loop. No timing is asserted: what is counted are XLA compilations (JAX's
monitoring events), which do not depend on the machine's load."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC
from numpyro.infer.util import initialize_model, potential_energy

from numpyro_mile import MILE, _programs
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Compiles:
    """Names of the programs XLA compiled while active."""

    def __init__(self):
        self.names: list[str] = []
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event, duration, **kwargs):
        if self.active and event == COMPILE_EVENT:
            self.names.append(kwargs.get("fun_name", "?"))

    def __enter__(self):
        self.names, self.active = [], True
        return self

    def __exit__(self, *exc):
        self.active = False


@pytest.fixture(scope="module")
def compiles():
    return Compiles()


def mile_run(X, y, key=0, **mcmc_kw):
    kernel = MILE(mlp_regression, phase_split=(0.4, 0.1, 0.5), ensemble_options=dict(max_epochs=5, progress_bar=False))
    mcmc = MCMC(
        kernel, num_warmup=40, num_samples=20, num_chains=2, chain_method="vectorized", progress_bar=False, **mcmc_kw
    )
    mcmc.run(jax.random.PRNGKey(key), X, y, hidden=(5,))
    return mcmc


def test_second_run_reuses_pretraining_and_init_programs(compiles):
    X, y = toy_regression(64, seed=3)
    mile_run(X, y)
    with compiles:  # new data values (same shapes), a new key, a new kernel and MCMC object
        mcmc = mile_run(X + 0.5, y - 0.25, key=1)
    # only NumPyro's own loop is compiled again (it re-traces it on every run, for NUTS as well)
    assert compiles.names == ["jit(_fori_collect_loop)"], compiles.names
    assert np.all(np.isfinite(np.asarray(mcmc.get_samples()["w0"])))


def test_init_traces_the_model_once_and_builds_the_init_program_once():
    """MILE's ``init`` walks forward: from given ``init_params``, a first init runs the model's Python code
    twice (one trace for its structure, one inside the compiled init program, which evaluates the potential),
    and a second init of new data of the same shapes once (the structure; the init program is reused)."""
    calls = []

    def counted(X, y=None, hidden=(5,)):
        calls.append(1)
        return mlp_regression(X, y, hidden=hidden)

    X, y = toy_regression(64, seed=6)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    one = initialize_model(jax.random.PRNGKey(1), mlp_regression, model_args=(X, y), model_kwargs={"hidden": (5,)})
    init_params = jax.tree.map(lambda v: jnp.stack([v, v + 0.1]), one.param_info.z)
    kernel = MILE(counted, pretrain=False, map_steps=0, shard_chains=False)  # no sharding cost estimate
    kernel.init(keys, 100, init_params, (X, y), {"hidden": (5,)})
    assert len(calls) == 2
    calls.clear()
    MILE(counted, pretrain=False, map_steps=0, shard_chains=False).init(
        keys, 100, init_params, (X + 1.0, y), {"hidden": (5,)}
    )
    assert len(calls) == 1


def test_data_are_arguments_of_the_loop_not_constants():
    """NumPyro passes the data to ``sample`` as constants (``jit_model_args=False``); the step uses the copy
    carried in the state, so the traced step closes over no array of the data's shape."""
    X, y = toy_regression(300, seed=4)
    mcmc = mile_run(X, y)
    kernel, state = mcmc.sampler, mcmc.last_state
    assert state.data is not None and len(state.data) == 2  # X and y travel with the state

    def shapes_of_constants(model_args):
        closed = jax.make_jaxpr(lambda s: kernel.sample(s, model_args, {"hidden": (5,)}))(state)
        return {tuple(np.shape(c)) for c in closed.consts}

    assert not {X.shape, y.shape} & shapes_of_constants((X, y))
    # other arrays than those of init (e.g. new data for a run from post_warmup_state) are used as given
    assert {X.shape, y.shape} <= shapes_of_constants((X.copy(), y.copy()))


def test_new_data_through_post_warmup_state_is_used():
    """Continuing from post_warmup_state with other data samples the posterior of the new data."""
    X, y = toy_regression(64, seed=5)
    mcmc = mile_run(X, y)
    mcmc.post_warmup_state = mcmc.last_state
    y_new = y + 3.0
    mcmc.run(jax.random.PRNGKey(2), X, y_new, hidden=(5,))
    last = mcmc.last_state
    z = jax.tree.map(lambda a: a[0], last.z)
    expected = potential_energy(mlp_regression, (X, y_new), {"hidden": (5,)}, z)
    old = potential_energy(mlp_regression, (X, y), {"hidden": (5,)}, z)
    np.testing.assert_allclose(float(last.potential_energy[0]), float(expected), rtol=1e-4)
    assert abs(float(expected) - float(old)) > 10.0  # the two data sets are told apart


def test_split_and_join_data_round_trip():
    X = np.ones((3, 2), np.float32)
    args, kwargs = (X, None), {"hidden": (4,), "scale": jnp.ones(3)}
    split = _programs.split_data(args, kwargs)
    assert len(split.arrays) == 2 and all(isinstance(a, jax.Array) for a in split.arrays)
    hash(split.key)
    args2, kwargs2 = _programs.join_data(split.key, split.arrays)
    assert args2[1] is None and kwargs2["hidden"] == (4,)
    np.testing.assert_array_equal(args2[0], X)
    assert _programs.same_data(split, args, kwargs)
    assert not _programs.same_data(split, (X.copy(), None), kwargs)  # other arrays
    assert not _programs.same_data(split, args, {**kwargs, "hidden": (8,)})  # other static values


def test_new_data_at_a_freed_arrays_address_is_not_the_same_data():
    """The split holds no strong reference to the caller's arrays, and a new array that Python places where a
    freed one lived (the same ``id()``) is told apart from it: a kernel never steps on stale data."""
    import gc
    import weakref

    X = np.ones((64, 3), np.float32)
    split, alive, address = _programs.split_data((X,), {}), weakref.ref(X), id(X)
    del X
    gc.collect()
    assert alive() is None
    candidates = [np.full((64, 3), 2.0, np.float32) for _ in range(200)]  # CPython reuses addresses
    reused = [Y for Y in candidates if id(Y) == address]
    for Y in reused or candidates[:1]:
        assert not _programs.same_data(split, (Y,), {})


#: a subprocess script's count of JAX's persistent-cache hits and misses (``events``), where it says CACHE_EVENTS
CACHE_EVENTS = """events = {"hits": 0, "misses": 0}
def listen(event, **kwargs):
    for name in events:
        if event == "/jax/compilation_cache/cache_" + name:
            events[name] += 1
jax.monitoring.register_event_listener(listen)"""
SECOND_PROCESS = """
import sys, jax
from numpyro.infer import MCMC
from numpyro_mile import MILE, enable_compilation_cache
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression
enable_compilation_cache(sys.argv[1])
CACHE_EVENTS
X, y = toy_regression(64, seed=int(sys.argv[2]))
kernel = MILE(mlp_regression, phase_split=(0.4, 0.1, 0.5), ensemble_options=dict(max_epochs=5, progress_bar=False))
mcmc = MCMC(kernel, num_warmup=40, num_samples=20, num_chains=2, chain_method="vectorized", progress_bar=False)
mcmc.run(jax.random.PRNGKey(int(sys.argv[2])), X, y, hidden=(5,))
print(events["hits"], events["misses"])
""".replace("CACHE_EVENTS", CACHE_EVENTS)


@pytest.mark.slow
def test_persistent_cache_serves_a_second_process(tmp_path):
    """A new process with other data values and key compiles nothing: every program comes from the cache."""

    def run(seed):
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SECOND_PROCESS), str(tmp_path), str(seed)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        hits, misses = map(int, out.stdout.split()[-2:])
        return hits, misses

    first_hits, first_misses = run(1)
    assert first_misses > 0
    hits, misses = run(2)
    assert misses == 0 and hits >= first_misses - 1, (hits, misses, first_misses)


KERNEL_NAMES = ("MILE", "SGLD", "ICSGLD", "SMILE")
SAME_SHAPES_AGAIN = """
import sys, jax, numpy as np, numpyro, numpyro.distributions as dist
from numpyro.infer import MCMC
from numpyro_mile import ICSGLD, MILE, SGLD, SMILE, enable_compilation_cache
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression
enable_compilation_cache(sys.argv[1])
style = sys.argv[2]
CACHE_EVENTS

def line(X, y=None, subsample_size=None):  # indexes its data with the plate's indices, as NumPyro's docs do
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w + b, 1.0), obs=None if y is None else y[idx])

def kernel(name):
    model = mlp_regression if style == "mlp" else line
    options = dict(ensemble_options=dict(max_epochs=5, progress_bar=False))
    return {"SGLD": lambda: SGLD(model, 1e-4),
            "ICSGLD": lambda: ICSGLD(model, 1e-4, zeta=0.75, num_bins=20, bin_width=5.0, min_energy=0.0),
            "SMILE": lambda: SMILE(model, **options),
            "MILE": lambda: MILE(model, phase_split=(0.4, 0.1, 0.5), **options)}[name]()

def run(name, seed):
    X, y = toy_regression(96, seed=seed)
    kwargs = {"hidden": (5,)} if style == "mlp" else {}
    if name != "MILE":
        kwargs["subsample_size"] = 16
    init = None if style == "mlp" else {"w": np.zeros((2, X.shape[1]), np.float32), "b": np.zeros(2, np.float32)}
    mcmc = MCMC(kernel(name), num_warmup=40, num_samples=20, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    before = dict(events)
    mcmc.run(jax.random.PRNGKey(seed), X, y, init_params=init, **kwargs)
    return events["misses"] - before["misses"]

for name in sys.argv[3:]:
    first = run(name, 1)
    print(name, first, run(name, 2))
""".replace("CACHE_EVENTS", CACHE_EVENTS)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["mlp", "line"])
def test_a_second_run_on_new_data_compiles_nothing_with_the_persistent_cache(tmp_path, style):
    """With JAX's persistent cache on, a second ``mcmc.run`` in the same process on new data of the same shapes
    (a new kernel, a new MCMC object, a new key) finds every program in the cache, NumPyro's sampling loop
    included: nothing of the data is a constant of any compiled program. Two model styles: the package's MLP
    (pretrained, or drawn from the prior) and a regression that indexes its data with the plate's indices, with
    ``init_params`` given."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SAME_SHAPES_AGAIN), str(tmp_path), style, *KERNEL_NAMES],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    misses = {name: (int(first), int(second)) for name, first, second in map(str.split, out.stdout.splitlines())}
    assert set(misses) == set(KERNEL_NAMES)
    assert all(first > 0 for first, _ in misses.values()), misses
    assert all(second == 0 for _, second in misses.values()), misses  # (misses of the first run, of the second)


def minibatch_kernel(name):
    from numpyro_mile import ICSGLD, SGLD, SMILE

    if name == "SGLD":
        return SGLD(mlp_regression, 1e-4)
    if name == "ICSGLD":
        return ICSGLD(mlp_regression, 1e-4, zeta=0.75, num_bins=20, bin_width=5.0, min_energy=0.0)
    return SMILE(mlp_regression, ensemble_options=dict(max_epochs=5, progress_bar=False))


def minibatch_run(name, X, y, key=0):
    mcmc = MCMC(
        minibatch_kernel(name),
        num_warmup=40,
        num_samples=20,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(key), X, y, hidden=(5,), subsample_size=16)
    return mcmc


@pytest.mark.parametrize("name", ["SGLD", "ICSGLD", "SMILE"])
def test_minibatch_kernels_compile_once_with_the_data_as_arguments(name, compiles):
    """SGLD, ICSGLD and SMILE carry the data in their state as MILE does: the traced step closes over no array of
    the data's shapes, and a second run on new data of the same shapes compiles no program of this package."""
    X, y = toy_regression(96, seed=6)
    mcmc = minibatch_run(name, X, y)
    kernel, state = mcmc.sampler, mcmc.last_state
    assert state.data is not None and len(state.data) == 2

    def shapes_of_constants(model_args):
        closed = jax.make_jaxpr(lambda s: kernel.sample(s, model_args, {"hidden": (5,), "subsample_size": 16}))(state)
        return {tuple(np.shape(c)) for c in closed.consts}

    assert not {X.shape, y.shape} & shapes_of_constants((X, y))
    assert {X.shape, y.shape} <= shapes_of_constants((X.copy(), y.copy()))  # other data: used as given
    with compiles:  # new data values (same shapes), a new key, a new kernel and MCMC object
        again = minibatch_run(name, X + 0.5, y - 0.25, key=1)
    assert set(compiles.names) <= {"jit(_fori_collect_loop)"}, compiles.names
    assert np.all(np.isfinite(np.asarray(again.get_samples()["w0"])))
