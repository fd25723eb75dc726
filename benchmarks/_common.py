"""Shared pieces of the benchmark scripts: machine description, load, timing, compile clock, options, reports.

``benchmarks/`` is on ``sys.path`` when a script in it runs, so scripts import this as ``_common``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "uci"

#: the JAX monitoring events that make up "trace + compile" time
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


# ============================================================================ kernels
KERNELS = ("MILE", "SGLD", "ICSGLD", "SMILE")


def make_kernel(name: str):
    """One of ``KERNELS`` on ``mlp_regression`` with the settings the benchmarks give each: MILE and SMILE with their
    defaults (pretraining without a progress bar), SGLD and ICSGLD with step size 1e-4 (ICSGLD: 50 energy bins of
    width 5 from 0, zeta 0.75). The minibatch kernels take ``subsample_size`` at ``MCMC.run``."""
    import numpyro_mile
    from numpyro_mile.models import mlp_regression

    quiet = dict(progress_bar=False)
    if name == "SGLD":
        return numpyro_mile.SGLD(mlp_regression, 1e-4)
    if name == "ICSGLD":
        return numpyro_mile.ICSGLD(mlp_regression, 1e-4, zeta=0.75, num_bins=50, bin_width=5.0, min_energy=0.0)
    if name == "SMILE":
        return numpyro_mile.SMILE(mlp_regression, ensemble_options=quiet)
    if name == "MILE":
        return numpyro_mile.MILE(mlp_regression, ensemble_options=quiet)
    raise ValueError(f"unknown kernel {name!r}; one of {KERNELS}")


# ============================================================================ machine
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo; ``platform.processor()`` or the architecture elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def total_memory() -> str:
    """The machine's memory from /proc/meminfo (``"23.5 GiB"``), or ``unknown``."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    return "unknown"


def usable_cores() -> int:
    """The cores this process may run on (``os.cpu_count()`` where the OS does not say)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load_average() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def load_span(start: float, end: float) -> str:
    """``Load average (1 min) <start> at the start and <end> at the end`` (one decimal each)."""
    return f"Load average (1 min) {start:.1f} at the start and {end:.1f} at the end"


def commit() -> str:
    """``<short hash> <subject>`` of the repository's HEAD (plus ``+ uncommitted changes``), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "log", "-1", "--format=%h %s"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return head + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hardware_info() -> dict:
    """The machine without the software: ``cpu``, ``cores``, ``usable cores``, ``memory`` (imports no JAX)."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "usable cores": usable_cores(), "memory": total_memory()}


def machine_info() -> dict:
    """:func:`hardware_info` plus the software: Python, jax, jaxlib, numpyro, blackjax versions, JAX's backend,
    device kind and devices, and the repository commit."""
    import jax
    import jaxlib
    import numpyro

    try:
        import blackjax

        bj = blackjax.__version__
    except ImportError:  # pragma: no cover
        bj = "not installed"
    return {
        **hardware_info(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpyro": numpyro.__version__,
        "blackjax": bj,
        "jax backend": jax.default_backend(),
        "device kind": jax.devices()[0].device_kind,
        "devices": ", ".join(f"{d.platform}:{d.id}" for d in jax.devices()),
        "commit": commit(),
    }


def machine_summary(info: dict | None = None, *, software: bool = True) -> str:
    """One line: ``CPU, n cores (u usable), memory RAM``, then (``software=True``; imports JAX) ``; JAX backend b
    (device kind); Python x, jax x, numpyro x, blackjax x``. ``info``: a :func:`machine_info` dict to describe."""
    info = info or (machine_info() if software else hardware_info())
    line = f"{info['cpu']}, {info['cores']} cores ({info['usable cores']} usable), {info['memory']} RAM"
    if software:
        line += (
            f"; JAX backend {info['jax backend']} ({info['device kind']}); Python {info['python']}, "
            f"jax {info['jax']}, numpyro {info['numpyro']}, blackjax {info['blackjax']}"
        )
    return line


def machine_lines(info: dict | None = None) -> list[str]:
    """Markdown bullet lines describing the machine and the software versions."""
    info = info or machine_info()
    return [
        f"- CPU: {info['cpu']}; os.cpu_count(): {info['cores']} (usable by this process: {info['usable cores']})",
        f"- python {info['python']}; jax / jaxlib {info['jax']} / {info['jaxlib']}; numpyro {info['numpyro']}; "
        f"blackjax {info['blackjax']}",
        f"- jax.default_backend(): {info['jax backend']}; devices: {info['devices']}",
        f"- repository commit: {info['commit']}",
    ]


# ============================================================================ timing
class Timing(NamedTuple):
    """Wall time and process CPU time of one call, in seconds (compares by wall time first)."""

    wall: float
    cpu: float


class Stopwatch:
    """Wall and process CPU seconds of a ``with`` block: ``.wall``, ``.cpu`` and ``.timing`` once it ends.

    It does not wait for JAX: block on the block's results inside it."""

    def __enter__(self) -> "Stopwatch":
        self._start = Timing(time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._start.wall
        self.cpu = time.process_time() - self._start.cpu

    @property
    def timing(self) -> Timing:
        return Timing(self.wall, self.cpu)


def timed(fn: Callable, *args, **kwargs) -> tuple[object, Timing]:
    """``fn(*args, **kwargs)`` (blocked until ready) and its wall and process CPU time."""
    import jax

    with Stopwatch() as clock:
        out = jax.block_until_ready(fn(*args, **kwargs))
    return out, clock.timing


def finished(mcmc):
    """``mcmc`` once its draws are computed (``MCMC.run`` returns while the computation still runs)."""
    import jax

    jax.block_until_ready(mcmc.get_samples())
    return mcmc


def fastest(calls: Sequence[Callable[[], object]], rounds: int) -> list[Timing]:
    """The fastest :class:`Timing` (by wall time) of each call over ``rounds`` rounds that run every call in turn,
    each blocked until ready, so that a change of the machine's load hits every call alike."""
    best: list[Timing | None] = [None] * len(calls)
    for _ in range(rounds):
        for j, call in enumerate(calls):
            _, t = timed(call)
            if best[j] is None or t < best[j]:
                best[j] = t
    return best


def compile_ahead(fn: Callable, *example) -> tuple[Callable, float]:
    """``jax.jit(fn).lower(*example).compile()`` and the wall seconds it took."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*example).compile()
    return compiled, time.perf_counter() - start


class CompileClock:
    """Sums the tracing, lowering and XLA compile (wall) time JAX reports while measuring."""

    _instance = None

    def __init__(self):
        import jax

        self.seconds = {event: 0.0 for event in COMPILE_EVENTS}
        self.compiled: list[tuple[str, float]] = []
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self)

    @classmethod
    def get(cls) -> "CompileClock":
        """The process's one clock (JAX listeners cannot be removed, so one is registered)."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __call__(self, event, duration, **kwargs):
        if self.active and event in self.seconds:
            self.seconds[event] += duration
            if event == COMPILE_EVENTS[-1]:
                self.compiled.append((kwargs.get("fun_name", "?"), duration))

    @contextlib.contextmanager
    def measure(self):
        self.seconds = {event: 0.0 for event in COMPILE_EVENTS}
        self.compiled, self.active = [], True
        try:
            yield self
        finally:
            self.active = False

    @property
    def total(self) -> float:
        """Trace + lower + XLA compile seconds."""
        return sum(self.seconds.values())

    def parts(self) -> dict:
        """``{"trace": s, "lower": s, "compile": s, "count": n}``."""
        trace, lower, backend = (self.seconds[e] for e in COMPILE_EVENTS)
        return {"trace": trace, "lower": lower, "compile": backend, "count": len(self.compiled)}

    def largest(self, n: int = 4) -> str:
        """The ``n`` longest XLA compilations, ``name s`` each."""
        top = sorted(self.compiled, key=lambda x: -x[1])[:n]
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in top) or "none"


# ============================================================================ command line
def data_dir(arg: str | os.PathLike | None = None) -> Path:
    """The UCI data folder: ``arg``, else ``$NUMPYRO_MILE_DATA``, else ``../shared/data/uci`` (:data:`DEFAULT_DATA`)."""
    if arg:
        return Path(arg)
    return Path(os.environ.get("NUMPYRO_MILE_DATA") or DEFAULT_DATA)


def argument_parser(doc: str, *, whole_doc: bool = False) -> argparse.ArgumentParser:
    """A parser described by the docstring's first paragraph (``whole_doc``: all of it, as written)."""
    if whole_doc:
        return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def add_common_options(
    parser: argparse.ArgumentParser,
    *,
    data: str | None = None,
    output: Path | None = None,
    out_dir: Path | None = None,
    no_write: str | None = None,
    render_only: str | None = None,
) -> argparse.ArgumentParser:
    """The options the scripts share, each added where its argument is given:

    - ``data``: ``--data DIR``, the folder with the files named by ``data`` (default ``None``: resolve it with
      :func:`data_dir`);
    - ``output``: ``--output FILE``, the report, default ``output``;
    - ``out_dir``: ``--out DIR``, the folder of the results, default ``out_dir``;
    - ``no_write``: ``--no-write``, with ``no_write`` as its help (what the script does instead);
    - ``render_only``: ``--render-only``, with ``render_only`` as its help (what it renders from what).
    """
    if data is not None:
        parser.add_argument(
            "--data", default=None, help=f"folder with {data} (default: $NUMPYRO_MILE_DATA, else ../shared/data/uci)"
        )
    if output is not None:
        parser.add_argument("--output", default=str(output), help=f"the report (default {_shown(output)})")
    if out_dir is not None:
        parser.add_argument("--out", default=str(out_dir), help=f"output folder (default {_shown(out_dir)})")
    if no_write is not None:
        parser.add_argument("--no-write", action="store_true", help=no_write)
    if render_only is not None:
        parser.add_argument("--render-only", action="store_true", help=render_only)
    return parser


def _shown(path: Path) -> str:
    """``path`` relative to the repository root where it is inside it."""
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


def command_line(script: str | os.PathLike | None = None, argv: Sequence[str] | None = None) -> str:
    """``python <script> <argv>`` with the script relative to the repository root (default: this process's
    ``sys.argv``; pass ``__file__`` and ``main``'s ``argv`` where ``main`` may be called from Python)."""
    script = sys.argv[0] if script is None else script
    argv = sys.argv[1:] if argv is None else argv
    return "python " + " ".join(shlex.quote(str(a)) for a in [os.path.relpath(script, ROOT), *argv])


# ============================================================================ reports
def markdown_table(
    header: list[str], rows: list[list], align: str | None = None, *, compact: bool = False
) -> list[str]:
    """A markdown table; ``align`` is one character per column (``l`` or ``r``; default: first left, rest right).

    ``compact``: the rule row without spaces (``|---|---:|``), as most pages have it."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    rule_line = "|" + "|".join(rule) + "|" if compact else "| " + " | ".join(rule) + " |"
    return ["| " + " | ".join(header) + " |", rule_line] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_csv(path: str | os.PathLike, *, missing_ok: bool = False) -> list[dict]:
    """The rows of a CSV file as dicts of strings (``missing_ok``: ``[]`` when the file does not exist)."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _csv_row(row: dict, fields: Sequence[str], float_format: str | None) -> dict:
    return {
        k: (format(row[k], float_format) if float_format and isinstance(row.get(k), float) else row.get(k, ""))
        for k in fields
    }


def write_csv(
    path: str | os.PathLike, rows: list[dict], fields: Sequence[str], *, float_format: str | None = None
) -> None:
    """``rows`` as a CSV file with the columns ``fields`` (a missing value blank, other keys dropped); floats
    written with ``float_format`` (e.g. ``".6g"``) where given."""
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(_csv_row(r, fields, float_format) for r in rows)


def append_csv(
    path: str | os.PathLike, rows: list[dict], fields: Sequence[str], *, float_format: str | None = None
) -> None:
    """Append ``rows`` to a CSV file (the header first when the file is new); a file written with another column
    list (an older version of the script) is rewritten first with ``fields`` (values it lacks blank)."""
    path = Path(path)
    if path.exists():
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header, old = reader.fieldnames, list(reader)
        if header != list(fields):
            write_csv(path, old, fields)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        if new:
            writer.writeheader()
        writer.writerows(_csv_row(r, fields, float_format) for r in rows)


def commands(out: Path, command: str | None = None) -> list[str]:
    """The commands that wrote ``out/results.csv`` (``out/commands.txt``, in order; ``command`` appended if new)."""
    path = out / "commands.txt"
    known = path.read_text().splitlines() if path.exists() else []
    if command and command not in known:
        known.append(command)
        path.write_text("\n".join(known) + "\n")
    return known
