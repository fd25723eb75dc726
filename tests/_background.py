"""Subprocess checks that run on a spare core while the rest of the suite runs.

Some tests start Python subprocesses (the examples' smoke runs, the multi-device and two-process
runs) that spend most of their time in JAX compilation, which is single-threaded, while the test
process itself mostly compiles on one core too. A test module lists such jobs in a module-level
``BACKGROUND_JOBS`` dict: the name of the test (``item.name``, with its parameters) or of the
fixture that needs the job -> a callable without arguments that returns what the test checks.
When collection is done, ``conftest.py`` submits the jobs that a selected test needs, in file
order, to ``cpu_count - 1`` worker threads (at least one), and the tests take the results with
``result(BACKGROUND_JOBS[name])``. A job that was never submitted runs in the test that asks for
it. Jobs only compute: the tests make the assertions, so a failure is reported where it belongs.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

#: XLA without LLVM optimisation passes, for subprocesses whose time is mostly compiling (smoke runs, the
#: multi-device checks): the examples' smoke runs took 30-40 % less CPU time with it
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

_pool: ThreadPoolExecutor | None = None
_futures: dict[Callable[[], Any], Future] = {}


def submit(job: Callable[[], Any]) -> None:
    """Queue ``job`` (once: a job already queued is not queued again)."""
    global _pool
    if _pool is None:
        workers = max(1, (os.cpu_count() or 2) - 1)
        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="background-check")
    if job not in _futures:
        _futures[job] = _pool.submit(job)


def result(job: Callable[[], Any]) -> Any:
    """What ``job`` returned: waits for it if it was queued, else runs it now."""
    future = _futures.get(job)
    return job() if future is None else future.result()


def shutdown() -> None:
    """Drop the jobs not started yet and wait for the running ones (before the session's files go)."""
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
