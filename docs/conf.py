"""Sphinx configuration of the numpyro_mile documentation.

Build (from the repository root)::

    pip install -e '.[docs]' && sphinx-build -W -n -b html docs docs/_build/html

``make -C docs check`` runs everything CI runs: the HTML build with warnings as errors and
nitpicky cross-references, the doctest builder (every code block of the quickstart and the
guide, and the ``.. doctest::`` examples of the docstrings), and, when ``DOCS_LINKCHECK=1``
is set (it needs the network), the external link check.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.directives.other import TocTree
from sphinx.util import logging
from sphinx.util.nodes import nested_parse_with_titles

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the package itself, also without an editable install
os.environ.setdefault("CI", "1")  # no progress bars in the executed examples
os.environ.setdefault("MPLBACKEND", "Agg")

logger = logging.getLogger(__name__)

project = "numpyro_mile"
author = "the numpyro_mile developers"
copyright = "2025, " + author

try:
    import numpyro_mile

    release = numpyro_mile.__version__
except Exception:  # pragma: no cover - the build then fails with a clearer message in api.md
    release = "unknown"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# ------------------------------------------------------------------ MyST
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# ------------------------------------------------------------------ strictness
# every internal reference must resolve (-n); external packages have no inventory offline
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(jax|jaxlib|numpy|np|jnp|numpyro|optax|flax|arviz|az|matplotlib|plt|scipy|sklearn|blackjax|tqdm"
        r"|pathlib|os|typing|collections|concurrent|types|abc)(\..*)?",
    ),
    (
        r"py:.*",
        r"(Array|ArrayLike|Callable|Mapping|Sequence|Iterable|Iterator|Any|Path|PathLike|ndarray|"
        r"PRNGKey|DType|dtype|Optional|Union|Literal|NamedTuple|Messenger|MCMCKernel|"
        r"InferenceData|ArrayTree|PyTree|Axes|Figure|Mesh|NamedSharding|Device|Sharding|optional|callable|"
        r"array_like|array|default)",
    ),
    (r"py:.*", r"(\w+\.)*_[A-Za-z]\w*(\.\w+)*"),  # private modules, helpers and bases: not documented
]
# Benchmark pages are written by benchmarks/ scripts (other authors): their heading levels are not ours.
suppress_warnings = ["myst.header"]

# ------------------------------------------------------------------ autodoc
# scikit-learn generates set_*_request methods on every estimator class (metadata routing): theirs, not ours
autodoc_default_options = {
    "members": True,
    "show-inheritance": False,
    "member-order": "bysource",
    "exclude-members": "set_fit_request,set_score_request,set_predict_request",
}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_preserve_defaults = True
autodoc_member_order = "bysource"
autoclass_content = "class"
add_module_names = False

# ------------------------------------------------------------------ doctest
doctest_global_setup = """
import os
os.environ.setdefault("CI", "1")
import warnings
import jax
import numpy as np
"""
import doctest as _doctest  # noqa: E402

doctest_default_flags = (
    _doctest.ELLIPSIS
    | _doctest.NORMALIZE_WHITESPACE
    | _doctest.IGNORE_EXCEPTION_DETAIL
    | _doctest.DONT_ACCEPT_TRUE_FOR_1
)
doctest_show_successes = False

# ------------------------------------------------------------------ HTML
html_theme = "furo"
html_title = f"numpyro_mile {release}"
html_static_path: list[str] = []
pygments_style = "sphinx"

# ------------------------------------------------------------------ link check (only with network)
linkcheck_timeout = 15
linkcheck_retries = 2
linkcheck_anchors = False
linkcheck_report_timeouts_as_broken = True


# ------------------------------------------------------------------ the API page's module list
class ApiModules(Directive):
    """``.. api-modules::``: one module per line; each becomes a section with its ``automodule``.

    A line is ``module.name [flag ...]`` with the flags

    * ``optional``: the module may not exist yet; skipped (with a log note) when absent. Without
      it, a missing module is a build error.
    * ``nomembers``: the module's docstring only (packages whose names are re-exports).

    By default a module shows its own documented public members (objects defined in it, whether
    or not listed in ``__all__``), so every object is documented once, under its defining module.
    """

    has_content = True
    flags = {"optional", "nomembers"}

    def run(self):
        rst: list[str] = []
        for raw in self.content:
            words = raw.split("#", 1)[0].split()
            if not words:
                continue
            name, flags = words[0], set(words[1:])
            if flags - self.flags:
                raise self.error(
                    f"api-modules: unknown flag(s) {sorted(flags - self.flags)} for {name}; "
                    f"known: {sorted(self.flags)}."
                )
            try:
                found = importlib.util.find_spec(name) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                if "optional" in flags:
                    logger.info(f"api-modules: optional module {name} is absent; skipped")
                    continue
                raise self.error(
                    f"api-modules: module {name!r} not found (add the flag 'optional' if it may be absent)."
                )
            importlib.import_module(name)  # an import error is a build error
            rst += [name, "-" * len(name), "", f".. automodule:: {name}"]
            if "nomembers" in flags:
                rst += ["   :no-members:"]
            else:
                rst += ["   :members:", "   :ignore-module-all:"]
            rst += [""]
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(rst, source="api-modules"), node)
        return node.children


# ------------------------------------------------------------------ toctree of pages that may not exist yet
class OptionalTocTree(TocTree):
    """``optional-toctree``: a toctree whose entries are left out while their pages do not exist.

    For pages other parts of the project write (e.g. ``distributed``), so the site builds with
    or without them. Options are those of ``toctree``; globs are not needed here.
    """

    def run(self):
        env = self.state.document.settings.env
        base = env.docname.rsplit("/", 1)[0] + "/" if "/" in env.docname else ""
        kept = []
        for line in self.content:
            entry = line.strip()
            name = entry.rsplit("<", 1)[-1].rstrip(">").strip() if entry.endswith(">") else entry
            if not entry or (base + name) in env.found_docs:
                kept.append(line)
            else:
                logger.info(f"optional-toctree: {name} does not exist yet; left out")
        if not any(line.strip() for line in kept):
            return []
        self.content = StringList(kept, source=self.content.source(0) if self.content else "")
        return super().run()


# ------------------------------------------------------------------ references to re-exported names
def _py_objects(env) -> dict:
    return env.get_domain("py").objects


def _canonical(target: str) -> str | None:
    """``numpyro_mile.SGLD`` -> ``numpyro_mile.kernels.sgld.SGLD`` by importing and asking the object."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if module and qualname:
            return f"{module}.{qualname}"
        if isinstance(obj, type(importlib)):
            return obj.__name__
        return None
    return None


def resolve_alias(app, env, node, contnode):
    """Resolve Python references that name a documented object through another path.

    Two cases, both unambiguous: a public re-export (``numpyro_mile.SGLD`` is documented as
    ``numpyro_mile.kernels.sgld.SGLD``), and a short name used in a docstring for an object of
    another module (``:func:`predict``` in ``reporting.py``) when exactly one documented object
    has that name. Anything else stays unresolved, and ``-n -W`` makes it a build error.
    """
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target or target.split(".")[0] in {"jax", "numpy", "np", "numpyro", "optax", "flax", "arviz"}:
        return None
    objects = _py_objects(env)
    candidates = []
    canonical = _canonical(target) if target.startswith("numpyro_mile") else None
    if canonical and canonical in objects:
        candidates = [canonical]
    else:
        bare = target.lstrip(".~")
        candidates = [name for name in objects if name == bare or name.endswith("." + bare)]
        module = node.get("py:module") or ""
        for scope in (module, module.rsplit(".", 1)[0]):  # the same module first, then its package
            if len(candidates) > 1 and scope:
                near = [c for c in candidates if c.startswith(scope + ".")]
                candidates = near if near else candidates
    if len(candidates) != 1:
        return None
    domain = env.get_domain("py")
    new = node.deepcopy()
    new["reftarget"] = candidates[0]
    new["refspecific"] = False
    return domain.resolve_xref(
        env, node.get("refdoc", ""), app.builder, node.get("reftype", "obj"), candidates[0], new, contnode
    )


def setup(app):
    app.add_directive("api-modules", ApiModules)
    app.add_directive("optional-toctree", OptionalTocTree)
    app.connect("missing-reference", resolve_alias)
    return {"parallel_read_safe": True}
