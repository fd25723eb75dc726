"""UCI regression benchmark of the MILE paper: DE vs BDE (NUTS) vs MILE, side by side.

Usage::

    python benchmarks/uci.py --quick                      # two small sets, one seed, short budgets (minutes)
    python benchmarks/uci.py                              # the paper's protocol (hours)
    python benchmarks/uci.py --datasets airfoil --seeds 1 2 3 --out docs/benchmarks/uci

One CSV row per (dataset, seed, method); rows already in the CSV are skipped (resumable). Then a
markdown table (mean ± sd over seeds) and a plot of LPPD vs sampler time are written next to it.
Data: ``--data DIR`` or ``$NUMPYRO_MILE_DATA`` or ``../shared/data/uci`` (see numpyro_mile.datasets).
Standardisation: features and target with training-split statistics (``--stats full`` for the
reference code's full-data statistics).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIELDS = ["dataset", "seed", "method", "rmse", "lppd", "de_seconds", "sampler_seconds", "compile_seconds",
          "grad_evals", "ess", "crhat", "num_nans", "num_chains", "budget", "stats", "versions", "machine"]

PROFILES = {
    # the paper: K = 12, MILE 50k warmup + 10k samples thinned by 10; BDE 1000 samples (100 / 1000 warmup)
    "full": dict(datasets=["airfoil", "concrete", "energy", "yacht", "bikesharing", "protein"], seeds=[1, 2, 3],
                 chains=12, mile_warmup=50_000, mile_samples=10_000, thinning=10, bde_samples=1000,
                 bde_warmups=[100, 1000], max_epochs=500),
    # the paper's MILE budget and K on the four small sets, one seed; BDE shortened to 200 samples
    "medium": dict(datasets=["yacht", "energy", "concrete", "airfoil"], seeds=[1], chains=12, mile_warmup=50_000,
                   mile_samples=10_000, thinning=10, bde_samples=200, bde_warmups=[100], max_epochs=500),
    "quick": dict(datasets=["yacht", "energy"], seeds=[1], chains=4, mile_warmup=2000, mile_samples=1000,
                  thinning=10, bde_samples=100, bde_warmups=[100], max_epochs=500),
    "tiny": dict(datasets=["yacht"], seeds=[1], chains=2, mile_warmup=100, mile_samples=20, thinning=2,
                 bde_samples=5, bde_warmups=[5], max_epochs=5),
}


def data_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if os.environ.get("NUMPYRO_MILE_DATA"):
        return Path(os.environ["NUMPYRO_MILE_DATA"])
    return REPO.parent / "shared" / "data" / "uci"


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores {jax.default_backend()}".strip()


def versions() -> str:
    import blackjax
    import numpyro

    return f"jax {jax.__version__}; numpyro {numpyro.__version__}; blackjax {blackjax.__version__}"


def done_keys(csv_path: Path) -> set[tuple[str, str, str]]:
    """(dataset, seed, method) of the rows already in ``csv_path``."""
    if not csv_path.exists():
        return set()
    with csv_path.open() as f:
        return {(r["dataset"], r["seed"], r["method"]) for r in csv.DictReader(f)}


def append_row(csv_path: Path, row: dict) -> None:
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def run_one(dataset: str, seed: int, profile: dict, args, csv_path: Path, done: set) -> None:
    from numpyro_mile import deep_ensemble
    from numpyro_mile.datasets import load_uci, split, standardize
    from numpyro_mile.experiments import run_bde, run_de, run_mile
    from numpyro_mile.models import mlp_regression

    methods = ["DE", "MILE"] + [f"BDE-w{w}-{m}" for w in profile["bde_warmups"] for m in args.bde_chain_methods]
    todo = [m for m in methods if (dataset, str(seed), m) not in done]
    if not todo:
        print(f"[{dataset} seed {seed}] all done, skipped", file=sys.stderr)
        return
    X, y = load_uci(dataset, data_dir=data_dir(args.data))
    (train, val, test), _ = standardize(split(X, y, seed=seed), stats=args.stats)
    key_de, key_mile, key_bde = jax.random.split(jax.random.PRNGKey(seed), 3)
    start = time.perf_counter()
    de = deep_ensemble(mlp_regression, key_de, profile["chains"], *train, validation=val,
                       max_epochs=profile["max_epochs"], progress_bar=False)
    de_seconds = time.perf_counter() - start
    print(f"[{dataset} seed {seed}] DE {de_seconds:.1f} s", file=sys.stderr)
    common = dict(dataset=dataset, seed=seed, de_seconds=round(de_seconds, 3), num_chains=profile["chains"],
                  stats=args.stats, versions=versions(), machine=machine())

    def record(result, budget):
        row = {**common, **{k: getattr(result, k) for k in ("rmse", "lppd", "grad_evals", "ess", "crhat",
                                                              "num_nans")},
               "method": result.method, "sampler_seconds": round(result.seconds, 3),
               "compile_seconds": round(result.compile_seconds, 3), "budget": budget}
        append_row(csv_path, row)
        print(f"[{dataset} seed {seed}] {result.method}: RMSE {result.rmse:.3f} LPPD {result.lppd:.3f} "
              f"time {result.seconds:.1f} s", file=sys.stderr)

    if "DE" in todo:
        record(run_de(mlp_regression, de, *test), "members")
    if "MILE" in todo:
        r = run_mile(mlp_regression, de, train, *test, rng_key=key_mile, num_warmup=profile["mile_warmup"],
                     num_samples=profile["mile_samples"], thinning=profile["thinning"])
        record(r, f"{profile['mile_warmup']}+{profile['mile_samples']}/{profile['thinning']}")
    for w in profile["bde_warmups"]:
        for method in args.bde_chain_methods:
            label = f"BDE-w{w}-{method}"
            if label in todo:
                r = run_bde(mlp_regression, de, train, *test, rng_key=key_bde, num_warmup=w,
                            num_samples=profile["bde_samples"], chain_method=method, label=label)
                record(r, f"{w}+{profile['bde_samples']}")


def summarise(csv_path: Path) -> str:
    """Markdown table: mean ± sd over seeds per dataset and method."""
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["method"]), []).append(r)

    def ms(values, fmt):
        v = np.asarray([float(x) for x in values])
        return f"{v.mean():{fmt}} ± {v.std(ddof=1):{fmt}}" if len(v) > 1 else f"{v.mean():{fmt}}"

    lines = ["| dataset | method | seeds | RMSE | LPPD | DE s | sampler s | grad evals | ESS/chain | cR-hat | NaN/div |",
             "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for (dataset, method), rs in sorted(groups.items()):
        lines.append(
            f"| {dataset} | {method} | {len(rs)} | {ms([r['rmse'] for r in rs], '.3f')} | "
            f"{ms([r['lppd'] for r in rs], '.3f')} | {ms([r['de_seconds'] for r in rs], '.1f')} | "
            f"{ms([r['sampler_seconds'] for r in rs], '.1f')} | {np.mean([int(r['grad_evals']) for r in rs]):,.0f} | "
            f"{ms([r['ess'] for r in rs], '.1f')} | {ms([r['crhat'] for r in rs], '.3f')} | "
            f"{sum(int(r['num_nans']) for r in rs)} |")
    return "\n".join(lines)


def plot(csv_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["method"] != "DE"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in sorted({r["method"] for r in rows}):
        rs = [r for r in rows if r["method"] == method]
        ax.scatter([float(r["sampler_seconds"]) for r in rs], [float(r["lppd"]) for r in rs], label=method)
    ax.set_xscale("log")
    ax.set_xlabel("sampler wall time [s] (log scale)")
    ax.set_ylabel("test LPPD")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short budgets on two small sets (minutes)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None)
    parser.add_argument("--datasets", nargs="+")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--data", help="folder with the UCI .data files")
    parser.add_argument("--stats", choices=["train", "full"], default="train")
    parser.add_argument("--bde-chain-methods", nargs="+", default=["sequential"],
                        choices=["sequential", "vectorized"])
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "uci"), help="output folder")
    args = parser.parse_args(argv)
    profile = dict(PROFILES[args.profile or ("quick" if args.quick else "full")])
    if args.datasets:
        profile["datasets"] = args.datasets
    if args.seeds:
        profile["seeds"] = args.seeds
    folder = data_dir(args.data)
    missing = [d for d in profile["datasets"] if not (folder / f"{d}.data").exists()]
    if missing:
        print(f"error: no data for {missing} in {folder}. Pass --data DIR or set $NUMPYRO_MILE_DATA, or fetch "
              "them with numpyro_mile.datasets.download_uci(name).", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "results.csv"
    for dataset in profile["datasets"]:
        for seed in profile["seeds"]:
            run_one(dataset, seed, profile, args, csv_path, done_keys(csv_path))
    table = summarise(csv_path)
    command = "python benchmarks/uci.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "results.md").write_text(
        f"# UCI benchmark: DE vs BDE vs MILE\n\nGenerated by `{command}` on {machine()} ({versions()}).\n"
        f"Standardisation: {args.stats}-split statistics. Times are wall seconds including start-up and "
        "compilation; `compile s` in the CSV is a tiny run with the same shapes.\n\n" + table + "\n")
    plot(csv_path, out / "lppd_vs_time.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
