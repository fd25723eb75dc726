"""Samples streamed to disk, read back lazily (memory-mapped); atomic file writes.

A :class:`SampleStore` is a directory with one ``.npy`` file per collected quantity, each of
shape ``(num_chains, num_draws, *shape)`` and preallocated when the store is created, plus a
small ``store.json`` that records the layout and how many draws are complete::

    samples/
      store.json                  layout, storage dtypes, num_written
      posterior/w0.npy            (chains, draws, 1, 16)
      sample_stats/step_size.npy  (chains, draws)

:func:`numpyro_mile.runs.chunked.run_chunked` writes one chunk of draws at a time into the files
(memory stays bounded by the chunk) and then advances ``num_written``; draws past
``num_written`` may hold a half-written chunk after a crash and are never read back (a resumed
run writes them again). :func:`load_samples` and
:func:`numpyro_mile.inference_data.load_inference_data` open the files
with ``numpy.load(mmap_mode="r")``: nothing is read from disk until it is used.

Floating-point values can be stored in a lower precision (``store_dtype="float32"``,
``"bfloat16"`` or ``"float16"``); ``bfloat16`` files hold the raw 16-bit patterns (NumPy's
``.npy`` format has no bfloat16 type) and are viewed as ``ml_dtypes.bfloat16`` on reading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ._arrays import STORE_DTYPES, storage_dtype

__all__ = ["SampleStore", "atomic_write_bytes", "load_samples"]

STORE_VERSION = 1
_STORE_FILE = "store.json"
GROUPS = ("posterior", "sample_stats")


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == STORE_DTYPES["bfloat16"]


def _file_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype written to the ``.npy`` file (bfloat16 as its raw 16-bit patterns)."""
    return np.dtype(np.uint16) if dtype == STORE_DTYPES["bfloat16"] else dtype


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new file.

    The bytes go to a temporary file in the same directory, which is flushed, ``fsync``-ed and
    renamed over ``path`` (``os.replace`` is atomic on POSIX and Windows).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class SampleStore:
    """A directory of preallocated, memory-mappable sample arrays (see the module docstring).

    Create one with :meth:`create` (or let :func:`numpyro_mile.runs.chunked.run_chunked` do it),
    reopen one with ``SampleStore(directory)``.

    :param directory: the store's directory (it must hold a ``store.json``).

    **Example**

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> store = SampleStore.create(d, {"posterior": {"x": ((3,), "float32")}}, num_chains=2, num_draws=4)
    >>> store.write({"posterior": {"x": np.ones((2, 2, 3), np.float32)}}, start=0)
    >>> load_samples(d)["x"].shape
    (2, 2, 3)
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta_path = self.directory / _STORE_FILE
        if not meta_path.exists():
            raise FileNotFoundError(
                f"{self.directory} is not a sample store (no {_STORE_FILE}); "
                "create one with SampleStore.create or run_chunked(..., sample_dir=...)."
            )
        try:
            self.meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{meta_path} is corrupt ({err}); delete the sample store and rerun.") from err
        if self.meta.get("version") != STORE_VERSION:
            raise ValueError(
                f"{self.directory} was written by store format version {self.meta.get('version')}, "
                f"this numpyro_mile reads version {STORE_VERSION}."
            )

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        directory: str | os.PathLike,
        spec: Mapping[str, Mapping[str, tuple]],
        *,
        num_chains: int,
        num_draws: int,
        store_dtype=None,
        attrs: Mapping | None = None,
    ) -> "SampleStore":
        """Create (or reuse, when the layout is the same) a store with preallocated files.

        :param directory: where to put it (created if needed).
        :param spec: ``{group: {name: (shape_per_draw, dtype)}}`` with ``group`` in
            ``("posterior", "sample_stats")``; ``shape_per_draw`` excludes chain and draw axes.
        :param num_chains: chains.
        :param num_draws: draws per chain (after thinning).
        :param store_dtype: storage dtype of floating-point values (``None``: as given in ``spec``).
        :param attrs: JSON-serialisable information kept in ``store.json``.
        """
        directory = Path(directory)
        dtype = storage_dtype(store_dtype)
        layout = {}
        for group, variables in spec.items():
            if group not in GROUPS:
                raise ValueError(f"sample store groups are {GROUPS}, got {group!r}.")
            for name, (shape, var_dtype) in variables.items():
                var_dtype = np.dtype(var_dtype)
                stored = dtype if (dtype is not None and _is_float(var_dtype)) else var_dtype
                layout.setdefault(group, {})[name] = {
                    "shape": [int(num_chains), int(num_draws)] + [int(s) for s in shape],
                    "dtype": stored.name,
                    "file": f"{group}/{_safe_name(name)}.npy",
                }
        meta = {
            "version": STORE_VERSION,
            "num_chains": int(num_chains),
            "num_draws": int(num_draws),
            "num_written": 0,
            "store_dtype": None if dtype is None else dtype.name,
            "layout": layout,
            "attrs": dict(attrs or {}),
        }
        if (directory / _STORE_FILE).exists():
            old = cls(directory)
            same = {k: v for k, v in old.meta.items() if k not in ("num_written", "attrs")}
            if same == {k: v for k, v in meta.items() if k not in ("num_written", "attrs")} and old._files_ok():
                return old
            raise ValueError(
                f"{directory} already holds a sample store with another layout (sites, shapes, dtypes, chains or "
                "draws); pass another sample_dir or delete it."
            )
        for group, variables in layout.items():
            (directory / group).mkdir(parents=True, exist_ok=True)
            for info in variables.values():
                mm = np.lib.format.open_memmap(
                    directory / info["file"],
                    mode="w+",
                    dtype=_file_dtype(np.dtype(STORE_DTYPES.get(info["dtype"], info["dtype"]))),
                    shape=tuple(info["shape"]),
                )
                del mm
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(directory / _STORE_FILE, json.dumps(meta, indent=1).encode())
        return cls(directory)

    def _files_ok(self) -> bool:
        return all((self.directory / info["file"]).exists() for _, _, info in self._variables())

    def _variables(self):
        for group, variables in self.meta["layout"].items():
            for name, info in variables.items():
                yield group, name, info

    # ------------------------------------------------------------------ writing
    @property
    def num_written(self) -> int:
        """Draws per chain that are complete on disk."""
        return int(self.meta["num_written"])

    def write(self, values: Mapping[str, Mapping[str, np.ndarray]], start: int, *, commit: bool = True) -> None:
        """Write draws ``start : start + n`` of every variable and, with ``commit``, mark them complete.

        :param values: ``{group: {name: array (num_chains, n, *shape)}}`` for every variable of the store.
        :param start: index of the first draw (per chain).
        :param commit: advance ``num_written`` to ``start + n`` (atomically) after the data are on disk.
        """
        n = None
        for group, name, info in self._variables():
            try:
                value = np.asarray(values[group][name])
            except KeyError:
                raise ValueError(f"write() is missing {group}/{name}; every variable of the store is written at once.")
            shape = tuple(info["shape"])
            if value.shape[0] != shape[0] or value.shape[2:] != shape[2:]:
                raise ValueError(f"{group}/{name}: expected shape ({shape[0]}, n, *{shape[2:]}), got {value.shape}.")
            n = value.shape[1] if n is None else n
            if value.shape[1] != n or start < 0 or start + n > shape[1]:
                raise ValueError(
                    f"{group}/{name}: draws {start}:{start + value.shape[1]} do not fit 0:{shape[1]} "
                    "or differ in number between variables."
                )
            dtype = np.dtype(STORE_DTYPES.get(info["dtype"], info["dtype"]))
            value = value.astype(dtype, copy=False)
            if dtype == STORE_DTYPES["bfloat16"]:
                value = value.view(np.uint16)
            mm = np.load(self.directory / info["file"], mmap_mode="r+")
            mm[:, start : start + n] = value
            mm.flush()
            del mm
        if commit and n is not None:
            self.commit(start + n)

    def commit(self, num_written: int) -> None:
        """Record that draws ``0 : num_written`` of every chain are complete."""
        self.meta["num_written"] = int(num_written)
        atomic_write_bytes(self.directory / _STORE_FILE, json.dumps(self.meta, indent=1).encode())

    # ------------------------------------------------------------------ reading
    def read(self, group: str | None = None, *, upcast: bool = False) -> dict[str, np.ndarray]:
        """Memory-mapped arrays ``(num_chains, num_written, *shape)`` (nothing is read until used).

        :param group: ``"posterior"``, ``"sample_stats"`` or ``None`` (both, in one dict).
        :param upcast: convert 16-bit floats to float32 (this reads the data into memory).
        """
        out = {}
        for g, name, info in self._variables():
            if group is not None and g != group:
                continue
            mm = np.load(self.directory / info["file"], mmap_mode="r")
            if tuple(mm.shape) != tuple(info["shape"]):
                raise ValueError(
                    f"{self.directory / info['file']} has shape {mm.shape}, store.json says "
                    f"{tuple(info['shape'])}: the store is corrupt."
                )
            if info["dtype"] == "bfloat16":
                mm = mm.view(STORE_DTYPES["bfloat16"])
            value = mm[:, : self.num_written]
            if upcast and _is_float(value.dtype) and value.dtype.itemsize < 4:
                value = value.astype(np.float32)
            out[name] = value
        return out


def _safe_name(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return safe if safe not in ("", ".", "..") else "_" + safe


def load_samples(
    sample_dir: str | os.PathLike, *, group_by_chain: bool = True, upcast: bool = False, group: str = "posterior"
) -> dict[str, np.ndarray]:
    """Samples of a :class:`SampleStore`, memory-mapped (lazy) when ``group_by_chain``.

    :param sample_dir: the store's directory (``run_chunked``'s ``sample_dir``).
    :param group_by_chain: keep the chain axis, ``(chains, draws, ...)``; else flatten to
        ``(chains * draws, ...)`` like ``MCMC.get_samples()`` (this copies into memory).
    :param upcast: convert 16-bit floats to float32 (reads into memory).
    :param group: ``"posterior"`` (the sample field) or ``"sample_stats"`` (extra fields).
    :return: dict name -> array, only the draws completed so far.

    **Example**

    >>> samples = load_samples("run.samples")        # doctest: +SKIP
    >>> samples["w0"].shape                           # doctest: +SKIP
    (4, 1000, 1, 16)
    """
    values = SampleStore(sample_dir).read(group, upcast=upcast)
    if not group_by_chain:
        values = {k: np.reshape(v, (-1,) + v.shape[2:]) for k, v in values.items()}
    return values
