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


def test_chainwise_rhat_arviz_rank_matches_arviz_per_chain(chains3):
    # method="arviz_rank" is the earlier definition: arviz.rhat(method="rank") of each chain's
    # pieces, trailing draws dropped, mean over chains
    result = d.chainwise_rhat(chains3, num_splits=4, method="arviz_rank")
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


def test_chainwise_rhat_arviz_rank_other_splits(chains3):
    result = d.chainwise_rhat(chains3[..., 0, 0], num_splits=3, method="arviz_rank")
    length = 203 // 3
    expected = np.mean([az.rhat(chains3[c, : 3 * length, 0, 0].reshape(3, length), method="rank") for c in range(3)])
    assert float(result) == pytest.approx(expected, rel=1e-10)


def _crhat_reference_loop(x, num_splits=4):
    """cR-hat as in the MILE reference code, one chain and one element at a time.

    Per chain: rank all n draws (ties averaged), z = Phi^-1((r - 0.375) / (n + 0.25)), keep
    the first num_splits * m values (m = n // num_splits), cut them into num_splits pieces,
    W = mean of the pieces' variances, B = variance of the pieces' means (ddof=1),
    R-hat = sqrt(((m - 1) / m * W + B) / W); then the mean over chains.
    """
    from scipy import stats

    chains, n = x.shape[:2]
    flat = x.reshape(chains, n, -1)
    m = n // num_splits
    out = np.zeros(flat.shape[2])
    for k in range(flat.shape[2]):
        for c in range(chains):
            z = stats.norm.ppf((stats.rankdata(flat[c, :, k]) - 0.375) / (n + 0.25))
            pieces = [z[i * m : (i + 1) * m] for i in range(num_splits)]
            w = np.mean([np.var(p, ddof=1) for p in pieces])
            b = np.var([np.mean(p) for p in pieces], ddof=1)
            out[k] += np.sqrt(((m - 1) / m * w + b) / w) / chains
    return out.reshape(x.shape[2:])


@pytest.mark.parametrize("draws", [1000, 1003])
def test_chainwise_rhat_mile_matches_reference_loop(draws):
    # slow AR(1) chains (phi = 0.9), so cR-hat is visibly above 1 and the formula matters;
    # 1003 draws is not a multiple of 4 (all draws ranked, the first 1000 used)
    x = _ar1_chains(np.random.default_rng(3), 3, draws, (5,), rho=0.9)
    result = d.chainwise_rhat(x)
    assert result.shape == (5,)
    np.testing.assert_allclose(result, _crhat_reference_loop(x), rtol=0, atol=1e-6)
    np.testing.assert_allclose(d.chainwise_rhat(x, method="mile"), result, rtol=0, atol=0)
    np.testing.assert_allclose(d.chainwise_rhat(x, num_splits=3), _crhat_reference_loop(x, 3), rtol=0, atol=1e-6)
    assert np.all(result > 1.005)  # the test is sensitive: cR-hat - 1 is well above 1e-6


def test_chainwise_rhat_mile_ties_and_shapes():
    # ties (discrete draws) get average ranks, as scipy.stats.rankdata; any param shape
    rng = np.random.default_rng(4)
    x = rng.integers(0, 6, size=(2, 203, 2, 3)).astype(float)
    np.testing.assert_allclose(d.chainwise_rhat(x), _crhat_reference_loop(x), rtol=0, atol=1e-6)


def test_chainwise_rhat_mile_detects_drift_and_is_one_for_iid():
    rng = np.random.default_rng(5)
    # iid N(0, 1) chains, n = 4000, m = 1000: B ~ chi2_3 / (3 m), so R-hat - 1 ~ B / 2 has mean
    # 1 / (2 m) = 0.0005 and sd ~ 0.0004 per chain; 0.01 is a wide margin
    iid = rng.normal(size=(4, 4000, 10))
    assert np.all(np.abs(d.chainwise_rhat(iid) - 1) < 0.01)
    # the same chains plus a linear drift of 2 sd over the run: consecutive piece means 0.5 sd
    # apart, B / W ~ 0.4, so R-hat ~ sqrt(1 + B / W) ~ 1.18 (rank normalisation changes little)
    drifting = iid + np.linspace(0.0, 2.0, 4000)[:, None]
    assert np.all(d.chainwise_rhat(drifting) > 1.1)
    # one drifting chain out of four still shows in the mean: ~ (1.18 + 3) / 4 ~ 1.045
    one = iid.copy()
    one[0] += np.linspace(0.0, 2.0, 4000)[:, None]
    assert np.all(d.chainwise_rhat(one) > 1.02)


def test_chainwise_rhat_mile_constant_elements_are_nan():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 100, 3))
    x[:, :, 0] = 2.0  # constant in every chain
    x[1, :, 2] = -1.0  # constant in one chain: that chain's R-hat is NaN, and so the mean
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning escapes
        result = d.chainwise_rhat(x)
        rows = d.summary({"x": x})
    assert np.isnan(result[0]) and np.isnan(result[2]) and np.isfinite(result[1])
    assert rows[0]["crhat"] == pytest.approx(result[1])  # NaN elements skipped


def test_chainwise_rhat_arviz_rank_equals_old_implementation():
    # the pre-change implementation, verbatim: the pieces of each chain as ArviZ's chains,
    # arviz.rhat(method="rank") in one call with the chain index as a parameter dimension
    x = _ar1_chains(np.random.default_rng(7), 3, 1003, (2, 2), rho=0.9)
    length = 1003 // 4
    pieces = x[:, : 4 * length].reshape(3, 4, length, 2, 2)
    dataset = az.convert_to_dataset({"x": np.moveaxis(pieces, 0, 2)})
    old = np.asarray(az.rhat(dataset, method="rank")["x"].values).reshape(3, 2, 2).mean(axis=0)
    np.testing.assert_allclose(d.chainwise_rhat(x, method="arviz_rank"), old, rtol=1e-12)
    # and the two definitions do differ (ArviZ also halves the pieces and folds)
    assert not np.allclose(d.chainwise_rhat(x), old, rtol=1e-3)
    rows = d.summary({"x": x}, crhat_method="arviz_rank")
    assert rows[0]["crhat"] == pytest.approx(old.mean())
    assert d.summary({"x": x})[0]["crhat"] == pytest.approx(d.chainwise_rhat(x).mean())


def test_chainwise_rhat_bad_method_raises():
    x = np.random.default_rng(8).normal(size=(2, 100))
    for bad in ("arviz", "MILE", "", None):
        with pytest.raises(ValueError, match="method must be one of 'mile', 'arviz_rank'"):
            d.chainwise_rhat(x, method=bad)
    with pytest.raises(ValueError, match="method must be one of"):
        d.chainwise_rhat({"x": x}, method="rank")
    with pytest.raises(ValueError, match="method must be one of"):
        d.summary({"x": x}, crhat_method="rank")


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
        assert row["ess_per_chain"] == pytest.approx(np.mean(d.ess(samples[name], per_chain=True)))
        assert row["crhat"] == pytest.approx(np.mean(d.chainwise_rhat(samples[name])))
        assert row["rhat"] == pytest.approx(np.mean(d.rhat(samples[name])))
    assert rows[0]["rhat"] > 1.5  # chains in different modes
    assert rows[1]["rhat"] < 1.1

    pooled = d.summary(samples, group=lambda s: s.rsplit(".", 1)[0])
    assert len(pooled) == 1 and pooled[0]["site"] == "layer0" and pooled[0]["size"] == 7
    all_crhat = np.concatenate([d.chainwise_rhat(samples["layer0.w"]).ravel(), d.chainwise_rhat(samples["layer0.b"])])
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
