"""Every script in examples/ runs to completion with ``--smoke`` (tiny budgets), in a fresh process.

New examples are picked up by the glob; each must accept ``--smoke`` and finish quickly with it.
The smoke runs are dominated by JAX compilation: they compile without LLVM optimisation
(tests/_subprocess.py).
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import _subprocess

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
SHARED_UCI = REPO.parent / "shared" / "data" / "uci"
TIMEOUT_S = 900  # per example; generous for a loaded machine (each takes well under a minute of CPU)


def _env() -> dict:
    env = dict(os.environ, CI="1", MPLBACKEND="Agg")
    if "xla_backend_optimization_level" not in env.get("XLA_FLAGS", ""):  # compiling is most of a smoke run
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {_subprocess.FAST_COMPILE_XLA_FLAGS}".strip()
    if "NUMPYRO_MILE_DATA" not in env and SHARED_UCI.is_dir():
        env["NUMPYRO_MILE_DATA"] = str(SHARED_UCI)  # the UCI example then uses real data
    return env


def _run(script: Path):
    """(completed process or None, error, seconds) of ``script --smoke`` in a fresh folder."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"smoke-{script.stem}-") as workdir:
        try:
            proc = subprocess.run(
                [sys.executable, str(script), "--smoke"],
                cwd=workdir,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as err:
            return None, f"timed out after {err.timeout} s", time.perf_counter() - start
    return proc, "", time.perf_counter() - start


def test_examples_are_found():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.py", "uci_regression.py", "icsgld_multimodal.py", "flax_cnn.py"} <= names, names


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_in_smoke_mode(script):
    proc, error, seconds = _run(script)
    assert proc is not None, f"{script.name} --smoke {error}"
    assert proc.returncode == 0, (
        f"{script.name} --smoke failed after {seconds:.0f} s:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    assert proc.stdout.strip(), f"{script.name} --smoke printed nothing"
