"""The UCI benchmark runner on a tiny budget: CSV schema, resume logic, missing data."""

import csv
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

import _subprocess

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("uci_bench", REPO / "benchmarks" / "uci.py")
uci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uci)
DATA = uci.data_dir(None)


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    assert uci.main(["--profile", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no data for ['yacht']" in capsys.readouterr().err


@pytest.mark.skipif(not (DATA / "yacht.data").exists(), reason="UCI data not available")
def test_tiny_run_schema_and_resume(tmp_path, monkeypatch):
    # the runner works in a child process per (dataset, seed), compile-bound at this budget: no LLVM optimisation
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} {_subprocess.FAST_COMPILE_XLA_FLAGS}".strip())
    out = tmp_path / "out"
    assert uci.main(["--profile", "tiny", "--data", str(DATA), "--out", str(out)]) == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == uci.FIELDS
    assert [r["method"] for r in rows] == ["DE", "MILE", "BDE-w5-auto"]
    assert all(float(r["rmse"]) > 0 for r in rows)
    # projections to the profile's larger budgets: MILE linear in steps (100 + 20 -> 1200), BDE run on one
    # of the two members, projected to both chains and to 10 + 10 iterations (each part less one compile)
    mile, bde = rows[1], rows[2]
    seconds, compile_s = float(mile["sampler_seconds"]), float(mile["compile_seconds"])
    assert float(mile["projected_seconds"]) == pytest.approx(
        min(seconds, compile_s) + max(seconds - compile_s, 0) * 10, abs=2e-3
    )
    assert "(projected to 1200 steps)" in mile["budget"]
    assert bde["budget"] == "5+5 on 1 of 2 chains (projected to 2 chains x 10+10)"
    seconds, compile_s = float(bde["sampler_seconds"]), float(bde["compile_seconds"])
    warm = float(bde["bde_warmup_seconds"])
    net_w, net_s = max(warm - compile_s, 0), max(seconds - warm - compile_s, 0)
    assert float(bde["projected_seconds"]) == pytest.approx(seconds + 3 * (net_w + net_s), abs=2e-3)
    assert (out / "results.md").read_text().count("| yacht |") == 3 + 1  # three methods, one targets row
    assert (out / "lppd_vs_time.png").exists()
    # resume: a second call finds every run done and adds nothing
    assert uci.main(["--profile", "tiny", "--data", str(DATA), "--out", str(out)]) == 0
    with (out / "results.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3
    assert uci.done_keys(out / "results.csv") == {("yacht", "1", m) for m in ["DE", "MILE", "BDE-w5-auto"]}


def test_scaling_exponent_fit_and_table():
    spec = importlib.util.spec_from_file_location("scaling_bench", REPO / "benchmarks" / "scaling.py")
    scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaling)
    sizes = [100.0, 400.0, 1600.0]
    slope, intercept = scaling.fit_exponent(sizes, [3.0 * s**1.5 for s in sizes])
    assert slope == pytest.approx(1.5) and intercept == pytest.approx(np.log(3.0))
    rows = [
        dict(
            sweep="width",
            dataset="bikesharing",
            width=str(w),
            train_rows="100",
            num_params=str(d),
            method=m,
            budget="b",
            seconds="1",
            cpu_seconds="1",
            projected_seconds=str(t),
            rmse="0.5",
            lppd="0.1",
        )
        for w, d, t_mile in ((4, 100, 10.0), (8, 400, 40.0))
        for m, t in (("MILE", t_mile), ("BDE", 20 * t_mile))
    ]
    table = scaling.summarise(rows)
    assert "MILE: projected time ~ d^1.00" in table and "BDE: projected time ~ d^1.00" in table
    assert table.count("| 20.0 |") == 4  # BDE / MILE ratio on every row


def test_time_target_uses_wall_time_only_on_an_idle_machine():
    row = lambda load: {"loadavg": load, "machine": "x86_64 2 cores cpu"}  # noqa: E731
    assert uci.idle([row("1.4"), row("2.5")]) and not uci.idle([row("1.4"), row("2.6")]) and not uci.idle([row("")])
    assert uci.time_target(6.0, 4.0, [row("1.5")]) == "yes (wall, idle machine)"
    assert uci.time_target(6.0, 4.0, [row("1.5"), row("9.0")]) == "**no** (CPU, loaded machine)"
    assert uci.time_target(4.0, float("nan"), [row("9.0")]) == "**no** (wall; no CPU time)"


def test_mixing_summary_of_chains_that_never_moved_has_nan_rhat_and_no_warning():
    import warnings

    from numpyro_mile.compare import _mixing

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" would fail the test
        ess, crhat = _mixing({"w": np.zeros((4, 20, 3))})
    assert np.isnan(crhat)  # R-hat of constant chains is 0 / 0 for every coordinate
    assert ess == 20.0
