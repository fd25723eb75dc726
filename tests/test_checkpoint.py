"""Checkpoints and chunked runs: kill-and-resume equals the uninterrupted run bit for bit, streamed
draws equal MCMC.run's in-memory draws, damaged files and other runs are refused."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, init_to_uniform

from numpyro_mile import (
    MILE,
    SGLD,
    CheckpointError,
    SampleStore,
    load_checkpoint,
    load_inference_data,
    load_samples,
    run_chunked,
    save_checkpoint,
)
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression
from numpyro_mile._arrays import round_to_dtype
from numpyro_mile.kernels._mile_cost import ESS_WORK_FACTOR

REPO = Path(__file__).resolve().parents[1]
KILLED = 17  # exit status of a subprocess that killed itself after a chunk


def assert_trees_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb):
        if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_same_draws(mcmc, run, extra=True):
    """Streamed draws (memory-mapped) equal MCMC.run's in-memory draws, bit for bit."""
    ref, got = mcmc.get_samples(group_by_chain=True), run.get_samples(group_by_chain=True)
    assert set(ref) == set(got)
    for name in ref:
        assert isinstance(got[name], np.memmap)  # read lazily from disk
        np.testing.assert_array_equal(np.asarray(ref[name]), got[name], err_msg=name)
    if extra:
        ref_x, got_x = mcmc.get_extra_fields(group_by_chain=True), run.get_extra_fields(group_by_chain=True)
        assert set(ref_x) == set(got_x)
        for name in ref_x:
            np.testing.assert_array_equal(np.asarray(ref_x[name]), got_x[name], err_msg=name)
    assert_trees_equal(mcmc.last_state, run.last_state)


# ------------------------------------------------------------------------------------------ MILE, killed twice
MILE_RUN = dict(num_warmup=100, num_samples=62, thinning=3, num_chains=2, chain_method="vectorized")
MILE_FIELDS = ("step_size", "L", "energy_change")


def mile_setup():
    """MILE on a 1-8-2 MLP from fixed random weights (no pretraining: the test is about resuming)."""
    X, y = toy_regression(40)
    rng = np.random.default_rng(0)
    shapes = {"w0": (1, 8), "b0": (8,), "w1": (8, 2), "b1": (2,)}
    init = {k: 0.5 * rng.standard_normal((MILE_RUN["num_chains"],) + s).astype(np.float32) for k, s in shapes.items()}
    mcmc = MCMC(MILE(mlp_regression), progress_bar=False, **MILE_RUN)
    return mcmc, (X, y), dict(hidden=(8,), init_params=init)


SCRIPT = textwrap.dedent(f"""
    import os, shutil, sys
    sys.path.insert(0, {str(REPO)!r})
    import jax
    from tests.test_checkpoint import mile_setup, MILE_FIELDS, KILLED
    from numpyro_mile import run_chunked
    path, snapshot_at, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mcmc, args, kwargs = mile_setup()
    def callback(progress):
        if progress.step == snapshot_at:  # the file a kill at this point would leave behind
            shutil.copy(path, path + f".at{{snapshot_at}}")
        if progress.step >= kill_at:
            os._exit(KILLED)  # no cleanup, like a kill -9 right after a chunk
    run_chunked(mcmc, jax.random.PRNGKey(0), *args, checkpoint_path=path, chunk_size=25,
                extra_fields=MILE_FIELDS, callback=callback, **kwargs)
    sys.exit(0)
""")


def test_mile_killed_mid_sampling_or_mid_warmup_resumes_bit_for_bit(tmp_path):
    """A MILE run in a subprocess is killed mid-sampling (step 125 of 100 + 62); its checkpoint from
    step 50 (Phase I of warmup), copied when it was written, is resumed too. Both resumed runs
    equal MCMC.run's uninterrupted in-memory run bit for bit: draws, extra fields, final state."""
    script, path = tmp_path / "run.py", tmp_path / "mile.ckpt"
    script.write_text(SCRIPT)
    env = dict(os.environ, CI="1", JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), "50", "125"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reference, args, kwargs = mile_setup()  # meanwhile: uninterrupted, in memory
    reference.run(jax.random.PRNGKey(0), *args, extra_fields=MILE_FIELDS, **kwargs)
    _, err = proc.communicate(timeout=1200)
    assert proc.returncode == KILLED, err[-3000:]

    warm = tmp_path / "mile.ckpt.at50"
    ckpt = load_checkpoint(warm)
    assert ckpt.step == 50 and ckpt.num_draws == 0 and int(ckpt.state.i) == 50
    ckpt = load_checkpoint(path)
    assert ckpt.step == 125 and ckpt.num_draws == (125 - 100 - 62 % 3) // 3 == 7
    assert load_samples(str(path) + ".samples")["w0"].shape[1] == 7

    mcmc, args, kwargs = mile_setup()  # resume here, with other chunks
    for resumed in (path, warm):
        run = run_chunked(
            mcmc,
            jax.random.PRNGKey(0),
            *args,
            checkpoint_path=resumed,
            chunk_size=40,
            extra_fields=MILE_FIELDS,
            **kwargs,
        )
        assert run.finished and run.step == 162 and run.num_draws == 62 // 3
        assert_same_draws(reference, run)
    idata = run.to_inference_data()
    assert idata.posterior["w0"].shape == (2, 20, 1, 8)
    np.testing.assert_array_equal(
        idata.sample_stats["L"].values, np.asarray(reference.get_extra_fields(group_by_chain=True)["L"])
    )

    # estimate_cost's memory prediction is this run's: the state of the chains and the draws
    cost = MILE(mlp_regression).estimate_cost(
        jax.random.PRNGKey(0),
        *args,
        num_warmup=100,
        num_samples=62,
        num_chains=2,
        thinning=3,
        chunk_size=40,
        min_seconds=0.01,
        **kwargs,
    )
    # the data the state carries through the loop are counted once, in data_bytes
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(reference.last_state._replace(data=None)))
    assert cost.state_bytes <= state_bytes <= cost.state_bytes + 2 * 64  # + a few scalars per chain
    draws = reference.get_samples(group_by_chain=True)
    assert cost.sample_bytes == sum(v.nbytes for v in draws.values())
    per_draw = cost.sample_bytes // (2 * 20)
    assert cost.phase3_bytes == 2 * 4 * 10 * 34  # n3 = 10 positions of 34 coordinates, in the Phase III step
    # one chunk of draws (40 / 3 steps) and, during the Phase III step, the positions and one chain's ESS work space
    phase3 = cost.phase3_bytes * (1 + ESS_WORK_FACTOR / 2)
    assert cost.predicted_bytes == pytest.approx(cost.data_bytes + cost.state_bytes + phase3 + 2 * 14 * per_draw, abs=1)
    assert cost.data_bytes == args[0].nbytes + args[1].nbytes and cost.num_params == 8 + 8 + 16 + 2


# ------------------------------------------------------------------------------------------ SGLD, sequential chains
DATA = np.random.default_rng(0).normal(1.0, 1.0, 50).astype(np.float32)


def mean_model(x, subsample_size=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    numpyro.deterministic("theta_sq", theta**2)
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size):
        batch = numpyro.subsample(x, event_dim=0)
        numpyro.sample("obs", dist.Normal(theta.sum(), 1.0), obs=batch)


def sgld_mcmc(step_size=1e-3, **run):
    settings = dict(dict(num_warmup=30, num_samples=40, thinning=3, num_chains=2, chain_method="sequential"), **run)
    return MCMC(
        SGLD(mean_model, step_size=step_size, init_strategy=init_to_uniform(radius=0.5)), progress_bar=False, **settings
    )


def test_sgld_sequential_chains_resumed_equal_mcmc_run_other_runs_refused_bfloat16(tmp_path):
    path = tmp_path / "sgld.ckpt"
    common = dict(checkpoint_path=path, extra_fields=("potential_energy",), subsample_size=10)
    part = run_chunked(
        sgld_mcmc(), jax.random.PRNGKey(3), DATA, chunk_size=7, callback=lambda p: p.step >= 40, **common
    )
    assert (part.step, part.finished, part.num_draws) == (44, False, (44 - 30 - 40 % 3) // 3)  # chunks end at W
    assert len(load_samples(part.sample_dir)["theta"][0]) == part.num_draws
    # a fresh kernel, another chunk size: the draws do not depend on it
    run = run_chunked(sgld_mcmc(), jax.random.PRNGKey(3), DATA, chunk_size=11, **common)
    assert run.finished and run.num_draws == 13
    reference = sgld_mcmc()
    reference.run(jax.random.PRNGKey(3), DATA, subsample_size=10, extra_fields=("potential_energy",))
    assert_same_draws(reference, run)
    assert set(run.get_samples()) == {"theta", "theta_sq"} and run.get_samples()["theta"].shape == (26, 2)

    # another run's checkpoint is refused before any work, naming what differs
    other = dict(common, chunk_size=11)
    cases = {
        "step_size": lambda: run_chunked(sgld_mcmc(step_size=2e-3), jax.random.PRNGKey(3), DATA, **other),
        "data": lambda: run_chunked(sgld_mcmc(), jax.random.PRNGKey(3), DATA + 1, **other),
        "rng_key": lambda: run_chunked(sgld_mcmc(), jax.random.PRNGKey(4), DATA, **other),
        "thinning": lambda: run_chunked(sgld_mcmc(thinning=2), jax.random.PRNGKey(3), DATA, **other),
        "store_dtype": lambda: run_chunked(sgld_mcmc(), jax.random.PRNGKey(3), DATA, store_dtype="float16", **other),
    }
    for field, call in cases.items():
        with pytest.raises(CheckpointError, match=f"{field}: checkpoint"):
            call()

    # bfloat16 storage: the same draws, rounded to nearest even
    half = run_chunked(
        sgld_mcmc(),
        jax.random.PRNGKey(3),
        DATA,
        checkpoint_path=tmp_path / "half.ckpt",
        chunk_size=35,
        store_dtype="bfloat16",
        subsample_size=10,
    )
    stored = load_samples(half.sample_dir)["theta"]
    assert stored.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(stored, round_to_dtype(reference.get_samples(True)["theta"], "bfloat16"))
    assert load_inference_data(half.sample_dir, upcast=True).posterior["theta"].dtype == np.float32


# ------------------------------------------------------------------------------------------ NUTS: any pytree state
def two_d():
    numpyro.sample("x", dist.Normal(jnp.zeros(2), jnp.array([1.0, 3.0])).to_event(1))


def test_nuts_stopped_mid_warmup_resumes_and_saved_warmup_continues_mcmc(tmp_path):
    mcmc = lambda: MCMC(NUTS(two_d), num_warmup=40, num_samples=30, progress_bar=False)  # noqa: E731
    path = tmp_path / "nuts.ckpt"
    chunked = mcmc()  # resumed with the same object: the compiled chunk loop is reused
    part = run_chunked(
        chunked, jax.random.PRNGKey(1), checkpoint_path=path, chunk_size=15, callback=lambda p: p.step >= 15
    )
    assert part.step == 15
    with pytest.raises(CheckpointError, match="middle of warmup"):  # MCMC.run cannot finish a warmup
        load_checkpoint(path, mcmc=mcmc())
    run = run_chunked(chunked, jax.random.PRNGKey(1), checkpoint_path=path, chunk_size=15)

    # NumPyro's own continuation through a file: warmup, save, load into a new MCMC, run
    warm = mcmc()
    warm.warmup(jax.random.PRNGKey(1))
    save_checkpoint(warm, tmp_path / "warm.ckpt", metadata={"note": "after warmup"})
    other = mcmc()
    ckpt = load_checkpoint(tmp_path / "warm.ckpt", mcmc=other)  # sets other.post_warmup_state
    assert ckpt.metadata["note"] == "after warmup" and ckpt.step == 40
    other.run(ckpt.state.rng_key)
    assert_same_draws(other, run)  # z and NUTS's default field 'diverging'
    with pytest.raises(CheckpointError, match="num_warmup: checkpoint 40, now 41"):
        load_checkpoint(tmp_path / "warm.ckpt", mcmc=MCMC(NUTS(two_d), num_warmup=41, num_samples=30))


def nuts_potential(z):
    return 0.5 * jnp.sum(z["x"] ** 2)


def other_potential(z):
    return jnp.sum(z["x"] ** 2)


def test_nuts_on_a_potential_fn_resumes_its_own_checkpoint(tmp_path):
    """NumPyro's HMC keeps its target as ``_potential_fn``: a NUTS checkpoint matches its own run and not one on
    another potential."""
    init = {"x": jnp.zeros(2)}
    mcmc = lambda fn: MCMC(NUTS(potential_fn=fn), num_warmup=20, num_samples=10, progress_bar=False)  # noqa: E731
    warm = mcmc(nuts_potential)
    warm.warmup(jax.random.PRNGKey(0), init_params=init)
    save_checkpoint(warm, tmp_path / "nuts_fn.ckpt")
    assert load_checkpoint(tmp_path / "nuts_fn.ckpt", mcmc=mcmc(nuts_potential)).step == 20
    with pytest.raises(CheckpointError, match="kernel_settings._potential_fn"):
        load_checkpoint(tmp_path / "nuts_fn.ckpt", mcmc=mcmc(other_potential))


# ------------------------------------------------------------------------------------------ file integrity
def small_state():
    from numpyro_mile.kernels._langevin import RunningMoments

    return RunningMoments(
        count=jnp.asarray(3),
        mean={"a": jnp.arange(4.0), "b": None},
        m2=[jax.random.key(5), np.float32(2.5), (1, jnp.ones((2, 2), jnp.int8))],
    )


def test_roundtrip_truncation_damage_version_and_crash_during_save(tmp_path, monkeypatch):
    path = tmp_path / "s.ckpt"
    state = small_state()
    save_checkpoint(state, path, metadata={"k": 1})
    assert_trees_equal(load_checkpoint(path).state, state)
    good = path.read_bytes()

    path.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        load_checkpoint(path)
    path.write_bytes(good[:-10])  # only the end missing
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    damaged = bytearray(good)
    offset = good.find(np.arange(4.0, dtype=np.float32).tobytes())
    damaged[offset + 1] ^= 0xFF  # a flipped bit in an array
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(path)

    path.write_bytes(good)  # another format version
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    meta_npy = members["__meta__.npy"]
    import io

    meta = json.loads(np.load(io.BytesIO(meta_npy)).tobytes())
    meta["version"] = 99
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(json.dumps(meta).encode(), np.uint8))
    members["__meta__.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(path)

    # a crash while writing the next checkpoint leaves the previous one readable
    path.write_bytes(good)
    import numpyro_mile.sample_store as streaming

    def crash(fd):
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(streaming.os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(state._replace(count=jnp.asarray(4)), path)
    monkeypatch.undo()
    assert int(load_checkpoint(path).state.count) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.ckpt"]  # no temporary file left


def test_sample_store_layout_and_errors(tmp_path):
    spec = {"posterior": {"w": ((2,), "float32")}, "sample_stats": {"n": ((), "int32")}}
    store = SampleStore.create(tmp_path, spec, num_chains=3, num_draws=5, store_dtype="float16")
    store.write(
        {"posterior": {"w": np.full((3, 2, 2), 1 / 3, np.float32)}, "sample_stats": {"n": np.ones((3, 2), np.int32)}},
        start=0,
    )
    w = load_samples(tmp_path)["w"]
    assert w.shape == (3, 2, 2) and w.dtype == np.float16 and float(w[0, 0, 0]) == float(np.float16(1 / 3))
    assert load_samples(tmp_path, group="sample_stats")["n"].dtype == np.int32
    assert load_samples(tmp_path, group_by_chain=False)["w"].shape == (6, 2)
    with pytest.raises(ValueError, match="do not fit"):
        store.write({"posterior": {"w": np.zeros((3, 4, 2))}, "sample_stats": {"n": np.zeros((3, 4))}}, start=3)
    with pytest.raises(ValueError, match="another layout"):
        SampleStore.create(tmp_path, spec, num_chains=3, num_draws=6)
    with pytest.raises(ValueError, match="store_dtype must be"):
        SampleStore.create(tmp_path / "x", spec, num_chains=1, num_draws=1, store_dtype="int8")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        run_chunked(sgld_mcmc(), jax.random.PRNGKey(0), DATA, checkpoint_path=tmp_path / "c", chunk_size=0)
    with pytest.raises(TypeError, match="needs a numpyro.infer.MCMC"):
        run_chunked(SGLD(mean_model), jax.random.PRNGKey(0), DATA, checkpoint_path=tmp_path / "c")


def test_a_checkpoint_missing_a_setting_is_another_run():
    """No setting has an implied value: a fingerprint that lacks one (or records it under another name) does not
    match, and the error names it."""
    from numpyro_mile.runs.checkpoint import _differences

    now = {"kernel_settings": {"target_schedule": "auto", "n_eff": 100.0}}
    assert _differences({"kernel_settings": dict(now["kernel_settings"])}, now) == []
    assert _differences({"kernel_settings": {"n_eff": 100.0}}, now) == [
        "kernel_settings.target_schedule: checkpoint '<absent>', now 'auto'"
    ]


# ------------------------------------------------------------------------------- a second run on new data
def fitted_line(X, y=None):
    """Regression whose collected sites depend on the data (a deterministic site reads X)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    numpyro.deterministic("first_fit", X[0] @ w)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, 0.5), obs=y)


def _line_data(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(30, 2)).astype(np.float32)
    return X, (X @ np.array([1.0, -2.0]) + 0.5 * rng.normal(size=30)).astype(np.float32)


@pytest.mark.parametrize("name", ["mile", "sgld", "nuts"])
def test_a_second_run_on_new_data_is_not_traced_again_and_samples_the_new_data(tmp_path, monkeypatch, name):
    """The same kernel run again through run_chunked on new data of the same shapes (an estimator's refit, the
    next cross-validation fold) reuses the compiled chunk loop, and its draws - sites computed from the data
    included - are those of MCMC.run of a fresh kernel on the new data, bit for bit (NUTS: with
    ``jit_model_args=True``; NumPyro otherwise compiles the data in as constants, which XLA may fold)."""
    from numpyro_mile.runs import chunked

    traces = []
    make = chunked._make_transform_of
    monkeypatch.setattr(
        chunked, "_make_transform_of", lambda *a: (lambda f: lambda *args: (traces.append(1), f(*args))[1])(make(*a))
    )

    def kernel():
        if name == "mile":
            return MILE(fitted_line, pretrain=False)
        return SGLD(fitted_line, 1e-3) if name == "sgld" else NUTS(fitted_line)

    def mcmc(k, **options):
        return MCMC(
            k,
            num_warmup=100,
            num_samples=20,
            num_chains=2,
            chain_method="vectorized" if name != "nuts" else "sequential",
            progress_bar=False,
            **options,
        )

    reused = kernel()
    run_chunked(mcmc(reused), jax.random.PRNGKey(1), *_line_data(0), checkpoint_path=tmp_path / "a.ckpt", chunk_size=30)
    first = len(traces)  # the sample spec once, then one trace of the loop
    run = run_chunked(
        mcmc(reused), jax.random.PRNGKey(2), *_line_data(1), checkpoint_path=tmp_path / "b.ckpt", chunk_size=30
    )
    assert len(traces) - first == 1 < first  # only the sample spec: the loop is not traced again
    reference = mcmc(kernel(), jit_model_args=True)  # the data as arguments, as in run_chunked's loop
    reference.run(jax.random.PRNGKey(2), *_line_data(1))
    for site, draws in reference.get_samples(group_by_chain=True).items():
        np.testing.assert_array_equal(np.asarray(draws), run.get_samples(group_by_chain=True)[site], err_msg=site)
