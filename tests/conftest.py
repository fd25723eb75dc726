"""Test session setup: one JAX persistent compilation cache for the whole session.

Many tests compile the same programs (the same toy models and shapes, NumPyro's sampling loop that
it re-compiles on every ``MCMC.run``); with the cache, a program is compiled once per session and
read back afterwards, in this process and in the subprocesses that tests start (the environment
variables are inherited). A fresh folder per session: nothing is reused from an earlier one.

The suite runs on every core with pytest-xdist (``-n auto`` in ``pyproject.toml``): each worker caches in
its own subfolder of the controller's folder (JAX does not write entries atomically: two workers sharing one
entry crashed a worker), which the controller removes at the end (a worker removes only the unused folder it
made itself).
"""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE = tempfile.mkdtemp(prefix="numpyro-mile-tests-jax-cache-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one subfolder per worker: JAX writes cache entries in place, and a worker that read an entry another worker
    # was writing crashed (a segfault in compilation_cache.get_executable_and_time, twice in full runs)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
        os.environ["JAX_COMPILATION_CACHE_DIR"].split(os.sep + "worker-")[0],
        "worker-" + os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(os.environ["JAX_COMPILATION_CACHE_DIR"], exist_ok=True)

import jax  # noqa: E402  (after the environment: JAX reads it when its configuration is created)

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
# off for the test processes themselves: a worker segfaulted reading an entry in every full run of 2026-12-03
# (test_smile::test_tuner_rules), with shared and with per-worker folders; tests of the cache enable their own
jax.config.update("jax_enable_compilation_cache", False)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # subprocesses that tests start (several CPU devices, other flags) do not share the worker's folder: a worker
    # segfaulted reading an entry of the same program (test_smile::test_tuner_rules) with per-worker folders too
    del os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)
