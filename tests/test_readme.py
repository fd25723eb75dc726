"""The README's Python blocks run as pasted: top to bottom in one namespace, as a newcomer pastes them into one
session (issue #29). Budgets are capped (``num_warmup`` <= 200, ``num_samples`` <= 200) so that the whole page runs
in CI; the README says so."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
CAPS = {"num_warmup": 200, "num_samples": 200}


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def capped(code: str) -> str:
    def cap(match):
        value = int(match.group(2).replace("_", ""))
        return f"{match.group(1)}={min(value, CAPS[match.group(1)])}"

    return re.sub(r"\b(num_warmup|num_samples)=([\d_]+)", cap, code)


def test_capping_keeps_small_budgets_and_shrinks_large_ones():
    assert capped("f(num_warmup=50_000, num_samples=20, thinning=10)") == "f(num_warmup=200, num_samples=20, thinning=10)"


@pytest.mark.filterwarnings("ignore")
def test_readme_python_blocks_run_in_order(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 7
    monkeypatch.chdir(tmp_path)  # the checkpoint block writes run.ckpt here
    namespace: dict = {}
    for number, block in enumerate(blocks, 1):
        try:
            exec(compile(capped(block), f"README.md python block {number}", "exec"), namespace)  # noqa: S102
        except Exception as err:  # say which block failed, with its text
            raise AssertionError(f"README python block {number} failed:\n{block}") from err
    assert namespace["idata"] is not None and namespace["cost"].predicted_seconds > 0
