"""Shared pieces of the benchmark scripts: machine description, load, timing, compile clock, reports.

``benchmarks/`` is on ``sys.path`` when a script in it runs, so scripts import this as ``_common``.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "uci"

#: the JAX monitoring events that make up "trace + compile" time
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo; ``platform.processor()`` or the architecture elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def commit() -> str:
    """``<short hash> <subject>`` of the repository's HEAD (plus ``+ uncommitted changes``), or ``unknown``."""
    try:
        head = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_lines() -> list[str]:
    """Markdown bullet lines describing the machine and the software versions."""
    import jax
    import jaxlib
    import numpyro

    try:
        import blackjax
        bj = blackjax.__version__
    except ImportError:  # pragma: no cover
        bj = "not installed"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"- CPU: {cpu_model()}; os.cpu_count(): {os.cpu_count()} (usable by this process: {usable})",
        f"- python {platform.python_version()}; jax / jaxlib {jax.__version__} / {jaxlib.__version__}; "
        f"numpyro {numpyro.__version__}; blackjax {bj}",
        f"- jax.default_backend(): {jax.default_backend()}; devices: "
        f"{', '.join(f'{d.platform}:{d.id}' for d in jax.devices())}",
        f"- repository commit: {commit()}",
    ]


class Timing(NamedTuple):
    """Wall time and process CPU time of one call, in seconds."""

    wall: float
    cpu: float


def timed(fn: Callable, *args, **kwargs) -> tuple[object, Timing]:
    """``fn(*args, **kwargs)`` (blocked until ready) and its wall and process CPU time."""
    import jax

    wall, cpu = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, Timing(time.perf_counter() - wall, time.process_time() - cpu)


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


def command_line() -> str:
    """The command that ran this script, relative to the repository root."""
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def markdown_table(header: list[str], rows: list[list], align: str | None = None) -> list[str]:
    """A markdown table; ``align`` is one character per column (``l`` or ``r``; default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows]
