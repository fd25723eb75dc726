"""The command line demo at tiny budgets: it runs end to end and prints the table, the ratio and a verdict."""

from __future__ import annotations

import re

from numpyro_mile.cli import main


def test_demo_prints_table_time_ratio_and_verdict(capsys):
    code = main(["demo", "--chains", "2", "--hidden", "4", "--mile-warmup", "100", "--mile-samples", "20",
                 "--thinning", "2", "--bde-warmup", "5", "--bde-samples", "5", "--quiet"])
    assert code == 0
    out = capsys.readouterr()
    rows = [line for line in out.out.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert [row.split(" | ")[0] for row in rows] == ["| DE (the members)", "| MILE", "| BDE (NUTS)"]
    for row in rows:  # RMSE and LPPD are numbers
        cells = row.split(" | ")
        float(cells[1])
        float(cells[2].split(" ± ")[0])
    assert re.search(r"LPPD difference [+-]\d+\.\d+ ± \d+\.\d+", out.out)
    assert "MILE paper's claim" in out.out  # the verdict, whichever way it goes
    assert "diabetes" in out.err  # real data by default
