"""Golden values of the MILE reference code's step-size and L tuning, for ``tests/test_mile_reference.py``.

Runs in the MILE authors' own environment (their checkout of github.com/EmanuelSommer/MILE, with the versions
their ``poetry.lock`` pins: jax/jaxlib 0.4.28, blackjax 1.2.2)::

    python tests/golden/make_mile_tuner.py ~/src/MILE tests/golden/mile_tuner.npz

It calls their ``make_L_step_size_adaptation`` (Phases I+II) and ``make_adaptation_L`` (Phase III) from
``src/training/warmup.py`` with the settings of their ``replicate_uci/mclmc.yaml``, on a stand-in for the MCLMC
kernel whose energy change is ``r * step_size**3`` (MCLMC's energy error scales as the step size cubed), ``r``
drawn from a Student-t from the step's key, and whose position follows an AR(1) walk per coordinate. A small
share of its proposals in Phases I+II is NaN (the tuner then rejects the step; their Phase III has no NaN
handling, so none are drawn there). Every call of the stand-in is recorded: the step
size it was given, the energy change and position it returned. ``tests/test_mile_reference.py`` feeds the same
energy changes and positions to numpyro_mile's tuner and compares the step-size trajectory and L.

Nothing of the authors' code is stored, only the numbers it produced.
"""

import sys
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: scenario -> (dim, warmup steps, (target start, end), median |r| (sets the step size the tuner finds), NaN share,
#: x64). "bnn": a BNN-like run (step size ~1e-2, linear 0.5 -> 0.1 as the reference configs); "exponential": the
#: schedule for a start above 2; "tiny": a target only step sizes ~1e-7 reach (eps^6 underflows float32; the
#: reference's own float32 update breaks there, so its float64 run is the golden one)
SCENARIOS = {
    "bnn": (64, 2000, (0.5, 0.1), 1.5e5, 0.003, False),
    "bnn_x64": (64, 2000, (0.5, 0.1), 1.5e5, 0.003, True),
    "exponential": (64, 2000, (10.0, 0.1), 1.5e5, 0.01, True),
    "tiny": (64, 2000, (5e-4, 5e-4), 2e20, 0.0, True),
}
STEP_SIZE_INIT = 1e-3  # replicate_uci/mclmc.yaml
TRUST, N_EFF, L_FACTOR = 1.5, 100, 0.4


class Info(NamedTuple):
    energy_change: jax.Array


def run(checkout: Path, name: str) -> dict:
    dim, num_warmup, (start, end), r_scale, nan_share, x64 = SCENARIOS[name]
    jax.config.update("jax_enable_x64", x64)
    sys.path.insert(0, str(checkout))
    from blackjax.adaptation.mclmc_adaptation import MCLMCAdaptationState
    from blackjax.mcmc.integrators import IntegratorState
    from src.training.warmup import make_adaptation_L, make_L_step_size_adaptation

    dtype = jnp.float64 if x64 else jnp.float32
    n1, n2, n3 = int(num_warmup * 0.8), int(num_warmup * 0.1), int(num_warmup * 0.1)
    rho = jnp.linspace(0.5, 0.995, dim, dtype=dtype)  # AR(1) coefficients: ESS per coordinate from ~n to ~n/400
    calls = []

    def record(step_size, energy_change, position):
        calls.append((float(step_size), float(energy_change), np.asarray(position, np.float64)))

    def kernel(sqrt_diag_cov, nan_share=nan_share):
        def step(rng_key, state, L, step_size):
            k1, k2, k3 = jax.random.split(rng_key, 3)
            r = r_scale * jax.random.t(k1, 3.0, dtype=dtype)
            noise = jax.random.normal(k3, (dim,), dtype)
            position = rho * state.position + jnp.sqrt(1 - rho**2) * noise
            bad = jax.random.uniform(k2, dtype=dtype) < nan_share
            position = jnp.where(bad, jnp.nan, position)
            energy_change = jnp.where(bad, jnp.nan, r * step_size**3).astype(dtype)
            jax.debug.callback(record, step_size, energy_change, position, ordered=True)
            return state._replace(position=position), Info(energy_change)

        return step

    zeros = jnp.zeros(dim, dtype)
    state = IntegratorState(zeros, zeros, jnp.zeros((), dtype), zeros)
    params = MCLMCAdaptationState(
        L=jnp.maximum(jnp.sqrt(dim), 15.0).astype(dtype),
        step_size=jnp.asarray(STEP_SIZE_INIT, dtype),
        sqrt_diag_cov=jnp.ones(dim, dtype),
    )
    key12, key3 = jax.random.split(jax.random.PRNGKey(0))
    state, params = make_L_step_size_adaptation(
        kernel=kernel,
        dim=dim,
        tune1_steps=n1,
        tune2_steps=n2,
        diagonal_preconditioning=False,
        desired_energy_var_start=start,
        desired_energy_var_end=end,
        trust_in_estimate=TRUST,
        num_effective_samples=N_EFF,
    )(state, params, key12)
    jax.effects_barrier()
    phase2_L, step_size = float(params.L), float(params.step_size)
    state, params = make_adaptation_L(kernel(None, nan_share=0.0), Lfactor=L_FACTOR)(state, params, n3, key3)
    jax.effects_barrier()
    assert len(calls) == n1 + n2 + n3, len(calls)
    step_sizes, energy_changes, positions = (np.array([c[i] for c in calls]) for i in range(3))
    return dict(
        dim=dim,
        num_warmup=num_warmup,
        phases=np.array([n1, n2, n3]),
        target=np.array([start, end]),
        x64=x64,
        step_sizes=step_sizes,
        energy_changes=energy_changes,
        positions=positions[n1 - 1 :].astype(np.float32),  # from the last Phase I step
        final_step_size=step_size,
        phase2_L=phase2_L,
        final_L=float(params.L),
    )


if __name__ == "__main__":
    import subprocess

    checkout, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    if len(sys.argv) > 3:  # one scenario per process (x64 is a process-wide switch)
        result = run(checkout, sys.argv[3])
        np.savez(out, **result)
    else:
        commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        parts = {}
        for name in SCENARIOS:
            tmp = out.with_suffix(f".{name}.npz")
            subprocess.run([sys.executable, __file__, str(checkout), str(tmp), name], check=True)
            with np.load(tmp) as f:
                parts.update({f"{name}/{k}": f[k] for k in f.files})
            tmp.unlink()
        import blackjax

        np.savez_compressed(
            out, reference_commit=commit, jax_version=jax.__version__, blackjax_version=blackjax.__version__, **parts
        )
        print(f"wrote {out}")
