"""Peers side by side: numpyro_mile, the MILE authors' code and scikit-learn-contrib ``bde`` on UCI regression.

UCI airfoil (``--data``: also energy, concrete, ...), K = 12 chains, 10,000 warmup + 2,000 sampling steps thinned
10 (200 draws per chain), seeds 1-3;
the network of the paper (two hidden layers of 16, ReLU, a (mu, log sigma) head, standard-normal priors) and
each implementation's deep ensemble (500 epochs at most, patience 10, AdamW 1e-3). Every implementation gets
every core the way its documentation configures it (the authors' ``train.py -d``, ``bde``'s ``XLA_FLAGS``,
NumPyro's ``set_host_device_count``) and keeps its progress bars. The split is the authors' (their loader:
full-data standardisation, a permutation from the seed, 70/10/20); ``bde`` and numpyro_mile receive it as arrays.
Every sampler conditions on the same training rows (70 %): the authors' and ours early-stop their ensembles on
the split's validation rows; ``bde`` gets the training rows only and holds out as many of them (its
``validation_split``) for its early stopping, as its documentation does.
Each run is one fresh Python process, run one after another, never side by side, in the order authors, bde,
ours, then ours again with ``progress_bar=False`` (a second row: what NumPyro's bar costs) per seed;
``benchmarks/_peer_drivers.py`` is what each process runs (it says what is timed).
Two cross runs per seed locate an LPPD gap: the authors' tuning and sampling code from our deep ensemble
(``authors-sampler``) and
our MILE from the authors' ensemble (``ours-authors-ensemble``), each from the ensemble of the same seed's
run in the same invocation; they are not timed against the others. ``ours-resampled`` measures the noise floor:
our MILE again from the ``ours`` run's ensemble with another key, so that its LPPD differs from ``ours``'s by
the sampler's run-to-run noise alone.

Neither peer is on the package index, and no third-party code enters this repository: the script takes paths
to checkouts and gives each its own virtualenv under ``--venvs``, built once with its pinned requirements:
the authors' ``poetry.lock`` through Poetry (``poetry install --no-root --with nlp``, as their README says,
without the torch group that tabular runs do not import), and ``bde`` either from the package index
(``--bde pypi``: ``pip install sklearn-contrib-bde``, what its users install) or from a checkout with its
``pyproject.toml`` under the versions its ``pixi.lock`` pins for the default Linux environment.

Usage::

    git clone https://github.com/EmanuelSommer/MILE ~/src/MILE
    git clone https://github.com/scikit-learn-contrib/bde ~/src/bde
    python benchmarks/peers.py --authors ~/src/MILE --bde pypi --data airfoil energy concrete
                                                                        # -> docs/benchmarks/peers.md, peers/results.csv
    python benchmarks/peers.py --render-only                             # page from results.csv
"""

from __future__ import annotations

import json
import os
import re
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
    load_average,
    machine_lines,
    markdown_table,
    read_csv,
    write_csv,
)

OUT = ROOT / "docs" / "benchmarks" / "peers"
PAGE = ROOT / "docs" / "benchmarks" / "peers.md"
DRIVER = Path(__file__).resolve().parent / "_peer_drivers.py"
IMPLEMENTATIONS = ("authors", "bde", "ours", "ours-quiet", "authors-sampler", "ours-authors-ensemble", "ours-resampled")
#: the users' runs, timed and compared; the others cross ensembles and samplers to locate an LPPD gap
TIMED = IMPLEMENTATIONS[:4]
LABELS = {
    "authors": "MILE authors' code",
    "bde": "scikit-learn-contrib bde",
    "ours": "numpyro_mile (README path)",
    "ours-quiet": "numpyro_mile, progress_bar=False (second row)",
    "authors-sampler": "the authors' tuning + sampling code from numpyro_mile's ensemble",
    "ours-authors-ensemble": "numpyro_mile's MILE from the authors' ensemble",
    "ours-resampled": "numpyro_mile's MILE again from its own ensemble, another key (noise floor)",
}
#: where a cross run takes its ensemble from: the run of that kind in the same invocation
ENSEMBLE_OF = {"authors-sampler": "ours", "ours-authors-ensemble": "authors", "ours-resampled": "ours"}
#: the key offset of ``ours-resampled``'s MILE run
RESAMPLED_KEY_OFFSET = 1000
FIELDS = [
    "data",
    "implementation",
    "seed",
    "chains",
    "warmup",
    "samples",
    "thinning",
    "devices",
    "process_wall",
    "fit_wall",
    "fit_cpu",
    "compile_s",
    "compiles",
    "loop_compile_s",
    "loop_compiles",
    "ensemble_s",
    "sampler_s",
    "lppd",
    "rmse",
    "commit",
    "load_start",
    "load_end",
]
# the bde versions its pixi.lock pins in the default Linux environment (read from the lock, see bde_pins)
BDE_PINNED = ("jax", "jaxlib", "numpy", "scipy", "scikit-learn", "optax", "blackjax", "chex")


# ============================================================================ environments
def git_commit(checkout) -> str:
    if str(checkout) == "pypi":
        return "pypi"
    return (
        subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )


def bde_pins(checkout: Path) -> list[str]:
    """``name==version`` for :data:`BDE_PINNED` from the default environment's linux-64 block of ``pixi.lock``."""
    lock = (checkout / "pixi.lock").read_text()
    default = lock[lock.index("\n  default:\n") :]
    linux = default[default.index("linux-64:") :]
    linux = linux[: re.search(r"\n      (osx|win)-", linux).start()]
    pins = {}
    for name in BDE_PINNED:
        found = re.search(rf"/{re.escape(name)}-([0-9][^-/]*)-", linux)
        if found:
            pins[name] = found.group(1)
    return [f"{k}=={v}" for k, v in pins.items()]


def run_logged(cmd: list[str], log: Path, **kwargs) -> None:
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True, **kwargs)


def environment(kind: str, checkout, venvs: Path) -> Path:
    """The Python of ``kind``'s virtualenv for ``checkout`` (for bde also ``"pypi"``: the package index), built on
    first use (a marker records the commit)."""
    commit = git_commit(checkout)
    venv = venvs / f"{kind}-{commit}"
    python = venv / "bin" / "python"
    if (venv / ".peers-ready").exists():
        return python
    venvs.mkdir(parents=True, exist_ok=True)
    log = venvs / f"{kind}-{commit}.log"
    print(f"building the {kind} environment in {venv} (log: {log})", file=sys.stderr, flush=True)
    run_logged([sys.executable, "-m", "venv", "--clear", str(venv)], log)
    if kind == "authors":
        poetry_venv = venvs / "poetry"
        if not (poetry_venv / "bin" / "poetry").exists():
            run_logged([sys.executable, "-m", "venv", str(poetry_venv)], log)
            run_logged([str(poetry_venv / "bin" / "pip"), "install", "poetry"], log)
        env = dict(os.environ, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
        run_logged(
            [str(poetry_venv / "bin" / "poetry"), "install", "--no-root", "--no-interaction", "--with", "nlp"],
            log,
            cwd=checkout,
            env=env,
        )
    elif str(checkout) == "pypi":
        run_logged([str(venv / "bin" / "pip"), "install", "sklearn-contrib-bde"], log)
    else:
        constraints = venvs / f"{kind}-{commit}-constraints.txt"
        constraints.write_text("\n".join(bde_pins(checkout)) + "\n")
        run_logged([str(venv / "bin" / "pip"), "install", "-c", str(constraints), str(checkout)], log)
    (venv / ".peers-ready").write_text(commit + "\n")
    return python


# ============================================================================ runs
def score(predictions: Path) -> tuple[float, float]:
    """Test LPPD and RMSE (standardised units) of one run's predictive draws, the same code for every peer."""
    import numpy as np

    from numpyro_mile.metrics import gaussian_log_likelihood, lppd, rmse

    p = np.load(predictions)
    return lppd(gaussian_log_likelihood(p["y"], p["mu"], p["sigma"])), rmse(p["y"], p["mu"])


def run_one(kind: str, python: Path, settings: dict, work: Path) -> dict:
    """One implementation's run in a fresh process (``ours-quiet``: ours with ``progress_bar=False``), scored."""
    work.mkdir(parents=True, exist_ok=True)
    args = dict(settings, workdir=str(work))
    label = kind
    if kind == "ours-quiet":
        kind, args["progress_bar"] = "ours", False
    if kind in ENSEMBLE_OF:  # a cross run: the ensemble of another kind's run of this seed, in this invocation
        source = work.parent / ENSEMBLE_OF[kind]
        if kind == "authors-sampler":
            kind, args["init"] = "authors_sampler", str(source / "ensemble.npz")
            found = (source / "ensemble.npz").exists()
        elif kind == "ours-resampled":
            kind, args["init_npz"] = "ours", str(source / "ensemble.npz")
            args["key_offset"] = RESAMPLED_KEY_OFFSET
            found = (source / "ensemble.npz").exists()
        else:
            kind = "ours"
            args["init_from"] = str(source / "results" / f"mclmc_seed{settings['seed']}" / "warmstart")
            found = Path(args["init_from"]).is_dir()
        if not found:
            raise RuntimeError(
                f"{label} needs the {ENSEMBLE_OF[label]} run of the same invocation: add {ENSEMBLE_OF[label]} to --only"
            )
    (work / "args.json").write_text(json.dumps(args))
    load_start, start = load_average(), time.perf_counter()
    with (work / "stderr.log").open("w") as err:
        proc = subprocess.run(
            [str(python), str(DRIVER), kind, str(work / "args.json")],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=work,
        )
    wall = time.perf_counter() - start
    (work / "stdout.log").write_text(proc.stdout)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed (exit {proc.returncode}); see {work / 'stderr.log'}")
    if kind == "split":
        return {}
    result = json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT ") :])
    lppd_value, rmse_value = score(work / "predictions.npz")
    return {
        **{k: settings[k] for k in ("data", "seed", "chains", "warmup", "samples", "thinning", "devices")},
        "implementation": label,
        "process_wall": wall,
        **result,
        "lppd": lppd_value,
        "rmse": rmse_value,
        "load_start": load_start,
        "load_end": load_average(),
    }


# ============================================================================ page
def mean(values) -> float:
    values = [float(v) for v in values if v not in ("", None)]
    return statistics.fmean(values) if values else float("nan")


def data_of(row: dict) -> str:
    return row.get("data") or "airfoil"  # rows of the single-data-set page, before --data


def single_blanks(lines: list[str]) -> list[str]:
    """``lines`` without a blank line right after another (paragraphs that some pages leave out)."""
    return [line for i, line in enumerate(lines) if line or i == 0 or lines[i - 1]]


def render(rows: list[dict], out: Path) -> str:
    names = list(dict.fromkeys(data_of(r) for r in rows))
    first = rows[0]
    loads = [float(r["load_start"]) for r in rows] + [float(r["load_end"]) for r in rows]
    lines = [
        "# Peers side by side: numpyro_mile, the MILE authors' code, scikit-learn-contrib bde",
        "",
        "Generated by `python benchmarks/peers.py --authors MILE-CHECKOUT --bde pypi --data "
        + " ".join(names)
        + budget_flags(first, out)
        + "` (see its docstring; `--only KIND` reruns one implementation, `--render-only` rewrites "
        "this page; results in "
        f"`{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}/results.csv`).",
        "",
        f"UCI {', '.join(names)}, the authors' split per seed (70/10/20, full-data standardisation), K = "
        f"{first['chains']} chains, {int(first['warmup']):,} warmup + {int(first['samples']):,} steps thinned "
        f"{first['thinning']} ({int(first['samples']) // int(first['thinning'])} draws per chain), {first['devices']} "
        "devices (every core), progress bars as each implementation defaults. Each run is a fresh process; times are "
        "seconds from the process's first line (before JAX is imported) until the posterior draws are in memory: "
        "what a user waits for, imports, ensemble training and compilation included. `compile` is the trace + lower "
        "+ XLA compile time JAX reports (`jax.monitoring`), part of the wall time; `ensemble` and `sampler` are the "
        "implementation's own split where it has one (the authors' `time.warmstart` / `time.sampling` log lines; "
        "for bde and numpyro_mile measured around their ensemble fit), both including their compilation. LPPD and "
        "RMSE on the test rows (standardised units) are computed by the same code for all from each "
        f"implementation's predictive draws (all {first['chains']} x "
        f"{int(first['samples']) // int(first['thinning'])}).",
        "",
        "Rows: every sampler conditions on the same training rows (70 % of the data). The authors' code and "
        "numpyro_mile early-stop their ensembles on the split's validation rows (10 %); bde, given the training rows "
        "as a user gives it data, holds out as many of them for its ensemble's early stopping (its "
        "`validation_split`), so its members train on fewer rows. Rows measured before this rule (bde fitted on "
        "training + validation rows) are marked where they remain.",
        "",
        *summary(rows, names),
    ]
    for name in names:
        lines += ["", f"## {name}", "", *section([r for r in rows if data_of(r) == name])]
    lines += [
        "",
        "Environments: each peer in its own virtualenv (the authors' `poetry.lock`: JAX 0.4.28, BlackJAX 1.2.2; bde "
        "from the package index, `sklearn-contrib-bde`, or from a checkout under its `pixi.lock` pins); commits: "
        + ", ".join(sorted({f"{r['implementation']} {r['commit']}" for r in rows}))
        + ".",
        "",
        *machine_lines(),
        f"- load average (1 min) over the runs: {min(loads):.2f} - {max(loads):.2f}",
    ]
    return "\n".join(single_blanks(lines)) + "\n"


def budget_flags(first: dict, out: Path) -> str:
    """The command-line flags of a page at another budget than the default (its own folder and page)."""
    if (int(first["warmup"]), int(first["samples"])) == (10_000, 2_000):
        return ""
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    return f" --warmup {int(first['warmup'])} --samples {int(first['samples'])} --out {shown} --output {shown}.md"


def summary(rows: list[dict], names: list[str]) -> list[str]:
    """Test LPPD per data set, mean over seeds, for each implementation, and whether ours is at least each peer's
    or within the noise floor (our sampler again from the same ensemble: the mean absolute LPPD difference)."""
    table, verdicts = [], []
    kinds = [k for k in ("ours", "authors", "bde", "ours-resampled") if any(r["implementation"] == k for r in rows)]
    for name in names:
        group = [r for r in rows if data_of(r) == name]
        by = {(r["implementation"], int(r["seed"])): r for r in group}
        seeds = sorted({int(r["seed"]) for r in group})
        table.append([name, *(f"{mean(by[(k, s)]['lppd'] for s in seeds if (k, s) in by):.3f}" for k in kinds)])
        floor = [
            abs(float(by[("ours", s)]["lppd"]) - float(by[("ours-resampled", s)]["lppd"]))
            for s in seeds
            if ("ours", s) in by and ("ours-resampled", s) in by
        ]
        ours = [s for s in seeds if ("ours", s) in by]
        for peer in ("authors", "bde"):
            common = [s for s in ours if (peer, s) in by]
            if not common:
                continue
            gap = mean(float(by[("ours", s)]["lppd"]) - float(by[(peer, s)]["lppd"]) for s in common)
            noise = f"{statistics.fmean(floor):.3f}" if floor else "not measured"
            if gap >= 0:
                word = "at least"
            elif not floor:
                word = "below"
            elif -gap <= statistics.fmean(floor):
                word = "below, within the noise floor"
            else:
                word = "below, beyond the noise floor"
            verdicts.append(
                f"- {name}, against {LABELS[peer]}: ours {gap:+.3f} on the mean over seeds "
                f"{', '.join(map(str, common))} ({word}; noise floor {noise})"
            )
    return [
        "Test LPPD, mean over seeds (the target: ours at least each peer's on every data set, or within the "
        "noise floor with the cause of the gap named: see each data set's cross runs):",
        "",
        *markdown_table(["data", *(LABELS[k] for k in kinds)], table, "l" + "r" * len(kinds), compact=True),
        "",
        *verdicts,
    ]


def section(rows: list[dict]) -> list[str]:
    """One data set's tables: timed runs per seed, ratios, verdict, reading (progress bar, cross runs, floor)."""
    seeds = sorted({int(r["seed"]) for r in rows})
    by = {(r["implementation"], int(r["seed"])): r for r in rows}
    present = [k for k in TIMED if any(r["implementation"] == k for r in rows)]
    table = []
    for kind in present:
        runs = [by[(kind, s)] for s in seeds if (kind, s) in by]
        for label, group in [*((str(int(r["seed"])), [r]) for r in runs), ("mean", runs)]:
            table.append(
                [
                    LABELS[kind] if label == "mean" else "",
                    label,
                    *(
                        f"{mean(r[k] for r in group):.1f}"
                        for k in ("fit_wall", "fit_cpu", "compile_s", "ensemble_s", "sampler_s")
                    ),
                    f"{mean(r['lppd'] for r in group):.3f}",
                    f"{mean(r['rmse'] for r in group):.3f}",
                    ("" if label != "mean" else f"{mean(r['process_wall'] for r in group):.1f}"),
                ]
            )
    parts = gap_parts(by, seeds)
    ratio_rows = []
    for mine in ("ours", "ours-quiet"):
        for kind in ("authors", "bde"):
            pairs = [(by[(mine, s)], by[(kind, s)]) for s in seeds if (mine, s) in by and (kind, s) in by]
            if not pairs:
                continue
            wall = [float(o["fit_wall"]) / float(p["fit_wall"]) for o, p in pairs]
            sampler = [float(o["sampler_s"]) / float(p["sampler_s"]) for o, p in pairs]
            dlppd = [float(o["lppd"]) - float(p["lppd"]) for o, p in pairs]
            ratio_rows.append(
                [
                    LABELS[mine],
                    LABELS[kind],
                    ", ".join(f"{w:.2f}" for w in wall),
                    f"{statistics.fmean(wall):.2f}",
                    f"{statistics.fmean(sampler):.2f}",
                    ", ".join(f"{d:+.3f}" for d in dlppd),
                ]
            )
    return [
        *markdown_table(
            [
                "implementation",
                "seed",
                "wall s",
                "CPU s",
                "compile s",
                "ensemble s",
                "sampler s",
                "test LPPD",
                "test RMSE",
                "process wall s",
            ],
            table,
            "llrrrrrrrr",
            compact=True,
        ),
        "",
        "numpyro_mile against each peer, per seed (wall time of the whole fit as above):",
        "",
        *markdown_table(
            [
                "ours",
                "peer",
                "our wall / theirs, per seed",
                "mean",
                "sampler ratio, mean",
                "our LPPD - theirs, per seed",
            ],
            ratio_rows,
            "llllrl",
            compact=True,
        ),
        "",
        *verdict(ratio_rows),
        "",
        *parts,
        "",
        *reading(by, seeds, with_bar=not parts),
    ]


def reading(by: dict, seeds: list[int], with_bar: bool = True) -> list[str]:
    """What the rows say about the progress bar (``with_bar``: when :func:`gap_parts` did not) and the LPPD gap
    (computed from the rows)."""
    pairs = [(by[("ours", s)], by[("ours-quiet", s)]) for s in seeds if ("ours", s) in by and ("ours-quiet", s) in by]
    pairs = pairs if with_bar else []
    lines = []
    if pairs:
        on, off = mean(o["fit_wall"] for o, _ in pairs), mean(q["fit_wall"] for _, q in pairs)
        lines.append(
            f"NumPyro's progress bar: the README path takes {on / off:.2f}x the wall time of the same run with "
            f"`progress_bar=False` ({on:.1f} against {off:.1f} s, the same draws): for `vectorized` chains NumPyro "
            "launches the compiled step from Python once per step, and a launch of a step split over two CPU devices "
            "costs about a millisecond (`defaults.md`). The peers compile their whole loops and update their bars "
            "from inside them."
        )
    peers = [k for k in ("authors", "bde") if any((k, s) in by for s in seeds)]
    gaps = [
        float(by[("ours", s)]["lppd"]) - float(by[(k, s)]["lppd"])
        for k in peers
        for s in seeds
        if ("ours", s) in by and (k, s) in by
    ]
    floor = [
        (s, float(by[("ours", s)]["lppd"]), float(by[("ours-resampled", s)]["lppd"]))
        for s in seeds
        if ("ours", s) in by and ("ours-resampled", s) in by
    ]
    if floor:
        lines += [
            "",
            "Noise floor: our MILE run again from the same ensemble with another key gives test LPPD "
            + ", ".join(f"{b:.3f} against {a:.3f} (seed {s})" for s, a, b in floor)
            + f": a mean absolute difference of {statistics.fmean(abs(a - b) for _, a, b in floor):.3f}.",
        ]
    crossed = cross_table(by, seeds)
    if crossed:
        lines += ["", *crossed]
    elif gaps and max(gaps) < 0:
        lines += [
            "",
            "Test LPPD: numpyro_mile is below both peers on every seed at this budget (differences in the "
            "table above); the cross runs (`--only authors ours authors-sampler ours-authors-ensemble`) "
            "say whether the ensemble or the sampler makes the gap. At the paper's budget (50,000 + 10,000 "
            "steps) see `uci_paper/results.md`.",
        ]
    return lines


#: (ensemble, sampler) -> the kind whose rows hold that combination
CROSS = {
    ("ours", "ours"): "ours",
    ("ours", "authors"): "authors-sampler",
    ("authors", "authors"): "authors",
    ("authors", "ours"): "ours-authors-ensemble",
}


def cross_table(by: dict, seeds: list[int]) -> list[str]:
    """Test LPPD of each (deep ensemble, sampler) combination, per seed and mean, and what differs: the cross
    runs start one implementation's sampler from the other's ensemble of the same seed."""
    complete = [s for s in seeds if all((kind, s) in by for kind in CROSS.values())]
    if not complete:
        return []

    def lppd(ensemble, sampler, group=complete):
        return [float(by[(CROSS[(ensemble, sampler)], s)]["lppd"]) for s in group]

    names = {"ours": "numpyro_mile's", "authors": "the authors'"}
    rows = [
        [
            f"{names[e]} ensemble",
            *(
                ", ".join(f"{v:.3f}" for v in lppd(e, m)) + f" (mean {mean(lppd(e, m)):.3f})"
                for m in ("ours", "authors")
            ),
        ]
        for e in ("ours", "authors")
    ]
    sampler_effect = [o - a for e in ("ours", "authors") for o, a in zip(lppd(e, "ours"), lppd(e, "authors"))]
    ensemble_effect = [o - a for m in ("ours", "authors") for o, a in zip(lppd("ours", m), lppd("authors", m))]
    return [
        f"Where the LPPD gap comes from (seeds {', '.join(map(str, complete))}): each sampler started from each "
        "implementation's deep ensemble of the same seed (the cross runs: `authors-sampler` is the authors' tuning "
        "and sampling code from our members, `ours-authors-ensemble` our MILE from their members; their times are "
        "not a user's run and are left out above). Test LPPD per seed:",
        "",
        *markdown_table(["ensemble", "numpyro_mile's sampler", "the authors' sampler"], rows, "lll", compact=True),
        "",
        f"Our sampler minus theirs, from the same ensemble: {statistics.fmean(sampler_effect):+.3f} on average "
        f"(from {min(sampler_effect):+.3f} to {max(sampler_effect):+.3f}); our ensemble minus theirs, under the same "
        f"sampler: {statistics.fmean(ensemble_effect):+.3f} (from {min(ensemble_effect):+.3f} to "
        f"{max(ensemble_effect):+.3f}).",
    ]


def verdict(ratio_rows: list[list]) -> list[str]:
    """The headline: the README path (progress bar on) against each peer, wall time and LPPD; the target is bde's
    wall time or less at a test LPPD no lower than bde's."""
    rows = [r for r in ratio_rows if r[0] == LABELS["ours"]]
    if not rows:
        return []
    dlppd = {r[1]: statistics.fmean(float(d) for d in r[5].split(", ")) for r in rows}  # peer -> mean LPPD gap
    lines = [
        f"{r[3]}x the wall time of {r[1]} at a test LPPD {dlppd[r[1]]:+.3f} from theirs (means over seeds)"
        for r in rows
    ]
    bde = [r for r in rows if r[1] == LABELS["bde"]]
    met = bool(bde) and float(bde[0][3]) <= 1.0 and dlppd[bde[0][1]] >= 0
    return [
        "Verdict: the target (the README path at most bde's wall time, at a test LPPD no lower than bde's) is "
        f"{'met' if met else 'missed'}. On the README path our fit takes " + "; ".join(lines) + "."
    ]


def gap_parts(by: dict, seeds: list[int]) -> list[str]:
    """Where the README path's wall time differs from bde's, means over the seeds with all three rows: NumPyro's
    progress bar (its per-step launches and the second compile of its per-step program: the README path minus the
    same run with ``progress_bar=False``) and the rest (ensemble, compilation, sampling: the quiet run minus bde)."""
    common = [s for s in seeds if all((k, s) in by for k in ("ours", "ours-quiet", "bde"))]
    if not common:
        return []

    def avg(kind, field):
        return statistics.fmean(float(by[(kind, s)].get(field) or 0) for s in common)

    bar = avg("ours", "fit_wall") - avg("ours-quiet", "fit_wall")
    steps = avg("ours", "warmup") + avg("ours", "samples")
    loop_s, loop_n = avg("ours", "loop_compile_s"), avg("ours", "loop_compiles")
    second = loop_s * (loop_n - 1) / loop_n if loop_n > 1 else 0.0
    rest = avg("ours-quiet", "fit_wall") - avg("bde", "fit_wall")
    ensemble = avg("ours-quiet", "ensemble_s") - avg("bde", "ensemble_s")
    compiled = avg("ours-quiet", "compile_s") - avg("bde", "compile_s")
    return [
        f"Where the README path's wall time differs from bde's ({avg('ours', 'fit_wall'):.1f} against "
        f"{avg('bde', 'fit_wall'):.1f} s, {avg('ours', 'fit_wall') - avg('bde', 'fit_wall'):+.1f} s; means over seeds "
        f"{', '.join(map(str, common))}):",
        "",
        f"- NumPyro's progress bar: {bar:+.1f} s (the README path against the same run with `progress_bar=False`). "
        f"Of it, {second:.1f} s is a second compile of NumPyro's per-step program (compiled {loop_n:.0f} times, "
        f"{loop_s:.1f} s in all): after the first step NumPyro's own loop scalars come back placed on the chains' "
        f"two devices, a new signature for its jitted step. The other {bar - second:.1f} s are its launches, "
        f"{(bar - second) / steps * 1e3:.2f} ms per step: for `vectorized` chains NumPyro launches the compiled "
        "step from Python once per step, and a launched step split over two CPU devices costs more than the same "
        "step inside one compiled loop. (MILE keeps its step's working memory, Phase III's stored positions and "
        "the ESS's arrays included, small enough for the C library to reuse from launch to launch: a large one "
        "is mapped afresh at every launch, a page fault for each page the step touches.)",
        f"- Everything else (the quiet run against bde): {rest:+.1f} s, of which ensemble {ensemble:+.1f} s and "
        f"trace + compile {compiled:+.1f} s; the remainder, {rest - ensemble - compiled:+.1f} s, is sampling, "
        "imports and set-up.",
        "",
        "What would close the bar's share: NumPyro running `vectorized` chains through its compiled progress-bar "
        "loop, as it does for `parallel` chains (one launch per run, not per step), and creating its loop scalars "
        "where its step places its outputs (one compile). Neither is in a kernel's hands: NumPyro picks the loop "
        "and places its own scalars. Until then a user who wants the quiet row's time keeps NumPyro's API with "
        "`progress_bar=False`, or gets a bar from `numpyro_mile.run_chunked` (its progress comes from inside "
        "compiled chunks) or the scikit-learn estimators (`estimators.md`).",
    ]


def save(results: Path, rows: list[dict]) -> None:
    """``rows`` into ``results``, replacing the rows of the same data set, implementation and seed."""
    results.parent.mkdir(parents=True, exist_ok=True)
    new = {(data_of(r), r["implementation"], int(r["seed"])) for r in rows}
    old = [
        {**r, "data": data_of(r)}
        for r in read_csv(results, missing_ok=True)
        if (data_of(r), r["implementation"], int(r["seed"])) not in new
    ]
    write_csv(results, old + rows, FIELDS, float_format=".6g")


def main(argv=None) -> None:
    parser = argument_parser(__doc__)
    add_common_options(
        parser,
        out_dir=OUT,
        output=PAGE,
        no_write="print the page only",
        render_only="rewrite the page from results.csv",
    )
    parser.add_argument("--authors", type=Path, help="checkout of github.com/EmanuelSommer/MILE")
    parser.add_argument(
        "--bde",
        help="'pypi' (the package index, sklearn-contrib-bde) or a checkout of github.com/scikit-learn-contrib/bde",
    )
    parser.add_argument("--data", nargs="+", default=["airfoil"], help="UCI data sets of the authors' data/ folder")
    parser.add_argument(
        "--venvs",
        type=Path,
        default=Path.home() / ".cache" / "numpyro_mile" / "peers",
        help="where the peers' virtualenvs are built (once per checkout commit)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--chains", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=2_000)
    parser.add_argument("--thinning", type=int, default=10)
    parser.add_argument("--devices", type=int, default=os.cpu_count() or 1, help="devices (cores) for everyone")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=IMPLEMENTATIONS,
        default=list(IMPLEMENTATIONS),
        help="implementations to run (results of the others are kept in results.csv)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    results = out / "results.csv"
    if args.render_only:
        text = render(read_csv(results), out)
    else:
        if args.authors is None:
            parser.error("--authors CHECKOUT is needed: the authors' data loader makes the split everyone uses")
        pythons = {
            "authors": environment("authors", args.authors, args.venvs),
            "ours": Path(sys.executable),
            "ours-quiet": Path(sys.executable),
            "ours-authors-ensemble": Path(sys.executable),
        }
        pythons["authors-sampler"] = pythons["authors"]
        pythons["split"] = pythons["authors"]
        checkouts = {
            "authors": args.authors,
            "bde": args.bde,
            "ours": ROOT,
            "ours-quiet": ROOT,
            "authors-sampler": args.authors,
            "ours-authors-ensemble": ROOT,
            "ours-resampled": ROOT,
        }
        pythons["ours-resampled"] = Path(sys.executable)
        if "bde" in args.only:
            if args.bde is None:
                parser.error("--bde CHECKOUT is needed (or leave bde out with --only)")
            pythons["bde"] = environment("bde", args.bde, args.venvs)
        rows = []
        with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
            for name in args.data:
                for seed in args.seeds:
                    work = Path(tmp) / name / f"seed{seed}"
                    settings = dict(
                        data=name,
                        seed=seed,
                        chains=args.chains,
                        warmup=args.warmup,
                        samples=args.samples,
                        thinning=args.thinning,
                        devices=args.devices,
                        checkout=str(args.authors.resolve()),
                        split=str(work / "split" / "split.npz"),
                    )
                    run_one("split", pythons["split"], settings, work / "split")
                    for kind in (k for k in IMPLEMENTATIONS if k in args.only):
                        row = run_one(kind, pythons[kind], settings, work / kind)
                        row["commit"] = git_commit(checkouts[kind])
                        rows.append(row)
                        print(
                            f"{name} seed {seed} {kind}: wall {row['fit_wall']:.1f} s, compile "
                            f"{row['compile_s']:.1f} s, LPPD {row['lppd']:.3f}, RMSE {row['rmse']:.3f}",
                            file=sys.stderr,
                            flush=True,
                        )
                        if not args.no_write:  # after every run: an interrupted invocation keeps what it measured
                            save(results, [row])
        text = render(
            read_csv(results) if not args.no_write else [{k: str(v) for k, v in r.items()} for r in rows], out
        )
    print(text)
    if not args.no_write:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
