"""The README's Python blocks run as pasted: top to bottom in one namespace, as a newcomer pastes them into one
session. Budgets are capped (``num_warmup`` <= 200, ``num_samples`` <= 200, the estimators' default budget too;
``num_samples`` <= 50 inside a ``bde(...)`` call, whose NUTS runs up to 1,023 leapfrog steps per draw on an MLP) so
that the page runs in CI; the README says so."""

import os
import re
from pathlib import Path

import pytest

from numpyro_mile import estimators

README = Path(__file__).resolve().parent.parent / "README.md"
CAPS = {"num_warmup": 200, "num_samples": 200}
BDE_CAPS = {"num_samples": 50}  # inside a bde(...) call
BUDGET = re.compile(r"\b(num_warmup|num_samples)=([\d_]+)")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def capped(code: str) -> str:
    def cap(match, caps=CAPS):
        value = int(match.group(2).replace("_", ""))
        return f"{match.group(1)}={min(value, caps.get(match.group(1), CAPS[match.group(1)]))}"

    def cap_bde_call(match):  # a bde(...) call, up to its closing parenthesis (no nested calls with budgets)
        return BUDGET.sub(lambda m: cap(m, BDE_CAPS), match.group(0))

    code = re.sub(r"\bbde\((?:[^()]|\([^()]*\))*\)", cap_bde_call, code)
    return BUDGET.sub(cap, code)


def test_capping_keeps_small_budgets_and_shrinks_large_ones():
    assert (
        capped("f(num_warmup=50_000, num_samples=20, thinning=10)") == "f(num_warmup=200, num_samples=20, thinning=10)"
    )
    assert (
        capped(
            "x = bde(m, p, X, key=jax.random.PRNGKey(3),\n  num_warmup=100, num_samples=200)\ny = f(num_samples=200)"
        )
        == "x = bde(m, p, X, key=jax.random.PRNGKey(3),\n  num_warmup=100, num_samples=50)\ny = f(num_samples=200)"
    )


@pytest.mark.filterwarnings("ignore")
def test_readme_python_blocks_run_in_order(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)  # nothing of a block lands in the checkout
    # the first block sets NumPyro's host device count (XLA_FLAGS): restored afterwards, for the tests that follow
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    # the estimators' default budget, capped like the explicit ones (4 chains kept: the example's shape)
    monkeypatch.setitem(estimators.BUDGETS, "quick", (4, CAPS["num_warmup"], CAPS["num_samples"], 10))
    namespace: dict = {}
    for number, block in enumerate(blocks, 1):
        try:
            exec(compile(capped(block), f"README.md python block {number}", "exec"), namespace)  # noqa: S102
        except Exception as err:  # say which block failed, with its text
            raise AssertionError(f"README python block {number} failed:\n{block}") from err
    assert namespace["idata"] is not None and namespace["reg"].samples_["w0"].shape[0] > 0
