"""Test session setup: JAX's compiled programs are freed after every test module.

Every compiled XLA:CPU program keeps its own memory mappings until JAX drops it from its caches, and the
suite compiles thousands (each toy model, shape and setting; NumPyro's sampling loop on every ``MCMC.run``).
An xdist worker that runs half the suite passed Linux's limit of 65,530 mappings per process
(``vm.max_map_count``): LLVM then failed with "Cannot allocate memory" or the worker segfaulted, in the
next test that compiled something (``tests/test_smile.py::test_tuner_rules`` in every full run of
2026-12-03). Measured with ``tests/test_mile.py`` + ``tests/test_smile.py`` in one process: 23,592 mappings
at the end without clearing, 1,508 with it, the same wall time (216 vs 218 s).

JAX's persistent compilation cache stays off in the test processes (its own tests turn it on in a
subprocess): the full suite took 792 s on 2 workers without it (2-core machine, 2026-12-03), less than
the 846 s recorded with it before.
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
