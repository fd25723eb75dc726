"""scikit-learn estimators over this package's kernels: a MILE posterior in ``fit(X, y)``.

:class:`MILERegressor` and :class:`MILEClassifier` wrap ``MCMC(MILE(model), ...)`` (or SMILE / pSMILE) on a
network of :mod:`numpyro_mile.models`, or on any NumPyro model of the usual ``model(X, y=None, **kwargs)``
signature, so a table goes in and predictions come out in the data's units: inputs (and regression targets) are
standardised inside with training statistics, class labels of any type are encoded and decoded. The fitted
posterior is a dict of NumPy draws (``samples_``), so an estimator pickles, clones and works in a ``Pipeline``
or ``GridSearchCV`` like any other.

Predictions reduce the posterior draws in chunks of rows, so memory is ``O(S x rows per chunk)`` whatever the
size of ``X``; the uncertainty they report is computed by :mod:`numpyro_mile.uncertainty`.
"""

from __future__ import annotations

import inspect
import math
import tempfile
import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np
from numpyro.infer import MCMC
from scipy.special import softmax
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import diagnostics, metrics, uncertainty
from .datasets.preprocess import Standardizer
from .kernels import MILE, SMILE
from .models import mlp_classification, mlp_regression
from .predictive import log_likelihood, predict
from .runs.chunked import run_chunked

__all__ = ["BUDGETS", "MILEClassifier", "MILERegressor"]

#: ``budget`` name -> (num_chains, num_warmup, num_samples, thinning). "quick": a sound posterior in about 20 s on
#: 1,200 rows and a minute on 14,000 on 2 CPU cores (``docs/benchmarks/estimators.md``); "paper": the MILE paper's
#: (12 chains, 50k + 10k steps).
BUDGETS: dict[str, tuple[int, int, int, int]] = {
    "quick": (4, 5_000, 1_000, 10),
    "paper": (12, 50_000, 10_000, 10),
}

_SAMPLERS = ("mile", "smile", "psmile")
#: floats one chunk of predictions may hold (draws x rows x outputs): 2**24 float32 = 64 MiB
_CHUNK_FLOATS = 2**24
#: keyword arguments run_chunked takes itself (a model keyword of the same name would never reach the model)
_RUN_CHUNKED_PARAMETERS = frozenset(inspect.signature(run_chunked).parameters) - {"mcmc", "rng_key", "args", "kwargs"}
#: minibatch size of SMILE / pSMILE when ``subsample_size`` is not given (capped at the number of rows)
_DEFAULT_SUBSAMPLE = 256


class _MILEEstimator(BaseEstimator):
    """What the regressor and the classifier share: the run, the scaling and the chunked predictions."""

    def __init__(
        self,
        model: Callable | None = None,
        *,
        hidden: Sequence[int] = (16, 16),
        prior_scale: float = 1.0,
        budget: str = "quick",
        num_chains: int | None = None,
        num_warmup: int | None = None,
        num_samples: int | None = None,
        thinning: int | None = None,
        sampler: str = "mile",
        subsample_size: int | None = None,
        ensemble_options: dict | None = None,
        kernel_options: dict | None = None,
        model_kwargs: dict | None = None,
        chain_method: str = "vectorized",
        progress_bar: bool = True,
        random_state=0,
    ):
        self.model = model
        self.hidden = hidden
        self.prior_scale = prior_scale
        self.budget = budget
        self.num_chains = num_chains
        self.num_warmup = num_warmup
        self.num_samples = num_samples
        self.thinning = thinning
        self.sampler = sampler
        self.subsample_size = subsample_size
        self.ensemble_options = ensemble_options
        self.kernel_options = kernel_options
        self.model_kwargs = model_kwargs
        self.chain_method = chain_method
        self.progress_bar = progress_bar
        self.random_state = random_state

    # -- what subclasses provide -------------------------------------------------------------------------------
    _default_model: Callable
    _output_sites: tuple[str, ...]

    def _targets(self, y) -> np.ndarray:
        """``y`` as the model takes it before scaling (float targets, or class codes ``0 .. C-1`` with
        ``classes_`` set)."""
        raise NotImplementedError

    # -- fitting -------------------------------------------------------------------------------------------------
    def _run_settings(self) -> tuple[int, int, int, int]:
        if self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {sorted(BUDGETS)}, got {self.budget!r}.")
        chosen = [
            given if given is not None else default
            for given, default in zip(
                (self.num_chains, self.num_warmup, self.num_samples, self.thinning), BUDGETS[self.budget]
            )
        ]
        for name, value in zip(("num_chains", "num_warmup", "num_samples", "thinning"), chosen):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        return tuple(int(v) for v in chosen)  # type: ignore[return-value]

    def _network_kwargs(self) -> dict:
        """Keyword arguments of the model (data excluded) at fit and predict time."""
        if self.model is not None:
            return dict(self.model_kwargs or {})
        return {"hidden": tuple(self.hidden), "prior_scale": self.prior_scale, **(self.model_kwargs or {})}

    def _check_model_settings(self) -> None:
        if self.model is None:
            if isinstance(self.hidden, (int, np.integer)) or not all(
                isinstance(width, (int, np.integer)) and width > 0 for width in self.hidden
            ):
                raise ValueError(
                    f"hidden must be a sequence of positive layer widths, e.g. (16, 16), got {self.hidden!r}."
                )
            return
        if tuple(self.hidden) != (16, 16) or self.prior_scale != 1.0:
            warnings.warn(
                f"hidden and prior_scale set the default network only; {type(self).__name__}(model=...) "
                "ignores them: pass the model's own settings in model_kwargs.",
                UserWarning,
                stacklevel=3,
            )
        if self.sampler in ("smile", "psmile") and not _accepts(self.model, "subsample_size"):
            raise ValueError(
                f"sampler={self.sampler!r} draws minibatches through the model's subsample_size keyword "
                "(numpyro.plate('data', N, subsample_size=subsample_size)), which this model does not "
                "take; add it, or use sampler='mile'."
            )

    def _kernel(self, model: Callable):
        options = dict(self.kernel_options or {})
        ensemble = {"progress_bar": self.progress_bar, **(self.ensemble_options or {})}
        if self.sampler == "mile":
            return MILE(model, ensemble_options=ensemble, **options)
        if self.sampler in ("smile", "psmile"):
            options.setdefault("precondition", self.sampler == "psmile")
            return SMILE(model, ensemble_options=ensemble, **options)
        raise ValueError(f"sampler must be one of {_SAMPLERS}, got {self.sampler!r}.")

    def _kernel_key(self, model: Callable):
        """What a kernel of this estimator is made of (see :func:`_pooled_kernel`); unhashable when the options
        cannot be compared."""
        try:
            return (
                self.sampler,
                model,
                _frozen(self.kernel_options),
                _frozen(self.ensemble_options),
                self.progress_bar,
            )
        except TypeError:  # e.g. a set of values that do not sort
            return [self.sampler]

    def fit(self, X, y):
        """Sample the posterior of the network's weights given ``(X, y)``.

        :param X: inputs, shape ``(N, F)``: NumPy, JAX, pandas or anything ``np.asarray`` takes.
        :param y: targets, shape ``(N,)``.
        :returns: ``self``, with ``samples_`` (dict site -> ``(num_chains * num_samples / thinning, ...)``, chain after
            chain), ``num_chains_`` and ``scaler_`` (the :class:`~numpyro_mile.datasets.Standardizer` of the training
            data).
        """
        X, y = validate_data(
            self, X, y, dtype=np.float64, y_numeric=isinstance(self, RegressorMixin), ensure_min_samples=2
        )
        num_chains, num_warmup, num_samples, thinning = self._run_settings()
        self._check_model_settings()
        y_model = self._targets(y)
        if isinstance(self, RegressorMixin):
            self.scaler_ = Standardizer.fit(X, y_model)
            y_model = self.scaler_.transform_y(y_model).astype(np.float32)
        else:
            self.scaler_ = Standardizer.fit(X)
        X_model = self.scaler_.transform_x(X).astype(np.float32)
        fit_kwargs = self._network_kwargs()
        taken = sorted(set(fit_kwargs) & _RUN_CHUNKED_PARAMETERS)
        if taken:
            raise ValueError(
                f"model_kwargs {taken} share their names with run_chunked's own parameters, which the "
                "fit runs through; rename them in the model."
            )
        if self.sampler in ("smile", "psmile"):
            fit_kwargs["subsample_size"] = min(self.subsample_size or _DEFAULT_SUBSAMPLE, X.shape[0])
        elif self.subsample_size is not None:
            raise ValueError("subsample_size is for sampler='smile' or 'psmile'; MILE uses every row per step.")
        seed = (
            int(self.random_state)
            if isinstance(self.random_state, (int, np.integer))
            else check_random_state(self.random_state).randint(2**31)
        )
        key = jax.random.PRNGKey(seed)
        model = self._model_function()
        with _pooled_kernel(self._kernel_key(model), lambda: self._kernel(model)) as kernel:
            mcmc = MCMC(
                kernel,
                num_warmup=num_warmup,
                num_samples=num_samples,
                num_chains=num_chains,
                thinning=thinning,
                chain_method=self.chain_method,
                progress_bar=self.progress_bar,
            )
            if self.chain_method == "parallel":  # NumPyro's own loop: run_chunked would run the chains one by one
                mcmc.run(key, X_model, y_model, **fit_kwargs)
                samples = mcmc.get_samples()
            else:
                # The draws of mcmc.run, bit for bit, in compiled chunks of steps: NumPyro's loop launches every
                # step from Python when its bar is on, and compiles its step twice when the chains span devices.
                with tempfile.TemporaryDirectory(prefix="numpyro_mile-fit-") as folder:
                    run = run_chunked(
                        mcmc, key, X_model, y_model, checkpoint_path=Path(folder) / "run.ckpt", **fit_kwargs
                    )
                    samples = {name: np.array(value) for name, value in run.get_samples().items()}
        outputs = set(self._output_sites) | {"y"}
        self.samples_ = {name: np.asarray(value) for name, value in samples.items() if name not in outputs}
        self.num_chains_ = num_chains
        return self

    def _model_function(self) -> Callable:
        return self.model if self.model is not None else self._default_model

    # -- predictions -----------------------------------------------------------------------------------------------
    def _model_inputs(self, X, y=None):
        """``X`` (and ``y``) validated against the fit and in the model's units: ``X`` standardised (float32);
        ``y`` standardised (regression) or encoded (classification)."""
        check_is_fitted(self, "samples_")
        if y is None:
            X = validate_data(self, X, dtype=np.float64, reset=False)
            return self.scaler_.transform_x(X).astype(np.float32)
        X, y = validate_data(self, X, y, dtype=np.float64, reset=False, y_numeric=isinstance(self, RegressorMixin))
        return self.scaler_.transform_x(X).astype(np.float32), self._encode_y(y)

    def _row_chunks(self, X, *arrays):
        """``(rows, X_chunk, *array_chunks)`` over chunks of rows of the model-unit inputs ``X`` (and arrays with
        the same rows), each chunk padded to one shape so that every chunk runs one compiled program; a chunk
        holds at most ``_CHUNK_FLOATS`` floats of outputs over all draws."""
        num_draws = next(iter(self.samples_.values())).shape[0]
        rows = max(1, min(X.shape[0], _CHUNK_FLOATS // (num_draws * self._outputs_per_row())))
        for start in range(0, X.shape[0], rows):
            parts = [a[start : start + rows] for a in (X, *arrays)]
            valid = parts[0].shape[0]
            if valid < rows:
                parts = [np.concatenate([p, np.zeros((rows - valid,) + p.shape[1:], p.dtype)]) for p in parts]
            yield valid, *parts

    def _chunk_draws(self, X):
        """Draws of the output sites, dict site -> ``(S, rows, ...)`` in the model's units, chunk by chunk of the
        model-unit inputs ``X`` (see :meth:`_row_chunks`)."""
        model, kwargs = self._model_function(), self._network_kwargs()
        for valid, chunk in self._row_chunks(X):
            out = predict(model, self.samples_, chunk, return_sites=list(self._output_sites), **kwargs)
            missing = [site for site in self._output_sites if site not in out]
            if missing:
                raise ValueError(
                    f"{type(self).__name__} needs the model to record the deterministic site(s) "
                    f"{list(self._output_sites)} when y is None (as numpyro_mile.models.{self._default_model.__name__} "
                    f"does); missing: {missing}."
                )
            yield {site: np.asarray(out[site])[:, :valid] for site in self._output_sites}

    def _pointwise_log_density(self, X, y) -> np.ndarray:
        """Log predictive density of each row ``(N,)`` of model-unit ``X`` and ``y``, chunk by chunk of rows."""
        model, kwargs = self._model_function(), self._network_kwargs()
        parts = []
        for valid, X_chunk, y_chunk in self._row_chunks(X, y):
            ll = np.asarray(log_likelihood(model, self.samples_, X_chunk, y_chunk, **kwargs)["y"])[:, :valid]
            parts.append(metrics.lppd(ll, pointwise=True)[1])
        return np.concatenate(parts)

    def _outputs_per_row(self) -> int:
        return 2

    def function_diagnostics(self, X) -> list[dict]:
        """ESS per chain, chainwise split R-hat (cR-hat, the MILE paper's) and between-chain R-hat of the network's
        outputs at inputs ``X`` (``mu`` and ``sigma``, or ``logits``): the diagnostics to read for an ensemble of
        chains (see the
        guide's "Reading ESS, R-hat and cR-hat"). Between-chain R-hat is large by design.

        :param X: inputs, shape ``(N, F)``, e.g. held-out rows (memory ``O(S x N)``: a few hundred rows suffice).
        :returns: :func:`numpyro_mile.diagnostics.summary` rows, one per output site; print them with
            :func:`numpyro_mile.diagnostics.format_summary`.
        """
        draws = _concatenate(list(self._chunk_draws(self._model_inputs(X))))
        return diagnostics.summary(
            {site: value.reshape((self.num_chains_, -1) + value.shape[1:]) for site, value in draws.items()}
        )


class MILERegressor(RegressorMixin, _MILEEstimator):
    """Bayesian neural-network regression sampled with MILE, as a scikit-learn estimator.

    The default network is :func:`numpyro_mile.models.mlp_regression` (heteroscedastic Gaussian head: each input
    gets a mean and a noise scale); inputs and targets are standardised with training statistics inside, and every
    prediction comes back in the targets' units.

    :param model: a NumPyro model ``model(X, y=None, **model_kwargs)`` that records deterministic sites ``"mu"`` and
        ``"sigma"`` when ``y is None``; default :func:`~numpyro_mile.models.mlp_regression`.
    :param hidden: hidden-layer widths of the default network.
    :param prior_scale: standard deviation of the default network's ``Normal(0, prior_scale)`` prior on every weight.
    :param budget: ``"quick"`` (4 chains, 5,000 warmup + 1,000 steps, thinned by 10: about 20 s on 1,200 rows, a
        minute on 14,000, on 2 CPU cores) or ``"paper"`` (the MILE paper's 12 chains, 50,000 + 10,000 steps, thinned by
        10); see :data:`BUDGETS`.
    :param num_chains: chains (one deep-ensemble member each); ``None``: the budget's.
    :param num_warmup: warmup (tuning) steps per chain; ``None``: the budget's.
    :param num_samples: sampling steps per chain; ``None``: the budget's.
    :param thinning: keep every ``thinning``-th sampling step; ``None``: the budget's.
    :param sampler: ``"mile"`` (full-batch, the default), or ``"smile"`` / ``"psmile"`` (minibatch gradients, for data
        too large for full-batch steps; :class:`~numpyro_mile.SMILE`).
    :param subsample_size: minibatch rows per step of SMILE / pSMILE (default ``min(256, N)``).
    :param ensemble_options: keyword arguments of the deep-ensemble pretraining (:func:`~numpyro_mile.deep_ensemble`),
        e.g. ``dict(max_epochs=200)``.
    :param kernel_options: keyword arguments of the kernel (:class:`~numpyro_mile.MILE` or
        :class:`~numpyro_mile.SMILE`), e.g. ``dict(target_energy_variance=(5e-4, 5e-4))``.
    :param model_kwargs: further keyword arguments of the model.
    :param chain_method: NumPyro's ``"vectorized"`` (default), ``"parallel"`` or ``"sequential"``.
    :param progress_bar: show the pretraining's and NumPyro's progress bars.
    :param random_state: an int seed (default 0), a ``numpy.random.RandomState`` or ``None``.

    **Example**

    .. doctest::

        >>> import numpy as np
        >>> from numpyro_mile.estimators import MILERegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(200, 3)); y = 10 + 5 * np.sin(X[:, 0]) + rng.normal(size=200)
        >>> reg = MILERegressor(num_warmup=500, num_samples=100, progress_bar=False).fit(X, y)
        >>> mean, std = reg.predict(X[:2], return_std=True)     # in y's units
        >>> lo, hi = reg.predict_interval(X[:2], 0.9)           # 90 % predictive interval
        >>> bool(np.all(lo < mean) and np.all(mean < hi)), round(reg.score(X, y), 1) > 0.5
        (True, True)
    """

    _default_model = staticmethod(mlp_regression)
    _output_sites = ("mu", "sigma")

    def _targets(self, y) -> np.ndarray:
        return np.asarray(y, dtype=np.float64)

    def _encode_y(self, y) -> np.ndarray:
        return self.scaler_.transform_y(np.asarray(y, dtype=np.float64)).astype(np.float32)

    def _in_units(self, draws: dict) -> dict[str, np.ndarray]:
        return {"mu": self.scaler_.inverse_y(draws["mu"]), "sigma": self.scaler_.inverse_scale(draws["sigma"])}

    def predict(self, X, return_std: bool = False):
        """The predictive mean per row (the average of the network's mean over the posterior), in ``y``'s units.

        :param X: inputs, shape ``(N, F)``.
        :param return_std: also return the total predictive standard deviation (noise and posterior spread).
        :returns: ``mean`` of shape ``(N,)``, or ``(mean, std)``.
        """
        parts = self.predict_uncertainty(X)
        return (parts.mean, parts.std) if return_std else parts.mean

    def predict_uncertainty(self, X) -> uncertainty.RegressionUncertainty:
        """Predictive mean and standard deviations (total, aleatoric, epistemic) per row, in ``y``'s units.

        :param X: inputs, shape ``(N, F)``.
        :returns: :class:`~numpyro_mile.uncertainty.RegressionUncertainty`, each field ``(N,)``.
        """
        parts = [uncertainty.regression(**self._in_units(draws)) for draws in self._chunk_draws(self._model_inputs(X))]
        return uncertainty.RegressionUncertainty(*(np.concatenate(field) for field in zip(*parts)))

    def predict_draws(self, X) -> dict[str, np.ndarray]:
        """The posterior draws behind every prediction: the network's mean and noise scale per draw, in ``y``'s
        units (the predictive of ``y`` is the equal-weight mixture of ``Normal(mu[s], sigma[s])``). Memory
        ``O(S x N)``; the other predictions reduce the draws chunk by chunk of rows.

        :param X: inputs, shape ``(N, F)``.
        :returns: ``{"mu": (S, N), "sigma": (S, N)}``.
        """
        return self._in_units(_concatenate(list(self._chunk_draws(self._model_inputs(X)))))

    def predict_quantiles(self, X, q: Sequence[float] = (0.05, 0.5, 0.95)) -> np.ndarray:
        """Quantiles of the posterior predictive of ``y`` per row (the mixture over draws), in ``y``'s units.

        :param X: inputs, shape ``(N, F)``.
        :param q: probabilities in ``(0, 1)``.
        :returns: shape ``(len(q), N)``: one row per probability (``numpy.quantile``'s layout).
        """
        q = tuple(np.atleast_1d(np.asarray(q, dtype=np.float64)).tolist())
        return np.concatenate(
            [
                uncertainty.mixture_quantiles(**self._in_units(draws), q=q)
                for draws in self._chunk_draws(self._model_inputs(X))
            ],
            axis=1,
        )

    def predict_interval(self, X, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """The central predictive interval at ``level`` per row, in ``y``'s units.

        :param X: inputs, shape ``(N, F)``.
        :param level: probability the interval holds, in ``(0, 1)``.
        :returns: ``(lower, upper)``, each ``(N,)``.
        """
        if not 0 < level < 1:
            raise ValueError(f"level must lie strictly between 0 and 1, got {level!r}.")
        lower, upper = self.predict_quantiles(X, ((1 - level) / 2, (1 + level) / 2))
        return lower, upper

    def log_predictive_density(self, X, y) -> float:
        """Mean log pointwise predictive density of ``(X, y)`` (test LPPD per row), with ``y`` in its own units.

        :param X: inputs, shape ``(N, F)``.
        :param y: targets, shape ``(N,)``.
        """
        X_model, y_model = self._model_inputs(X, y)
        # the density of y is the density of the standardised target divided by y_std
        return float(self._pointwise_log_density(X_model, y_model).mean()) - math.log(self.scaler_.y_std)


class MILEClassifier(ClassifierMixin, _MILEEstimator):
    """Bayesian neural-network classification sampled with MILE, as a scikit-learn estimator.

    The default network is :func:`numpyro_mile.models.mlp_classification` (softmax over the classes seen in
    ``fit``); labels of any type are encoded in ``fit`` and decoded in ``predict``; inputs are standardised with
    training statistics inside. Parameters as in :class:`MILERegressor`, except that a custom ``model`` takes
    labels ``0 .. C-1``, a ``num_classes`` keyword, and records ``"logits"`` ``(N, C)`` when ``y is None``.

    **Example**

    .. doctest::

        >>> import numpy as np
        >>> from numpyro_mile.estimators import MILEClassifier
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(200, 2)); y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
        >>> clf = MILEClassifier(num_warmup=500, num_samples=100, progress_bar=False).fit(X, y)
        >>> clf.predict(X[:3]).tolist() == y[:3].tolist(), clf.predict_proba(X[:3]).shape
        (True, (3, 2))
        >>> u = clf.predict_uncertainty(X[:3])                  # entropy = aleatoric + epistemic (nats)
        >>> bool(np.allclose(u.entropy, u.aleatoric + u.epistemic))
        True
    """

    _default_model = staticmethod(mlp_classification)
    _output_sites = ("logits",)

    def _targets(self, y) -> np.ndarray:
        check_classification_targets(y)
        self.classes_, encoded = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 classes in y, got 1 class ({self.classes_[0]!r})."
            )
        return encoded.astype(np.int32)

    def _encode_y(self, y) -> np.ndarray:
        lookup = {label: i for i, label in enumerate(self.classes_.tolist())}
        unseen = sorted({label for label in np.asarray(y).tolist() if label not in lookup}, key=repr)
        if unseen:
            raise ValueError(f"y has labels not seen in fit: {unseen[:5]}; known: {self.classes_.tolist()}.")
        return np.asarray([lookup[label] for label in np.asarray(y).tolist()], np.int32)

    def _network_kwargs(self) -> dict:
        return {"num_classes": int(self.classes_.size), **super()._network_kwargs()}

    def _outputs_per_row(self) -> int:
        return int(self.classes_.size)

    def _chunk_proba(self, X):
        """Class probabilities per draw, ``(S, rows, C)``, chunk by chunk of rows of ``X``."""
        for draws in self._chunk_draws(self._model_inputs(X)):
            yield softmax(np.asarray(draws["logits"], np.float64), axis=-1)

    def predict_draws(self, X) -> dict[str, np.ndarray]:
        """The posterior draws behind every prediction: class probabilities per draw. Memory ``O(S x N x C)``; the
        other predictions reduce the draws chunk by chunk of rows.

        :param X: inputs, shape ``(N, F)``.
        :returns: ``{"proba": (S, N, C)}``, classes in the order of ``classes_``.
        """
        return {"proba": np.concatenate(list(self._chunk_proba(X)), axis=1)}

    def predict_proba(self, X) -> np.ndarray:
        """Posterior predictive class probabilities, shape ``(N, C)`` with columns in the order of ``classes_``."""
        return np.concatenate([proba.mean(axis=0) for proba in self._chunk_proba(X)])

    def predict_log_proba(self, X) -> np.ndarray:
        """Logarithm of :meth:`predict_proba`."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X) -> np.ndarray:
        """The most probable class per row under the posterior predictive, as the labels given to ``fit``."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def predict_uncertainty(self, X) -> uncertainty.ClassificationUncertainty:
        """Predictive probabilities and the entropy split (total, aleatoric, epistemic; nats) per row.

        :param X: inputs, shape ``(N, F)``.
        :returns: :class:`~numpyro_mile.uncertainty.ClassificationUncertainty`.
        """
        parts = [uncertainty.classification(proba) for proba in self._chunk_proba(X)]
        return uncertainty.ClassificationUncertainty(*(np.concatenate(field) for field in zip(*parts)))

    def log_predictive_density(self, X, y) -> float:
        """Mean log pointwise predictive density of the labels ``y`` at ``X`` (minus the test NLL per row)."""
        return float(self._pointwise_log_density(*self._model_inputs(X, y)).mean())


#: kernels no fit is using, by what they are made of (least recently used first); see :func:`_pooled_kernel`
_IDLE_KERNELS: OrderedDict = OrderedDict()
_MAX_IDLE_KERNELS = 8
_IDLE_KERNELS_LOCK = threading.Lock()


@contextmanager
def _pooled_kernel(key, build: Callable):
    """A kernel made of ``key``: the idle one an earlier fit left, else ``build()``; back in the pool afterwards.

    ``run_chunked`` keeps the compiled chunk loop of each kernel object, with the data as its arguments: a refit
    (new rows of the same shapes, the next cross-validation fold, a clone in a grid search) on the kernel of an
    earlier fit is not traced or compiled again. A kernel is used by one fit at a time (taken out while in use),
    and holds no draws between fits."""
    try:
        hash(key)
    except TypeError:  # options that do not hash (e.g. an array): a kernel of its own
        yield build()
        return
    with _IDLE_KERNELS_LOCK:
        kernel = _IDLE_KERNELS.pop(key, None)
    if kernel is None:
        kernel = build()
    try:
        yield kernel
    finally:
        getattr(kernel, "ensembles", []).clear()  # the pretrained members of this fit: not kept in the pool
        with _IDLE_KERNELS_LOCK:
            _IDLE_KERNELS[key] = kernel
            while len(_IDLE_KERNELS) > _MAX_IDLE_KERNELS:
                _IDLE_KERNELS.popitem(last=False)


def _frozen(value):
    """``value`` with dicts, lists and sets made hashable (tuples), for :func:`_pooled_kernel`'s key."""
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return ("set",) + tuple(sorted(_frozen(v) for v in value))
    return value


def _accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name`` (or ``**kwargs``); ``True`` when its signature is unknown."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _concatenate(chunks: list[dict]) -> dict[str, np.ndarray]:
    """Chunks of draws, dict site -> ``(S, rows, ...)``, joined along the rows."""
    return {site: np.concatenate([chunk[site] for chunk in chunks], axis=1) for site in chunks[0]}
