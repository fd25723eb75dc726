"""benchmarks/peers.py without the peers: the lock-file pins it installs and the page it writes from results."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
spec = importlib.util.spec_from_file_location("peers_bench", REPO / "benchmarks" / "peers.py")
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)

PIXI_LOCK = """version: 6
environments:
  benchmark:
    packages:
      linux-64:
      - pypi: https://files.pythonhosted.org/packages/aa/jax-0.10.2-py3-none-any.whl
  default:
    channels:
    - url: https://conda.anaconda.org/conda-forge/
    packages:
      linux-64:
      - conda: https://conda.anaconda.org/conda-forge/linux-64/numpy-1.26.4-py312h0_0.conda
      - pypi: https://files.pythonhosted.org/packages/bb/jax-0.7.1-py3-none-any.whl
      - pypi: https://files.pythonhosted.org/packages/cc/jaxlib-0.7.1-cp312-cp312-manylinux_2_27_x86_64.whl
      - pypi: https://files.pythonhosted.org/packages/dd/blackjax-1.2.2-py3-none-any.whl
      osx-64:
      - pypi: https://files.pythonhosted.org/packages/ee/jax-0.4.38-py3-none-any.whl
"""


def test_bde_pins_come_from_the_default_linux_environment(tmp_path):
    (tmp_path / "pixi.lock").write_text(PIXI_LOCK)
    assert peers.bde_pins(tmp_path) == ["jax==0.7.1", "jaxlib==0.7.1", "numpy==1.26.4", "blackjax==1.2.2"]


def row(kind, seed, wall, lppd):
    return {
        "implementation": kind,
        "seed": str(seed),
        "chains": "12",
        "warmup": "10000",
        "samples": "2000",
        "thinning": "10",
        "devices": "2",
        "process_wall": str(wall + 1),
        "fit_wall": str(wall),
        "fit_cpu": str(2 * wall),
        "compile_s": "10",
        "compiles": "100",
        "ensemble_s": "5",
        "sampler_s": str(wall - 5),
        "lppd": str(lppd),
        "rmse": "0.2",
        "commit": "abc",
        "load_start": "1",
        "load_end": "1",
    }


def test_page_reports_ratios_per_seed_and_a_verdict_from_the_rows():
    rows = [row("authors", s, 100.0, 0.5) for s in (1, 2)] + [row("bde", s, 40.0, 0.6) for s in (1, 2)]
    rows += [row("ours", s, 20.0, 0.55) for s in (1, 2)] + [row("ours-quiet", s, 10.0, 0.55) for s in (1, 2)]
    page = peers.render(rows, peers.OUT)
    assert "| numpyro_mile (README path) | MILE authors' code | 0.20, 0.20 | 0.20 |" in page
    assert "| numpyro_mile (README path) | scikit-learn-contrib bde | 0.50, 0.50 | 0.50 |" in page
    # half bde's wall time, but a lower test LPPD than bde's
    assert "the README path at most bde's wall time, at a test LPPD no lower than bde's) is missed" in page
    assert "0.50x the wall time of scikit-learn-contrib bde at a test LPPD -0.050 from theirs" in page


def test_page_splits_the_wall_time_gap_to_bde_into_the_progress_bar_and_the_rest():
    """NumPyro's bar (README path minus the quiet run), of it the repeated compiles of NumPyro's per-step program,
    and the rest (quiet run minus bde: ensemble, compile, remainder), from the rows."""
    rows = [row("bde", s, 40.0, 0.5) for s in (1, 2)]
    rows += [{**row("ours", s, 50.0, 0.55), "loop_compile_s": "9", "loop_compiles": "2"} for s in (1, 2)]
    rows += [{**row("ours-quiet", s, 42.0, 0.55), "ensemble_s": "3", "compile_s": "12"} for s in (1, 2)]
    page = peers.render(rows, peers.OUT)
    assert "(50.0 against 40.0 s, +10.0 s; means over seeds 1, 2)" in page
    assert "- NumPyro's progress bar: +8.0 s" in page
    assert "Of it, 4.5 s is a second compile of NumPyro's per-step program (compiled 2 times, 9.0 s in all)" in page
    assert "The other 3.5 s are its launches, 0.29 ms per step" in page  # 12,000 steps
    assert "+2.0 s, of which ensemble -2.0 s and trace + compile +2.0 s; the remainder, +2.0 s" in page
    assert "is missed. On the README path our fit takes 1.25x the wall time of scikit-learn-contrib bde" in page


def test_cross_runs_say_whether_the_ensemble_or_the_sampler_makes_the_lppd_gap():
    """The cross runs (one implementation's sampler from the other's ensemble) give the 2x2 table and the two
    effects, from the rows; they stay out of the timed table."""
    lppd = {"ours": 0.50, "authors-sampler": 0.52, "authors": 0.58, "ours-authors-ensemble": 0.56}
    rows = [row(kind, s, 20.0, value + 0.01 * s) for kind, value in lppd.items() for s in (1, 2)]
    page = peers.render(rows, peers.OUT)
    assert "| numpyro_mile's ensemble | 0.510, 0.520 (mean 0.515) | 0.530, 0.540 (mean 0.535) |" in page
    assert "| the authors' ensemble | 0.570, 0.580 (mean 0.575) | 0.590, 0.600 (mean 0.595) |" in page
    assert "Our sampler minus theirs, from the same ensemble: -0.020 on average" in page
    assert "our ensemble minus theirs, under the same sampler: -0.060" in page
    assert "authors' tuning + sampling code" not in page.split("Where the LPPD gap")[0]  # not a timed row


def test_page_has_a_section_per_data_set_and_a_verdict_against_the_noise_floor():
    """Rows of two data sets: a summary of mean test LPPD per data set, and per peer whether ours is at least
    theirs, below within the noise floor (our sampler again from the same ensemble), or below beyond it."""
    rows = []
    for data, ours, authors, resampled in (("airfoil", 0.55, 0.56, 0.57), ("energy", 1.60, 1.50, 1.61)):
        for s in (1, 2):
            rows += [
                {**row("ours", s, 20.0, ours), "data": data},
                {**row("authors", s, 100.0, authors), "data": data},
                {**row("ours-resampled", s, 20.0, resampled), "data": data},
            ]
    page = peers.render(rows, peers.OUT)
    assert "## airfoil" in page and "## energy" in page
    assert (
        "- airfoil, against MILE authors' code: ours -0.010 on the mean over seeds 1, 2 (below, within the noise "
        "floor; noise floor 0.020)" in page
    )
    assert "- energy, against MILE authors' code: ours +0.100 on the mean over seeds 1, 2 (at least" in page
    assert "a mean absolute difference of 0.020" in page
