"""The checkpoint file format, shared by :mod:`~numpyro_mile.runs.checkpoint` and :mod:`~numpyro_mile.runs.chunked`
(package-internal): a pytree codec (namedtuples, dicts, tuples, lists, ``None``, typed PRNG keys), SHA-256
digests of arrays, and atomic writes of one ``.npz`` file with a JSON header (format version, structure,
per-array checksums, library versions).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

from .._version import __version__
from ..sample_store import atomic_write_bytes

__all__ = [
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "checkpoint_state",
    "digest",
    "read",
    "resumed_state",
    "versions",
    "write",
]

#: version of the checkpoint file format (2: kernel settings recorded only as ``kernel.settings()`` names them)
CHECKPOINT_VERSION = 2
_META = "__meta__"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: truncated, damaged, another format version, or
    written by another run (model, data, kernel settings or MCMC settings)."""


# ============================================================================== pytree <-> arrays
def _leaf_to_numpy(x, info: dict) -> np.ndarray:
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        info["prng_impl"] = str(jax.random.key_impl(x))
        x = jax.random.key_data(x)
    elif isinstance(x, (bool, int, float, complex)):
        info["python"] = type(x).__name__
    return np.asarray(jax.device_get(x))


def _encode(tree, leaves: list) -> Any:
    """A JSON description of ``tree``; its arrays are appended to ``leaves``."""
    if tree is None:
        return None
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        cls = type(tree)
        return {
            "namedtuple": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f: _encode(getattr(tree, f), leaves) for f in tree._fields},
        }
    if isinstance(tree, dict):
        return {"dict": [[_encode_key(k), _encode(v, leaves)] for k, v in tree.items()]}
    if isinstance(tree, (tuple, list)):
        return {type(tree).__name__: [_encode(v, leaves) for v in tree]}
    if isinstance(tree, (jax.Array, np.ndarray, np.generic, bool, int, float)):
        info = {"leaf": len(leaves)}
        leaves.append(_leaf_to_numpy(tree, info))
        return info
    raise TypeError(
        f"cannot checkpoint a {type(tree).__name__} inside the state: a checkpointable state is a pytree of "
        "arrays built from namedtuples, dicts, tuples, lists and None."
    )


def _encode_key(key):
    """Dict keys: strings, integers, or tuples of them (NumPyro's mass-matrix dicts use tuples of sites)."""
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return key
    if isinstance(key, tuple) and all(isinstance(k, (str, int)) for k in key):
        return {"tuple": list(key)}
    raise TypeError(f"checkpoints store dicts whose keys are strings, integers or tuples of them, got {key!r}.")


def _decode_key(key):
    return tuple(key["tuple"]) if isinstance(key, dict) else key


def _import_namedtuple(path: str):
    module, _, qualname = path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise CheckpointError(f"the checkpoint's state uses the class {path}, which cannot be imported here ({err}).")
    if not (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise CheckpointError(f"{path} in the checkpoint is not a namedtuple class.")
    return obj


def _decode(node, leaves: list) -> Any:
    if node is None:
        return None
    if "namedtuple" in node:
        cls = _import_namedtuple(node["namedtuple"])
        fields = node["fields"]
        if tuple(fields) != tuple(cls._fields):
            raise CheckpointError(
                f"{node['namedtuple']} has fields {cls._fields} here, the checkpoint has "
                f"{tuple(fields)}: it was written by another version of that class."
            )
        return cls(*(_decode(fields[f], leaves) for f in cls._fields))
    if "dict" in node:
        return {_decode_key(k): _decode(v, leaves) for k, v in node["dict"]}
    if "tuple" in node:
        return tuple(_decode(v, leaves) for v in node["tuple"])
    if "list" in node:
        return [_decode(v, leaves) for v in node["list"]]
    value = leaves[node["leaf"]]
    if "prng_impl" in node:
        return jax.random.wrap_key_data(jnp.asarray(value), impl=node["prng_impl"])
    if "python" in node:
        return {"bool": bool, "int": int, "float": float, "complex": complex}[node["python"]](value)
    array = jnp.asarray(value)
    if array.dtype != value.dtype:
        raise CheckpointError(
            f"the checkpoint holds {value.dtype} arrays, which JAX turns into {array.dtype} here: "
            "set jax.config.update('jax_enable_x64', True) as in the run that wrote it (or the reverse)."
        )
    return array


def digest(value) -> str:
    """SHA-256 of an array-like's dtype, shape and bytes."""
    if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    array = np.ascontiguousarray(jax.device_get(value))
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(array.tobytes())
    return h.hexdigest()[:16]


def versions() -> dict:
    return {"jax": jax.__version__, "numpyro": numpyro.__version__, "numpyro_mile": __version__}


def write(path, payload: dict, meta: dict) -> Path:
    path = Path(path)
    leaves: list[np.ndarray] = []
    structure = _encode(payload, leaves)
    meta = dict(
        meta,
        version=CHECKPOINT_VERSION,
        structure=structure,
        checksums=[digest(leaf) for leaf in leaves],
        versions=versions(),
        time=time.time(),
    )
    buffer = io.BytesIO()
    arrays = {f"a{i}": leaf for i, leaf in enumerate(leaves)}
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(buffer, **arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def read(path) -> tuple[dict, dict]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(bytes(npz[_META]).decode())
            if meta.get("version") != CHECKPOINT_VERSION:
                raise CheckpointError(
                    f"{path} has checkpoint format version {meta.get('version')}; this numpyro_mile reads version "
                    f"{CHECKPOINT_VERSION}. Resume with the numpyro_mile that wrote it."
                )
            leaves = [npz[f"a{i}"] for i in range(len(meta["checksums"]))]
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError, OSError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"{path} is truncated or damaged ({type(err).__name__}: {err}); it cannot be resumed. A crash while "
            "saving cannot cause this (writes are atomic); restore a copy or delete it to start afresh."
        ) from err
    for i, (leaf, checksum) in enumerate(zip(leaves, meta["checksums"])):
        if digest(leaf) != checksum:
            raise CheckpointError(f"{path} is damaged: array {i} does not match its checksum; it cannot be resumed.")
    return _decode(meta["structure"], leaves), meta


def checkpoint_state(kernel, state):
    """``state`` as a checkpoint stores it: the kernel's ``checkpoint_state`` hook (this package's kernels leave
    out the model data they carry); other kernels' states (NUTS, HMC) as they are."""
    hook = getattr(kernel, "checkpoint_state", None)
    return state if hook is None else hook(state)


def resumed_state(kernel, saved, fresh):
    """A stored state made ready to run: the kernel's ``resumed_state`` hook with ``fresh``, the state its
    ``init`` just made for the resumed run (other kernels' states as they are), placed on ``fresh``'s devices
    where its chains are sharded."""
    hook = getattr(kernel, "resumed_state", None)
    state = saved if hook is None else hook(saved, fresh)
    if jax.tree.structure(state) != jax.tree.structure(fresh):
        return state
    # chains sharded over devices: the saved leaves (host arrays) placed as ``fresh``'s, which is how the compiled
    # step returns them, or the resumed run compiles its step twice (see numpyro_mile._arrays.place_state)
    return jax.tree.map(
        lambda leaf, like: (
            jax.device_put(leaf, like.sharding)
            if isinstance(getattr(like, "sharding", None), jax.sharding.NamedSharding)
            else leaf
        ),
        state,
        fresh,
    )
