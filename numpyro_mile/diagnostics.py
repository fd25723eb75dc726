"""Convergence diagnostics for ensembles of Bayesian neural network chains.

Thin wrappers around ArviZ (0.23) rank-normalised ESS and R-hat that take what NumPyro
returns: an array of shape ``(chains, draws, *param_shape)`` or a dict of them, as from
``mcmc.get_samples(group_by_chain=True)``. Dict inputs give dicts of per-element results
shaped like each parameter. Beyond ArviZ this adds

* per-chain ESS averaged over chains (``ess(..., per_chain=True)``), as reported in the
  MILE paper, and
* chainwise R-hat (cR-hat, MILE / BDE papers): R-hat of the consecutive pieces of each
  single chain, averaged over chains. It measures mixing *within* a chain's mode, which is
  what matters for ensembles started from different deep-ensemble members.

cR-hat is computed, by default, exactly as the MILE paper's reference code computes it
(``method="mile"``). For every chain and scalar element separately: the chain's ``n`` draws
are rank-normalised together, rank ``r`` (1-based, ties averaged) becoming the standard
normal quantile of ``(r - 0.375) / (n + 0.25)``; the normalised draws are cut into
``num_splits = 4`` consecutive pieces of length ``m = n // 4`` (when ``n`` is not a multiple
of 4, all ``n`` draws are ranked and the first ``4 m`` normalised values are used); then::

    R-hat = sqrt(((m - 1) / m * W + B) / W),

with ``W`` the mean of the pieces' variances and ``B`` the variance of the pieces' means
(both with ``ddof=1``). cR-hat is the mean of these over chains. There is no further
splitting of the pieces, no folded variant and no maximum with anything.
``method="arviz_rank"`` gives ArviZ's statistic instead: its rank-normalised
split R-hat (``arviz.rhat(method="rank")``) with a chain's pieces as ArviZ's chains.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Mapping

import numpy as np
from scipy.special import ndtri

with warnings.catch_warnings():
    # ArviZ 0.23 announces its 1.0 refactor on import; irrelevant to the functions used here.
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = ["chainwise_rhat", "ess", "format_summary", "rhat", "summary"]

_MIN_DRAWS = 4  # ArviZ returns NaN for fewer draws per chain
_CRHAT_METHODS = ("mile", "arviz_rank")


def _chains_array(name: str, values) -> np.ndarray:
    """Validated float array of shape ``(chains, draws, *param_shape)``."""
    try:
        arr = np.asarray(values)
    except Exception as err:  # e.g. a JAX tracer
        raise ValueError(f"{name}: samples must be concrete arrays, not traced values.") from err
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name}: samples must be real-valued, got dtype {arr.dtype}.")
    if arr.ndim < 2:
        raise ValueError(
            f"{name}: samples must have shape (chains, draws, ...), got {arr.shape}. Use "
            "mcmc.get_samples(group_by_chain=True), or add a chain axis with x[None]."
        )
    if arr.shape[0] < 1 or arr.shape[1] < _MIN_DRAWS:
        raise ValueError(
            f"{name}: need at least 1 chain and {_MIN_DRAWS} draws per chain, got shape "
            f"{arr.shape} (chains, draws, ...)."
        )
    return arr.astype(np.float64, copy=False)


def _as_dict(samples) -> dict[str, Any] | None:
    """The sites of a dict or ``InferenceData`` input, or ``None`` for a single array."""
    posterior = getattr(samples, "posterior", None)
    if posterior is not None:  # arviz.InferenceData
        samples = posterior
    if isinstance(samples, Mapping):  # also an xarray.Dataset of (chain, draw, ...) variables
        return {str(k): _chain_draw_first(v) for k, v in samples.items()}
    return None


def _chain_draw_first(values):
    """An xarray.DataArray with chain/draw dims as a plain array of (chain, draw, ...)."""
    dims = getattr(values, "dims", None)
    if dims is not None and "chain" in dims and "draw" in dims:
        return values.transpose("chain", "draw", ...).values
    return values


def _arviz_stat(func: Callable, arr: np.ndarray, **kwargs) -> np.ndarray:
    """Apply an ArviZ diagnostic elementwise to ``(chains, draws, *shape)``; shape ``shape``."""
    dataset = az.convert_to_dataset({"x": arr})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant elements give NaN
        result = func(dataset, **kwargs)
    return np.asarray(result["x"].values, dtype=np.float64).reshape(arr.shape[2:])


def _ess_array(arr: np.ndarray, per_chain: bool) -> np.ndarray:
    if not per_chain:
        return _arviz_stat(az.ess, arr, method="bulk")
    # (chains, draws, *s) -> (1, draws, chains, *s): every chain becomes its own element.
    per = _arviz_stat(az.ess, np.swapaxes(arr, 0, 1)[None], method="bulk")
    return per.mean(axis=0)


def _rhat_array(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.shape[0] < 2:
        raise ValueError(
            f"{name}: R-hat needs at least 2 chains, got {arr.shape[0]}. For a single chain use chainwise_rhat."
        )
    return _arviz_stat(az.rhat, arr, method="rank")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n along the last axis, ties given their average rank (``scipy.stats.rankdata``
    with ``method="average"``), vectorised over the leading axes."""
    n = x.shape[-1]
    order = np.argsort(x, axis=-1)  # any order of ties: they share their average rank
    ordered = np.take_along_axis(x, order, axis=-1)
    position = np.arange(1, n + 1, dtype=np.float64)
    starts = np.ones(x.shape, dtype=bool)  # first position of a run of tied values
    starts[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    ends = np.ones(x.shape, dtype=bool)  # last position of a run
    ends[..., :-1] = starts[..., 1:]
    first = np.maximum.accumulate(np.where(starts, position, 0.0), axis=-1)
    last = np.minimum.accumulate(np.where(ends, position, n + 1.0)[..., ::-1], axis=-1)[..., ::-1]
    ranks = np.empty(x.shape, dtype=np.float64)
    np.put_along_axis(ranks, order, (first + last) / 2, axis=-1)
    return ranks


def _mile_crhat(arr: np.ndarray, num_splits: int) -> np.ndarray:
    """cR-hat as in the MILE reference code, for ``(chains, draws, *shape)``; shape ``shape``."""
    chains, draws = arr.shape[:2]
    length = draws // num_splits
    # (chains, draws, *s) -> (chains, k, draws): rank every chain and element along the draws
    x = np.ascontiguousarray(np.moveaxis(arr.reshape(chains, draws, -1), 1, -1))
    ranks = _average_ranks(x)
    z = ndtri((ranks - 0.375) / (draws + 0.25))
    z[np.isnan(x).any(axis=-1)] = np.nan  # NaN draws give NaN, as in scipy's rankdata
    # rank all draws, then keep the first num_splits * length normalised values
    pieces = z[..., : num_splits * length].reshape(chains, -1, num_splits, length)
    within = pieces.var(axis=-1, ddof=1).mean(axis=-1)  # W: (chains, k)
    between = pieces.mean(axis=-1).var(axis=-1, ddof=1)  # B: (chains, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.sqrt(((length - 1) / length * within + between) / within)
    value = np.where(within > 0, value, np.nan)  # e.g. an element constant in a chain
    return value.mean(axis=0).reshape(arr.shape[2:])


def _arviz_crhat(arr: np.ndarray, num_splits: int) -> np.ndarray:
    chains, draws = arr.shape[:2]
    length = draws // num_splits
    pieces = arr[:, : num_splits * length].reshape(chains, num_splits, length, *arr.shape[2:])
    # (chains, splits, length, *s) -> (splits, length, chains, *s): the pieces of one chain
    # are ArviZ's chains and the original chain index becomes a parameter dimension, so a
    # single call computes the R-hat of every chain separately.
    per_chain = _arviz_stat(az.rhat, np.moveaxis(pieces, 0, 2), method="rank")
    return per_chain.mean(axis=0)


def _check_crhat_method(method) -> str:
    if not isinstance(method, str) or method not in _CRHAT_METHODS:
        raise ValueError(
            f"chainwise R-hat method must be one of {', '.join(map(repr, _CRHAT_METHODS))}, got {method!r}."
        )
    return method


def _chainwise_rhat_array(arr: np.ndarray, num_splits: int, name: str, method: str = "mile") -> np.ndarray:
    _check_crhat_method(method)
    if int(num_splits) != num_splits or num_splits < 2:
        raise ValueError(f"num_splits must be an integer >= 2, got {num_splits}.")
    num_splits = int(num_splits)
    draws = arr.shape[1]
    if draws // num_splits < _MIN_DRAWS:
        raise ValueError(
            f"{name}: chainwise R-hat with num_splits={num_splits} needs at least "
            f"{num_splits * _MIN_DRAWS} draws per chain, got {draws}."
        )
    if method == "mile":
        return _mile_crhat(arr, num_splits)
    return _arviz_crhat(arr, num_splits)


def ess(samples, per_chain: bool = False):
    """Rank-normalised bulk effective sample size (``arviz.ess(method="bulk")``).

    :param samples: array of shape ``(chains, draws, *param_shape)`` or a dict of them.
    :param per_chain: compute the ESS of every chain on its own (as a one-chain array) and
        return the mean over chains, as reported in the MILE paper; otherwise the ESS of
        all chains together.
    :returns: array of shape ``param_shape`` (0-d for a scalar parameter), or a dict of them.
    """
    sites = _as_dict(samples)
    if sites is None:
        return _ess_array(_chains_array("samples", samples), per_chain)
    return {k: _ess_array(_chains_array(k, v), per_chain) for k, v in sites.items()}


def rhat(samples):
    """Rank-normalised split R-hat across chains (``arviz.rhat(method="rank")``).

    :param samples: array of shape ``(chains, draws, *param_shape)`` with at least 2 chains,
        or a dict of them.
    :returns: array of shape ``param_shape``, or a dict of them.
    """
    sites = _as_dict(samples)
    if sites is None:
        return _rhat_array(_chains_array("samples", samples), "samples")
    return {k: _rhat_array(_chains_array(k, v), k) for k, v in sites.items()}


def chainwise_rhat(samples, num_splits: int = 4, method: str = "mile"):
    """Chainwise R-hat (cR-hat) of the MILE / BDE papers.

    Each chain is cut into ``num_splits`` consecutive pieces and R-hat is computed between
    the pieces of that chain; the result is the mean over chains. Values near 1 mean each
    chain is stationary within its mode, whatever the distance between the modes of
    different chains.

    ``method="mile"`` (default) follows the MILE paper's reference code exactly. For every
    chain and scalar element: rank the chain's ``n`` draws together (1-based, ties get their
    average rank) and map rank ``r`` to the standard normal quantile of
    ``(r - 0.375) / (n + 0.25)``; cut the normalised draws into ``num_splits`` consecutive
    pieces of length ``m = n // num_splits`` (if ``n`` is not a multiple of ``num_splits``,
    all ``n`` draws are ranked and the first ``num_splits * m`` normalised values are used;
    the reference code requires a multiple); then
    ``R-hat = sqrt(((m - 1) / m * W + B) / W)`` with ``W`` the mean of the pieces' variances
    and ``B`` the variance of the pieces' means, both with ``ddof=1``. No further halving of
    the pieces, no folded variant, no maximum with anything. Where ``W = 0`` (e.g. an element
    constant in a chain) the chain's value is NaN, and so is the mean over chains.

    ``method="arviz_rank"`` applies ArviZ's statistic within each chain: the trailing draws are
    dropped, the pieces are treated as chains and ArviZ's rank-normalised split R-hat
    (``arviz.rhat(method="rank")``, which ranks the pieces jointly, splits each piece in two
    and takes the maximum of the bulk and folded R-hat) is computed within every chain.

    :param samples: array of shape ``(chains, draws, *param_shape)`` or a dict of them;
        ``draws >= 4 * num_splits``.
    :param num_splits: number of pieces per chain (>= 2).
    :param method: ``"mile"`` (default) or ``"arviz_rank"``, as above.
    :returns: array of shape ``param_shape``, or a dict of them.
    """
    _check_crhat_method(method)
    sites = _as_dict(samples)
    if sites is None:
        return _chainwise_rhat_array(_chains_array("samples", samples), num_splits, "samples", method)
    return {k: _chainwise_rhat_array(_chains_array(k, v), num_splits, k, method) for k, v in sites.items()}


def _nanmean(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else float("nan")


def summary(
    samples,
    group: Callable[[str], str | None] | Mapping[str, str] | None = None,
    num_splits: int = 4,
    crhat_method: str = "mile",
) -> list[dict[str, Any]]:
    """Per-site (or per-layer) convergence table.

    One row per site, with the means over the site's elements of the per-chain bulk ESS,
    the chainwise R-hat (:func:`chainwise_rhat`; by default exactly as the MILE reference
    code computes it: per chain, rank-normalise all draws, cut them into ``num_splits``
    pieces, ``sqrt(((m - 1) / m * W + B) / W)``, mean over chains) and the between-chain
    R-hat (NaN elements, e.g. constant ones, are skipped; R-hat is NaN for a single chain).

    How to read it for ensembles: chains of MILE and similar samplers start from different
    members of a deep ensemble, i.e. in different modes of a highly multimodal posterior,
    and stay there. The between-chain R-hat is then expected to be far above 1 — that is
    the ensemble's diversity, not a failure to converge — and must not be used as a
    convergence criterion. Judge mixing by the chainwise R-hat (close to 1 when each chain
    is stationary within its mode), the per-chain ESS, and predictive metrics (LPPD,
    RMSE/accuracy, calibration) on held-out data.

    :param samples: dict of arrays ``(chains, draws, *param_shape)`` (e.g.
        ``mcmc.get_samples(group_by_chain=True)``), an ``arviz.InferenceData``, or a single
        array (one site named ``"samples"``). All sites of a row share chains and draws.
    :param group: optional map from a site name to a row label; sites with the same label
        are pooled into one row (e.g. ``lambda s: s.rsplit(".", 1)[0]`` to merge the weight
        and bias of a layer). A mapping leaves names it lacks unchanged; a callable may
        return ``None`` to leave a site out.
    :param num_splits: pieces per chain for the chainwise R-hat.
    :param crhat_method: definition of the chainwise R-hat, passed to
        :func:`chainwise_rhat` as ``method``: ``"mile"`` (default, as the MILE reference
        code computes it) or ``"arviz_rank"`` (ArviZ's rank-normalised split R-hat of the
        pieces).
    :returns: list of rows in first-appearance order, each a dict with keys ``"site"``
        (str), ``"size"`` (number of scalar elements), ``"ess_per_chain"``, ``"crhat"``
        and ``"rhat"`` (floats).
    """
    _check_crhat_method(crhat_method)
    sites = _as_dict(samples)
    if sites is None:
        sites = {"samples": samples}
    pooled: dict[str, list[np.ndarray]] = {}
    for name, values in sites.items():
        if group is None:
            label = name
        elif isinstance(group, Mapping):
            label = group.get(name, name)
        else:
            label = group(name)
        if label is None:
            continue
        arr = _chains_array(name, values)
        pooled.setdefault(str(label), []).append(arr.reshape(arr.shape[0], arr.shape[1], -1))
    rows = []
    for label, parts in pooled.items():
        if len({p.shape[:2] for p in parts}) > 1:
            shapes = sorted({p.shape[:2] for p in parts})
            raise ValueError(f"sites pooled into {label!r} have different (chains, draws): {shapes}.")
        arr = np.concatenate(parts, axis=2)
        if arr.shape[2] == 0:
            continue
        rows.append(
            {
                "site": label,
                "size": int(arr.shape[2]),
                "ess_per_chain": _nanmean(_ess_array(arr, per_chain=True)),
                "crhat": _nanmean(_chainwise_rhat_array(arr, num_splits, label, crhat_method)),
                "rhat": _nanmean(_rhat_array(arr, label)) if arr.shape[0] > 1 else math.nan,
            }
        )
    return rows


def format_summary(rows: list[Mapping[str, Any]]) -> str:
    """Render :func:`summary` rows as a fixed-width text table.

    :param rows: rows as returned by :func:`summary`.
    :returns: the table, one line per row below a header, without a trailing newline.
    """
    header = ("site", "size", "ESS/chain", "cR-hat", "R-hat")
    lines = [
        (
            str(r["site"]),
            str(int(r["size"])),
            f"{float(r['ess_per_chain']):.1f}",
            f"{float(r['crhat']):.3f}",
            f"{float(r['rhat']):.3f}",
        )
        for r in rows
    ]
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(header)]

    def fmt(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:]))
        return "  ".join((first, *rest)).rstrip()

    table = [fmt(header), "  ".join("-" * w for w in widths)]
    table += [fmt(line) for line in lines]
    return "\n".join(table)
