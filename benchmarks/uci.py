"""UCI regression benchmark of the MILE paper: DE vs BDE (NUTS) vs MILE, side by side.

Usage::

    python benchmarks/uci.py --quick                      # two small sets, one seed, short budgets (minutes)
    python benchmarks/uci.py                              # the paper's protocol (hours)
    python benchmarks/uci.py --profile paper --out docs/benchmarks/uci_paper   # paper budgets, BDE projected
    python benchmarks/uci.py --profile large --out docs/benchmarks/uci_large   # bikesharing, protein: projected
    python benchmarks/uci.py --datasets airfoil --seeds 1 2 3 --out docs/benchmarks/uci

One CSV row per (dataset, seed, method); rows already in the CSV are skipped (resumable). Each
(dataset, seed) runs in a fresh Python process, so one crash loses one run, not the batch. Then a
markdown table (mean ± sd over seeds) and a plot of LPPD vs sampler time are written next to it.
Data: ``--data DIR`` or ``$NUMPYRO_MILE_DATA`` or ``../shared/data/uci`` (see numpyro_mile.datasets).
Standardisation: features and target with training-split statistics (``--stats full`` for the
reference code's full-data statistics).
"""

from __future__ import annotations

import argparse
import re
import subprocess
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
    commands,
    data_dir,
    load_average,
    machine_info,
    machine_summary,
    markdown_table,
    pyplot,
    read_csv,
)

FIELDS = [
    "dataset",
    "seed",
    "method",
    "rmse",
    "lppd",
    "de_seconds",
    "sampler_seconds",
    "compile_seconds",
    "grad_evals",
    "ess",
    "crhat",
    "num_nans",
    "num_chains",
    "budget",
    "stats",
    "versions",
    "machine",
    "sampler_cpu_seconds",
    "bde_warmup_seconds",
    "projected_seconds",
    "loadavg",
    "crhat_method",
    "de_early_stopping",
    "mile_tuner",
]
#: MILE's tuner of the rows written now: the reference code's, step by step (tests/test_mile_reference.py)
MILE_TUNER = "reference"
# definitions of the cR-hat column (numpyro_mile.diagnostics.chainwise_rhat's `method`); rows written before the
# crhat_method column existed were measured with ArviZ's variant
CRHAT_LABELS = {"arviz_rank": "ArviZ rank variant", "mile": "MILE reference"}
CRHAT_NOTES = {
    "arviz_rank": "ArviZ's rank-normalised split R-hat of each chain's 4 pieces, as cR-hat was computed before it "
    'followed the MILE reference code (`chainwise_rhat(method="arviz_rank")`; it also halves and '
    "folds the pieces, so it usually reads higher than the MILE reference definition)",
    "mile": "as the MILE reference code computes it: each chain rank-normalised, cut into 4 pieces, "
    'sqrt(((m-1)/m W + B) / W), mean over chains (`chainwise_rhat(method="mile")`)',
}

PROFILES = {
    # the paper: K = 12, MILE 50k warmup + 10k samples thinned by 10; BDE 1000 samples (100 / 1000 warmup)
    "full": dict(
        de_early_stopping="mile",
        datasets=["airfoil", "concrete", "energy", "yacht", "bikesharing", "protein"],
        seeds=[1, 2, 3],
        chains=12,
        mile_warmup=50_000,
        mile_samples=10_000,
        thinning=10,
        bde_samples=1000,
        bde_warmups=[100, 1000],
        max_epochs=500,
    ),
    # the paper's MILE budget and K on the four small sets, one seed; BDE shortened to 200 samples
    "medium": dict(
        de_early_stopping="mile",
        datasets=["yacht", "energy", "concrete", "airfoil"],
        seeds=[1],
        chains=12,
        mile_warmup=50_000,
        mile_samples=10_000,
        thinning=10,
        bde_samples=200,
        bde_warmups=[100],
        max_epochs=500,
    ),
    # the paper's MILE budget and K on the four small sets, three seeds; BDE (100 warmup) draws 200 samples and its
    # time for the paper's 1000 is projected from the measured time per draw (see compare.run_bde)
    "paper": dict(
        de_early_stopping="mile",
        datasets=["yacht", "energy", "concrete", "airfoil"],
        seeds=[1, 2, 3],
        chains=12,
        mile_warmup=50_000,
        mile_samples=10_000,
        thinning=10,
        bde_samples=200,
        bde_warmups=[100],
        max_epochs=500,
        bde_projected_samples=1000,
    ),
    # bikesharing and protein at short budgets (the paper's take hours per run on two CPU cores): K = 12 for DE
    # and MILE, BDE on the first 2 members only; both times projected to the paper's budgets (MILE 50k + 10k steps;
    # BDE 12 chains x (100 warmup + 1000 draws)) from the measured cost per step / per iteration
    "large": dict(
        de_early_stopping="mile",
        datasets=["bikesharing", "protein"],
        seeds=[1],
        chains=12,
        mile_warmup=1000,
        mile_samples=500,
        thinning=10,
        bde_samples=10,
        bde_warmups=[20],
        max_epochs=500,
        mile_projected_steps=60_000,
        bde_chains=2,
        bde_projected_warmup=100,
        bde_projected_samples=1000,
    ),
    "quick": dict(
        datasets=["yacht", "energy"],
        seeds=[1],
        chains=4,
        mile_warmup=2000,
        mile_samples=1000,
        thinning=10,
        bde_samples=100,
        bde_warmups=[100],
        max_epochs=500,
    ),
    # the tests' profile; it also exercises the projections of the "large" profile (one BDE chain of two)
    "tiny": dict(
        datasets=["yacht"],
        seeds=[1],
        chains=2,
        mile_warmup=100,
        mile_samples=20,
        thinning=2,
        bde_samples=5,
        bde_warmups=[5],
        max_epochs=5,
        mile_projected_steps=1200,
        bde_chains=1,
        bde_projected_warmup=10,
        bde_projected_samples=10,
    ),
}


def versions(info: dict) -> str:
    """The ``versions`` column: ``jax x; numpyro x; blackjax x`` of a :func:`_common.machine_info` dict."""
    return "; ".join(f"{name} {info[name]}" for name in ("jax", "numpyro", "blackjax"))


def done_keys(csv_path: Path) -> set[tuple[str, str, str]]:
    """(dataset, seed, method) of the rows already in ``csv_path``."""
    return {(r["dataset"], r["seed"], r["method"]) for r in read_csv(csv_path, missing_ok=True)}


def run_one(dataset: str, seed: int, profile: dict, args, csv_path: Path, done: set) -> None:
    from numpyro_mile import deep_ensemble
    from numpyro_mile.datasets import load_uci, split, standardize
    from numpyro_mile.compare import run_bde, run_de, run_mile
    from numpyro_mile.models import mlp_regression

    bar = "+bar" if args.progress_bar else ""  # rows run with NumPyro's progress bar are labelled apart
    methods = [
        m
        for m in ["DE", f"MILE{bar}"]
        + [f"BDE-w{w}-{m}{bar}" for w in profile["bde_warmups"] for m in args.bde_chain_methods]
        if m.split("-")[0].split("+")[0] in args.methods
    ]
    todo = [m for m in methods if (dataset, str(seed), m) not in done]
    if not todo:
        print(f"[{dataset} seed {seed}] all done, skipped", file=sys.stderr)
        return
    X, y = load_uci(dataset, data_dir=data_dir(args.data))
    (train, val, test), _ = standardize(split(X, y, seed=seed), stats=args.stats)
    key_de, key_mile, key_bde = jax.random.split(jax.random.PRNGKey(seed), 3)
    early_stopping = profile.get("de_early_stopping", "best")  # "mile": the reference code's rule (final params)
    with Stopwatch() as de_clock:
        de = deep_ensemble(
            mlp_regression,
            key_de,
            profile["chains"],
            *train,
            validation=val,
            max_epochs=profile["max_epochs"],
            early_stopping=early_stopping,
            progress_bar=False,
        )
    de_seconds = de_clock.wall
    print(f"[{dataset} seed {seed}] DE {de_seconds:.1f} s", file=sys.stderr)
    info = machine_info()
    common = dict(
        dataset=dataset,
        seed=seed,
        de_seconds=round(de_seconds, 3),
        num_chains=profile["chains"],
        stats=args.stats,
        versions=versions(info),
        machine=machine_summary(info),
        de_early_stopping=early_stopping,
        mile_tuner=MILE_TUNER,
    )

    def finite(x):
        return round(x, 3) if np.isfinite(x) else ""

    def record(result, budget):
        row = {
            **common,
            **{k: getattr(result, k) for k in ("rmse", "lppd", "grad_evals", "ess", "crhat", "num_nans")},
            "method": result.method,
            "sampler_seconds": round(result.seconds, 3),
            "compile_seconds": round(result.compile_seconds, 3),
            "budget": budget,
            "sampler_cpu_seconds": finite(result.cpu_seconds),
            "bde_warmup_seconds": finite(result.warmup_seconds),
            "projected_seconds": finite(result.projected_seconds),
            "loadavg": f"{load_average():.1f}",
            "crhat_method": "mile",
        }  # compare._mixing: chainwise_rhat(method="mile")
        append_csv(csv_path, [row], FIELDS)
        print(
            f"[{dataset} seed {seed}] {result.method}: RMSE {result.rmse:.3f} LPPD {result.lppd:.3f} "
            f"time {result.seconds:.1f} s",
            file=sys.stderr,
        )

    if "DE" in todo:
        record(run_de(mlp_regression, de, *test), "members")
    if f"MILE{bar}" in todo:
        steps = profile.get("mile_projected_steps")
        r = run_mile(
            mlp_regression,
            de,
            train,
            *test,
            rng_key=key_mile,
            num_warmup=profile["mile_warmup"],
            num_samples=profile["mile_samples"],
            thinning=profile["thinning"],
            projected_steps=steps,
            progress_bar=args.progress_bar,
        )
        r = r._replace(method=f"{r.method}{bar}")
        record(
            r,
            f"{profile['mile_warmup']}+{profile['mile_samples']}/{profile['thinning']}"
            + (f" (projected to {steps} steps)" if steps else ""),
        )
    bde_chains = profile.get("bde_chains", profile["chains"])
    bde_members = de._replace(init_params=jax.tree.map(lambda x: x[:bde_chains], de.init_params))
    for w in profile["bde_warmups"]:
        for method in args.bde_chain_methods:
            label = f"BDE-w{w}-{method}{bar}"
            if label in todo:
                draws, warm = profile.get("bde_projected_samples"), profile.get("bde_projected_warmup")
                r = run_bde(
                    mlp_regression,
                    bde_members,
                    train,
                    *test,
                    rng_key=key_bde,
                    num_warmup=w,
                    num_samples=profile["bde_samples"],
                    chain_method=method,
                    label=label,
                    progress_bar=args.progress_bar,
                    projected_samples=draws,
                    projected_warmup=warm,
                    projected_chains=profile["chains"],
                )
                budget = f"{w}+{profile['bde_samples']}"
                if bde_chains != profile["chains"]:
                    budget += f" on {bde_chains} of {profile['chains']} chains"
                if draws or warm:
                    budget += (
                        f" (projected to {profile['chains']} chains x {warm or w}+{draws or profile['bde_samples']})"
                    )
                record(r, budget)


def _values(rows: list[dict], key: str) -> np.ndarray:
    """Column ``key`` as floats; blanks (columns added after a row was written) become NaN."""
    return np.asarray([float(r[key]) if r.get(key) not in (None, "") else np.nan for r in rows])


def _ms(v: np.ndarray, fmt: str) -> str:
    v = v[np.isfinite(v)]
    if not len(v):
        return "–"
    return f"{v.mean():{fmt}} ± {v.std(ddof=1):{fmt}}" if len(v) > 1 else f"{v.mean():{fmt}}"


def _projected_cpu(rows: list[dict]) -> np.ndarray:
    """CPU seconds scaled like the wall time to the projected budget (CPU x projected / wall)."""
    wall, projected = _values(rows, "sampler_seconds"), _values(rows, "projected_seconds")
    return _values(rows, "sampler_cpu_seconds") * np.where(np.isfinite(projected), projected, wall) / wall


def targets(groups: dict[tuple[str, str], list[dict]]) -> list[str]:
    """The paper's claims per dataset, for every MILE row variant against every BDE variant present (seeds
    matched)."""
    rows = []
    for dataset in sorted({d for d, _ in groups}):
        de = groups.get((dataset, "DE"))
        pairs = [
            (m, b)
            for m in sorted(m for d, m in groups if d == dataset and m.startswith("MILE"))
            for b in sorted(b for d, b in groups if d == dataset and b.startswith("BDE"))
        ]
        for mile_method, method in pairs:
            mile, bde = groups[(dataset, mile_method)], groups[(dataset, method)]
            variant = f"{method} vs {mile_method}"
            seeds = sorted({r["seed"] for r in mile or []} & {r["seed"] for r in bde} & {r["seed"] for r in de or []})
            if not seeds:
                continue
            pick = lambda rs: sorted((r for r in rs if r["seed"] in seeds), key=lambda r: r["seed"])  # noqa: E731
            m, b, e = pick(mile), pick(bde), pick(de)
            sd = lambda v: v.std(ddof=1) if len(v) > 1 else 0.0  # noqa: E731
            ok = lambda c: "yes" if c else "**no**"  # noqa: E731
            rmse_m, rmse_b = _values(m, "rmse"), _values(b, "rmse")
            lppd_m, lppd_b = _values(m, "lppd"), _values(b, "lppd")
            projected = _values(b, "projected_seconds")
            projected = np.where(np.isfinite(projected), projected, _values(b, "sampler_seconds"))  # older rows
            mile_projected = _values(m, "projected_seconds")
            mile_projected = np.where(np.isfinite(mile_projected), mile_projected, _values(m, "sampler_seconds"))
            wall = projected.mean() / mile_projected.mean()
            cpu_b, cpu_m = _projected_cpu(b), _projected_cpu(m)
            cpu = cpu_b.mean() / cpu_m.mean() if np.all(np.isfinite(cpu_b)) and np.all(np.isfinite(cpu_m)) else np.nan
            rows.append(
                [
                    dataset,
                    f"{variant} (seeds {', '.join(seeds)})",
                    ok(np.all(lppd_m >= _values(e, "lppd"))),
                    ok(rmse_m.mean() <= rmse_b.mean() + max(sd(rmse_m), sd(rmse_b))),
                    ok(lppd_m.mean() >= lppd_b.mean() - max(sd(lppd_m), sd(lppd_b))),
                    f"{wall:.1f}; {cpu:.1f}{'' if np.isfinite(cpu) else ' (BDE not projected)'}",
                    measured_or_projected(m + b),
                    time_target(wall, cpu, m + b),
                    time_target(wall, cpu, m + b, 10.0),
                ]
            )
    return markdown_table(
        [
            "dataset",
            "BDE variant",
            "MILE LPPD >= DE",
            "MILE RMSE within 1 sd of BDE or better",
            "MILE LPPD within 1 sd of BDE or better",
            "BDE time / MILE time (wall; CPU)",
            "times",
            ">= 5",
            ">= 10",
        ],
        rows,
        "lllllllll",
        compact=True,
    )


def idle(rows: list[dict]) -> bool:
    """Whether every row ran on an otherwise idle machine: 1-min load average <= its core count + 0.5."""

    def cores(r):
        found = re.search(r"(\d+) cores", r.get("machine", ""))
        return int(found.group(1)) if found else 1

    return all(r.get("loadavg") not in (None, "") and float(r["loadavg"]) <= cores(r) + 0.5 for r in rows)


def time_target(wall: float, cpu: float, rows: list[dict], threshold: float = 5.0) -> str:
    """The ``>= threshold`` time check: on wall time when all ``rows`` ran on an idle machine (the paper's
    measure), else on CPU time (other jobs inflate wall times unevenly); on wall time when CPU time is missing."""
    if idle(rows) or not np.isfinite(cpu):
        return ("yes" if wall >= threshold else "**no**") + (
            " (wall, idle machine)" if idle(rows) else " (wall; no CPU time)"
        )
    return ("yes" if cpu >= threshold else "**no**") + " (CPU, loaded machine)"


def measured_or_projected(rows: list[dict]) -> str:
    """``measured`` when every row ran its full budget, else ``projected`` (some time scaled from a shorter run)."""
    return "projected" if any("projected" in (r.get("budget") or "") for r in rows) else "measured"


def projection_check(csv_path: Path, other: Path) -> str:
    """Full-budget times here against the times projected for the same (dataset, seed, method) in ``other``."""
    here = [r for r in read_csv(csv_path) if r["method"] != "DE" and "projected" not in (r.get("budget") or "")]
    there = {(r["dataset"], r["seed"], r["method"]): r for r in read_csv(other / "results.csv")}
    lines = [
        f"Full-budget times measured here against the times `{other}` projected for the same data set, seed "
        "and method from a shorter run:",
        "",
    ]
    rows = []
    for r in here:
        match = there.get((r["dataset"], r["seed"], r["method"]))
        if match is None or match.get("projected_seconds") in (None, ""):
            continue
        measured, projected = float(r["sampler_seconds"]), float(match["projected_seconds"])
        rows.append(
            [
                r["dataset"],
                r["seed"],
                r["method"],
                r["budget"],
                f"{measured:.1f}",
                f"{projected:.1f}",
                f"{measured / projected:.2f}",
            ]
        )
    lines += markdown_table(
        ["dataset", "seed", "method", "budget here", "measured s", "projected s (there)", "measured / projected"],
        rows,
        "lrllrrr",
        compact=True,
    )
    return "\n".join(lines) + "\n"


def crhat_methods(rows: list[dict]) -> list[str]:
    """The cR-hat definitions of the rows with a cR-hat value; a row without ``crhat_method`` (written before the
    column existed) used ArviZ's rank variant."""
    return sorted({r.get("crhat_method") or "arviz_rank" for r in rows if np.isfinite(_values([r], "crhat")[0])})


def summarise(csv_path: Path) -> str:
    """Markdown tables: mean ± sd over seeds per dataset and method, then the paper's targets."""
    rows = read_csv(csv_path)
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["method"]), []).append(r)

    # which cR-hat definition the numbers used: in the header when all rows agree, else on every cell
    used = crhat_methods(rows)
    crhat_header = f"cR-hat ({CRHAT_LABELS[used[0]]})" if len(used) == 1 else "cR-hat"

    def crhat_label(rs: list[dict]) -> str:
        methods = crhat_methods(rs)
        if len(used) < 2 or not methods:
            return ""
        return f" ({CRHAT_LABELS[methods[0]]})" if len(methods) == 1 else " (mixed definitions)"

    cells = [
        [
            dataset,
            method,
            "; ".join(sorted({r.get("budget", "") for r in rs})),
            len(rs),
            _ms(_values(rs, "rmse"), ".3f"),
            _ms(_values(rs, "lppd"), ".3f"),
            _ms(_values(rs, "de_seconds"), ".1f"),
            _ms(_values(rs, "sampler_seconds"), ".1f"),
            _ms(_values(rs, "sampler_cpu_seconds"), ".1f"),
            _ms(_values(rs, "projected_seconds"), ".1f") if method != "DE" else "",
            f"{np.mean([int(r['grad_evals']) for r in rs]):,.0f}",
            _ms(_values(rs, "ess"), ".1f"),
            _ms(_values(rs, "crhat"), ".3f") + crhat_label(rs),
            sum(int(r["num_nans"]) for r in rs),
        ]
        for (dataset, method), rs in sorted(groups.items())
    ]
    lines = markdown_table(
        [
            "dataset",
            "method",
            "budget",
            "seeds",
            "RMSE",
            "LPPD",
            "DE s",
            "sampler s",
            "sampler CPU s",
            "projected s",
            "grad evals",
            "ESS/chain",
            crhat_header,
            "NaN/div",
        ],
        cells,
        "lllrllrrrrrrrr",
        compact=True,
    )
    notes = [f"cR-hat ({CRHAT_LABELS[m]}): {CRHAT_NOTES[m]}." for m in used]
    return "\n".join(
        lines
        + [line for note in notes for line in ("", note)]
        + [
            "",
            "Targets (the MILE paper's claims; times = projected to the full budget where a shorter one was measured):",
            "",
        ]
        + targets(groups)
    )


def plot(csv_path: Path, png_path: Path) -> None:
    plt = pyplot()

    rows = [r for r in read_csv(csv_path) if r["method"] != "DE"]
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
    parser = argument_parser(__doc__, whole_doc=True)
    parser.add_argument("--quick", action="store_true", help="short budgets on two small sets (minutes)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None)
    parser.add_argument("--datasets", nargs="+")
    parser.add_argument("--seeds", nargs="+", type=int)
    add_common_options(parser, data="the UCI .data files")
    parser.add_argument("--stats", choices=["train", "full"], default="train")
    parser.add_argument("--bde-warmups", nargs="+", type=int, help="BDE warmup lengths (default: the profile's)")
    parser.add_argument(
        "--bde-chain-methods",
        nargs="+",
        default=["auto"],
        choices=["auto", "sequential", "vectorized"],
        help="BDE's chain_method; auto (default): chains over every core, as numpyro_mile.bde runs them",
    )
    parser.add_argument(
        "--progress-bar",
        action="store_true",
        help="run the samplers with NumPyro's progress bar, as its default is (rows labelled '+bar'); "
        "without it the bars are off, as the existing pages were measured",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["DE", "MILE", "BDE"],
        choices=["DE", "MILE", "BDE"],
        help="which methods to run (default: all)",
    )
    add_common_options(parser, out_dir=ROOT / "docs" / "benchmarks" / "uci")
    parser.add_argument(
        "--projection-of",
        default=None,
        help="a results folder whose projected times this run's full-budget times check",
    )
    add_common_options(
        parser, render_only="only rewrite results.md and the plot from the CSV (e.g. while a run is going on)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one (dataset, seed), in-process
    args = parser.parse_args(argv)
    profile = dict(PROFILES[args.profile or ("quick" if args.quick else "full")])
    if args.datasets:
        profile["datasets"] = args.datasets
    if args.seeds:
        profile["seeds"] = args.seeds
    if args.bde_warmups:
        profile["bde_warmups"] = args.bde_warmups
    folder = data_dir(args.data)
    out = Path(args.out)
    if args.render_only:
        render(
            out,
            args,
            command_line(
                __file__, ["--profile", args.profile or ("quick" if args.quick else "full"), "--out", args.out]
            ),
            profile,
        )
        return 0
    missing = [d for d in profile["datasets"] if not (folder / f"{d}.data").exists()]
    if missing:
        print(
            f"error: no data for {missing} in {folder}. Pass --data DIR or set $NUMPYRO_MILE_DATA, or fetch "
            "them with numpyro_mile.datasets.download_uci(name).",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "results.csv"
    argv = list(sys.argv[1:] if argv is None else argv)
    if args.child:
        for dataset in profile["datasets"]:
            for seed in profile["seeds"]:
                run_one(dataset, seed, profile, args, csv_path, done_keys(csv_path))
        return 0
    # one fresh process per (dataset, seed): a long process accumulates JAX/LLVM code mappings until LLVM
    # fails ("Cannot allocate memory") after a few dozen compiles; a failed run is reported and the rest go on
    failed = []
    for dataset in profile["datasets"]:
        for seed in profile["seeds"]:
            child = [
                sys.executable,
                str(Path(__file__).resolve()),
                *argv,
                "--datasets",
                dataset,
                "--seeds",
                str(seed),
                "--child",
            ]
            if subprocess.run(child).returncode != 0:
                failed.append(f"{dataset} seed {seed}")
                print(f"[{dataset} seed {seed}] failed (see above); rerun to resume", file=sys.stderr)
    commands(out, command_line(__file__, argv))
    render(out, args, command_line(__file__, argv), profile)
    return 1 if failed else 0


def early_stopping_note(csv_path: Path, profile: dict) -> str:
    """A sentence on the deep ensemble's early-stopping rule: the profile's, and that of rows measured before."""
    rows = read_csv(csv_path)
    rules = [r.get("de_early_stopping") or "" for r in rows]
    rule = profile.get("de_early_stopping", "best")
    text = f"\nDeep ensemble early stopping (`deep_ensemble(early_stopping=...)`): this profile uses '{rule}'" + (
        " (the MILE reference code's rule: stop when each of the last 10 validation losses is >= the loss "
        "just before them, keep the final parameters)"
        if rule == "mile"
        else " (keep the best parameters)"
    )
    old = sum(1 for r in rules if not r)
    if old:
        text += (
            f"; {old} of {len(rules)} rows were measured before the option existed, with 'best' (patience 10, "
            "best parameters), and with MILE's Phase III keeping at most 1,000 thinned positions per chain for "
            "its ESS (the default is now 10,000, as the reference code); they are not rerun"
        )
    before = sum(1 for r in rows if r.get("mile_tuner") != MILE_TUNER)
    if before:
        text += (
            f". {before} of {len(rules)} rows predate MILE's tuner following the reference code step by step (a "
            "rejected step entering its averages with an energy change of 0, the linear target's n1 + n2 + 1 "
            "denominator, Phase III's ESS over every coordinate up to 2,000 and every position up to 10,000): "
            "their MILE rows are the earlier tuner's and are not rerun (`peers.md` has MILE rows of the "
            "current defaults)"
        )
    return text + ".\n"


def render(out: Path, args, command: str, profile: dict) -> None:
    """results.md (tables + targets) and lppd_vs_time.png from ``out/results.csv``."""
    csv_path = out / "results.csv"
    table = summarise(csv_path)
    done = {(r["dataset"], r["seed"]) for r in read_csv(csv_path)}
    planned = [(d, str(s)) for d in profile["datasets"] for s in profile["seeds"]]
    missing = [f"{d} seed {s}" for d, s in planned if (d, s) not in done]
    written_by = commands(out) or [command]
    generated = (
        f"Generated by `{written_by[0]}`"
        if len(written_by) == 1
        else "Generated by these commands, each adding the rows it lacks to results.csv: "
        + "; ".join(f"`{c}`" for c in written_by)
        + ","
    )
    # the machines the rows were measured on (a page re-rendered elsewhere names them, not the renderer)
    measured_on = sorted(
        {
            r["machine"].strip() + ("" if "jax " in r["machine"] else f" ({r['versions']})")  # newer rows name them
            for r in read_csv(csv_path)
            if r.get("machine")
        }
    )
    (out / "results.md").write_text(
        f"# UCI benchmark: DE vs BDE vs MILE\n\n{generated} on {'; '.join(measured_on) or machine_summary()}.\n"
        f"Standardisation: {args.stats}-split statistics. Times are wall seconds including start-up and "
        "compilation; `compile s` in the CSV is a tiny run with the same shapes. Each row's load average is in "
        "the CSV: on a shared machine compare CPU seconds rather than wall seconds. The >= 5 time target is checked on "
        "wall time when every row compared ran on an idle machine (load average <= cores + 0.5), else on CPU time; "
        "MILE's vectorized chains keep two cores busy (more CPU than wall seconds), sequential NUTS about one. "
        "Methods without '+bar' ran with NumPyro's progress bar off (`progress_bar=False`); what the bar adds "
        "to a user's run is on `peers.md` / `defaults.md`. "
        "A budget marked 'projected' was run short: RMSE, LPPD, ESS and cR-hat are the short run's, and only its "
        "time is projected to the stated budget from the measured cost per step (MILE) or per warmup iteration "
        "and per draw (BDE; see numpyro_mile.compare.run_bde).\n"
        + early_stopping_note(csv_path, profile)
        + (f"\nNot run yet (the run is resumable): {', '.join(missing)}.\n" if missing else "")
        + "\n"
        + table
        + "\n\n"
        + (projection_check(csv_path, Path(args.projection_of)) + "\n" if getattr(args, "projection_of", None) else "")
        + "![LPPD vs sampler time](lppd_vs_time.png)\n"
    )
    plot(csv_path, out / "lppd_vs_time.png")
    print(table)


if __name__ == "__main__":
    import os

    import numpyro

    numpyro.set_host_device_count(os.cpu_count() or 1)  # every core a device, before JAX starts (NumPyro's advice)
    sys.exit(main())
