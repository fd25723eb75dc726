"""Compile once: compiled programs kept per model, static arguments and settings, with data as arguments.

A kernel or the deep ensemble builds its jitted functions here under a key that names everything
the function closes over (the model, the static parts of the model's arguments, the settings);
the arrays of the model's arguments are *arguments* of the compiled programs, never constants
baked into them. A second run with the same model, shapes and settings (new data values, a new
key, a new ``MCMC`` object) therefore reuses the compiled programs, and JAX's persistent
compilation cache (:func:`enable_compilation_cache`) can serve them to a new process.

No imports from the package, so any module may use this one.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Hashable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._validation import as_array, is_pandas

logger = logging.getLogger(__name__)

_PROGRAMS: OrderedDict = OrderedDict()
#: programs kept (least recently used dropped first)
MAX_PROGRAMS = 64


def program(key: Hashable, build: Callable[[], Callable]) -> Callable:
    """The program built earlier under ``key``, else ``build()`` (kept under ``key``).

    An unhashable ``key`` (e.g. a model argument that is a list) builds a fresh program each call.
    """
    try:
        hash(key)
    except TypeError:
        return build()
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    fn = build()
    _PROGRAMS[key] = fn
    while len(_PROGRAMS) > MAX_PROGRAMS:
        _PROGRAMS.popitem(last=False)
    return fn


def _is_data(leaf) -> bool:
    return isinstance(leaf, (np.ndarray, jax.Array, np.generic)) or is_pandas(leaf)


class DataSplit(NamedTuple):
    """The model's arguments split into array leaves (program arguments) and the rest (static).

    :ivar arrays: the array leaves, as JAX arrays, in tree order.
    :ivar key: hashable description of everything else (tree structure and the non-array
        leaves); part of a program's key.
    :ivar sources: one reference per array leaf to the object the caller passed (a weak reference where the
        type allows one; ``None`` for a traced leaf), to recognise the very same data again by identity: an
        ``id()`` could be reused by a new array once the first one is freed.
    """

    arrays: tuple
    key: Hashable
    sources: tuple


def _signature(model_args: tuple, model_kwargs: dict | None, convert: bool):
    leaves, treedef = jax.tree.flatten((tuple(model_args), dict(model_kwargs or {})))
    arrays, statics, sources = [], [], []
    for leaf in leaves:
        if isinstance(leaf, jax.core.Tracer):
            if not convert:
                return None
            arrays.append(leaf)  # traced (e.g. chains under pmap): an argument already; never "the same data"
            sources.append(None)
            statics.append(None)
        elif _is_data(leaf):
            arrays.append(jnp.asarray(as_array(leaf)) if convert else leaf)
            sources.append(_reference(leaf) if convert else leaf)
            statics.append(None)
        else:
            statics.append(("static", leaf))
    return DataSplit(tuple(arrays), (treedef, tuple(statics)), tuple(sources))


def _reference(leaf) -> Callable[[], Any]:
    """A callable returning ``leaf``: a weak reference when its type allows one (the caller's data are not kept
    alive by a kernel that has copied them), else a strong one."""
    try:
        return weakref.ref(leaf)
    except TypeError:
        return lambda: leaf


def split_data(model_args: tuple, model_kwargs: dict | None) -> DataSplit:
    """Split ``(model_args, model_kwargs)`` into arrays and a static key (see :class:`DataSplit`).

    Traced array leaves (e.g. inside ``pmap``) are kept as they are, with an ``id`` of ``None``.
    """
    return _signature(model_args, model_kwargs, convert=True)


def join_data(key: Hashable, arrays) -> tuple[tuple, dict]:
    """``(model_args, model_kwargs)`` from a :class:`DataSplit`'s ``key`` and (possibly traced) ``arrays``."""
    treedef, statics = key
    arrays = iter(arrays)
    leaves = [next(arrays) if s is None else s[1] for s in statics]
    return jax.tree.unflatten(treedef, leaves)


def on_data(of_data: Callable[[tuple, dict], Callable], key: Hashable) -> Callable:
    """``f(x, arrays) = of_data(args, kwargs)(x)``, with ``(args, kwargs)`` joined from a :class:`DataSplit`'s
    ``key`` and ``arrays``: a function of the model's arguments made a function of their array leaves, which
    compiled programs then take as arguments (e.g. ``of_data`` = the potential energy of a model on its data)."""

    def on(x, arrays):
        args, kwargs = join_data(key, arrays)
        return of_data(args, kwargs)(x)

    return on


def same_data(split: DataSplit | None, model_args: tuple, model_kwargs: dict | None) -> bool:
    """Whether ``(model_args, model_kwargs)`` are the very arrays (same objects) and static values of ``split``."""
    if split is None:
        return False
    now = _signature(model_args, model_kwargs, convert=False)
    if now is None or None in split.sources or len(now.sources) != len(split.sources):
        return False
    if any(source() is not leaf for source, leaf in zip(split.sources, now.sources)):
        return False
    try:
        return bool(now.key == split.key)
    except Exception:  # a static value whose == is not a plain bool
        return False


def default_cache_dir() -> Path:
    """``$NUMPYRO_MILE_CACHE``, else ``$XDG_CACHE_HOME/numpyro_mile/jax``, else ``~/.cache/numpyro_mile/jax``."""
    if os.environ.get("NUMPYRO_MILE_CACHE"):
        return Path(os.environ["NUMPYRO_MILE_CACHE"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "numpyro_mile" / "jax"


def enable_compilation_cache(path: str | os.PathLike | None = None, *, min_compile_seconds: float = 0.0) -> Path:
    """Switch on JAX's persistent compilation cache (for this process, all JAX programs).

    Compiled XLA programs are written to ``path`` and read back by later compilations of the
    same program, in this process and in later ones: a second ``mcmc.run`` of the same model,
    shapes and settings then skips XLA's compilation, and so does a new process (a notebook
    restart, the next cross-validation fold, a benchmark script run again). NumPyro traces its
    sampling loop again on every ``MCMC.run`` (for NUTS as well); with the cache on, that costs
    only the tracing.

    This sets JAX's global options ``jax_compilation_cache_dir``,
    ``jax_persistent_cache_min_compile_time_secs`` and
    ``jax_persistent_cache_min_entry_size_bytes`` (the same can be done with those options or
    their ``JAX_...`` environment variables). Delete the folder to empty the cache.

    :param path: cache folder (created); default :func:`default_cache_dir`.
    :param min_compile_seconds: programs that compile faster than this are not cached.
    :return: the cache folder.

    **Example**

    .. doctest::

        >>> import tempfile
        >>> from numpyro_mile import enable_compilation_cache
        >>> folder = enable_compilation_cache(tempfile.mkdtemp())
    """
    folder = Path(path).expanduser() if path is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:  # the cache reads its settings once; start it again so that the new folder is used
        from jax.experimental.compilation_cache import compilation_cache as _cc

        _cc.reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - older/newer JAX
        pass
    logger.info("JAX persistent compilation cache: %s", folder)
    return folder
