"""Checkpoint files of MCMC states: a pytree codec, a run fingerprint, an atomic file format.

:func:`save_checkpoint` / :func:`load_checkpoint` store any kernel state that is a pytree of
arrays (namedtuples, dicts, tuples, lists, ``None``; MILE, SGLD, ICSGLD, NUTS/HMC) in one file.
Writes are atomic (a temporary file, ``fsync``, ``os.replace``): a crash while saving leaves
the previous checkpoint readable. The file records a format version, a SHA-256 checksum of
every array (a truncated or damaged file raises :class:`~numpyro_mile.runs._state_file.CheckpointError`) and a
fingerprint of
the run (kernel class and settings, model, data, MCMC settings) that is checked on loading.
Between NumPyro runs this is all that is needed::

    mcmc.warmup(key, X, y)
    save_checkpoint(mcmc, "warm.ckpt", model_args=(X, y))
    ...                                             # later, in another process
    ckpt = load_checkpoint("warm.ckpt", mcmc=mcmc, model_args=(X, y))  # sets post_warmup_state
    mcmc.run(ckpt.state.rng_key, X, y)

Runs that must stop and resume mid-warmup use :func:`numpyro_mile.runs.chunked.run_chunked`,
which writes these files after every chunk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from ._state_file import CHECKPOINT_VERSION, CheckpointError, checkpoint_state, digest, read, write

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "check_fingerprint",
    "load_checkpoint",
    "run_fingerprint",
    "save_checkpoint",
]


class Checkpoint(NamedTuple):
    """A loaded checkpoint.

    :ivar state: the kernel state (a pytree of JAX arrays), as ``mcmc.last_state``.
    :ivar step: steps (warmup + sampling) the chains had taken, when known, else ``None``.
    :ivar num_draws: draws per chain written to the sample store (:func:`run_chunked`), else 0.
    :ivar fingerprint: what identifies the run (see :func:`run_fingerprint`).
    :ivar metadata: other recorded information (versions, time, user ``metadata``).
    :ivar extra: other saved arrays (:func:`run_chunked` keeps the initial keys here).
    """

    state: Any
    step: int | None
    num_draws: int
    fingerprint: dict
    metadata: dict
    extra: dict


# ============================================================================== fingerprint
#: attributes that NumPyro's own kernels (HMC, NUTS, ...) set in ``init``, not settings: left out of their fingerprint
#: (this package's kernels list their settings themselves: ``kernel.settings()``)
_NUMPYRO_RUNTIME_ATTRS = frozenset(
    {
        "_sample_fn",
        "_init_fn",
        "_postprocess_fn",
        "_potential_fn_gen",
        "_inv_transforms",
        "_dynamic_support",
        "_prototype_trace",
        "_model",
        "_cache",
        "_num_warmup",
    }
)


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _describe(value, depth: int = 0):
    """A JSON-able, process-independent description of a setting (no memory addresses)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value.item() if isinstance(value, np.generic) else value
    if depth > 4:
        return type(value).__qualname__
    if isinstance(value, (np.ndarray, jax.Array)):
        return {"array": digest(value)}
    if isinstance(value, (tuple, list)):
        return [_describe(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v, depth + 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, functools.partial):
        return {
            "partial": _qualname(value.func),
            "args": _describe(value.args, depth + 1),
            "keywords": _describe(value.keywords, depth + 1),
        }
    if callable(value):
        return _qualname(value)
    return type(value).__qualname__


def _kernel_settings(kernel) -> dict:
    if callable(getattr(kernel, "settings", None)):  # this package's kernels say what their settings are
        return {name: _describe(value) for name, value in sorted(kernel.settings().items())}
    settings = {}
    for name, value in sorted(vars(kernel).items()):
        if name in _NUMPYRO_RUNTIME_ATTRS:
            continue
        if name.startswith("_") and not (
            isinstance(value, (bool, int, float, str, functools.partial))
            or (callable(value) and not isinstance(value, type))
        ):
            continue  # private containers and objects are runtime state, not settings
        settings[name] = _describe(value)
    return settings


def _datadigest(model_args, model_kwargs) -> str:
    h = hashlib.sha256()
    for name, value in [(str(i), a) for i, a in enumerate(model_args)] + sorted((model_kwargs or {}).items()):
        h.update(name.encode())
        for leaf in jax.tree.leaves(value):
            if isinstance(leaf, (np.ndarray, jax.Array)):
                h.update(digest(leaf).encode())
            else:
                h.update(json.dumps(_describe(leaf)).encode())
    return h.hexdigest()[:16]


def run_fingerprint(mcmc, model_args: tuple = (), model_kwargs: dict | None = None, **extra) -> dict:
    """What identifies a run: kernel class and settings, model, data and MCMC settings.

    Used by :func:`save_checkpoint` and :func:`run_chunked`; a checkpoint is only resumed by a
    call whose fingerprint is the same. Settings are described without memory addresses
    (functions by qualified name, arrays by a SHA-256 digest), so fingerprints are equal across
    processes.

    :param mcmc: a ``numpyro.infer.MCMC``.
    :param model_args: the model's positional arguments (hashed: digest of dtype, shape, bytes).
    :param model_kwargs: its keyword arguments (hashed the same way).
    :param extra: further JSON-able entries (e.g. ``extra_fields``), stored as given.
    :return: a JSON-able dict.

    >>> import numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC, NUTS
    >>> def model(): numpyro.sample("x", dist.Normal())
    >>> fp = run_fingerprint(MCMC(NUTS(model), num_warmup=10, num_samples=10))
    >>> fp["kernel"], fp["num_warmup"], fp["kernel_settings"]["_max_tree_depth"]
    ('numpyro.infer.hmc.NUTS', 10, 10)
    """
    kernel = mcmc.sampler
    chain_method = mcmc.chain_method if isinstance(mcmc.chain_method, str) else _qualname(mcmc.chain_method)
    chain_method = "single" if mcmc.num_chains == 1 else chain_method  # irrelevant for one chain
    fingerprint = {
        "kernel": _qualname(type(kernel)),
        "kernel_settings": _kernel_settings(kernel),
        "model": _qualname(kernel.model) if getattr(kernel, "model", None) is not None else None,
        "data": _datadigest(tuple(model_args), model_kwargs),
        "num_warmup": int(mcmc.num_warmup),
        "num_samples": int(mcmc.num_samples),
        "num_chains": int(mcmc.num_chains),
        "chain_method": chain_method,
        "thinning": int(mcmc.thinning),
        "postprocess_fn": None if mcmc.postprocess_fn is None else _qualname(mcmc.postprocess_fn),
    }
    fingerprint.update({k: _describe(v) for k, v in extra.items()})
    return fingerprint


def _differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key, "<absent>"), now.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict) and key == "kernel_settings":
            out += _differences(a, b, prefix=f"{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: checkpoint {a!r}, now {b!r}")
    return out


def check_fingerprint(saved: dict, now: dict, path, *, ignore: tuple[str, ...] = ()) -> None:
    """Raise :class:`~numpyro_mile.runs._state_file.CheckpointError` listing every entry where ``saved`` and
    ``now`` differ."""
    diffs = [d for d in _differences(saved, now) if d.split(":")[0] not in ignore]
    if diffs:
        raise CheckpointError(
            f"the checkpoint {path} was written by another run; it differs in\n  "
            + "\n  ".join(diffs)
            + "\nResume with the original model, data, kernel and MCMC settings, or delete the checkpoint "
            "(or pass resume=False) to start a new run."
        )


def _step_of(state) -> int | None:
    i = getattr(state, "i", None)
    if i is None:
        return None
    try:
        return int(np.max(np.asarray(i)))
    except TypeError:
        return None


def save_checkpoint(
    source,
    path: str | os.PathLike,
    *,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    metadata: dict | None = None,
) -> Path:
    """Save an MCMC run's state (``mcmc.last_state``) or any state pytree, atomically.

    :param source: a ``numpyro.infer.MCMC`` after ``run`` or ``warmup`` (its ``last_state``
        and settings are saved), or a state pytree (arrays in namedtuples/dicts/tuples/lists).
    :param path: the checkpoint file (its parent directory is created if needed).
    :param model_args: the model's arguments: their digest is checked by :func:`load_checkpoint`.
    :param model_kwargs: the model's keyword arguments (digest, likewise).
    :param metadata: JSON-able information to keep with it.
    :return: the path written.

    **Example**

    >>> import jax, tempfile, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC, NUTS
    >>> def model(): numpyro.sample("x", dist.Normal())
    >>> mcmc = MCMC(NUTS(model), num_warmup=50, num_samples=50, progress_bar=False)
    >>> mcmc.warmup(jax.random.PRNGKey(0))
    >>> path = save_checkpoint(mcmc, tempfile.mkdtemp() + "/warm.ckpt")
    >>> mcmc2 = MCMC(NUTS(model), num_warmup=50, num_samples=50, progress_bar=False)
    >>> ckpt = load_checkpoint(path, mcmc=mcmc2)      # sets mcmc2.post_warmup_state
    >>> mcmc2.run(ckpt.state.rng_key)
    """
    if hasattr(source, "sampler") and hasattr(source, "last_state"):
        if source.last_state is None:
            raise ValueError("this MCMC has no state yet: call mcmc.run(...) or mcmc.warmup(...) before saving.")
        state = checkpoint_state(source.sampler, source.last_state)
        fingerprint = run_fingerprint(source, model_args, model_kwargs)
        if not model_args and not model_kwargs:
            fingerprint["data"] = None  # not recorded: not checked on loading
    else:
        state, fingerprint = source, {}
    meta = {
        "kind": "state",
        "step": _step_of(state),
        "num_draws": 0,
        "fingerprint": fingerprint,
        "metadata": dict(metadata or {}),
    }
    return write(path, {"state": state}, meta)


def load_checkpoint(
    path: str | os.PathLike, *, mcmc=None, model_args: tuple | None = None, model_kwargs: dict | None = None
) -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint` or :func:`run_chunked`.

    :param path: the checkpoint file.
    :param mcmc: optional ``MCMC`` to continue: the checkpoint's fingerprint must match its
        kernel and settings (raises :class:`~numpyro_mile.runs._state_file.CheckpointError` listing the
        differences), and its
        ``post_warmup_state`` is set, so that ``mcmc.run(ckpt.state.rng_key, ...)`` continues.
    :param model_args: the model's arguments; when given with ``mcmc``, their digest is checked too.
    :param model_kwargs: its keyword arguments (checked together with ``model_args``).
    :return: a :class:`Checkpoint`.
    :raises CheckpointError: truncated or damaged file, another format version, another run.
    """
    payload, meta = read(path)
    ckpt = Checkpoint(
        state=payload["state"],
        step=meta.get("step"),
        num_draws=int(meta.get("num_draws", 0)),
        fingerprint=meta.get("fingerprint", {}),
        metadata=dict(meta.get("metadata", {}), versions=meta.get("versions"), time=meta.get("time")),
        extra={k: v for k, v in payload.items() if k != "state"},
    )
    if mcmc is not None:
        now = run_fingerprint(mcmc, model_args or (), model_kwargs)
        unknown = (model_args is None and model_kwargs is None) or ckpt.fingerprint.get("data") is None
        ignore = ("data",) if unknown else ()
        saved = {k: v for k, v in ckpt.fingerprint.items() if k in now}
        check_fingerprint(saved, now, path, ignore=ignore)
        if ckpt.metadata.get("kind") == "chunked" and ckpt.step is not None and ckpt.step < mcmc.num_warmup:
            raise CheckpointError(
                f"{path} was saved by run_chunked in the middle of warmup (step {ckpt.step} of {mcmc.num_warmup}); "
                "MCMC.run would sample from it without finishing warmup. Resume it with run_chunked."
            )
        mcmc.post_warmup_state = ckpt.state
    return ckpt
