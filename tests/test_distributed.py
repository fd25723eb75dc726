"""Chains sharded over devices and processes (numpyro_mile.runs.distributed).

The multi-device checks run in subprocesses: one process with 4 virtual CPU devices
(``--xla_force_host_platform_device_count=4``), and two processes joined by
``jax.distributed.initialize`` on 127.0.0.1 (CPU collectives: gloo) with 2 devices each. Each
compares the per-chain draws with a single-device ``vectorized`` run of the same keys.

Tolerances: the sharded program is the vectorized program partitioned by XLA, so differences
can only come from float32 rounding (XLA may vectorise a block of 1 chain differently from a
block of 6). SGLD and ICSGLD came out bit-identical here; MILE differs by up to ~3e-4 after 30
steps because its step-size adaptation feeds rounding back into the dynamics (SMILE's tuner can do
the same: it gets MILE's tolerance). The tolerances (1e-5 and 1e-3) are far below the distance between *different*
chains (checked: > 20 x the tolerance), so a
chain that received another chain's key, start or histogram would fail.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC

import _subprocess

from numpyro_mile import run_distributed
from numpyro_mile.runs.distributed import chain_mesh, collectives, padded_size, shard_chains, to_host

TOL = {"mile": 1e-3, "sgld": 1e-5, "icsgld": 1e-5, "smile": 1e-3}
COUNTS = (3, 4, 6)
NUM_BINS = 22

# a 3-parameter regression with a "data" plate: the kernels' code paths at the lowest compile cost
MODEL = (
    """
import numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
def linreg(X, y=None, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w + b, 0.5), obs=None if y is None else y[idx])
rng = np.random.default_rng(0)
X = jnp.asarray(rng.normal(size=(40, 2)), jnp.float32)
y = X @ jnp.array([1.0, -0.5]) + 0.3 + 0.5 * jnp.asarray(rng.normal(size=40), jnp.float32)
def kernel(name, pretrain_epochs=None, shard_chains=None):
    from numpyro_mile import ICSGLD, MILE, SGLD, SMILE
    if name == "mile":
        return MILE(linreg, phase_split=(0.4, 0.1, 0.5), shard_chains=shard_chains, ess_num_coords=2,
                    ensemble_options=dict(max_epochs=pretrain_epochs or 1, progress_bar=False))
    if name == "sgld":
        return SGLD(linreg, 1e-3)
    if name == "smile":
        return SMILE(linreg, 1e-3, precondition=True)
    return ICSGLD(linreg, 1e-3, zeta=1.0, num_bins=%d, bin_width=10.0, min_energy=0.0, sa_schedule=0.05)
def model_kwargs(name):
    return {} if name == "mile" else dict(subsample_size=10)
"""
    % NUM_BINS
)

FOUR_DEVICES = (
    MODEL
    + """
import json, warnings
from numpyro.infer import MCMC
from numpyro_mile import deep_ensemble, run_distributed, sharded_deep_ensemble
from numpyro_mile.runs.distributed import collectives, to_host
warnings.simplefilter("ignore")
assert jax.device_count() == 4
# the references run on one device: inputs committed to a device keep the kernels from sharding them
one = jax.devices()[0]
keys = jax.device_put(jax.random.split(jax.random.PRNGKey(0), 6), one)
init = jax.device_put({"w": 0.3 * jax.random.normal(jax.random.PRNGKey(1), (6, 2)),
                       "b": 0.3 * jax.random.normal(jax.random.PRNGKey(2), (6,))}, one)
num_devices = lambda tree: max(len(x.sharding.device_set) for x in jax.tree.leaves(tree))
first = lambda n: jax.tree.map(lambda v: v[:n], init)
new_mcmc = lambda name, n: MCMC(kernel(name), num_warmup=20, num_samples=10, num_chains=n,
                                chain_method="vectorized", progress_bar=False)
out = {}
def record(name, n, ref, mcmc, draws):
    a = np.asarray(ref.get_samples(group_by_chain=True)["w"])[:n]
    b = to_host(draws)[:n]
    other = min(float(np.abs(a[j] - b[k]).max()) for j in range(n) for k in range(n) if j != k)
    res = dict(diff=float(np.abs(a - b).max()), other_chain=other, shape=list(b.shape))
    if name == "icsgld":
        res["theta_diff"] = float(np.abs(np.asarray(ref.last_state.theta) - np.asarray(mcmc.last_state.theta)).max())
    out[f"{name}_{n}"] = res
for name in ["mile", "sgld", "icsgld", "smile"]:
    refs = {}
    for n in (3, 4, 6) if name == "icsgld" else (6,):  # ICSGLD's walkers interact: one reference per count
        refs[n] = new_mcmc(name, n)
        refs[n].run(keys[:n], X, y, init_params=first(n), **model_kwargs(name))
    ref = lambda n: refs[n if name == "icsgld" else 6]
    # 4 chains, then 3 on the same MCMC (padded to 4: same shapes, so ICSGLD's walker mask must live in the
    # state, not in a compiled constant), then 6 (padded to 8)
    shared = new_mcmc(name, 4)
    users_kernel = shared.sampler
    for n in (4, 3):
        shared.num_chains = n
        gather = not (name == "sgld" and n == 3)  # SGLD, 3 chains: samples kept sharded (padded to 4)
        run = run_distributed(shared, keys[:n], X, y, init_params=first(n), gather=gather, **model_kwargs(name))
        record(name, n, ref(n), shared, run.samples["w"])
        if name == "icsgld" and n == 3:  # for the two-process test
            out["icsgld_3_draws"] = to_host(run.samples["w"]).tolist()
            out["icsgld_3_theta"] = np.asarray(shared.last_state.theta).tolist()
            out["icsgld_3_active"] = [users_kernel.num_active_chains, shared.sampler.num_active_chains]
        if not gather:
            out["kept"] = dict(shape=list(run.samples["w"].shape), spec=str(tuple(run.samples["w"].sharding.spec)),
                               padded=run.num_padded_chains)
    assert num_devices(ref(6).last_state) == 1
    mcmc = new_mcmc(name, 6)
    run = run_distributed(mcmc, keys, X, y, init_params=init, **model_kwargs(name))
    record(name, 6, ref(6), mcmc, run.samples["w"])
    # a plain vectorized run from uncommitted inputs (MILE: forced with shard_chains=True, as this model is too
    # small for the automatic rule): MILE on 3 of the 4 devices (6 chains), the others on one
    default = MCMC(kernel(name, shard_chains=True) if name == "mile" else kernel(name), num_warmup=20,
                   num_samples=10, num_chains=6, chain_method="vectorized", progress_bar=False)
    default.run(jax.random.split(jax.random.PRNGKey(0), 6), X, y, init_params=jax.tree.map(np.asarray, init),
                **model_kwargs(name))
    record(f"default_{name}", 6, ref(6), default, default.get_samples(group_by_chain=True)["w"])
    out[f"default_{name}_6"]["devices"] = num_devices(default.last_state)
    if name == "mile":  # Phase III in groups of one chain per device, the ESS one column at a time
        from numpyro_mile.kernels import _mile_cost
        limits = _mile_cost.PHASE3_POSITIONS_BYTES, _mile_cost.PHASE3_ESS_BYTES
        _mile_cost.PHASE3_POSITIONS_BYTES, _mile_cost.PHASE3_ESS_BYTES = 1, 1
        grouped = MCMC(kernel(name, shard_chains=True), num_warmup=20, num_samples=10, num_chains=6,
                       chain_method="vectorized", progress_bar=False)
        grouped.run(jax.random.split(jax.random.PRNGKey(0), 6), X, y, init_params=jax.tree.map(np.asarray, init))
        _mile_cost.PHASE3_POSITIONS_BYTES, _mile_cost.PHASE3_ESS_BYTES = limits
        record("grouped_mile", 6, ref(6), grouped, grouped.get_samples(group_by_chain=True)["w"])
        out["grouped_mile_6"]["devices"] = num_devices(grouped.last_state)
    if name in ("mile", "sgld", "smile"):  # sharded chains: init's state typed and placed as the step returns it
        from jax.tree_util import keystr, tree_flatten_with_path
        from numpyro_mile.runs.distributed import shard_chains
        n = 6 if name == "mile" else 4  # MILE shards 6 uncommitted chains over 3 devices; others' keys put on 4
        chain_keys = jax.random.split(jax.random.PRNGKey(0), n)
        kern = kernel(name, shard_chains=True) if name == "mile" else kernel(name)
        start = kern.init(chain_keys if name == "mile" else shard_chains(chain_keys), 20,
                          jax.tree.map(np.asarray, first(n)), (X, y), model_kwargs(name))
        after = jax.jit(lambda s: kern.sample(s, (X, y), model_kwargs(name)))(start)
        signature = lambda x: (str(x.sharding), x.dtype.name, bool(getattr(x, "weak_type", False)))
        if name == "sgld":  # a mesh whose axis has another name than "chains" (chain_mesh(axis_name=...))
            from numpyro_mile.runs.distributed import chain_mesh
            named = run_distributed(new_mcmc(name, 4), chain_keys, X, y, mesh=chain_mesh(axis_name="walkers"),
                                    init_params=first(4), **model_kwargs(name))
            out["sgld_walkers_axis"] = list(to_host(named.samples["w"]).shape)
            # one MCMC object, run_chunked on devices 0-1 then 2-3: the chunk program of the first placement
            # (whose sharding constraints name its devices) is not reused for the second
            import tempfile
            from numpyro_mile import run_chunked
            from numpyro_mile.runs.distributed import chain_mesh
            moved, placed_on = new_mcmc(name, 2), []
            for devices in (jax.devices()[:2], jax.devices()[2:]):
                with tempfile.TemporaryDirectory() as tmp:
                    run = run_chunked(moved, shard_chains(chain_keys[:2], chain_mesh(devices)), X, y,
                                      checkpoint_path=tmp + "/run.ckpt", chunk_size=10, **model_kwargs(name))
                    placed_on.append(sorted(d.id for d in run.last_state.z["w"].sharding.device_set))
            out["sgld_moved"] = placed_on
        out[f"{name}_init"] = dict(devices=num_devices(start), changed=[
            keystr(path) for (path, a), b in zip(tree_flatten_with_path(start)[0], jax.tree.leaves(after))
            if signature(a) != signature(b)])
    if name == "mile":  # run_chunked over sharded chains, 3 chunks: its chunk program compiled once
        import logging, tempfile
        from numpyro_mile import run_chunked
        compiled = []
        class CompileLog(logging.Handler):
            def emit(self, record):
                compiled.append(record.getMessage())
        logging.getLogger("jax").addHandler(CompileLog())
        chunked = MCMC(kernel(name, shard_chains=True), num_warmup=20, num_samples=10, num_chains=6,
                       chain_method="vectorized", progress_bar=False)
        with tempfile.TemporaryDirectory() as tmp, jax.log_compiles(True):
            chunked_run = run_chunked(chunked, jax.random.split(jax.random.PRNGKey(0), 6), X, y,
                                      checkpoint_path=tmp + "/run.ckpt", chunk_size=10,
                                      init_params=jax.tree.map(np.asarray, init))
            chunked_run_draws = np.asarray(chunked_run.get_samples()["w"])
        out["mile_chunk_compiles"] = sum("compilation of jit(advance)" in m for m in compiled)
        out["mile_chunked_devices"] = num_devices(chunked_run.last_state)
        # stopped after its first chunk, then resumed from the checkpoint: the saved state is placed as the step
        # returns it, so the resumed run reuses the compiled chunk program; the draws are those of one run
        compiled.clear()
        paused = MCMC(kernel(name, shard_chains=True), num_warmup=20, num_samples=10, num_chains=6,
                      chain_method="vectorized", progress_bar=False)
        with tempfile.TemporaryDirectory() as tmp, jax.log_compiles(True):
            run_args = (paused, jax.random.split(jax.random.PRNGKey(0), 6), X, y)
            opts = dict(checkpoint_path=tmp + "/run.ckpt", chunk_size=10, init_params=jax.tree.map(np.asarray, init))
            stopped = run_chunked(*run_args, callback=lambda progress: True, **opts)
            resumed = run_chunked(*run_args, **opts)
            out["mile_resume"] = dict(
                first_step=stopped.step, finished=resumed.finished, devices=num_devices(resumed.last_state),
                compiles=sum("compilation of jit(advance)" in m for m in compiled),
                diff=float(np.abs(np.asarray(resumed.get_samples()["w"])
                                  - np.asarray(chunked_run_draws)).max()))
    if name == "mile":  # the automatic rule: this model's steps are too little work to shard
        auto = new_mcmc(name, 6)
        auto.run(jax.random.split(jax.random.PRNGKey(0), 6), X, y, init_params=jax.tree.map(np.asarray, init))
        out["mile_auto_devices"] = num_devices(auto.last_state)
        from numpyro_mile._arrays import default_chain_sharding
        out["auto_rule"] = [default_chain_sharding(6, step_flops=f) is not None for f in (1e6, 1e9)]
    out[f"{name}_state_specs"] = sorted({str(tuple(x.sharding.spec)) for x in jax.tree.leaves(mcmc.last_state)})
    if name != "sgld":  # what crosses devices in one step of 8 sharded chains
        kern, kw = mcmc.sampler, model_kwargs(name)
        step = jax.jit(lambda s: kern.sample(s, (X, y), kw)).lower(mcmc.last_state).compile()
        out[f"{name}_collectives"] = [list(c) for c in collectives(step)]

# single-device references for the two-process test: MILE with its own (deep-ensemble) pretraining, and
# deep_ensemble for sharded_deep_ensemble (3 members on 4 devices: padded)
pretrained = MCMC(kernel("mile", pretrain_epochs=2), num_warmup=20, num_samples=10, num_chains=3,
                  chain_method="vectorized", progress_bar=False)
pretrained.run(keys[:3], X, y)
out["mile_pretrained_draws"] = np.asarray(pretrained.get_samples(group_by_chain=True)["w"]).tolist()
default = MCMC(kernel("mile", pretrain_epochs=2, shard_chains=True), num_warmup=20, num_samples=10, num_chains=3,
               chain_method="vectorized", progress_bar=False)
default.run(jax.random.split(jax.random.PRNGKey(0), 6)[:3], X, y)  # pretraining and sampling on 3 devices
record("default_mile_pretrained", 3, pretrained, default, default.get_samples(group_by_chain=True)["w"])
out["default_mile_pretrained_3"]["devices"] = num_devices(default.last_state)
de = deep_ensemble(linreg, jax.random.PRNGKey(3), 3, X, y, max_epochs=2, progress_bar=False)
sde = sharded_deep_ensemble(linreg, jax.random.PRNGKey(3), 3, X, y, max_epochs=2, progress_bar=False)
out["ensemble"] = dict(diff=float(np.abs(np.asarray(de.init_params["w"]) - sde.init_params["w"]).max()),
                       curve_diff=float(np.nanmax(np.abs(de.val_loss - sde.val_loss))),
                       shape=list(sde.init_params["w"].shape))
print("RESULT " + json.dumps(out))
"""
)

TWO_PROCESSES = (
    """
import json, sys, warnings
import jax
pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=120)
"""
    + MODEL
    + """
from numpyro.infer import MCMC
from numpyro_mile import run_distributed
warnings.simplefilter("ignore")
res = {"process_count": jax.process_count(), "device_count": jax.device_count()}
keys = jax.random.split(jax.random.PRNGKey(0), 6)[:3]
init = {"w": 0.3 * jax.random.normal(jax.random.PRNGKey(1), (6, 2))[:3],
        "b": 0.3 * jax.random.normal(jax.random.PRNGKey(2), (6,))[:3]}
# 3 walkers padded to 4 (masked histogram, all-reduced across the processes), as in the 4-device run
mcmc = MCMC(kernel("icsgld"), num_warmup=20, num_samples=10, num_chains=3, chain_method="vectorized",
            progress_bar=False)
run = run_distributed(mcmc, keys, X, y, init_params=init, **model_kwargs("icsgld"))
res["icsgld_draws"] = run.samples["w"].tolist()
res["icsgld_theta"] = np.asarray(mcmc.last_state.theta).tolist()
# MILE with its deep-ensemble pretraining sharded over both processes
mcmc = MCMC(kernel("mile", pretrain_epochs=2), num_warmup=20, num_samples=10, num_chains=3,
            chain_method="vectorized", progress_bar=False)
res["mile_draws"] = run_distributed(mcmc, keys, X, y).samples["w"].tolist()
if pid == 0:
    print("RESULT " + json.dumps(res), flush=True)
"""
)


def _env(num_devices):
    env = dict(os.environ)
    # no LLVM optimisation: compiling dominates these short runs (reference and sharded runs alike)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices} {_subprocess.FAST_COMPILE_XLA_FLAGS}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _result(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, "the subprocess printed no RESULT line"
    return json.loads(lines[-1][len("RESULT ") :])


def _run_four_devices() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FOUR_DEVICES], capture_output=True, text=True, timeout=900, env=_env(4)
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_processes() -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of processes 1 and 0."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_PROCESSES, str(pid), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(2),
        )
        for pid in (1, 0)
    ]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=900))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outs)]


@pytest.fixture(scope="module")
def four_devices():
    proc = _run_four_devices()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _result(proc.stdout)


# ---------------------------------------------------------------------------------------------- 4 devices
@pytest.mark.parametrize("name", ["mile", "sgld", "icsgld", "smile"])
def test_sharded_chains_equal_vectorized_chains(four_devices, name):
    for n in COUNTS:
        res = four_devices[f"{name}_{n}"]
        assert res["shape"] == [n, 10, 2]
        assert res["diff"] < TOL[name], (n, res)
        assert res["other_chain"] > 20 * TOL[name], (n, res)  # the check can tell chains apart
        if name == "icsgld":
            assert res["theta_diff"] < 1e-6, (n, res)
    if name == "icsgld":  # 3 walkers padded to 4: a copy of the kernel masks the 4th; the user's kernel is unchanged
        assert four_devices["icsgld_3_active"] == [None, 3]


@pytest.mark.parametrize("name", ["mile", "sgld", "icsgld", "smile", "mile_pretrained"])
def test_vectorized_chains_run_over_every_device_by_default(four_devices, name):
    """``MCMC(MILE(model, shard_chains=True), ..., chain_method="vectorized")`` shards its chains over the local
    devices (issue #29): 6 chains on 3 of 4 devices (the largest count that divides them), 3 pretrained chains on
    3; the draws equal those of the one-device run of the same keys (inputs committed to one device stay there).
    SGLD, SMILE and ICSGLD stay on one device unless run_distributed is used."""
    n = 3 if name == "mile_pretrained" else 6
    res = four_devices[f"default_{name}_{n}"]
    assert res["devices"] == (3 if name.startswith("mile") else 1), res
    assert res["shape"] == [n, 10, 2]
    tol = TOL[name.split("_")[0]]
    assert res["diff"] < tol, res
    assert res["other_chain"] > 20 * tol, res


def test_sharded_phase3_in_groups_of_chains_gives_the_same_draws(four_devices):
    """MILE's Phase III on CPU with its work space limits at their lowest (one chain per device at a time, the ESS one
    coordinate at a time: what large Phase III buffers get) on 6 chains sharded over 3 devices: the draws of the
    one-device run of the same keys, each chain on its own device."""
    res = four_devices["grouped_mile_6"]
    assert res["devices"] == 3 and res["shape"] == [6, 10, 2], res
    assert res["diff"] < TOL["mile"], res
    assert res["other_chain"] > 20 * TOL["mile"], res


def test_sharded_chains_compile_their_step_once(four_devices):
    """The state ``init`` makes for sharded chains (MILE's own sharding; SGLD, SMILE from keys put on 4 devices) is
    typed and placed as the compiled step returns it (chain-axis leaves split, the counter and the data copied to
    every device), so ``run_chunked`` compiles its chunk program once, not again at the second chunk (issue #29:
    2.7 s more per run on airfoil, 2 devices), also when resumed from a checkpoint."""
    assert four_devices["sgld_walkers_axis"] == [4, 10, 2]  # a mesh axis named otherwise
    assert four_devices["sgld_moved"] == [[0, 1], [2, 3]]  # the same kernel's chunks on other devices
    for name, devices in [("mile", 3), ("sgld", 4), ("smile", 4)]:  # every leaf enters the step as it leaves it
        assert four_devices[f"{name}_init"] == dict(devices=devices, changed=[]), four_devices[f"{name}_init"]
    assert four_devices["mile_chunked_devices"] == 3
    assert four_devices["mile_chunk_compiles"] == 1
    resume = four_devices["mile_resume"]  # stopped after one chunk, resumed: no new compilation, the same draws
    assert resume["first_step"] == 10 and resume["finished"] and resume["devices"] == 3, resume
    assert resume["compiles"] == 1 and resume["diff"] == 0.0, resume


def test_mile_shards_by_default_only_when_a_step_is_enough_work(four_devices):
    """``shard_chains=None``: sharded when a step of all chains costs at least MIN_SHARDED_STEP_FLOPS (NumPyro's
    progress bar launches the step once per step; a multi-device launch costs more than this model's step)."""
    assert four_devices["auto_rule"] == [False, True]
    assert four_devices["mile_auto_devices"] == 1


def test_the_step_cost_threshold_decides_for_cpu_devices_only(monkeypatch):
    """MIN_SHARDED_STEP_FLOPS was measured on CPU: on another platform the automatic rule (a step cost given)
    leaves the chains where NumPyro puts them, however large the step; without a cost (``shard_chains=True``)
    the rule goes on to build a mesh of those devices."""
    from numpyro_mile import _arrays

    class Device:  # stands for a GPU; only its platform is read before the mesh is built
        platform = "gpu"

    monkeypatch.setattr(_arrays.jax, "local_devices", lambda: [Device(), Device()])
    monkeypatch.setattr(_arrays.jax.sharding, "Mesh", lambda devices, axes: (len(devices), axes))
    monkeypatch.setattr(_arrays.jax.sharding, "NamedSharding", lambda mesh, spec: mesh)
    assert _arrays.default_chain_sharding(4, step_flops=1e15) is None
    assert _arrays.default_chain_sharding(4, step_flops=None) == (2, (_arrays.CHAIN_AXIS,))


def test_only_the_histogram_crosses_devices(four_devices):
    """ICSGLD: one all-reduce of the m bins (plus a few scalars), never positions or gradients.

    MILE: nothing at all; its end-of-warmup ESS runs per device block of chains (``shard_map``: XLA
    does not partition an FFT over a batch axis, and would all-gather the Phase III buffer). No
    collective also means that sharding MILE by default cannot deadlock XLA's CPU collectives under
    NumPyro's one-call-per-step progress-bar loop.

    SMILE: independent chains, nothing larger than a scalar.
    """
    ics = four_devices["icsgld_collectives"]
    assert ics and {op for op, _, _ in ics} == {"all-reduce"}
    sizes = sorted(count for _, _, count in ics)  # the bins and the walker count; a few scalars
    assert NUM_BINS <= sizes[-1] <= NUM_BINS + 1 and all(size <= 2 for size in sizes[:-1]), ics
    assert four_devices["mile_collectives"] == []
    assert all(count <= 2 for _, _, count in four_devices["smile_collectives"])  # independent chains: scalars
    for name in ("mile", "sgld", "icsgld", "smile"):  # per-chain state sharded, shared fields replicated
        assert set(four_devices[f"{name}_state_specs"]) <= {"('chains',)", "()"}
        assert "('chains',)" in four_devices[f"{name}_state_specs"]


def test_samples_kept_sharded_and_sharded_deep_ensemble(four_devices):
    assert four_devices["kept"] == {"shape": [4, 10, 2], "spec": "('chains',)", "padded": 4}
    ens = four_devices["ensemble"]
    assert ens["shape"] == [3, 2] and ens["diff"] < 1e-5 and ens["curve_diff"] < 1e-5


# ---------------------------------------------------------------------------------------------- 2 processes
def test_two_processes_with_jax_distributed(four_devices):
    """jax.distributed.initialize on 127.0.0.1: 2 processes x 2 CPU devices, gloo collectives.

    Compared with single-device vectorized references computed by the 4-device script (ICSGLD: its
    sharded run, itself checked against the reference above; the same 4-device layout).
    """
    outs = _run_two_processes()
    for returncode, _, err in outs:
        assert returncode == 0, err[-3000:]
    res = _result(outs[1][1])
    assert res["process_count"] == 2 and res["device_count"] == 4
    ics, mile = np.asarray(res["icsgld_draws"]), np.asarray(res["mile_draws"])
    assert ics.shape == mile.shape == (3, 10, 2)
    np.testing.assert_allclose(ics, four_devices["icsgld_3_draws"], rtol=0, atol=TOL["icsgld"])
    np.testing.assert_allclose(res["icsgld_theta"], four_devices["icsgld_3_theta"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(mile, four_devices["mile_pretrained_draws"], rtol=0, atol=TOL["mile"])


# ---------------------------------------------------------------------------------------------- in process
def test_padding_and_placement():
    assert [padded_size(n, 4) for n in (1, 3, 4, 6, 8)] == [4, 4, 4, 8, 8]
    mesh = chain_mesh()
    tree = {"a": np.arange(6.0).reshape(3, 2), "k": jax.random.split(jax.random.key(0), 3)}
    placed = shard_chains(tree, mesh)
    assert placed["a"].shape[0] == padded_size(3, jax.device_count())
    np.testing.assert_array_equal(to_host(placed["a"])[:3], tree["a"])
    padding = to_host(placed["a"])[3:]  # copies of the last chain
    np.testing.assert_array_equal(padding, np.broadcast_to(tree["a"][-1], padding.shape))
    assert jnp.issubdtype(placed["k"].dtype, jax.dtypes.prng_key)
    with pytest.raises(ValueError, match="leading chain axis"):
        shard_chains({"a": np.zeros((3, 2)), "b": np.zeros((4,))}, mesh)
    with pytest.raises(ValueError, match="positive integer"):
        padded_size(0, 4)


def test_collectives_parser():
    hlo = textwrap.dedent("""
        %all-reduce.3 = f32[20]{0} all-reduce(%x), channel_id=4, replica_groups=...
        %ag = f32[8,3]{1,0} all-gather(%y), dimensions={0}
        %ars = (f32[], f32[]) all-reduce-start(%a), channel_id=1
        %add = f32[20]{0} add(%all-reduce.3, %z)
    """)
    assert collectives(hlo) == [
        ("all-reduce", "f32[20]{0}", 20),
        ("all-gather", "f32[8,3]{1,0}", 24),
        ("all-reduce-start", "(f32[], f32[])", 1),
    ]


def test_run_distributed_errors_and_one_chain():
    ns = {}
    exec(MODEL, ns)  # noqa: S102  (the subprocesses' tiny model, data and kernels)
    X, y = ns["X"], ns["y"]
    mcmc = MCMC(
        ns["kernel"]("sgld"), num_warmup=5, num_samples=5, num_chains=2, chain_method="sequential", progress_bar=False
    )
    with pytest.raises(ValueError, match="chain_method='vectorized'"):
        run_distributed(mcmc, jax.random.PRNGKey(0), X, y)
    mcmc = MCMC(
        ns["kernel"]("sgld"), num_warmup=5, num_samples=5, num_chains=2, chain_method="vectorized", progress_bar=False
    )
    with pytest.raises(ValueError, match="one per chain"):
        run_distributed(mcmc, jax.random.split(jax.random.PRNGKey(0), 3), X, y)
    # one chain on a one-device mesh: MCMC's unbatched single-chain path, same draws as mcmc.run
    runs = []
    for distributed in (False, True):
        mcmc = MCMC(ns["kernel"]("sgld"), num_warmup=5, num_samples=5, progress_bar=False)
        if distributed:
            out = run_distributed(
                mcmc, jax.random.PRNGKey(0), X, y, mesh=chain_mesh(jax.devices()[:1]), subsample_size=10
            )
            assert out.samples["w"].shape == (1, 5, 2) and isinstance(out.samples["w"], np.ndarray)
        else:
            mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=10)
        runs.append(np.asarray(mcmc.get_samples(group_by_chain=True)["w"]))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert mcmc.num_chains == 1
