"""The installed package's version (from its metadata, so that it is written in one place: pyproject.toml)."""

from importlib import metadata

try:
    __version__ = metadata.version("numpyro_mile")
except metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "unknown"
