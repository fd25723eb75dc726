"""Every script in examples/ runs to completion with ``--smoke`` (tiny budgets), in a fresh process.

New examples are picked up by the glob; each must accept ``--smoke`` and finish in seconds with it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
SHARED_UCI = REPO.parent / "shared" / "data" / "uci"
TIMEOUT_S = 600  # generous: a loaded CI machine; the smoke runs take seconds of CPU each


def _env() -> dict:
    env = dict(os.environ, CI="1", MPLBACKEND="Agg", PYTHONWARNINGS="ignore::FutureWarning")
    if "NUMPYRO_MILE_DATA" not in env and SHARED_UCI.is_dir():
        env["NUMPYRO_MILE_DATA"] = str(SHARED_UCI)  # the UCI example then uses real data
    return env


def test_examples_are_found():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.py", "uci_regression.py", "icsgld_multimodal.py", "flax_cnn.py"} <= names, names


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_in_smoke_mode(script, tmp_path):
    proc = subprocess.run([sys.executable, str(script), "--smoke"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{script.name} --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{script.name} --smoke printed nothing"
    assert "Traceback" not in proc.stderr
