"""Test session setup: JAX's compiled programs are freed after every test module.

Every compiled XLA:CPU program keeps its own memory mappings until JAX drops it from its caches, and the
suite compiles thousands (each toy model, shape and setting; NumPyro's sampling loop on every ``MCMC.run``).
An xdist worker that runs half the suite can pass Linux's limit of mappings per process
(``vm.max_map_count``, 65,530 by default): LLVM then fails with "Cannot allocate memory" or the worker
segfaults in the next test that compiles something. Clearing JAX's caches after each module keeps the
mappings far below the limit at no cost in wall time.

JAX's persistent compilation cache stays off in the test processes (its own tests turn it on in a
subprocess, the estimator checks for their module): on the whole suite it did not pay for its writes.
"""

from __future__ import annotations

import gc

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop JAX's compiled programs after each test module (see the module docstring)."""
    yield
    jax.clear_caches()
    gc.collect()
