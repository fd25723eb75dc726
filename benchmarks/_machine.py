"""Kept for the scripts that import it: the machine description now lives in ``_common``."""

from _common import cpu_model  # noqa: F401  (benchmarks/ is on sys.path when a script runs)
