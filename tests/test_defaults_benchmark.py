"""benchmarks/defaults.py without measuring: the page is what its saved measurements render to."""

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
spec = importlib.util.spec_from_file_location("defaults_bench", REPO / "benchmarks" / "defaults.py")
defaults = importlib.util.module_from_spec(spec)
spec.loader.exec_module(defaults)
PAGE = REPO / "docs" / "benchmarks" / "defaults.md"


def test_committed_page_is_rendered_from_the_committed_measurements(tmp_path):
    out = tmp_path / "defaults.md"
    (tmp_path / "defaults.json").write_text(PAGE.with_suffix(".json").read_text())
    defaults.main(["--render-only", "--output", str(out)])
    assert out.read_text() == PAGE.read_text()


def result(kernel, devices, bar, small_wall, big_wall):
    return {
        "kernel": kernel,
        "devices": devices,
        "bar": bar,
        "placed_on": 1,
        "small": {"steps": 1200, "wall": small_wall, "cpu": small_wall},
        "big": {"steps": 6000, "wall": big_wall, "cpu": big_wall},
    }


def test_targets_are_judged_on_both_the_per_step_and_the_wall_ratio(tmp_path):
    # per step (ms): off 1.0; on 1.05 (met); run_chunked: per step 1.0 but the big run's wall 1.2x (missed)
    results = [
        result("SGLD", 1, "off", 2.0, 6.8),
        result("SGLD", 1, "on", 2.0, 7.04),
        result("SGLD", 1, "run_chunked", 3.36, 8.16),
    ]
    saved = dict(
        big=5000, small=1000, kernels=["SGLD"], results=results, machine=["- CPU: test"], load_average=[0.0, 0.0]
    )
    (tmp_path / "defaults.json").write_text(json.dumps(saved))
    out = tmp_path / "defaults.md"
    defaults.main(["--render-only", "--output", str(out)])
    text = out.read_text()
    assert "- SGLD, 1 device: +0.050 ms per step, 1.05x per step, 1.04x on the big run's wall (target met)" in text
    assert "SGLD 1 device 1.00x per step (1.20x wall). Largest wall ratio 1.20x" in text
    assert "the 1.1x target is missed on some rows." in text
    assert "--big 5000 --small 1000 --kernels SGLD" in text
