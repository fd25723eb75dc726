"""The command line demo at tiny budgets: it runs end to end and prints the table, the ratio and a verdict."""

from __future__ import annotations

import re

import numpy as np
import pytest

from numpyro_mile.cli import main


def test_two_significant_digits():
    from numpyro_mile.cli import _two_digits

    assert [_two_digits(x) for x in (0.0472, 0.5, 1.0, 1.234, 12.6, 345.6)] == [
        "0.047",
        "0.50",
        "1.0",
        "1.2",
        "13",
        "346",
    ]


def test_verdict_says_holds_only_when_lppd_and_time_both_support_it():
    from numpyro_mile.cli import _verdict

    above = _verdict(0.12, 0.014, 2.9, 29.0, 50)
    assert above.startswith("MILE's LPPD is above BDE's (by 0.120 ± 0.014) in 0.34x BDE's wall time")
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


@pytest.mark.parametrize("data, score", [(None, "RMSE"), ("breast_cancer", "accuracy")])
def test_demo_prints_table_time_ratio_and_verdict(capsys, data, score):
    """The default (UCI airfoil, regression, shipped with the package) and a classification data set."""
    code = main(
        [
            "demo",
            "--chains",
            "2",
            "--hidden",
            "4",
            "--mile-warmup",
            "100",
            "--mile-samples",
            "20",
            "--thinning",
            "2",
            "--bde-warmup",
            "5",
            "--bde-samples",
            "5",
            "--quiet",
        ]
        + ([] if data is None else ["--data", data])
    )
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
    assert ("airfoil" if data is None else "breast cancer") in out.err  # real data, UCI's airfoil by default


@pytest.mark.parametrize("name", ["airfoil", "breast_cancer", "diabetes", "toy"])
def test_every_demo_data_set_loads_standardised(name):
    from numpyro_mile.cli import _load

    task = _load(name, seed=1, hidden=(4,))
    (X_train, y_train), (X_val, y_val), (X_test, y_test) = task.data
    assert len(X_train) > len(X_test) > 0 and len(X_val) > 0 and X_train.shape[1] == X_test.shape[1]
    np.testing.assert_allclose(X_train.mean(0), 0, atol=1e-5)  # standardised with the training rows' statistics
    if task.score == "RMSE":
        np.testing.assert_allclose([y_train.mean(), y_train.std()], [0, 1], atol=1e-5)
    else:
        assert set(np.unique(y_train)) == {0, 1}
