"""The command line demo at tiny budgets: it runs end to end and prints the table, the ratio and a verdict."""

from __future__ import annotations

import re

import pytest

from numpyro_mile.cli import main


def test_two_significant_digits():
    from numpyro_mile.cli import _two_digits

    assert [_two_digits(x) for x in (0.0472, 0.5, 1.0, 1.234, 12.6, 345.6)] == ["0.047", "0.50", "1.0", "1.2", "13",
                                                                             "346"]


def test_verdict_says_holds_only_when_lppd_and_time_both_support_it():
    from numpyro_mile.cli import _verdict

    faster = _verdict(0.001, 0.002, 1.3, 5.9, 150)
    assert "claim holds here, against BDE's short run" in faster and "0.77x BDE's wall time" in faster
    assert _verdict(0.001, 0.002, 1.3, 1.3, 1000).endswith("claim holds here.")
    slower = _verdict(0.001, 0.002, 0.73, 2.9, 150)  # equal LPPD, BDE's short run faster, its 1,000 draws not
    assert "holds here" not in slower and "holds only against BDE at the paper's 1,000 draws" in slower
    for ratio, projected, draws in [(0.5, 0.8, 150), (1.0, 3.0, 1000)]:  # MILE slower, projected or measured
        assert "does not hold" in _verdict(0.001, 0.002, ratio, projected, draws)
    worse = _verdict(-0.01, 0.002, 5.0, 20.0, 150)
    assert "does not hold" in worse and "5.0 standard errors" in worse
    assert "standard errors" not in _verdict(-0.01, 0.0, 5.0, 20.0, 150)  # no division by a zero error


def test_ensemble_verdict_says_when_the_ensemble_alone_wins():
    from numpyro_mile.cli import _ensemble_verdict

    # the demo's breast-cancer run of 2026-12-07: DE 0.974 / -0.064, MILE 0.957 / -0.077
    loses = _ensemble_verdict(-0.013, 0.006, "accuracy", 0.957, 0.974, 4.5)
    assert loses.startswith("The deep ensemble alone (4.5 s) has the higher LPPD here") and "not better" in loses
    assert "ensemble alone is the better buy" in loses
    ties = _ensemble_verdict(-0.002, 0.006, "RMSE", 0.70, 0.72, 4.5)
    assert "equal to its deep ensemble's" in ties and "RMSE 0.700 against the ensemble's 0.720, better" in ties
    wins = _ensemble_verdict(0.05, 0.01, "RMSE", 0.70, 0.72, 4.5)
    assert wins.startswith("MILE's LPPD is above its deep ensemble's") and "better buy" not in wins


@pytest.mark.parametrize("data, score", [(None, "accuracy"), ("diabetes", "RMSE")])
def test_demo_prints_table_time_ratio_and_verdict(capsys, data, score):
    """The default (UCI breast cancer, classification) and the regression data set."""
    code = main(["demo", "--chains", "2", "--hidden", "4", "--mile-warmup", "100", "--mile-samples", "20",
                 "--thinning", "2", "--bde-warmup", "5", "--bde-samples", "5", "--quiet"]
                + ([] if data is None else ["--data", data]))
    assert code == 0
    out = capsys.readouterr()
    rows = [line for line in out.out.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert [row.split(" | ")[0] for row in rows] == ["| DE (the members)", "| MILE", "| BDE (NUTS)"]
    assert f"| method | {score} | LPPD" in out.out
    for row in rows:  # the score and LPPD are numbers
        cells = row.split(" | ")
        value = float(cells[1])
        assert score == "RMSE" or 0 <= value <= 1
        float(cells[2].split(" ± ")[0])
    assert re.search(r"LPPD difference [+-]\d+\.\d+ ± \d+\.\d+", out.out)
    assert "MILE paper's claim" in out.out  # the verdict, whichever way it goes
    assert "its deep ensemble's" in out.out or "The deep ensemble alone" in out.out  # and against the ensemble
    ratio = re.search(r"BDE took (\S+)x MILE's wall time", out.out).group(1)
    assert float(ratio) > 0 and len(ratio.replace(".", "").lstrip("0")) <= 2  # two significant digits, never 0.0
    assert ("breast cancer" if data is None else data) in out.err  # real data, UCI's breast cancer by default
