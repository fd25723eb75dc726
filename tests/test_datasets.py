"""Tests for numpyro_mile.datasets: UCI loading/download, splits, standardisation, toy data.

No test contacts the internet: downloads go to a local HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from numpyro_mile.datasets import (
    GAP,
    UCI_DATASETS,
    Split,
    Standardizer,
    download_uci,
    load_uci,
    split,
    standardize,
    toy_function,
    toy_regression,
    toy_regression_grid,
)

SHARED_UCI = Path(os.environ.get("NUMPYRO_MILE_DATA") or Path(__file__).parents[2] / "shared" / "data" / "uci")
needs_shared = pytest.mark.skipif(
    not (SHARED_UCI / "airfoil.data").is_file(), reason=f"no shared UCI data at {SHARED_UCI}"
)


def _write_table(path: Path, table: np.ndarray) -> Path:
    np.savetxt(path, table, fmt="%.10g", delimiter=" ")
    return path


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No $NUMPYRO_MILE_DATA, and the per-user cache inside tmp_path."""
    monkeypatch.delenv("NUMPYRO_MILE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep pytest output clean
        pass


@pytest.fixture
def serve(monkeypatch):
    """Start a local HTTP server on a folder; returns a function folder -> base URL."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- registry / loading


def test_registry_entries():
    assert set(UCI_DATASETS) == {"airfoil", "concrete", "energy", "yacht", "bikesharing", "protein", "ionosphere"}
    for name, info in UCI_DATASETS.items():
        assert len(info.sha256) == 64
        assert info.url.endswith(f"/{name}.data") and info.url.startswith("https://")
    assert UCI_DATASETS["ionosphere"].task == "classification"
    assert UCI_DATASETS["airfoil"].num_features == 5


def test_load_round_trip_data_dir(tmp_path):
    table = np.random.default_rng(0).normal(size=(12, 7))
    _write_table(tmp_path / "yacht.data", table)
    with pytest.warns(UserWarning, match="reference yacht.data"):
        X, y = load_uci("yacht", data_dir=tmp_path)
    assert X.shape == (12, 6) and y.shape == (12,)
    assert X.dtype == np.float64 and y.dtype == np.float64
    np.testing.assert_allclose(X, table[:, :-1], rtol=1e-9)
    np.testing.assert_allclose(y, table[:, -1], rtol=1e-9)


def test_load_from_env_var(clean_env, monkeypatch):
    folder = clean_env / "env"
    folder.mkdir()
    table = np.arange(5 * 6, dtype=float).reshape(5, 6)
    _write_table(folder / "airfoil.data", table)
    monkeypatch.setenv("NUMPYRO_MILE_DATA", str(folder))
    with pytest.warns(UserWarning):
        X, y = load_uci("airfoil")
    np.testing.assert_array_equal(y, table[:, -1])


def test_load_from_xdg_cache(clean_env):
    folder = clean_env / "cache" / "numpyro_mile" / "uci"
    folder.mkdir(parents=True)
    _write_table(folder / "energy.data", np.ones((4, 9)))
    with pytest.warns(UserWarning):
        X, y = load_uci("energy")
    assert X.shape == (4, 8)


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="Known names: airfoil, bikesharing, concrete"):
        load_uci("iris")
    with pytest.raises(ValueError, match="Unknown UCI data set"):
        download_uci("iris")


def test_missing_file_message(clean_env, monkeypatch):
    env_dir = clean_env / "nothing_here"
    monkeypatch.setenv("NUMPYRO_MILE_DATA", str(env_dir))
    with pytest.raises(FileNotFoundError) as info:
        load_uci("concrete")
    message = str(info.value)
    assert str(env_dir / "concrete.data") in message
    assert str(clean_env / "cache" / "numpyro_mile" / "uci" / "concrete.data") in message
    assert "download_uci('concrete')" in message
    assert "NUMPYRO_MILE_DATA" in message

    with pytest.raises(FileNotFoundError, match="download_uci") as info:
        load_uci("concrete", data_dir=clean_env / "explicit")
    assert str(clean_env / "explicit" / "concrete.data") in str(info.value)


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_nan_in_file(tmp_path, bad):
    (tmp_path / "yacht.data").write_text(f"1 2 3 4 5 6 7\n1 2 {bad} 4 5 6 7\n")
    with pytest.raises(ValueError, match="NaN or infinite"):
        load_uci("yacht", data_dir=tmp_path)


def test_unparsable_file(tmp_path):
    (tmp_path / "yacht.data").write_text("1 2 3 4 5 6 7\n1 2 NA 4 5 6 7\n")
    with pytest.raises(ValueError, match="Could not parse"):
        load_uci("yacht", data_dir=tmp_path)


@needs_shared
def test_load_shared_airfoil():
    X, y = load_uci("airfoil", data_dir=SHARED_UCI)
    assert X.shape == (1503, 5) and y.shape == (1503,)


@needs_shared
def test_load_shared_ionosphere_labels():
    X, y = load_uci("ionosphere", data_dir=SHARED_UCI)
    assert X.shape == (351, 33)
    assert set(np.unique(y)) == {0.0, 1.0}


# --------------------------------------------------------------------------- download


@needs_shared
def test_download_from_local_server(serve, tmp_path):
    base_url = serve(SHARED_UCI)
    target = tmp_path / "dl"
    path = download_uci("yacht", target, base_url=base_url)
    assert path == target / "yacht.data"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == UCI_DATASETS["yacht"].sha256
    assert sorted(p.name for p in target.iterdir()) == ["yacht.data"]
    X, y = load_uci("yacht", data_dir=target)
    assert X.shape == (308, 6)
    # Present and verified: no second download (an unreachable base_url is never used).
    assert download_uci("yacht", target, base_url="http://127.0.0.1:9") == path


def test_download_rejects_wrong_checksum(serve, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "yacht.data").write_text("1 2 3 4 5 6 7\n")  # tampered content
    target = tmp_path / "dl"
    with pytest.raises(ValueError) as info:
        download_uci("yacht", target, base_url=serve(served) + "/")
    message = str(info.value)
    assert UCI_DATASETS["yacht"].sha256 in message
    assert hashlib.sha256(b"1 2 3 4 5 6 7\n").hexdigest() in message
    assert list(target.iterdir()) == []


def test_existing_file_with_wrong_checksum(tmp_path):
    (tmp_path / "yacht.data").write_text("0 0 0 0 0 0 0\n")
    with pytest.raises(ValueError, match="overwrite=True"):
        download_uci("yacht", tmp_path, base_url="http://127.0.0.1:9")


# --------------------------------------------------------------------------- split


def _ids(n: int = 100, features: int = 3):
    X = np.repeat(np.arange(n, dtype=float)[:, None], features, axis=1)
    return X, np.arange(n, dtype=float)


def test_split_sizes_disjoint_and_aligned():
    X, y = _ids(1503)
    parts = split(X, y, seed=1)
    assert isinstance(parts, Split)
    assert [len(p[1]) for p in parts] == [1052, 150, 301]
    ids = [p[1].astype(int) for p in parts]
    assert len(set(np.concatenate(ids))) == 1503
    for Xp, yp in parts:
        np.testing.assert_array_equal(Xp[:, 0], yp)


def test_split_exact_floor_sizes():
    X, y = _ids(10)
    assert [len(p[1]) for p in split(X, y, seed=0)] == [7, 1, 2]


def test_split_deterministic():
    X, y = _ids()
    a, b, c = split(X, y, seed=3), split(X, y, seed=3), split(X, y, seed=4)
    for pa, pb in zip(a, b):
        np.testing.assert_array_equal(pa[1], pb[1])
    assert not np.array_equal(a.train[1], c.train[1])
    assert not np.array_equal(a.train[1], np.sort(a.train[1]))


@pytest.mark.parametrize(
    "fractions, match",
    [
        ((0.7, 0.2, 0.2), "sum to 1"),
        ((0.8, 0.0, 0.2), "positive"),
        ((1.1, -0.1, 0.0), "positive"),
        ((0.5, 0.5), "three entries"),
    ],
)
def test_split_bad_fractions(fractions, match):
    X, y = _ids()
    with pytest.raises(ValueError, match=match):
        split(X, y, seed=0, fractions=fractions)


def test_split_too_small():
    X, y = _ids(5)
    with pytest.raises(ValueError, match="too few"):
        split(X, y, seed=0)


def test_split_checks_inputs():
    X, y = _ids()
    with pytest.raises(ValueError, match="different numbers of rows"):
        split(X, y[:-1], seed=0)
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        split(X, y, seed=0)


# --------------------------------------------------------------------------- standardize


def _data(n: int = 500, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=[3.0, -2.0, 50.0], scale=[2.0, 0.5, 10.0], size=(n, 3))
    X = np.column_stack([X, np.full(n, 7.0)])  # a constant column
    y = 5.0 + 4.0 * X[:, 0] + rng.normal(size=n)
    return X, y


def test_standardize_train_stats():
    parts, scaler = standardize(split(*_data(), seed=0))
    assert isinstance(scaler, Standardizer)
    X_tr, y_tr = parts.train
    np.testing.assert_allclose(X_tr.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(X_tr[:, :3].std(0), 1.0, rtol=1e-12)
    assert scaler.x_std[3] == 1.0
    np.testing.assert_allclose(X_tr[:, 3], 0.0)
    assert abs(y_tr.mean()) < 1e-12 and abs(y_tr.std() - 1.0) < 1e-12
    assert abs(parts.test[1].mean()) > 1e-6  # test part not fitted exactly


def test_standardize_full_stats():
    X, y = _data()
    parts, scaler = standardize(split(X, y, seed=0), stats="full")
    np.testing.assert_allclose(scaler.x_mean, X.mean(0))
    np.testing.assert_allclose(scaler.y_std, y.std())
    allX = np.concatenate([p[0] for p in parts])
    np.testing.assert_allclose(allX.mean(0), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="'train' or 'full'"):
        standardize(parts, stats="test")


def test_standardize_inverse_round_trip():
    raw = split(*_data(), seed=2)
    parts, scaler = standardize(raw)
    np.testing.assert_allclose(scaler.inverse_y(parts.test[1]), raw.test[1])
    np.testing.assert_allclose(scaler.transform_x(raw.val[0]), parts.val[0])
    np.testing.assert_allclose(scaler.transform_y(raw.val[1]), parts.val[1])
    np.testing.assert_allclose(scaler.inverse_scale(2.0), 2.0 * scaler.y_std)
    rmse_std = np.sqrt(np.mean((parts.test[1] - 0.1) ** 2))
    rmse_raw = np.sqrt(np.mean((raw.test[1] - scaler.inverse_y(0.1)) ** 2))
    np.testing.assert_allclose(scaler.inverse_scale(rmse_std), rmse_raw)


def test_standardize_classification_keeps_labels():
    X, _ = _data()
    labels = (X[:, 0] > 3.0).astype(np.int64)
    parts, scaler = standardize(split(X, labels, seed=0), standardize_y=False)
    assert scaler.y_mean == 0.0 and scaler.y_std == 1.0
    assert parts.train[1].dtype == np.int64
    assert set(np.unique(parts.train[1])) <= {0, 1}


# --------------------------------------------------------------------------- toy


def test_toy_regression_gap_and_shapes():
    X, y = toy_regression(200, seed=0)
    assert X.shape == (200, 1) and y.shape == (200,)
    x = X[:, 0]
    assert not np.any((x > GAP[0]) & (x < GAP[1]))
    assert np.all(np.abs(x) <= 1.0)
    assert (x < 0).sum() == 100 and (x > 0).sum() == 100
    assert np.std(y - toy_function(x)) == pytest.approx(0.1, rel=0.25)


def test_toy_regression_deterministic():
    a, b, c = toy_regression(50, seed=1), toy_regression(50, seed=1), toy_regression(50, seed=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    X, y = toy_regression(31, seed=0, noise=0.0)
    np.testing.assert_array_equal(y, toy_function(X[:, 0]))
    with pytest.raises(ValueError):
        toy_regression(1)
    with pytest.raises(ValueError):
        toy_regression(10, noise=-1.0)


def test_toy_grid():
    G = toy_regression_grid(7)
    assert G.shape == (7, 1)
    np.testing.assert_allclose(G[:, 0], np.linspace(-1.5, 1.5, 7))


# ---------------------------------------------------------------- classification sets
@pytest.mark.parametrize("name, shape, classes", [("digits", (8, 8, 1), 10), ("mnist1d", (40, 1), 10)])
def test_classification_sets_shapes_labels_and_seed(name, shape, classes):
    from numpyro_mile import datasets

    loader = getattr(datasets, name)
    kwargs = {"images": True} if name == "digits" else {"channel_axis": True}
    parts = loader(seed=3, **kwargs)
    assert datasets.NUM_CLASSES[name] == classes
    for X, y in parts:
        assert X.shape[1:] == shape and X.dtype == np.float32 and y.dtype == np.int32
        assert np.isfinite(X).all() and set(np.unique(y)) <= set(range(classes))
    assert set(np.unique(parts.train[1])) == set(range(classes))
    again = loader(seed=3, **kwargs)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(parts, again))
    other = loader(seed=4, **kwargs)
    assert not np.array_equal(parts.train[1], other.train[1])


def test_mnist1d_restores_numpy_global_state():
    from numpyro_mile.datasets import mnist1d

    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    mnist1d(num_samples=100)
    assert np.random.rand() == expected
    with pytest.raises(ValueError, match="multiple of 10"):
        mnist1d(num_samples=15)


@needs_shared
def test_ionosphere_split_is_standardised_binary():
    from numpyro_mile.datasets import ionosphere

    (X, y), val, test = ionosphere(seed=1, data_dir=SHARED_UCI)
    assert X.shape[1] == 33 and set(np.unique(y)) == {0, 1}
    np.testing.assert_allclose(X.mean(0), 0.0, atol=1e-5)
    assert len(X) + len(val[0]) + len(test[0]) == 351


def test_packaged_airfoil_is_the_reference_file_and_found_without_setup(clean_env):
    """The package ships airfoil (licence and citation in its README) so the guide runs without a download: the
    file is the reference's byte for byte, and load_uci finds it when no other folder holds it."""
    from numpyro_mile.datasets import uci

    packaged = uci.PACKAGED_DIR / "airfoil.data"
    assert uci._sha256(packaged) == uci.UCI_DATASETS["airfoil"].sha256
    assert "CC BY 4.0" in (uci.PACKAGED_DIR / "README.md").read_text()
    X, y = load_uci("airfoil")
    assert X.shape == (1503, 5) and y.shape == (1503,)
