"""Scaling ablation of the MILE paper: sampler time vs parameters (widths) and vs data size, MILE and BDE.

Two sweeps, both with the benchmark MLP (``mlp_regression``, two hidden layers of width ``w``):

* **width** on UCI bikesharing (seed 1, 70 % training split): ``w`` in ``--widths``, so the number of
  parameters ``d`` grows about as ``w**2``;
* **data size** on UCI protein: the first ``n`` rows of the shuffled training split, ``n`` in
  ``--sizes``, width 16.

For every point a ``--chains``-member deep ensemble is fitted (few epochs: only the samplers are
timed), then MILE and BDE (NumPyro NUTS, sequential chains) run on short budgets, and both are
projected to the paper's budgets from the measured costs:

* MILE: every step costs two gradient evaluations, so its time is linear in steps:
  ``projected = compile + (seconds - compile) * 60_000 / (W + S)`` for the paper's 50k + 10k steps;
* BDE: NUTS's cost per draw is its tree size; warmup and draws are timed apart and each, less one
  compilation, is projected to 100 warmup + 1000 draws (``numpyro_mile.compare.run_bde``).

Then ``log(time)`` is fitted against ``log(size)`` by least squares for each sampler (the exponent
is the slope) and the BDE / MILE time ratio is reported per point. Process CPU seconds are
recorded beside wall seconds (other jobs may share the machine).

Usage::

    python benchmarks/scaling.py                                 # writes docs/benchmarks/scaling/
    python benchmarks/scaling.py --widths 4 8 --sizes 500 1000 --out /tmp/scaling   # quick look
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests): find _common beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    ROOT,
    Stopwatch,
    add_common_options,
    append_csv,
    argument_parser,
    command_line,
    data_dir,
    load_average,
    machine_summary,
    markdown_table,
    pyplot,
    read_csv,
)

FIELDS = [
    "sweep",
    "dataset",
    "width",
    "train_rows",
    "num_params",
    "method",
    "budget",
    "seconds",
    "cpu_seconds",
    "compile_seconds",
    "grad_evals",
    "projected_seconds",
    "rmse",
    "lppd",
    "loadavg",
]
PAPER_MILE_STEPS = 60_000
PAPER_BDE = (100, 1000)


def load(dataset: str, folder: Path, rows: int | None):
    from numpyro_mile.datasets import load_uci, split, standardize

    X, y = load_uci(dataset, data_dir=folder)
    (train, val, test), _ = standardize(split(X, y, seed=1))
    if rows is not None:
        train = (train[0][:rows], train[1][:rows])
    return train, val, test[0][:2000], test[1][:2000]


def run_point(sweep: str, dataset: str, width: int, rows: int | None, args) -> list[dict]:
    from numpyro_mile import deep_ensemble
    from numpyro_mile.compare import run_bde, run_mile
    from numpyro_mile.models import mlp_regression

    train, val, X_test, y_test = load(dataset, data_dir(args.data), rows)
    hidden = (width, width)
    de = deep_ensemble(
        mlp_regression,
        jax.random.PRNGKey(0),
        args.chains,
        *train,
        validation=val,
        max_epochs=args.epochs,
        progress_bar=False,
        hidden=hidden,
    )
    num_params = sum(int(np.prod(v.shape[1:])) for v in de.init_params.values())
    base = dict(sweep=sweep, dataset=dataset, width=width, train_rows=len(train[1]), num_params=num_params)
    rows_out = []

    mw, ms = args.mile
    mile = run_mile(
        mlp_regression,
        de,
        train,
        X_test,
        y_test,
        rng_key=jax.random.PRNGKey(1),
        num_warmup=mw,
        num_samples=ms,
        thinning=10,
        projected_steps=PAPER_MILE_STEPS,
        hidden=hidden,
    )
    rows_out.append({**base, "method": "MILE", "budget": f"{mw}+{ms}", **_measured(mile)})

    bw, bs = args.bde
    bde = run_bde(
        mlp_regression,
        de,
        train,
        X_test,
        y_test,
        rng_key=jax.random.PRNGKey(2),
        num_warmup=bw,
        num_samples=bs,
        projected_warmup=PAPER_BDE[0],
        projected_samples=PAPER_BDE[1],
        hidden=hidden,
    )
    rows_out.append({**base, "method": "BDE", "budget": f"{bw}+{bs}", **_measured(bde)})
    return rows_out


def _measured(result) -> dict:
    return dict(
        seconds=round(result.seconds, 2),
        cpu_seconds=round(result.cpu_seconds, 2),
        compile_seconds=round(result.compile_seconds, 2),
        grad_evals=result.grad_evals,
        projected_seconds=round(result.projected_seconds, 2),
        rmse=round(result.rmse, 4),
        lppd=round(result.lppd, 4),
        loadavg=f"{load_average():.1f}",
    )


def fit_exponent(sizes, times) -> tuple[float, float]:
    """Least-squares ``log t = a + b log size``; returns ``(b, a)``."""
    b, a = np.polyfit(np.log(np.asarray(sizes, float)), np.log(np.asarray(times, float)), 1)
    return float(b), float(a)


def size_of(row: dict) -> float:
    return float(row["num_params"] if row["sweep"] == "width" else row["train_rows"])


def summarise(rows: list[dict]) -> str:
    lines = []
    for sweep, label in (("width", "parameters d"), ("data", "training rows n")):
        rs = [r for r in rows if r["sweep"] == sweep]
        if not rs:
            continue
        by_size = {}
        for r in rs:
            by_size.setdefault(size_of(r), {})[r["method"]] = r
        table = []
        for size in sorted(by_size):
            pair = by_size[size]
            ratio = (
                float(pair["BDE"]["projected_seconds"]) / float(pair["MILE"]["projected_seconds"])
                if {"BDE", "MILE"} <= set(pair)
                else float("nan")
            )
            table += [
                [
                    f"{size:,.0f}",
                    r["width"],
                    method,
                    r["budget"],
                    f"{float(r['seconds']):.1f}",
                    f"{float(r['cpu_seconds']):.1f}",
                    f"{float(r['projected_seconds']):.0f}",
                    f"{ratio:.1f}",
                    f"{float(r['rmse']):.3f}",
                    f"{float(r['lppd']):.3f}",
                ]
                for method, r in ((m, pair[m]) for m in ("MILE", "BDE") if m in pair)
            ]
        lines += [f"### {sweep} sweep ({rs[0]['dataset']}): time vs {label}", ""] + markdown_table(
            [
                label,
                "width",
                "method",
                "measured budget",
                "measured s",
                "CPU s",
                "projected s (paper budget)",
                "BDE / MILE (projected)",
                "test RMSE",
                "test LPPD",
            ],
            table,
            "rrllrrrrrr",
            compact=True,
        )
        lines.append("")
        for method in ("MILE", "BDE"):
            pts = [(size_of(r), float(r["projected_seconds"])) for r in rs if r["method"] == method]
            if len(pts) >= 2:
                b, _ = fit_exponent(*zip(*pts))
                lines.append(
                    f"- {method}: projected time ~ {label.split()[-1]}^{b:.2f} (least squares on log-log, "
                    f"{len(pts)} points)"
                )
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], png: Path) -> None:
    plt = pyplot()

    sweeps = [s for s in ("width", "data") if any(r["sweep"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps):
        for method, marker in (("MILE", "o"), ("BDE", "s")):
            pts = sorted(
                (size_of(r), float(r["projected_seconds"]))
                for r in rows
                if r["sweep"] == sweep and r["method"] == method
            )
            if pts:
                x, t = zip(*pts)
                ax.plot(x, t, marker=marker, label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters d" if sweep == "width" else "training rows n")
        ax.set_ylabel("projected sampler time at the paper's budget [s]")
        ax.set_title("bikesharing, widths" if sweep == "width" else "protein, subsets")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv=None) -> int:
    p = argument_parser(__doc__, whole_doc=True)
    add_common_options(p, data="bikesharing.data and protein.data")
    p.add_argument("--widths", nargs="+", type=int, default=[4, 8, 16, 32])
    p.add_argument("--sizes", nargs="+", type=int, default=[1000, 2000, 4000, 8000, 16000])
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20, help="deep-ensemble epochs (only samplers are timed)")
    p.add_argument("--mile", nargs=2, type=int, default=[1000, 500], metavar=("WARMUP", "SAMPLES"))
    p.add_argument("--bde", nargs=2, type=int, default=[30, 10], metavar=("WARMUP", "SAMPLES"))
    add_common_options(p, out_dir=ROOT / "docs" / "benchmarks" / "scaling")
    args = p.parse_args(argv)
    folder = data_dir(args.data)
    missing = [d for d in ("bikesharing", "protein") if not (folder / f"{d}.data").exists()]
    if missing:
        print(f"error: no data for {missing} in {folder}; pass --data DIR or set $NUMPYRO_MILE_DATA.", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "results.csv"
    done = {
        (r["sweep"], r["width"], r["train_rows"] if r["sweep"] == "data" else "")
        for r in read_csv(csv_path, missing_ok=True)
    }
    points = [("width", "bikesharing", w, None) for w in args.widths]
    points += [("data", "protein", 16, n) for n in args.sizes]
    for sweep, dataset, width, rows in points:
        key = (sweep, str(width), str(rows) if sweep == "data" else "")
        if key in done:
            print(f"[{sweep} {dataset} w={width} n={rows}] done, skipped", file=sys.stderr)
            continue
        with Stopwatch() as clock:
            new = run_point(sweep, dataset, width, rows, args)
            append_csv(csv_path, new, FIELDS)
        print(
            f"[{sweep} {dataset} w={width} n={rows}] "
            + "; ".join(f"{r['method']} {r['seconds']} s -> {r['projected_seconds']} s" for r in new)
            + f" ({clock.wall:.0f} s)",
            file=sys.stderr,
        )
    rows = read_csv(csv_path, missing_ok=True)
    (out / "results.md").write_text(
        f"# Scaling ablation: MILE vs BDE sampler time\n\nGenerated by `{command_line(__file__, argv)}` on "
        f"{machine_summary()}.\n"
        f"K = {args.chains} chains; deep ensembles of {args.epochs} epochs; MILE measured on {args.mile[0]}+"
        f"{args.mile[1]} steps and BDE on {args.bde[0]} warmup + {args.bde[1]} draws, both projected to the paper's "
        "budgets (MILE 50k + 10k steps; BDE 100 warmup + 1000 draws) as described in the script's docstring. "
        "Wall seconds; the machine's load average is in the CSV.\n\n"
        "**Caveat.** With short measured budgets, compilation (`compile_seconds` in the CSV, from a separate "
        "tiny run) is most of each measured time, and the projection multiplies the remainder by up to "
        "60k / (W + S) for MILE and 1000 / S for BDE, so noise in the compile estimate (other jobs on the "
        "machine) is amplified as much. Treat exponents and ratios from a loaded machine as rough; rerun with "
        "larger `--mile` / `--bde` budgets on an idle machine (the CSV is resumable per point).\n\n"
        + summarise(rows)
        + "\n![scaling](scaling.png)\n"
    )
    plot(rows, out / "scaling.png")
    print(summarise(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
