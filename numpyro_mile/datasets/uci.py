"""UCI benchmark data used by the MILE paper: registry, loader and checksummed download.

The files are the plain-text ``{name}.data`` files of the MILE reference repository
(github.com/EmanuelSommer/MILE, folder ``data/``): one observation per row, columns
separated by whitespace, no header, the target in the LAST column.

Where files are looked for (first match wins):

1. ``data_dir`` when given (then only there);
2. the folder in the environment variable ``$NUMPYRO_MILE_DATA``;
3. the per-user cache folder ``$XDG_CACHE_HOME/numpyro_mile/uci``
   (default ``~/.cache/numpyro_mile/uci``), where :func:`download_uci` puts them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validation import check_finite

__all__ = [
    "DATA_ENV_VAR",
    "MILE_COMMIT",
    "UCIDataset",
    "UCI_DATASETS",
    "default_cache_dir",
    "download_uci",
    "load_uci",
    "uci_search_dirs",
]

logger = logging.getLogger(__name__)

#: Environment variable naming a folder that holds ``{name}.data`` files.
DATA_ENV_VAR = "NUMPYRO_MILE_DATA"
#: the folder of the data files shipped inside the package (airfoil; its README gives licence and citation)
PACKAGED_DIR = Path(__file__).resolve().parent / "data"

#: Commit of github.com/EmanuelSommer/MILE whose ``data/`` folder the checksums refer to.
MILE_COMMIT = "2c6dd8d170d991c5c2884153aa8a1e26297cbaca"

_BASE_URL = f"https://raw.githubusercontent.com/EmanuelSommer/MILE/{MILE_COMMIT}/data"
_CHUNK = 1 << 16


@dataclass(frozen=True)
class UCIDataset:
    """Reference description of one UCI data file.

    :param sha256: hex SHA-256 of the file's bytes.
    :param rows: number of observations ``N``.
    :param columns: number of columns in the file (features plus the target).
    :param task: ``"regression"`` or ``"classification"`` (0/1 labels).
    :param url: canonical download address of the file.
    """

    sha256: str
    rows: int
    columns: int
    task: str
    url: str

    @property
    def num_features(self) -> int:
        """Number of input features ``F`` (all columns but the last)."""
        return self.columns - 1


def _entry(name: str, sha256: str, rows: int, columns: int, task: str = "regression"):
    return name, UCIDataset(sha256, rows, columns, task, f"{_BASE_URL}/{name}.data")


#: Known data sets, keyed by name; checksums of MILE commit :data:`MILE_COMMIT`.
UCI_DATASETS: dict[str, UCIDataset] = dict(
    [
        _entry("airfoil", "3c5a45dcbb5f7cece50cb0163076b35421d80677cd0e773cfeddc5e5c38ed499", 1503, 6),
        _entry("concrete", "3af4f47d2f36c0e26a6d5ca423252e8ba36e82e0886c75c61e67185c2475a7af", 1030, 9),
        _entry("energy", "2b67b85eb98de29bba675b95a2cfaf177bcf518500477bae5981c7a834a30acf", 768, 9),
        _entry("yacht", "547880ac1116f554480d94e856d9230537b52d5907816ff12e52bb67f963d2ed", 308, 7),
        _entry("bikesharing", "48d3828986f1b06610a1a92441ddd58b3132a60d179a66611e43cde811036889", 17379, 13),
        _entry("protein", "d35f332707e8a73f21e021039250a1e7b26e14f7dd826a0337ffa8e8e48b9727", 45730, 10),
        _entry(
            "ionosphere",
            "08038e4eadbe69f7eb4c1682062bf1a46af2525b15b81a08ee4b69fc48da4502",
            351,
            34,
            task="classification",
        ),
    ]
)


def _dataset(name: str) -> UCIDataset:
    """Look ``name`` up in :data:`UCI_DATASETS`; ``ValueError`` listing the known names."""
    try:
        return UCI_DATASETS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(UCI_DATASETS))
        raise ValueError(f"Unknown UCI data set {name!r}. Known names: {known}.") from None


def default_cache_dir() -> Path:
    """Per-user folder for downloaded UCI files.

    :return: ``$XDG_CACHE_HOME/numpyro_mile/uci``, or ``~/.cache/numpyro_mile/uci`` when
        ``$XDG_CACHE_HOME`` is unset or empty.
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "numpyro_mile" / "uci"


def uci_search_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched for ``{name}.data``, in order.

    :param data_dir: explicit folder; when given it is the only one searched.
    :return: ``[data_dir]``, else ``[$NUMPYRO_MILE_DATA (if set), cache folder, the package's own data]`` (the
        package ships ``airfoil.data``: see ``numpyro_mile/datasets/data/README.md`` for its licence and citation).
    """
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    dirs = []
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(default_cache_dir())
    dirs.append(PACKAGED_DIR)
    return dirs


def _missing_file_message(name: str, searched: list[Path]) -> str:
    paths = "\n".join(f"  - {p}" for p in searched)
    return (
        f"UCI data file {name}.data not found. Searched:\n{paths}\n"
        f"Put {name}.data (whitespace-separated, target in the last column) into one of these "
        f"folders, or set ${DATA_ENV_VAR} to a folder that holds it, or pass data_dir=... . "
        f"To download it (checksum-verified) run "
        f"numpyro_mile.datasets.download_uci({name!r}) (source: {UCI_DATASETS[name].url})."
    )


def _read_table(path: Path) -> np.ndarray:
    """Parse a whitespace-separated numeric table into a float array of shape ``(N, C)``."""
    try:
        table = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise ValueError(f"Could not parse {path} as a whitespace-separated numeric table: {err}") from err
    if table.shape[0] == 0 or table.shape[1] < 2:
        raise ValueError(
            f"{path} must hold at least one row and two columns (features, then the target); got shape {table.shape}."
        )
    return table


def load_uci(name: str, data_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Load one UCI data set as NumPy arrays, in the file's row order (not shuffled).

    :param name: one of :data:`UCI_DATASETS` (``airfoil``, ``concrete``, ``energy``, ``yacht``,
        ``bikesharing``, ``protein``, ``ionosphere``).
    :param data_dir: folder holding ``{name}.data``; default: ``$NUMPYRO_MILE_DATA``, then
        the per-user cache folder (see :func:`uci_search_dirs`).
    :return: ``(X, y)``: inputs of shape ``(N, F)`` and targets of shape ``(N,)``, both
        ``float64`` in the file's original units (for ``ionosphere`` ``y`` holds 0/1 labels).
    :raises ValueError: unknown ``name``; unparsable file; NaN or infinite values.
    :raises FileNotFoundError: no ``{name}.data`` in any searched folder; the message lists
        the paths and how to get the file.
    """
    info = _dataset(name)
    searched = [d / f"{name}.data" for d in uci_search_dirs(data_dir)]
    path = next((p for p in searched if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(_missing_file_message(name, searched))
    table = _read_table(path)
    check_finite(f"UCI file {path}", table)
    if table.shape != (info.rows, info.columns):
        warnings.warn(
            f"{path} has shape {table.shape}, the reference {name}.data has "
            f"({info.rows}, {info.columns}); results will not be comparable to the MILE paper.",
            stacklevel=2,
        )
    return table[:, :-1], table[:, -1]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _checksum_error(name: str, expected: str, actual: str, source: str) -> ValueError:
    return ValueError(
        f"Checksum mismatch for {name}.data from {source}: expected sha256 {expected}, "
        f"got {actual}. The file is corrupt or a different version."
    )


def _fetch_verified(url: str, target: Path, expected: str, name: str, timeout: float) -> None:
    """Stream ``url`` to a temporary file next to ``target``, check sha256, rename atomically."""
    handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".part", delete=False)
    tmp = Path(handle.name)
    try:
        digest = hashlib.sha256()
        with handle, urllib.request.urlopen(url, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                digest.update(chunk)
                handle.write(chunk)
        actual = digest.hexdigest()
        if actual != expected:
            raise _checksum_error(name, expected, actual, url)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def download_uci(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    base_url: str | None = None,
    overwrite: bool = False,
    timeout: float = 60.0,
) -> Path:
    """Download ``{name}.data``, verify its SHA-256 and store it where :func:`load_uci` looks.

    The bytes go to a temporary file in the target folder, which is renamed to
    ``{name}.data`` only when the checksum matches; otherwise it is deleted.

    :param name: one of :data:`UCI_DATASETS`.
    :param data_dir: target folder (created if needed); default ``$NUMPYRO_MILE_DATA`` when
        set, else the per-user cache folder.
    :param base_url: folder URL to fetch ``{base_url}/{name}.data`` from instead of the
        canonical address (a mirror, or a local server in tests).
    :param overwrite: download again even if a verified file is already there.
    :param timeout: network timeout in seconds.
    :return: path of the verified ``{name}.data``.
    :raises ValueError: unknown ``name``; downloaded (or existing) file with a wrong checksum,
        naming the expected and actual sums.
    """
    info = _dataset(name)
    target_dir = uci_search_dirs(data_dir)[0]
    target = target_dir / f"{name}.data"
    if target.is_file() and not overwrite:
        actual = _sha256(target)
        if actual != info.sha256:
            raise ValueError(
                f"{target} exists but its sha256 is {actual}, expected {info.sha256}. "
                "Delete it or call download_uci(..., overwrite=True)."
            )
        logger.info("%s already present and verified at %s", name, target)
        return target
    url = info.url if base_url is None else f"{base_url.rstrip('/')}/{name}.data"
    target_dir.mkdir(parents=True, exist_ok=True)
    logger.info("Downloading %s to %s", url, target)
    _fetch_verified(url, target, info.sha256, name, timeout)
    return target
