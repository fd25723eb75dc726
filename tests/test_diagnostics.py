"""Tests of numpyro_mile.diagnostics against ArviZ applied by hand, element by element."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

from numpyro_mile import diagnostics as d


def _ar1_chains(rng, chains, draws, shape=(), rho=0.7, offsets=None):
    """AR(1) chains, shape (chains, draws, *shape), optionally shifted per chain."""
    noise = rng.normal(size=(chains, draws, *shape))
    x = np.empty_like(noise)
    x[:, 0] = noise[:, 0]
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho**2) * noise[:, t]
    if offsets is not None:
        x = x + np.asarray(offsets).reshape(chains, *([1] * (x.ndim - 1)))
    return x


@pytest.fixture
def chains3():
    # 3 chains in different "modes", 203 draws (not divisible by 4), parameter shape (2, 2)
    rng = np.random.default_rng(0)
    return _ar1_chains(rng, 3, 203, (2, 2), offsets=[0.0, 3.0, -2.0])


def test_chainwise_rhat_matches_arviz_per_chain(chains3):
    result = d.chainwise_rhat(chains3, num_splits=4)
    assert result.shape == (2, 2)
    length = 203 // 4
    expected = np.zeros((2, 2))
    for c in range(3):
        for i in range(2):
            for j in range(2):
                pieces = chains3[c, : 4 * length, i, j].reshape(4, length)
                expected[i, j] += az.rhat(pieces, method="rank") / 3
    np.testing.assert_allclose(result, expected, rtol=1e-10)
    # within-mode mixing is fine, between modes it is not
    assert np.all(result < 1.25)
    assert np.all(d.rhat(chains3) > 1.5)


def test_chainwise_rhat_other_splits(chains3):
    result = d.chainwise_rhat(chains3[..., 0, 0], num_splits=3)
    length = 203 // 3
    expected = np.mean(
        [az.rhat(chains3[c, : 3 * length, 0, 0].reshape(3, length), method="rank") for c in range(3)]
    )
    assert float(result) == pytest.approx(expected, rel=1e-10)


def test_ess_per_chain_matches_arviz_per_chain(chains3):
    result = d.ess(chains3, per_chain=True)
    assert result.shape == (2, 2)
    expected = np.zeros((2, 2))
    for c in range(3):
        for i in range(2):
            for j in range(2):
                expected[i, j] += az.ess(chains3[c, :, i, j][None, :], method="bulk") / 3
    np.testing.assert_allclose(result, expected, rtol=1e-10)


def test_ess_and_rhat_pooled_match_arviz(chains3):
    ess = d.ess(chains3)
    rhat = d.rhat(chains3)
    for i in range(2):
        for j in range(2):
            assert ess[i, j] == pytest.approx(az.ess(chains3[:, :, i, j], method="bulk"))
            assert rhat[i, j] == pytest.approx(az.rhat(chains3[:, :, i, j], method="rank"))


def test_dict_input_returns_dicts_shaped_like_parameters(chains3):
    samples = {"w": chains3, "b": chains3[..., 0, 0]}
    ess = d.ess(samples, per_chain=True)
    crhat = d.chainwise_rhat(samples)
    rhat = d.rhat(samples)
    assert ess["w"].shape == (2, 2) and ess["b"].shape == ()
    assert crhat["w"].shape == (2, 2) and rhat["b"].shape == ()
    assert float(ess["b"]) == pytest.approx(ess["w"][0, 0])


def test_summary_on_dict(chains3):
    rng = np.random.default_rng(1)
    samples = {"layer0.w": chains3, "layer0.b": _ar1_chains(rng, 3, 203, (3,))}
    rows = d.summary(samples)
    assert [r["site"] for r in rows] == ["layer0.w", "layer0.b"]
    assert [r["size"] for r in rows] == [4, 3]
    for row, name in zip(rows, samples):
        assert row["ess_per_chain"] == pytest.approx(
            np.mean(d.ess(samples[name], per_chain=True))
        )
        assert row["crhat"] == pytest.approx(np.mean(d.chainwise_rhat(samples[name])))
        assert row["rhat"] == pytest.approx(np.mean(d.rhat(samples[name])))
    assert rows[0]["rhat"] > 1.5  # chains in different modes
    assert rows[1]["rhat"] < 1.1

    pooled = d.summary(samples, group=lambda s: s.rsplit(".", 1)[0])
    assert len(pooled) == 1 and pooled[0]["site"] == "layer0" and pooled[0]["size"] == 7
    all_crhat = np.concatenate(
        [d.chainwise_rhat(samples["layer0.w"]).ravel(), d.chainwise_rhat(samples["layer0.b"])]
    )
    assert pooled[0]["crhat"] == pytest.approx(all_crhat.mean())

    text = d.format_summary(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["site", "size", "ESS/chain", "cR-hat", "R-hat"]
    assert lines[2].split()[:2] == ["layer0.w", "4"]
    assert f"{rows[1]['crhat']:.3f}" in lines[3]


def test_summary_single_chain_has_nan_rhat():
    rng = np.random.default_rng(2)
    rows = d.summary({"x": _ar1_chains(rng, 1, 100)})
    assert np.isnan(rows[0]["rhat"]) and np.isfinite(rows[0]["crhat"])
    assert "nan" in d.format_summary(rows)


def test_errors():
    with pytest.raises(ValueError, match=r"\(chains, draws, \.\.\.\)"):
        d.ess(np.zeros(10))
    with pytest.raises(ValueError, match="at least 2 chains"):
        d.rhat(np.zeros((1, 50)))
    with pytest.raises(ValueError, match="at least 16 draws"):
        d.chainwise_rhat(np.zeros((2, 10)), num_splits=4)
    with pytest.raises(ValueError, match="num_splits"):
        d.chainwise_rhat(np.zeros((2, 100)), num_splits=1)
    with pytest.raises(ValueError, match="different \\(chains, draws\\)"):
        d.summary({"a": np.zeros((2, 50)), "b": np.zeros((2, 60))}, group=lambda s: "all")


def test_inference_data_input_matches_dict(chains3):
    samples = {"w": chains3}
    idata = az.from_dict(posterior=samples)
    assert d.summary(idata) == d.summary(samples)
    np.testing.assert_allclose(d.chainwise_rhat(idata)["w"], d.chainwise_rhat(chains3))
