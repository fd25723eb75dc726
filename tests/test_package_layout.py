"""The package's layering (docs/architecture.md): imports run one way, the public API is one __all__."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpyro_mile

PACKAGE = Path(numpyro_mile.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """``{module: package modules it imports}`` and the imports made inside functions or classes."""
    graph, nested = {}, []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        deps = set()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            targets = [target] if node.module else []
            targets += [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            for t in targets:
                if t in modules and t != name:
                    deps.add(t)
                    if id(node) not in top_level:
                        nested.append((name, t, node.lineno))
        graph[name] = deps
    return graph, nested


def test_imports_run_one_way():
    graph, nested = _imports(_modules())
    # nothing imports the package root (e.g. for __version__: numpyro_mile._version)
    assert [name for name, deps in graph.items() if "numpyro_mile" in deps and name != "numpyro_mile"] == []
    # no import inside a function working around the layering
    assert nested == []
    # no cycle
    state: dict[str, int] = {}

    def visit(name, stack):
        state[name] = 1
        for dep in graph[name]:
            if dep == "numpyro_mile":
                continue
            assert state.get(dep) != 1, f"import cycle: {' -> '.join(stack[stack.index(dep) :] + [dep])}"
            if dep not in state:
                visit(dep, stack + [dep])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    # runs/ (checkpoints, chunked and distributed drivers) is a top layer: below the package root, the command
    # line and the scikit-learn estimators (applications over the whole package), no module outside it imports it
    # (inference_data and runs/
    # used to import each other's modules)
    assert (
        sorted(
            name
            for name, deps in graph.items()
            if name not in ("numpyro_mile", "numpyro_mile.cli", "numpyro_mile.estimators")
            and not name.startswith("numpyro_mile.runs")
            and any(d.startswith("numpyro_mile.runs") for d in deps)
        )
        == []
    )


def test_public_api_is_one_all():
    for name in numpyro_mile.__all__:
        assert hasattr(numpyro_mile, name), name
    assert len(set(numpyro_mile.__all__)) == len(numpyro_mile.__all__)
    for name in (
        "MILE",
        "SGLD",
        "ICSGLD",
        "deep_ensemble",
        "bde",
        "predict",
        "log_likelihood",
        "to_inference_data",
        "importance_weights",
        "run_chunked",
        "save_checkpoint",
        "load_checkpoint",
        "run_distributed",
        "enable_compilation_cache",
        "__version__",
    ):
        assert name in numpyro_mile.__all__, name
    assert numpyro_mile.__version__ != "unknown"  # read from the installed package's metadata


def test_importing_the_package_leaves_jax_unstarted():
    """``import numpyro_mile`` starts no JAX backend (BlackJAX, which does at import, is imported on first use), so
    NumPyro's advice ``numpyro.set_host_device_count(n)`` still works after it: vectorized chains then use every
    core (issue #29)."""
    code = "import numpyro_mile, numpyro\nnumpyro.set_host_device_count(3)\nimport jax\nprint(jax.local_device_count())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "3"


def _imported_names(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every ``from module import name`` (relative modules resolved against the
    package) and every module named by an ``import`` statement or an ``importlib.import_module`` string."""
    name_of = {p: m for m, p in _modules().items()}
    module = name_of[path]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found += [(base, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))
        ):
            text = ast.unparse(node.args[0])
            found.append((text.strip("'\"f"), "", node.lineno))
    return found


def test_blackjax_only_in_the_mclmc_adapter():
    """All MCLMC/isokinetic dynamics (MILE's step, SMILE's minibatch step, the ESS) go through
    ``kernels/_mclmc.py``: no other module imports BlackJAX (issue #31)."""
    offenders = [
        (str(path.relative_to(PACKAGE)), module, line)
        for path in PACKAGE.rglob("*.py")
        if path.name != "_mclmc.py"
        for module, _, line in _imported_names(path)
        if module.split(".")[0] == "blackjax"
    ]
    assert offenders == []
    assert any(module.startswith("blackjax") for module, _, _ in _imported_names(PACKAGE / "kernels" / "_mclmc.py"))


def test_flax_is_an_extra_the_package_never_imports():
    """Flax is for the examples (the ``examples`` and ``test`` extras), not a dependency of the package."""
    offenders = [
        (str(path.relative_to(PACKAGE)), module, line)
        for path in PACKAGE.rglob("*.py")
        for module, _, line in _imported_names(path)
        if module.split(".")[0] == "flax"
    ]
    assert offenders == []
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    dependencies = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "flax" not in dependencies


def test_no_private_kernel_names_outside_the_kernels():
    """Generic layers use what a kernel module exports, never its private names (issue #31)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "kernels":
            continue
        for module, name, line in _imported_names(path):
            inside_kernels = module.startswith("numpyro_mile.kernels")
            if inside_kernels and (name.startswith("_") or any(p.startswith("_") for p in module.split(".")[2:])):
                offenders.append((str(path.relative_to(PACKAGE)), f"{module}.{name}", line))
    assert offenders == []


def test_generic_layers_ask_kernels_through_hooks():
    """``inference_data`` and ``runs/`` know no kernel: they ask through ChainKernel's hooks (``sample_weights``,
    ``checkpoint_state``, ``resumed_state``, ``run_warnings``) rather than importing kernel modules (issue #31)."""
    generic = [PACKAGE / "inference_data.py", *sorted((PACKAGE / "runs").glob("*.py"))]
    offenders = [
        (path.name, module, line)
        for path in generic
        for module, _, line in _imported_names(path)
        if module.startswith("numpyro_mile.kernels")
    ]
    assert offenders == []


def test_ci_runs_the_linter_and_the_formatter_configured_in_pyproject():
    """ruff's rules and line length live in pyproject.toml, and CI fails on a lint error or unformatted code."""
    root = PACKAGE.parent
    pyproject = (root / "pyproject.toml").read_text()
    assert "[tool.ruff]" in pyproject and "line-length" in pyproject
    ci = (root / ".ci" / "run").read_text()
    assert "ruff check ." in ci and "ruff format --check ." in ci


def test_kernels_declare_settings_by_their_constructor_alone():
    """No kernel keeps a list of its settings beside its constructor (``setting_names``, or a ``settings``
    override): the constructor's arguments are the one declaration (``ChainKernel.settings``)."""
    offenders = []
    for path in (PACKAGE / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                names = [t.id for t in getattr(item, "targets", []) if isinstance(t, ast.Name)]
                if "setting_names" in names or (
                    isinstance(item, ast.FunctionDef) and item.name == "settings" and node.name != "ChainKernel"
                ):
                    offenders.append(f"{path.name}:{node.name}.{item.lineno}")
    assert offenders == []
