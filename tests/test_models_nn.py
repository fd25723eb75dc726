"""CNN and attention models: shapes, log density against NumPy references, errors, deep ensemble + MILE."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import MCMC
from numpyro.infer.util import log_density
from scipy import stats

from numpyro_mile import MILE, deep_ensemble
from numpyro_mile.models import attention, attention_apply, attention_shapes, cnn, cnn_apply, cnn_shapes


def random_params(rng, shapes, scale=0.5):
    return {k: jnp.asarray(scale * rng.normal(size=s), jnp.float32) for k, s in shapes.items()}


def np_conv_same(h, w):
    """Naive SAME cross-correlation with loops: h (N, *spatial, Ci), w (*window, Ci, Co), odd window."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    spatial, window = h.shape[1:-1], w.shape[:-2]
    pad = [(0, 0)] + [(k // 2, k // 2) for k in window] + [(0, 0)]
    hp = np.pad(h, pad)
    out = np.zeros(h.shape[:-1] + (w.shape[-1],))
    for pos in np.ndindex(*spatial):
        for off in np.ndindex(*window):
            idx = (slice(None),) + tuple(p + o for p, o in zip(pos, off))
            out[(slice(None),) + pos] += hp[idx] @ w[off]
    return out


def np_max_pool(h, p):
    n, *spatial, c = h.shape
    out = np.zeros((n, *[s // p for s in spatial], c))
    for pos in np.ndindex(*out.shape[1:-1]):
        block = h[(slice(None),) + tuple(slice(i * p, i * p + p) for i in pos)]
        out[(slice(None),) + pos] = block.reshape(n, -1, c).max(1)
    return out


def np_cnn(params, X, pool):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    h = np.asarray(X, np.float64)
    k = 0
    while f"cw{k}" in p:
        h = np_max_pool(np.maximum(np_conv_same(h, p[f"cw{k}"]) + p[f"cb{k}"], 0), pool)
        k += 1
    h = h.reshape(len(h), -1)
    k = 0
    while f"w{k + 1}" in p:
        h = np.maximum(h @ p[f"w{k}"] + p[f"b{k}"], 0)
        k += 1
    return h @ p[f"w{k}"] + p[f"b{k}"]


def np_attention(params, X, num_heads):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    X = np.asarray(X, np.float64)
    n, length, c_in = X.shape
    patch = p["embed_w"].shape[0] // c_in

    def norm(a):
        return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)

    h = X.reshape(n, length // patch, patch * c_in) @ p["embed_w"] + p["embed_b"] + p["pos"]
    d = h.shape[-1]
    x = norm(h)
    mixed = np.zeros_like(h)
    for head in range(num_heads):
        cols = slice(head * d // num_heads, (head + 1) * d // num_heads)
        q, k, v = (x @ p[w][:, cols] for w in ("wq", "wk", "wv"))
        for i in range(n):
            scores = q[i] @ k[i].T / np.sqrt(d // num_heads)
            weights = np.exp(scores - scores.max(1, keepdims=True))
            mixed[i, :, cols] = (weights / weights.sum(1, keepdims=True)) @ v[i]
    h = h + mixed @ p["wo"] + p["bo"]
    u = norm(h) @ p["mlp_w0"] + p["mlp_b0"]
    h = h + np.maximum(u, 0) @ p["mlp_w1"] + p["mlp_b1"]
    return norm(h).mean(1) @ p["head_w"] + p["head_b"]


def traced_shapes(model, *args, **kwargs):
    """Shapes of the sample and deterministic sites of one prior-predictive trace (abstract evaluation)."""

    def values():
        trace = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(*args, **kwargs)
        return {k: v["value"] for k, v in trace.items() if v["type"] in ("sample", "deterministic")}

    return {k: v.shape for k, v in jax.eval_shape(values).items()}


def expected_log_joint(params, logits, y, prior_scale):
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    prior = sum(stats.norm(0, prior_scale).logpdf(np.asarray(v, np.float64)).sum() for v in params.values())
    return log_softmax[np.arange(len(y)), y].sum() + prior


@pytest.mark.parametrize("input_shape", [(8, 8, 1), (12, 2)], ids=["2d", "1d"])
def test_cnn_shapes_forward_and_log_density(input_shape):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, *input_shape)).astype(np.float32)
    y = np.array([0, 2, 1])
    kwargs = dict(num_classes=3, channels=(2, 3), kernel_size=3, hidden=(4,))
    shapes = cnn_shapes(input_shape, 3, channels=(2, 3), kernel_size=3, hidden=(4,))
    spatial_out = [s // 4 for s in input_shape[:-1]]
    assert shapes["cw1"] == (3,) * len(spatial_out) + (2, 3) and shapes["w0"] == (int(np.prod(spatial_out)) * 3, 4)
    tr = traced_shapes(cnn, X, **kwargs)
    assert {k: tr[k] for k in shapes} == shapes
    assert tr["logits"] == (3, 3) and tr["y"] == (3,)

    params = random_params(rng, shapes)
    reference = np_cnn(params, X, pool=2)

    @jax.jit  # one compilation instead of one per eager op
    def evaluate(p):
        logits = [cnn_apply(p, jnp.asarray(X), conv_impl=impl) for impl in ("lax", "matmul")]
        # prior_scale 0.3, and the default: the MILE paper's LeNet prior N(0, 0.1)
        return logits, [log_density(cnn, (X, y), {**kwargs, **extra}, p)[0] for extra in ({"prior_scale": 0.3}, {})]

    logits, (logp, logp_default) = evaluate(params)
    for value in logits:
        np.testing.assert_allclose(value, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(logp), expected_log_joint(params, reference, y, 0.3), rtol=1e-5)
    np.testing.assert_allclose(float(logp_default), expected_log_joint(params, reference, y, 0.1), rtol=1e-5)


@pytest.mark.parametrize("patch_size", [1, 2])
def test_attention_shapes_forward_and_log_density(patch_size):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(4, 6, 1)).astype(np.float32)
    y = np.array([1, 0, 2, 1])
    kwargs = dict(num_classes=3, d_model=4, num_heads=2, mlp_hidden=5, patch_size=patch_size, activation=jax.nn.relu)
    shapes = attention_shapes((6, 1), 3, d_model=4, mlp_hidden=5, patch_size=patch_size)
    assert shapes["pos"] == (6 // patch_size, 4) and shapes["embed_w"] == (patch_size, 4)
    tr = traced_shapes(attention, X, **kwargs)
    assert {k: tr[k] for k in shapes} == shapes
    assert tr["logits"] == (4, 3)

    params = random_params(rng, shapes)
    reference = np_attention(params, X, num_heads=2)

    @jax.jit
    def evaluate(p):
        return (
            attention_apply(p, jnp.asarray(X), num_heads=2, activation=jax.nn.relu),
            log_density(attention, (X, y), kwargs, p)[0],
        )

    logits, logp = evaluate(params)
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(logp), expected_log_joint(params, reference, y, 0.2), rtol=1e-5)


def test_minibatch_plate_scales_the_likelihood():
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(10, 4, 1)).astype(np.float32), rng.integers(0, 2, 10)
    kwargs = dict(num_classes=2, d_model=2, num_heads=1, mlp_hidden=2)
    params = random_params(rng, attention_shapes((4, 1), 2, d_model=2, mlp_hidden=2))
    idx = jnp.array([1, 4, 7])
    sub = numpyro.handlers.substitute(attention, data={"data": idx})
    tr = numpyro.handlers.trace(numpyro.handlers.substitute(sub, data=params)).get_trace(
        X, y, subsample_size=3, **kwargs
    )
    assert tr["y"]["scale"] == pytest.approx(10 / 3)
    logits = np_attention(params, X[idx], num_heads=1)
    np.testing.assert_allclose(
        tr["y"]["fn"].log_prob(tr["y"]["value"]),
        (logits - np.log(np.exp(logits).sum(1, keepdims=True)))[np.arange(3), y[idx]],
        rtol=1e-4,
    )


@pytest.mark.parametrize(
    "model, X, kwargs, match",
    [
        (cnn, np.zeros((3, 8)), {}, "rank 4"),
        (cnn, np.zeros((3, 8, 1)), {"channels": (2, 2, 2, 2)}, "too small"),
        (cnn, np.zeros((3, 8, 1)), {"kernel_size": 0}, "kernel_size"),
        (cnn, np.zeros((3, 8, 1)), {"conv_impl": "fft"}, "conv_impl"),
        (attention, np.zeros((3, 8, 8, 1)), {}, "rank 3"),
        (attention, np.zeros((3, 8, 1)), {"d_model": 6, "num_heads": 4}, "multiple of num_heads"),
        (attention, np.zeros((3, 8, 1)), {"patch_size": 3}, "patch_size"),
        (attention, np.zeros((3, 8, 1)), {"subsample_size": 5}, "subsample_size"),
    ],
)
def test_bad_input_errors(model, X, kwargs, match):
    with pytest.raises(ValueError, match=match):
        numpyro.handlers.seed(model, 0)(X, num_classes=2, **kwargs)


def test_label_errors():
    X = np.zeros((3, 4, 4, 1))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        numpyro.handlers.seed(cnn, 0)(X, np.array([0, 1, 2]), num_classes=2, channels=(1,), hidden=())
    with pytest.raises(ValueError, match="integer class labels"):
        numpyro.handlers.seed(cnn, 0)(X, np.array([0.5, 1, 0]), num_classes=2, channels=(1,), hidden=())


def few_step_mile(model, X, y, init_params, **kwargs):
    mcmc = MCMC(
        MILE(model), num_warmup=100, num_samples=20, num_chains=2, chain_method="vectorized", progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(3), X, y, init_params=init_params, extra_fields=("num_nans",), **kwargs)
    samples = mcmc.get_samples(group_by_chain=True)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in samples.values())
    assert int(np.asarray(mcmc.get_extra_fields()["num_nans"]).max()) == 0
    steps = np.asarray(mcmc.last_state.step_size)
    assert steps.shape == (2,) and np.all(steps > 0)
    return samples


def easy_task(rng, shape, n=48):
    """Two classes separated by the sign of the mean input (a DE learns it in a few epochs)."""
    y = rng.integers(0, 2, n)
    X = rng.normal(size=(n, *shape)) + (2.0 * y - 1.0).reshape(-1, *[1] * len(shape))
    return X.astype(np.float32), y.astype(np.int32)


def test_deep_ensemble_and_few_step_mile_cnn():
    rng = np.random.default_rng(4)
    X, y = easy_task(rng, (6, 6, 1))
    kwargs = dict(num_classes=2, channels=(2,), hidden=(4,))
    de = deep_ensemble(
        cnn, jax.random.PRNGKey(0), 2, X, y, max_epochs=15, batch_size=16, validation=None, progress_bar=False, **kwargs
    )
    assert de.init_params["cw0"].shape == (2, 3, 3, 1, 2)
    assert np.all(de.train_loss[:, -1] < de.train_loss[:, 0])  # the members train through the "data" plate
    samples = few_step_mile(cnn, X, y, de.init_params, **kwargs)
    assert samples["cw0"].shape == (2, 20, 3, 3, 1, 2)
    # the chains move, and stay near their members' mode: posterior-predictive training accuracy
    assert np.all(np.asarray(samples["w0"]).std(1) > 0)
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in samples.items()}
    probs = jax.nn.softmax(jax.vmap(lambda p: cnn_apply(p, jnp.asarray(X)))(flat)).mean(0)
    de_probs = jax.nn.softmax(jax.vmap(lambda p: cnn_apply(p, jnp.asarray(X)))(de.samples)).mean(0)
    assert np.mean(np.argmax(probs, 1) == y) >= np.mean(np.argmax(de_probs, 1) == y) - 0.1


def test_few_step_mile_attention():
    rng = np.random.default_rng(5)
    X, y = easy_task(rng, (8, 1))
    kwargs = dict(num_classes=2, d_model=4, num_heads=2, mlp_hidden=4, patch_size=2)
    init = {
        k: 0.3 * jax.random.normal(jax.random.PRNGKey(i), (2, *s))
        for i, (k, s) in enumerate(attention_shapes((8, 1), 2, d_model=4, mlp_hidden=4, patch_size=2).items())
    }
    samples = few_step_mile(attention, X, y, init, **kwargs)
    assert samples["pos"].shape == (2, 20, 4, 4)
    assert np.all(np.asarray(samples["wq"]).std(1) > 0)
