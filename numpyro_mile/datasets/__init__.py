"""Data for the benchmarks and examples: UCI files, splits, standardisation, toy data.

Typical use::

    from numpyro_mile.datasets import load_uci, split, standardize

    X, y = load_uci("airfoil")                      # file's units, X (N, F), y (N,)
    parts = split(X, y, seed=1)                     # 70 / 10 / 20 %, shuffled
    parts, scaler = standardize(parts)              # training-part mean / std
    X_train, y_train = parts.train
    rmse_in_db = scaler.inverse_scale(rmse_standardised)
"""

from .classification import NUM_CLASSES, digits, ionosphere, mnist1d
from .preprocess import Split, Standardizer, split, standardize
from .toy import GAP, toy_function, toy_regression, toy_regression_grid
from .uci import (
    DATA_ENV_VAR,
    MILE_COMMIT,
    UCI_DATASETS,
    UCIDataset,
    default_cache_dir,
    download_uci,
    load_uci,
    uci_search_dirs,
)

__all__ = [
    "NUM_CLASSES",
    "digits",
    "ionosphere",
    "mnist1d",
    "DATA_ENV_VAR",
    "GAP",
    "MILE_COMMIT",
    "Split",
    "Standardizer",
    "UCIDataset",
    "UCI_DATASETS",
    "default_cache_dir",
    "download_uci",
    "load_uci",
    "split",
    "standardize",
    "toy_function",
    "toy_regression",
    "toy_regression_grid",
    "uci_search_dirs",
]
