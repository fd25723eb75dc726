"""Estimators side by side: numpyro_mile's MILERegressor / MILEClassifier against scikit-learn-contrib bde's
BdeRegressor / BdeClassifier, on bde's own example data and on UCI sets.

Data: airfoil, concrete and bikesharing (UCI regression; bde ships all three as examples), iris (bde's
classification example) and breast cancer (scikit-learn's), seeds 1-3: rows shuffled by the seed, 80 % to fit on,
20 % held out. Both estimators get the same rows in the data's units and the same budget: 4 chains (bde: members),
5,000 warmup + 1,000 sampling steps thinned by 10 (``MILERegressor``'s default budget), the paper's network (two
hidden layers of 16), deep ensembles of at most 500 epochs with patience 10 on 10 % of the fitted rows (AdamW 1e-3,
weight decay 1e-3). Each is used as its documentation shows: ours takes the raw table (scaling is inside); bde's
examples standardise first, so its driver standardises features (and regression targets) with training
statistics and maps its predictions back. Every implementation gets every core the way its documentation
configures it and keeps its progress bars. ``benchmarks/_peer_drivers.py`` (``bde_estimator``,
``ours_estimator``) is what each fresh process runs; its wall time runs from the process's first line to the
fitted posterior (imports, ensemble, compilation, sampling: what a user waits for).

Both are scored by the same code from their posterior draws on the held-out rows, in the data's units: test LPPD
(regression: the mixture of ``Normal(mu_s, sigma_s)``; classification: minus the log loss of the mean class
probabilities), RMSE of the predictive mean or accuracy, and the share of held-out rows inside the central 90 %
predictive interval (regression).

Usage::

    python benchmarks/estimators.py --bde pypi            # -> docs/benchmarks/estimators.md, estimators/results.csv
    python benchmarks/estimators.py --render-only         # the page from results.csv
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    ROOT,
    add_common_options,
    argument_parser,
    command_line,
    load_average,
    machine_lines,
    markdown_table,
    read_csv,
    write_csv,
)
from peers import DRIVER, environment

OUT = ROOT / "docs" / "benchmarks" / "estimators"
PAGE = ROOT / "docs" / "benchmarks" / "estimators.md"
DATA = ("airfoil", "concrete", "bikesharing", "iris", "breast_cancer")
CLASSIFICATION = ("iris", "breast_cancer")
IMPLEMENTATIONS = ("bde", "ours")
LABELS = {"bde": "bde `BdeRegressor` / `BdeClassifier`", "ours": "numpyro_mile `MILERegressor` / `MILEClassifier`"}
FIELDS = (
    "data",
    "seed",
    "implementation",
    "chains",
    "warmup",
    "samples",
    "thinning",
    "devices",
    "n_fit",
    "n_test",
    "fit_wall",
    "fit_cpu",
    "compile_s",
    "lppd",
    "score",
    "coverage90",
    "fn_crhat",
    "fn_ess_per_chain",
    "load_start",
    "load_end",
)
TEST_FRACTION = 0.2


def load_rows(name: str, seed: int, data_dir: str | None):
    """``(train_x, train_y, test_x, test_y)`` of ``name`` for ``seed``, in the data's units."""
    import numpy as np

    if name == "iris":
        from sklearn.datasets import load_iris

        X, y = load_iris(return_X_y=True)
    elif name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        X, y = load_breast_cancer(return_X_y=True)
    else:
        from numpyro_mile.datasets import load_uci

        X, y = load_uci(name, data_dir=data_dir)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(TEST_FRACTION * len(y)))
    test, train = order[:n_test], order[n_test:]
    return X[train], y[train], X[test], y[test]


def score(predictions: Path, test_y, regression: bool) -> dict:
    """Test LPPD, RMSE (regression) or accuracy, and 90 % interval coverage from one run's draws; the same code
    for both implementations."""
    import numpy as np

    from numpyro_mile import metrics, uncertainty

    p = np.load(predictions)
    if regression:
        mu, sigma = p["mu"], p["sigma"]
        lppd = metrics.lppd(metrics.gaussian_log_likelihood(test_y, mu, sigma))
        lower, upper = uncertainty.mixture_quantiles(mu, sigma, (0.05, 0.95))
        return {
            "lppd": lppd,
            "score": metrics.rmse(test_y, mu.mean(0)),
            "coverage90": float(np.mean((test_y >= lower) & (test_y <= upper))),
        }
    proba = p["proba"].mean(0)
    index = {label: i for i, label in enumerate(p["classes"].tolist())}
    codes = np.array([index[label] for label in test_y.tolist()])
    return {
        "lppd": float(np.mean(np.log(np.clip(proba[np.arange(len(codes)), codes], 1e-300, None)))),
        "score": float(np.mean(proba.argmax(1) == codes)),
        "coverage90": "",
    }


def run_one(kind: str, python: Path, settings: dict, work: Path, test_y) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    args = dict(settings, workdir=str(work))
    (work / "args.json").write_text(json.dumps(args))
    load_start = load_average()
    with (work / "stderr.log").open("w") as err:
        proc = subprocess.run(
            [str(python), str(DRIVER), f"{kind}_estimator", str(work / "args.json")],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=work,
        )
    (work / "stdout.log").write_text(proc.stdout)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed (exit {proc.returncode}); see {work / 'stderr.log'}")
    result = json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT ") :])
    return {
        **{k: settings[k] for k in ("data", "seed", "chains", "warmup", "samples", "thinning", "devices")},
        "implementation": kind,
        **result,
        **score(work / "predictions.npz", test_y, settings["task"] == "regression"),
        "load_start": load_start,
        "load_end": load_average(),
    }


def mean(values) -> float:
    values = [float(v) for v in values if v not in ("", None)]
    return statistics.fmean(values) if values else float("nan")


def _or_dash(value: float, spec: str = ".3f") -> str:
    return "-" if value != value else format(value, spec)


def render(rows: list[dict], out: Path, results: Path, command: str) -> str:
    first = rows[0]
    loads = [float(r["load_start"]) for r in rows] + [float(r["load_end"]) for r in rows]
    lines = [
        "# Estimators side by side: numpyro_mile against scikit-learn-contrib bde",
        "",
        f"Generated by `{command}` (`benchmarks/estimators.py`; its docstring has the protocol). "
        f"{first['chains']} chains, {int(first['warmup']):,} warmup + {int(first['samples']):,} sampling steps "
        f"thinned by {first['thinning']} for both; the same rows (80 % fit, 20 % held out) for both; seeds "
        f"{', '.join(sorted({str(r['seed']) for r in rows}))}; {first['devices']} devices. One process per fit, one at "
        f"a time; load average {min(loads):.2f}-{max(loads):.2f} over the runs.",
        "",
        *machine_lines(),
        "",
        "Means over seeds. Wall: from the process's first line to the fitted posterior (imports, deep ensemble, "
        "trace + compile, sampling); compile: JAX's trace + compile seconds inside it. LPPD: test log pointwise "
        "predictive density per row in the data's units (higher is better); RMSE of the predictive mean (regression, "
        "data units, lower is better) or accuracy (classification); coverage: held-out rows inside the central 90 % "
        "predictive interval.",
        "",
    ]
    table = []
    for name in dict.fromkeys(r["data"] for r in rows):
        by_kind = {k: [r for r in rows if r["data"] == name and r["implementation"] == k] for k in IMPLEMENTATIONS}
        if not all(by_kind.values()):
            continue
        walls = {k: mean(r["fit_wall"] for r in v) for k, v in by_kind.items()}
        for kind, runs in by_kind.items():
            regression = name not in CLASSIFICATION
            cover = mean(r["coverage90"] for r in runs)
            table.append(
                [
                    name,
                    LABELS[kind],
                    f"{walls[kind]:.1f}",
                    f"{mean(r['compile_s'] for r in runs):.1f}",
                    f"{walls[kind] / walls['bde']:.2f}",
                    f"{mean(r['lppd'] for r in runs):.3f}",
                    ("RMSE " if regression else "accuracy ") + f"{mean(r['score'] for r in runs):.3f}",
                    f"{cover:.3f}" if regression else "-",
                    _or_dash(mean(r.get("fn_crhat") for r in runs)),
                    _or_dash(mean(r.get("fn_ess_per_chain") for r in runs), ".0f"),
                    str(len(runs)),
                ]
            )
    lines += markdown_table(
        [
            "data",
            "estimator",
            "wall (s)",
            "compile (s)",
            "wall / bde's",
            "test LPPD",
            "RMSE / accuracy",
            "90 % coverage",
            "function cR-hat",
            "function ESS/chain",
            "seeds",
        ],
        table,
        "llrrrrrrrrr",
    )
    lines += [
        "",
        "Function cR-hat and ESS/chain: `function_diagnostics(X_test)` of ours (the predicted means or logits at "
        'the held-out rows, chain by chain; the guide\'s "Diagnostics that matter"); bde reports none.',
    ]
    lines += ["", f"Per seed: `{os.path.relpath(results, ROOT)}`."]
    verdicts = []
    for name in dict.fromkeys(r["data"] for r in rows):
        pair = {k: [r for r in rows if r["data"] == name and r["implementation"] == k] for k in IMPLEMENTATIONS}
        if not all(pair.values()):
            continue
        lppd_of = {k: {int(r["seed"]): float(r["lppd"]) for r in v} for k, v in pair.items()}
        diffs = [
            lppd_of["ours"][seed] - lppd_of["bde"][seed] for seed in sorted(lppd_of["ours"]) if seed in lppd_of["bde"]
        ]
        d_lppd = statistics.fmean(diffs)
        spread = (
            f" ± {statistics.stdev(diffs) / len(diffs) ** 0.5:.3f} (standard error over {len(diffs)} seeds; "
            f"per seed {', '.join(f'{d:+.3f}' for d in diffs)})"
            if len(diffs) > 1
            else ""
        )
        ratio = mean(r["fit_wall"] for r in pair["ours"]) / mean(r["fit_wall"] for r in pair["bde"])
        quality = "at least bde's" if d_lppd >= 0 else f"{-d_lppd:.3f} below bde's"
        time_word = "within bde's time" if ratio <= 1 else f"{ratio:.2f}x bde's time"
        verdicts.append(
            f"- {name}: test LPPD {quality}: ours - bde {d_lppd:+.3f}{spread}; wall {time_word} ({ratio:.2f}x)."
        )
    lines += ["", "Against the target (at least bde's quality at no more than its time):", "", *verdicts, ""]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def main(argv=None) -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--bde",
        default="pypi",
        help="'pypi' (default: sklearn-contrib-bde from the package index) "
        "or a checkout of github.com/scikit-learn-contrib/bde",
    )
    parser.add_argument(
        "--venvs",
        type=Path,
        default=Path.home() / ".cache" / "numpyro_mile" / "peers",
        help="folder of the peers' virtualenvs (built on first use)",
    )
    parser.add_argument("--only-data", nargs="+", default=list(DATA), choices=DATA)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--samples", type=int, default=1_000)
    parser.add_argument("--thinning", type=int, default=10)
    parser.add_argument("--devices", type=int, default=None, help="host devices (default: every core)")
    parser.add_argument(
        "--only",
        nargs="+",
        default=list(IMPLEMENTATIONS),
        choices=IMPLEMENTATIONS,
        help="run these implementations; the other's rows of the same data, seeds and budget are kept from results.csv",
    )
    add_common_options(
        parser,
        data="the UCI .data files",
        out_dir=OUT,
        output=PAGE,
        render_only="render the page from results.csv without running anything",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = command_line(__file__, argv)
    recorded = out / "command.txt"  # the command of the run, which a page rendered later still names
    if args.render_only:
        command = recorded.read_text().strip() if recorded.exists() else command
        print(render(read_csv(out / "results.csv"), Path(args.output), out / "results.csv", command))
        return

    import numpy as np

    recorded.write_text(command + "\n")
    devices = args.devices or os.cpu_count()
    pythons = {"ours": Path(sys.executable)}
    if "bde" in args.only:
        pythons["bde"] = environment("bde", args.bde, args.venvs)
    budget = (str(args.chains), str(args.warmup), str(args.samples), str(args.thinning))
    kept = [
        r
        for r in read_csv(out / "results.csv", missing_ok=True)
        if r["implementation"] not in args.only
        and r["data"] in args.only_data
        and int(r["seed"]) in args.seeds
        and (r["chains"], r["warmup"], r["samples"], r["thinning"]) == budget
    ]
    rows = []
    work_root = Path(tempfile.mkdtemp(prefix="estimators-"))  # draws and logs of each run, not kept
    for name in args.only_data:
        for seed in args.seeds:
            train_x, train_y, test_x, test_y = load_rows(name, seed, args.data)
            work = work_root / f"{name}-seed{seed}"
            work.mkdir(parents=True, exist_ok=True)
            np.savez(work / "rows.npz", train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)
            settings = dict(
                data=name,
                seed=seed,
                chains=args.chains,
                warmup=args.warmup,
                samples=args.samples,
                thinning=args.thinning,
                devices=devices,
                rows=str(work / "rows.npz"),
                task="classification" if name in CLASSIFICATION else "regression",
            )
            rows += [r for r in kept if r["data"] == name and int(r["seed"]) == seed]
            for kind in args.only:
                start = time.perf_counter()
                row = run_one(kind, pythons[kind], settings, work / kind, test_y)
                row.update(n_fit=len(train_y), n_test=len(test_y))
                rows.append(row)
                print(
                    f"{name} seed {seed} {kind}: wall {row['fit_wall']:.1f} s, LPPD {row['lppd']:.3f}, "
                    f"score {row['score']:.3f} ({time.perf_counter() - start:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                write_csv(out / "results.csv", rows, FIELDS, float_format=".6g")
    print(render(rows, Path(args.output), out / "results.csv", command))


if __name__ == "__main__":
    main()
