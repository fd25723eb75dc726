"""The command line demo at tiny budgets: it runs end to end and prints the table, the ratio and a verdict."""

from __future__ import annotations

import re

from numpyro_mile.cli import main


def test_two_significant_digits():
    from numpyro_mile.cli import _two_digits

    assert [_two_digits(x) for x in (0.0472, 0.5, 1.0, 1.234, 12.6, 345.6)] == ["0.047", "0.50", "1.0", "1.2", "13",
                                                                             "346"]


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
    ratio = re.search(r"BDE took (\S+)x MILE's wall time", out.out).group(1)
    assert float(ratio) > 0 and len(ratio.replace(".", "").lstrip("0")) <= 2  # two significant digits, never 0.0
    assert "diabetes" in out.err  # real data by default
