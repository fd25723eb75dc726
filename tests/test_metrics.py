"""Tests of numpyro_mile.metrics against independent hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from numpyro_mile import metrics as m

# --------------------------------------------------------------------------------------
# regression
# --------------------------------------------------------------------------------------


def test_gaussian_log_likelihood_matches_formula():
    rng = np.random.default_rng(0)
    y = rng.normal(size=5)
    mu = rng.normal(size=(3, 5))
    sigma = rng.uniform(0.5, 2.0, size=(3, 5))
    out = m.gaussian_log_likelihood(y, mu, sigma)
    assert out.shape == (3, 5)
    for s in range(3):
        for n in range(5):
            expected = -0.5 * math.log(2 * math.pi * sigma[s, n] ** 2) - (y[n] - mu[s, n]) ** 2 / (2 * sigma[s, n] ** 2)
            assert out[s, n] == pytest.approx(expected, rel=1e-12)
    # scalar sigma broadcasts
    assert m.gaussian_log_likelihood(y, mu, 1.0).shape == (3, 5)


def test_gaussian_log_likelihood_errors():
    with pytest.raises(ValueError, match="N = 4"):
        m.gaussian_log_likelihood(np.zeros(4), np.zeros((3, 5)), 1.0)
    with pytest.raises(ValueError, match="positive"):
        m.gaussian_log_likelihood(np.zeros(5), np.zeros((3, 5)), 0.0)
    with pytest.raises(ValueError, match="broadcast"):
        m.gaussian_log_likelihood(np.zeros(5), np.zeros((3, 5)), np.ones((2, 5)))


def test_lppd_matches_direct_loop():
    rng = np.random.default_rng(1)
    ll = rng.normal(-1.0, 0.7, size=(50, 8))
    expected = []
    for n in range(ll.shape[1]):
        expected.append(math.log(sum(math.exp(v) for v in ll[:, n]) / ll.shape[0]))
    mean, pointwise = m.lppd(ll, pointwise=True)
    np.testing.assert_allclose(pointwise, expected, rtol=1e-12)
    assert mean == pytest.approx(np.mean(expected), rel=1e-12)
    assert m.lppd(ll) == pytest.approx(np.mean(expected), rel=1e-12)
    # (chains, draws, N) is flattened
    assert m.lppd(ll.reshape(5, 10, 8)) == pytest.approx(np.mean(expected), rel=1e-12)


def test_lppd_weighted_matches_direct_loop():
    rng = np.random.default_rng(2)
    ll = rng.normal(-1.0, 0.7, size=(20, 6))
    raw = rng.uniform(size=20)
    w = raw / raw.sum()
    expected = [math.log(sum(w[s] * math.exp(ll[s, n]) for s in range(20))) for n in range(6)]
    assert m.lppd(ll, weights=w) == pytest.approx(np.mean(expected), rel=1e-12)
    # unnormalised weights are normalised
    assert m.lppd(ll, weights=3.0 * raw) == pytest.approx(np.mean(expected), rel=1e-12)
    # uniform weights equal the unweighted value
    assert m.lppd(ll, weights=np.ones(20)) == pytest.approx(m.lppd(ll), rel=1e-12)
    # zero weights drop samples
    w0 = np.zeros(20)
    w0[:5] = 1.0
    assert m.lppd(ll, weights=w0) == pytest.approx(m.lppd(ll[:5]), rel=1e-12)


def test_lppd_is_stable_for_very_negative_log_likelihoods():
    # exp(-2000) underflows; log mean exp(-2000 + d) = -2000 + log mean exp(d)
    d = np.array([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
    ll = -2000.0 + d
    expected = -2000.0 + np.mean(np.log(np.mean(np.exp(d), axis=0)))
    assert m.lppd(ll) == pytest.approx(expected, rel=1e-12)


def test_lppd_errors():
    with pytest.raises(ValueError, match=r"\(S, N\)"):
        m.lppd(np.zeros(5))
    with pytest.raises(ValueError, match=r"shape \(S,\) = \(4,\)"):
        m.lppd(np.zeros((4, 3)), weights=np.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        m.lppd(np.zeros((2, 3)), weights=np.array([1.0, -1.0]))


def test_rmse():
    y = np.array([1.0, 2.0, 3.0])
    mu = np.array([[1.0, 2.0, 5.0], [3.0, 2.0, 1.0]])  # mean: [2, 2, 3]
    assert m.rmse(y, mu) == pytest.approx(math.sqrt((1.0 + 0.0 + 0.0) / 3))
    assert m.rmse(y, np.array([2.0, 2.0, 3.0])) == pytest.approx(math.sqrt(1.0 / 3))
    # weights (0.25, 0.75): mean = [2.5, 2, 2] -> errors [-1.5, 0, 1]
    assert m.rmse(y, mu, weights=np.array([1.0, 3.0])) == pytest.approx(math.sqrt((2.25 + 0.0 + 1.0) / 3))


def test_rmse_errors():
    with pytest.raises(ValueError, match="different numbers of observations: 4 vs 3"):
        m.rmse(np.zeros(3), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"\(S, N\) or \(N,\)"):
        m.rmse(np.zeros(3), np.zeros((2, 2, 3)))


# --------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------

# Hand-worked top-label example with 4 bins (0, .25], (.25, .5], (.5, .75], (.75, 1]:
#   conf .9 correct, .8 wrong            -> bin 4: n=2, conf .85, acc .5,  gap .35
#   conf .6 correct, .7 correct, .65 wrong -> bin 3: n=3, conf .65, acc 2/3, gap 1/60
#   ECE = 2/5 * .35 + 3/5 * 1/60 = .14 + .01 = .15 ; MCE = .35
ECE_PROBS = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.65, 0.35]])
ECE_LABELS = np.array([0, 0, 0, 1, 1])

# Hand-worked all-classes example, 2 bins (0, .5], (.5, 1]:
#   predictions (p, correct): (.6,1) (.3,0) (.1,0) (.2,0) (.7,0) (.1,1)
#   bin 1: .3 .1 .2 .1 -> n=4, conf .175, acc .25, gap .075
#   bin 2: .6 .7       -> n=2, conf .65,  acc .5,  gap .15
#   ECE = 4/6 * .075 + 2/6 * .15 = .1 ; MCE = .15
ALL_PROBS = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1]])
ALL_LABELS = np.array([0, 2])


def test_ece_and_mce_worked_example():
    assert m.ece(ECE_PROBS, ECE_LABELS, num_bins=4) == pytest.approx(0.15)
    assert m.mce(ECE_PROBS, ECE_LABELS, num_bins=4) == pytest.approx(0.35)


def test_ece_all_classes_worked_example():
    assert m.ece_all_classes(ALL_PROBS, ALL_LABELS, num_bins=2) == pytest.approx(0.1)
    assert m.mce_all_classes(ALL_PROBS, ALL_LABELS, num_bins=2) == pytest.approx(0.15)


def test_perfectly_calibrated_one_hot_has_zero_ece():
    probs = np.eye(3)[[0, 1, 2, 1]]
    y = np.array([0, 1, 2, 1])
    assert m.ece(probs, y) == pytest.approx(0.0)
    assert m.ece_all_classes(probs, y) == pytest.approx(0.0)


def test_calibration_curve_counts():
    curve = m.calibration_curve(ECE_PROBS, ECE_LABELS, num_bins=4)
    np.testing.assert_allclose(curve.bin_edges, [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(curve.counts, [0, 0, 3, 2])
    assert np.isnan(curve.confidence[:2]).all() and np.isnan(curve.accuracy[:2]).all()
    np.testing.assert_allclose(curve.confidence[2:], [0.65, 0.85])
    np.testing.assert_allclose(curve.accuracy[2:], [2 / 3, 0.5])
    all_curve = m.calibration_curve(ALL_PROBS, ALL_LABELS, num_bins=2, all_classes=True)
    np.testing.assert_array_equal(all_curve.counts, [4, 2])


def test_brier_nll_accuracy():
    # brier: (.4^2 + .3^2 + .1^2) = .26 and (.2^2 + .7^2 + .9^2) = 1.34 -> mean .8
    assert m.brier(ALL_PROBS, ALL_LABELS) == pytest.approx(0.8)
    assert m.nll(ALL_PROBS, ALL_LABELS) == pytest.approx(-(math.log(0.6) + math.log(0.1)) / 2)
    assert m.accuracy(ALL_PROBS, ALL_LABELS) == pytest.approx(0.5)


def test_sample_axis_and_weights_use_predictive_mean():
    p_a = np.array([[0.9, 0.1], [0.4, 0.6]])
    p_b = np.array([[0.3, 0.7], [0.2, 0.8]])
    stacked = np.stack([p_a, p_b])  # (S=2, N=2, C=2)
    y = np.array([1, 1])
    np.testing.assert_allclose(m.predictive_mean_probs(stacked), [[0.6, 0.4], [0.3, 0.7]])
    # weights (0.25, 0.75): [[0.45, 0.55], [0.25, 0.75]]
    w = np.array([0.25, 0.75])
    np.testing.assert_allclose(m.predictive_mean_probs(stacked, w), [[0.45, 0.55], [0.25, 0.75]])
    assert m.accuracy(stacked, y) == pytest.approx(0.5)
    assert m.accuracy(stacked, y, weights=w) == pytest.approx(1.0)
    assert m.nll(stacked, y, weights=w) == pytest.approx(-(math.log(0.55) + math.log(0.75)) / 2)


def test_classification_errors():
    with pytest.raises(ValueError, match="different numbers of observations: 5 vs 4"):
        m.accuracy(ECE_PROBS, ECE_LABELS[:4])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        m.ece(ECE_PROBS, np.array([0, 0, 2, 1, 1]))
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        m.nll(ECE_PROBS, np.array([0, -1, 0, 1, 1]))
    with pytest.raises(ValueError, match="logits"):
        m.brier(np.array([[2.0, -1.0]]), np.array([0]))
    with pytest.raises(ValueError, match="sum to 1"):
        m.brier(np.array([[2.0, 1.0]]), np.array([0]))
    with pytest.raises(ValueError, match=r"\(S, N, C\) or \(N, C\)"):
        m.accuracy(np.array([0.5, 0.5]), np.array([0]))
    with pytest.raises(ValueError, match="integer"):
        m.accuracy(ECE_PROBS, ECE_LABELS + 0.5)
    with pytest.raises(ValueError, match="weights"):
        m.accuracy(ECE_PROBS, ECE_LABELS, weights=np.ones(5))
    with pytest.raises(ValueError, match="num_bins"):
        m.ece(ECE_PROBS, ECE_LABELS, num_bins=0)


# --------------------------------------------------------------------------------------
# temperature scaling
# --------------------------------------------------------------------------------------


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("true_t", [0.5, 2.5])
def test_fit_temperature_recovers_true_temperature(true_t):
    rng = np.random.default_rng(3)
    true_logits = 2.0 * rng.normal(size=(5000, 5))
    probs = _softmax(true_logits)
    u = rng.uniform(size=(5000, 1))
    y = np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), 4)
    logits = true_logits * true_t
    t_hat = m.fit_temperature(logits, y)
    assert t_hat == pytest.approx(true_t, rel=0.1)
    # the fit does not do worse than T = 1 on its own data
    assert m.nll(m.apply_temperature(logits, t_hat), y) <= m.nll(_softmax(logits), y) + 1e-12


def test_apply_temperature():
    z = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    np.testing.assert_allclose(m.apply_temperature(z, 2.0), _softmax(z / 2.0), rtol=1e-12)
    with pytest.raises(ValueError, match="positive"):
        m.apply_temperature(z, 0.0)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        m.fit_temperature(z[0], np.array([0]))


# --------------------------------------------------------------------------------------
# coverage
# --------------------------------------------------------------------------------------

LEVELS = (0.5, 0.75, 0.9, 0.95)


def test_coverage_of_calibrated_gaussian():
    rng = np.random.default_rng(4)
    n = 4000
    draws = rng.normal(size=(4000, n))
    y = rng.normal(size=n)
    cov = m.coverage(y, draws, LEVELS)
    assert set(cov) == set(LEVELS)
    for a in LEVELS:
        assert abs(cov[a] - a) < 4 * math.sqrt(a * (1 - a) / n)


def test_coverage_weighted():
    rng = np.random.default_rng(5)
    n = 2000
    draws = rng.normal(size=(1000, n))
    y = rng.normal(size=n)
    # uniform weights reproduce NumPy's default (linear) quantiles exactly
    assert m.coverage(y, draws, LEVELS, weights=np.ones(1000)) == m.coverage(y, draws, LEVELS)
    # importance weights from a wide proposal N(0, 2^2) to the target N(0, 1)
    wide = 2.0 * rng.normal(size=(4000, 1))
    draws_w = np.broadcast_to(wide, (4000, n))
    w = np.exp(-0.5 * wide[:, 0] ** 2 + 0.5 * (wide[:, 0] / 2.0) ** 2)
    cov = m.coverage(y, draws_w, LEVELS, weights=w)
    unweighted = m.coverage(y, draws_w, LEVELS)
    for a in LEVELS:
        # slack for the binomial error of y and the Monte Carlo error of the quantiles
        assert abs(cov[a] - a) < 4 * math.sqrt(a * (1 - a) / n) + 0.03
        assert unweighted[a] > cov[a] + 0.02  # the wide proposal alone over-covers


def test_weighted_quantiles_hand_example():
    # one column, draws 0..3, weights .1 .2 .3 .4:
    # positions (W_k - w_k) / (1 - w_last) = 0, .1/.6, .3/.6, .6/.6 = 0, 1/6, 1/2, 1
    draws = np.array([[3.0], [1.0], [0.0], [2.0]])
    w = np.array([0.4, 0.2, 0.1, 0.3])
    q = m._weighted_quantiles(draws, [0.0, 1 / 12, 1 / 3, 0.75, 1.0], w)
    np.testing.assert_allclose(q[:, 0], [0.0, 0.5, 1.5, 2.5, 3.0])


def test_coverage_errors():
    with pytest.raises(ValueError, match="different numbers of observations: 4 vs 3"):
        m.coverage(np.zeros(3), np.zeros((10, 4)))
    with pytest.raises(ValueError, match="between 0 and 1"):
        m.coverage(np.zeros(3), np.zeros((10, 3)), levels=(1.5,))
    with pytest.raises(ValueError, match=r"\(S, N\)"):
        m.coverage(np.zeros(3), np.zeros(3))
