"""The UCI benchmark runner on a tiny budget: CSV schema, resume logic, missing data."""

import csv
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("uci_bench", REPO / "benchmarks" / "uci.py")
uci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uci)
DATA = uci.data_dir(None)


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    assert uci.main(["--profile", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no data for ['yacht']" in capsys.readouterr().err


@pytest.mark.skipif(not (DATA / "yacht.data").exists(), reason="UCI data not available")
def test_tiny_run_schema_and_resume(tmp_path):
    out = tmp_path / "out"
    assert uci.main(["--profile", "tiny", "--data", str(DATA), "--out", str(out)]) == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == uci.FIELDS
    assert [r["method"] for r in rows] == ["DE", "MILE", "BDE-w5-sequential"]
    assert all(float(r["rmse"]) > 0 for r in rows)
    assert (out / "results.md").read_text().count("| yacht |") == 3 + 1  # three methods, one targets row
    assert (out / "lppd_vs_time.png").exists()
    # resume: a second call finds every run done and adds nothing
    assert uci.main(["--profile", "tiny", "--data", str(DATA), "--out", str(out)]) == 0
    with (out / "results.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3
    assert uci.done_keys(out / "results.csv") == {("yacht", "1", m) for m in ["DE", "MILE", "BDE-w5-sequential"]}
