"""Classification data that needs no download: scikit-learn digits, generated MNIST-1D, ionosphere.

Every loader returns a :class:`~numpyro_mile.datasets.Split` of ``(X, y)`` parts with
``float32``-ready inputs and ``int32`` labels in ``0 .. num_classes - 1``, cut by
:func:`~numpyro_mile.datasets.split` (so the same ``seed`` gives the same split).

==============  =======  ============================  ==========================================
name            rows     inputs                        source
==============  =======  ============================  ==========================================
``digits``      1797     ``(64,)`` or ``(8, 8, 1)``    ``sklearn.datasets.load_digits`` (bundled)
``mnist1d``     4000     ``(40,)`` or ``(40, 1)``      ``mnist1d`` package templates (generated)
``ionosphere``  351      ``(33,)``                     ``ionosphere.data`` via :func:`load_uci`
==============  =======  ============================  ==========================================
"""

from __future__ import annotations

import os

import numpy as np

from .preprocess import Split, split, standardize
from .uci import load_uci

__all__ = ["digits", "ionosphere", "mnist1d", "NUM_CLASSES"]

#: Number of classes of each data set.
NUM_CLASSES = {"digits": 10, "mnist1d": 10, "ionosphere": 2}


def _labels(parts: Split) -> Split:
    return Split(*((np.asarray(X, np.float32), np.asarray(y).astype(np.int32)) for X, y in parts))


def digits(*, seed: int = 0, images: bool = False, fractions=(0.7, 0.1, 0.2)) -> Split:
    """scikit-learn's 8x8 handwritten digits, pixels scaled to ``[0, 1]``.

    :param seed: seed of the shuffle.
    :param images: return inputs of shape ``(N, 8, 8, 1)`` (height, width, channel) for a CNN;
        default flat ``(N, 64)``.
    :param fractions: ``(train, val, test)`` fractions.
    :return: :class:`Split` with ``y`` in ``0..9``.

    **Example**

    >>> from numpyro_mile.datasets import digits
    >>> (X, y), val, test = digits(seed=1, images=True)
    >>> X.shape[1:], int(y.max())
    ((8, 8, 1), 9)
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - scikit-learn is in the test/examples extras
        raise ImportError("digits() needs scikit-learn: pip install 'numpyro_mile[examples]'.") from err
    data = load_digits()
    X = data.data.astype(np.float32) / 16.0
    parts = split(X, data.target, seed=seed, fractions=fractions)
    if images:
        parts = Split(*((X.reshape(-1, 8, 8, 1), y) for X, y in parts))
    return _labels(parts)


def mnist1d(
    *,
    seed: int = 0,
    num_samples: int = 4000,
    channel_axis: bool = False,
    fractions=(0.7, 0.1, 0.2),
    generator_seed: int = 42,
) -> Split:
    """MNIST-1D (Greydanus 2020), generated locally from the ``mnist1d`` package's templates.

    Nothing is downloaded: the package's generator turns its ten built-in templates into
    length-40 sequences with random padding, shift, shear, scale and noise. The global NumPy
    random state the generator uses is restored afterwards.

    :param seed: seed of the train/validation/test shuffle.
    :param num_samples: number of sequences (a multiple of 10; the reference set has 4000 + 1000).
    :param channel_axis: return inputs of shape ``(N, 40, 1)`` (length, channel) for a 1-D CNN
        or an attention model; default flat ``(N, 40)``.
    :param fractions: ``(train, val, test)`` fractions.
    :param generator_seed: seed of the generator (42 reproduces the reference data set's rows).
    :return: :class:`Split` with ``y`` in ``0..9``; inputs have mean 0 and standard deviation 1 overall.
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as err:
        raise ImportError("mnist1d() needs the mnist1d package: pip install mnist1d.") from err
    if num_samples < 10 or num_samples % 10:
        raise ValueError(f"num_samples must be a positive multiple of 10, got {num_samples}.")
    args = get_dataset_args()
    args.num_samples, args.train_split, args.seed = num_samples, 1.0, generator_seed
    state = np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(state)
    X = np.asarray(data["x"], np.float32)
    parts = split(X, np.asarray(data["y"]), seed=seed, fractions=fractions)
    if channel_axis:
        parts = Split(*((X[..., None], y) for X, y in parts))
    return _labels(parts)


def ionosphere(*, seed: int = 0, data_dir: str | os.PathLike | None = None, fractions=(0.7, 0.1, 0.2)) -> Split:
    """UCI ionosphere (binary), features standardised with training-part statistics.

    :param seed: seed of the shuffle.
    :param data_dir: folder holding ``ionosphere.data`` (see :func:`~numpyro_mile.datasets.load_uci`).
    :param fractions: ``(train, val, test)`` fractions.
    :return: :class:`Split` with inputs ``(N, 33)`` and ``y`` in ``{0, 1}``.
    """
    X, y = load_uci("ionosphere", data_dir=data_dir)
    parts, _ = standardize(split(X, y, seed=seed, fractions=fractions), standardize_y=False)
    return _labels(parts)
