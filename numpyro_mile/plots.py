"""Diagnostic plots for Bayesian neural networks (matplotlib, imported on first use).

Each function draws on a new figure, or on ``ax`` when given, and returns the
``matplotlib.figure.Figure``; nothing is shown or saved. matplotlib is an optional
dependency (``pip install numpyro_mile[examples]``).
"""

from __future__ import annotations

import numpy as np

from .metrics import calibration_curve

__all__ = ["lppd_vs_samples", "predictive_band", "reliability_diagram", "warmup_trace"]


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "numpyro_mile.plots needs matplotlib: pip install matplotlib (or numpyro_mile[examples])."
        ) from err
    return plt


def _figure_and_axes(ax, nrows: int = 1, figsize=(5.0, 4.0)):
    plt = _pyplot()
    if ax is not None:
        axes = np.atleast_1d(ax)
        if axes.size != nrows:
            raise ValueError(f"ax must hold {nrows} axes, got {axes.size}.")
        return axes.flat[0].figure, list(axes.flat)
    fig, axes = plt.subplots(nrows, 1, figsize=figsize, squeeze=False, sharex=nrows > 1)
    return fig, list(axes[:, 0])


def _chains_steps(name: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"{name} must have shape (chains, steps), got {np.shape(values)}.")
    return arr


def reliability_diagram(probs, y, num_bins: int = 15, *, weights=None, ax=None):
    """Reliability diagram: accuracy against confidence per top-label bin.

    Bars show the accuracy of each non-empty bin, the diagonal perfect calibration, and the
    title the expected calibration error (from :func:`numpyro_mile.metrics.calibration_curve`).

    :param probs: class probabilities, shape ``(S, N, C)`` or ``(N, C)``.
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of equal-width confidence bins.
    :param weights: optional sample weights, shape ``(S,)``.
    :param ax: optional matplotlib axes to draw on.
    :returns: the figure.
    """
    curve = calibration_curve(probs, y, num_bins=num_bins, weights=weights)
    fig, (axis,) = _figure_and_axes(ax)
    filled = curve.counts > 0
    lo, hi = curve.bin_edges[:-1], curve.bin_edges[1:]
    axis.bar(
        lo[filled],
        curve.accuracy[filled],
        width=(hi - lo)[filled],
        align="edge",
        edgecolor="black",
        alpha=0.7,
        label="accuracy",
    )
    axis.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    total = curve.counts.sum()
    gaps = np.abs(curve.accuracy[filled] - curve.confidence[filled])
    ece = float(np.sum(curve.counts[filled] / total * gaps)) if total else float("nan")
    axis.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=f"Reliability (ECE = {ece:.3f})")
    axis.legend(loc="upper left")
    return fig


def predictive_band(X_train, y_train, X_grid, mean, std, *, num_std: float = 2.0, ax=None):
    """Predictive mean and ``mean +- num_std * std`` band over a 1-D input grid, with the data.

    :param X_train: training inputs, shape ``(N,)`` or ``(N, 1)``.
    :param y_train: training targets, shape ``(N,)``.
    :param X_grid: grid inputs, shape ``(G,)`` or ``(G, 1)``.
    :param mean: predictive mean on the grid, shape ``(G,)``.
    :param std: predictive standard deviation on the grid, shape ``(G,)`` (e.g. the square
        root of the total variance ``E[sigma^2] + Var[mu]``).
    :param num_std: half-width of the band in standard deviations.
    :param ax: optional matplotlib axes.
    :returns: the figure.
    """
    x_train = np.asarray(X_train, dtype=np.float64)
    x_grid = np.asarray(X_grid, dtype=np.float64)
    for name, x in (("X_train", x_train), ("X_grid", x_grid)):
        if not (x.ndim == 1 or (x.ndim == 2 and x.shape[1] == 1)):
            raise ValueError(f"{name} must be 1-D inputs of shape (N,) or (N, 1), got {x.shape}.")
    x_train, x_grid = x_train.reshape(-1), x_grid.reshape(-1)
    y_train = np.asarray(y_train, dtype=np.float64).reshape(-1)
    mean = np.asarray(mean, dtype=np.float64).reshape(-1)
    std = np.asarray(std, dtype=np.float64).reshape(-1)
    if y_train.shape != x_train.shape:
        raise ValueError(f"X_train and y_train have different lengths: {x_train.size} vs {y_train.size}.")
    if mean.shape != x_grid.shape or std.shape != x_grid.shape:
        raise ValueError(
            f"mean and std must have one value per grid point ({x_grid.size}), got {mean.size} and {std.size}."
        )
    order = np.argsort(x_grid)
    x_grid, mean, std = x_grid[order], mean[order], std[order]
    fig, (axis,) = _figure_and_axes(ax)
    axis.fill_between(x_grid, mean - num_std * std, mean + num_std * std, alpha=0.3, label=f"mean ± {num_std:g} std")
    axis.plot(x_grid, mean, label="predictive mean")
    axis.scatter(x_train, y_train, s=8, color="black", label="training data")
    axis.set(xlabel="x", ylabel="y")
    axis.legend(loc="best")
    return fig


def warmup_trace(step_size, L, energy_change, *, ax=None):
    """Traces of step size, L and energy change per chain over the (warm-up) steps.

    :param step_size: shape ``(chains, steps)`` (or ``(steps,)`` for one chain), e.g. the
        extra field ``step_size`` of a MILE run with ``collect_warmup=True``.
    :param L: momentum decoherence length, same shape.
    :param energy_change: energy change per step, same shape.
    :param ax: optional sequence of three matplotlib axes.
    :returns: the figure (three stacked panels, log scale for step size and L).
    """
    series = [
        _chains_steps("step_size", step_size),
        _chains_steps("L", L),
        _chains_steps("energy_change", energy_change),
    ]
    if len({s.shape for s in series}) != 1:
        raise ValueError(
            f"step_size, L and energy_change must have the same shape (chains, steps), got {[s.shape for s in series]}."
        )
    fig, axes = _figure_and_axes(ax, nrows=3, figsize=(6.0, 7.0))
    labels = ("step size", "L", "energy change")
    steps = np.arange(series[0].shape[1])
    for axis, values, label in zip(axes, series, labels):
        for c, chain in enumerate(values):
            axis.plot(steps, chain, lw=0.8, label=f"chain {c}")
        if label != "energy change" and np.all(values > 0):
            axis.set_yscale("log")
        axis.set_ylabel(label)
    axes[-1].set_xlabel("step")
    if series[0].shape[0] <= 10:
        axes[0].legend(loc="best", fontsize="small")
    return fig


def lppd_vs_samples(log_lik, *, num_points: int = 50, ax=None):
    """Mean LPPD as a function of the number of posterior samples used.

    With ``k`` draws per chain, the LPPD uses the first ``k`` draws of every chain (``C k``
    samples): ``1/N sum_n log mean_{c, d < k} exp(log_lik[c, d, n])``; one curve per chain
    (its own first ``k`` draws) and one for all chains together.

    :param log_lik: pointwise log-likelihood, shape ``(chains, draws, N)`` (e.g.
        ``idata.log_likelihood["y"].values``) or ``(draws, N)`` for one chain.
    :param num_points: at most this many values of ``k`` (log-spaced).
    :param ax: optional matplotlib axes.
    :returns: the figure.
    """
    ll = np.asarray(log_lik, dtype=np.float64)
    if ll.ndim == 2:
        ll = ll[None]
    if ll.ndim != 3 or 0 in ll.shape:
        raise ValueError(f"log_lik must have shape (chains, draws, N), got {np.shape(log_lik)}.")
    chains, draws, _ = ll.shape
    ks = np.unique(np.geomspace(1, draws, num=min(num_points, draws)).round().astype(int))

    # running log-sum-exp over draws, per chain and observation: (chains, draws, N)
    running = np.logaddexp.accumulate(ll, axis=1)
    per_chain = running[:, ks - 1, :] - np.log(ks)[None, :, None]  # (chains, K, N)
    pooled = np.logaddexp.reduce(running[:, ks - 1, :], axis=0) - np.log(chains * ks)[:, None]  # (K, N)

    fig, (axis,) = _figure_and_axes(ax)
    if chains > 1:
        for c in range(chains):
            axis.plot(
                ks,
                per_chain[c].mean(axis=-1),
                lw=0.8,
                alpha=0.5,
                color="gray",
                label="single chains" if c == 0 else None,
            )
    axis.plot(ks * chains, pooled.mean(axis=-1), lw=2.0, color="C0", label="all chains" if chains > 1 else "LPPD")
    axis.set_xscale("log")
    axis.set(xlabel="number of samples", ylabel="LPPD (mean per observation)")
    axis.legend(loc="lower right")
    return fig


def reliability_grid(
    probs_by_method, y, num_bins: int = 15, *, weights_by_method=None, ncols: int = 4, panel_size: float = 2.8
):
    """Reliability diagrams of several methods side by side (one panel each, shared axes).

    :param probs_by_method: dict method name -> class probabilities, shape ``(S, N, C)`` or ``(N, C)``
        (e.g. the posterior predictive means of MAP, VI, MC-dropout, Laplace, SGLD, ...).
    :param y: integer labels, shape ``(N,)``.
    :param num_bins: number of equal-width confidence bins.
    :param weights_by_method: optional dict method name -> sample weights ``(S,)`` (e.g. ICSGLD's
        importance weights); methods not in it are weighted uniformly.
    :param ncols: panels per row.
    :param panel_size: width and height of one panel in inches.
    :returns: the figure; each panel is titled with the method and its ECE.

    **Example**

    >>> import numpy as np
    >>> from numpyro_mile.plots import reliability_grid
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(3), size=50); y = rng.integers(0, 3, 50)
    >>> fig = reliability_grid({"A": p, "B": p[:, ::-1]}, y, num_bins=5)
    >>> len(fig.axes)
    2
    """
    if not probs_by_method:
        raise ValueError("probs_by_method must name at least one method, e.g. {'MAP': probs}.")
    if ncols < 1:
        raise ValueError(f"ncols must be at least 1, got {ncols}.")
    weights_by_method = weights_by_method or {}
    plt = _pyplot()
    names = list(probs_by_method)
    ncols = min(ncols, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size * ncols, panel_size * nrows), squeeze=False)
    for axis, name in zip(axes.flat, names):
        reliability_diagram(probs_by_method[name], y, num_bins, weights=weights_by_method.get(name), ax=axis)
        ece = axis.get_title().split("=")[-1].strip(" )")
        axis.set_title(f"{name} (ECE {ece})", fontsize="medium")
        axis.legend().remove()
        axis.label_outer()
    for axis in list(axes.flat)[len(names) :]:
        axis.remove()
    fig.tight_layout()
    return fig


__all__ += ["reliability_grid"]
