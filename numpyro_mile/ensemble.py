"""Deep-ensemble pretraining with optax: the first stage of MILE and the DE / BDE baselines.

Members are trained in parallel (``vmap``) on the model's mean negative log-likelihood (no prior
term, as in the MILE reference), with minibatches reshuffled every epoch and early stopping on a
validation NLL. Minibatches are drawn by substituting row indices into the model's observation
plate (``"data"``, or the one plate all observations share), so any NumPyro model that indexes
its data through that plate can be pretrained without slicing its arguments. A model that uses
its full data arrays inside the plate (``numpyro.sample("obs", d, obs=y)`` with ``y`` of all
``N`` rows) cannot be evaluated on a minibatch: it is trained full-batch instead (one Adam step
per epoch), with a warning that says why.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro import handlers
from numpyro.infer.util import constrain_fn

from . import _model_utils as model_utils
from . import _programs
from . import _progress
from ._validation import is_concrete, user_stacklevel
from ._arrays import as_jax_arrays, to_host

logger = logging.getLogger(__name__)


class DeepEnsemble(NamedTuple):
    """Result of :func:`deep_ensemble`.

    :ivar init_params: unconstrained parameters, dict site -> array ``(members, ...)``; pass as
        ``mcmc.run(..., init_params=...)``.
    :ivar samples: the same members in constrained space, usable as posterior "samples" of the DE
        baseline (e.g. with ``numpyro.infer.Predictive``).
    :ivar train_loss: mean training NLL per epoch, ``(members, epochs)``; NaN after a member stopped.
    :ivar val_loss: validation NLL per epoch, ``(members, epochs)``.
    :ivar num_epochs: epochs each member trained before early stopping, ``(members,)``.
    :ivar best_val_loss: validation NLL of the returned parameters, ``(members,)``.
    :ivar fit_seconds: wall time of the fit in seconds (compilation included).
    """

    init_params: dict
    samples: dict
    train_loss: np.ndarray
    val_loss: np.ndarray
    num_epochs: np.ndarray
    best_val_loss: np.ndarray
    fit_seconds: float


class MemberState(NamedTuple):
    """Training state of one member.

    :ivar recent_val: the last ``patience + 1`` validation losses, oldest first (``inf`` before
        that many epochs); used by ``early_stopping="mile"``.
    """

    params: dict
    opt_state: tuple
    best_params: dict
    best_val: jax.Array
    wait: jax.Array
    stopped: jax.Array
    epochs: jax.Array
    recent_val: jax.Array


#: early-stopping rules of :func:`deep_ensemble`
EARLY_STOPPING_RULES = ("best", "mile")


def should_stop(rule: str, wait, recent_val, patience: int):
    """Whether a member stops after this epoch.

    ``"best"``: the validation loss has not improved on its best for ``patience`` epochs
    (``wait >= patience``). ``"mile"`` (the MILE reference code): each of the last ``patience``
    validation losses is >= the loss just before them, ``patience`` epochs before the current one
    (``recent_val`` holds the last ``patience + 1`` losses, oldest first, ``inf`` where there are
    fewer epochs, which never stops); a non-finite loss (a diverged member) stops at once.
    """
    if rule == "best":
        return wait >= patience
    diverged = ~jnp.isfinite(recent_val[-1])
    return (jnp.all(recent_val[1:] >= recent_val[0]) & jnp.isfinite(recent_val[0])) | diverged


def default_optimizer() -> optax.GradientTransformation:
    """AdamW with the MILE reference settings (lr 1e-3, betas 0.9/0.999, weight decay 1e-3)."""
    return optax.adamw(1e-3, b1=0.9, b2=0.999, weight_decay=1e-3)


#: the optimizer used when none is given (one object, so that its compiled programs are reused)
_DEFAULT_OPTIMIZER = default_optimizer()


def init_member_params(rng_key, trace: dict) -> dict:
    """Initial unconstrained parameters of one member.

    Sites of rank >= 2 (weight matrices) get LeCun-normal values, ``N(0, 1 / fan_in)`` with
    ``fan_in = prod(shape[:-1])``; sites of lower rank (biases, scalars) start at 0. Shapes are
    the unconstrained ones (``K - 1`` for a ``Dirichlet`` of size ``K``).
    """
    return _init_params(rng_key, tuple(model_utils.unconstrained_shapes(trace).items()))


def _minibatch_failure(nll, params, data, indices, n) -> str | None:
    """Why the loss cannot be evaluated on a minibatch of rows (``None`` when it can).

    Evaluated abstractly (``jax.eval_shape``, the data closed over as in training): nothing is
    computed or compiled.
    """
    try:
        jax.eval_shape(lambda p, i: nll(p, data, i, n), params, indices)
    except (ValueError, TypeError, IndexError) as err:
        return f"{type(err).__name__}: {err}"
    return None


_FULL_BATCH_WARNING = (
    "To pretrain on minibatches, index the data through the plate {plate!r}, e.g. "
    "`with numpyro.plate({plate!r}, N) as idx: numpyro.sample('obs', d, obs=y[idx])` (or numpyro.subsample). "
    "The model failed on a minibatch of {batch} of its {n} rows ({reason}), so deep-ensemble pretraining trains "
    "full-batch instead: one Adam step on all rows per epoch, {validation}."
)


def _progress_enabled(progress_bar: bool) -> bool:
    return progress_bar and not os.environ.get("CI")


def _init_params(rng_key, shapes: tuple) -> dict:
    """:func:`init_member_params` from ``(name, unconstrained shape)`` pairs."""
    params = {}
    for key, (name, shape) in zip(jax.random.split(rng_key, len(shapes)), shapes):
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[:-1]))
            params[name] = jax.random.normal(key, shape) / np.sqrt(fan_in)
        else:
            params[name] = jnp.zeros(shape)
    return params


def _member_nll(model, plate_name, params, data, indices, num_rows):
    """Mean negative log-likelihood per row of the rows ``indices`` (``None``: the model's own arrays)."""
    args, kwargs = data
    values = constrain_fn(handlers.seed(model, jax.random.PRNGKey(0)), args, kwargs, params)
    plate_indices = None if indices is None else {plate_name: indices}
    return -model_utils.observed_log_likelihood(model, args, kwargs, values, plate_indices) / num_rows


class _EpochSetup(NamedTuple):
    """Everything the compiled epoch closes over (hashable: the key of its compiled program)."""

    model: Callable
    plate_name: str
    n: int
    data_key: tuple
    val_kind: str  # "none", "rows" (held-out rows of the data) or "data" (separate validation arrays)
    val_data_key: tuple
    n_val: int
    shapes: tuple
    optimizer: optax.GradientTransformation
    full_batch: bool
    batch: int
    num_batches: int
    early_stopping: str
    patience: int


def _members_init_program(setup: _EpochSetup) -> Callable:
    """Jitted ``member_keys -> MemberState`` (members first)."""

    def init_state(member_key) -> MemberState:
        params = _init_params(jax.random.fold_in(member_key, -1 % 2**31), setup.shapes)
        dtype = jnp.result_type(*jax.tree.leaves(params)) if params else jnp.float32
        return MemberState(
            params,
            setup.optimizer.init(params),
            params,
            jnp.full((), jnp.inf, dtype),
            jnp.zeros((), jnp.int32),
            jnp.zeros((), bool),
            jnp.zeros((), jnp.int32),
            jnp.full((setup.patience + 1,), jnp.inf, dtype),
        )

    return jax.jit(jax.vmap(init_state))


def _epoch_program(setup: _EpochSetup) -> Callable:
    """Jitted ``(states, epoch, member_keys, (arrays, train_idx, val_idx, val_arrays)) -> (states, (train, val))``:
    one epoch of every member; the data are arguments (see :mod:`numpyro_mile._programs`)."""
    nll = partial(_member_nll, setup.model, setup.plate_name)
    optimizer, batch, num_batches = setup.optimizer, setup.batch, setup.num_batches

    def run_epoch(states, epoch_index, member_keys, arrays):
        data_arrays, train_idx, val_idx, val_arrays = arrays
        data = _programs.join_data(setup.data_key, data_arrays)

        def val_loss_fn(params):
            if setup.val_kind == "rows":
                return nll(params, data, val_idx, setup.n)
            val_args, _ = _programs.join_data(setup.val_data_key, val_arrays)
            return nll(params, (val_args, data[1]), None, setup.n_val)

        def train_step(carry, indices):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(nll)(params, data, indices, setup.n)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        def epoch(state: MemberState, key):
            if setup.full_batch:  # no indices: the model runs on its own arrays, every row once (scale 1)
                (params, opt_state), loss = train_step((state.params, state.opt_state), None)
                losses = loss[None]
            else:
                order = jax.random.permutation(key, train_idx)[: num_batches * batch].reshape(num_batches, batch)
                (params, opt_state), losses = jax.lax.scan(train_step, (state.params, state.opt_state), order)
            # a stopped member keeps its parameters (it is still computed: members train together)
            params = jax.tree.map(lambda a, b: jnp.where(state.stopped, b, a), params, state.params)
            has_val = setup.val_kind != "none"
            val = val_loss_fn(params) if has_val else losses.mean()
            improved = (val < state.best_val) & ~state.stopped
            if not has_val or setup.early_stopping == "mile":
                improved = ~state.stopped & jnp.isfinite(val)  # keep the final (finite) parameters
            wait = jnp.where(improved, 0, state.wait + 1)
            recent = jnp.where(state.stopped, state.recent_val, jnp.append(state.recent_val[1:], val))
            stop = should_stop(setup.early_stopping, wait, recent, setup.patience) if has_val else False
            new_state = MemberState(
                params=params,
                opt_state=opt_state,
                best_params=jax.tree.map(lambda a, b: jnp.where(improved, a, b), params, state.best_params),
                best_val=jnp.where(improved, val, state.best_val).astype(state.best_val.dtype),
                wait=wait.astype(state.wait.dtype),
                stopped=state.stopped | stop,
                epochs=state.epochs + jnp.where(state.stopped, 0, 1).astype(state.epochs.dtype),
                recent_val=recent.astype(state.recent_val.dtype),
            )
            nan = jnp.nan
            return new_state, (jnp.where(state.stopped, nan, losses.mean()), jnp.where(state.stopped, nan, val))

        keys = jax.vmap(lambda k: jax.random.fold_in(k, epoch_index))(member_keys)
        return jax.vmap(epoch)(states, keys)

    return jax.jit(run_epoch)


def fit_members(
    model: Callable,
    member_keys: jax.Array,
    model_args: tuple,
    model_kwargs: dict,
    *,
    optimizer: optax.GradientTransformation | None = None,
    batch_size: int = 32,
    max_epochs: int = 500,
    patience: int = 10,
    validation=0.1,
    validation_seed: int = 0,
    plate_name: str | None = None,
    early_stopping: str = "mile",
    progress_bar: bool = True,
    trace: dict | None = None,
) -> DeepEnsemble:
    """Train one member per key in ``member_keys`` (shape ``(members, 2)``); see :func:`deep_ensemble`.

    Member ``k`` depends only on ``member_keys[k]`` (and the shared validation split), so training
    members together or one at a time gives the same members.

    :param trace: a trace of ``model`` on these arguments when the caller has one (a kernel that
        pretrains has traced the model already); else the model is traced here.
    """
    start = time.perf_counter()
    optimizer = _DEFAULT_OPTIMIZER if optimizer is None else optimizer
    if early_stopping not in EARLY_STOPPING_RULES:
        raise ValueError(f"early_stopping must be one of {EARLY_STOPPING_RULES}, got {early_stopping!r}.")
    model_args, model_kwargs = as_jax_arrays(tuple(model_args)), as_jax_arrays(dict(model_kwargs))
    if isinstance(validation, (tuple, list)):
        validation = as_jax_arrays(tuple(validation))
    trace = model_utils.trace_model(model, model_args, model_kwargs) if trace is None else trace
    plate = model_utils.observation_plate(trace) if plate_name is None else model_utils.plates(trace).get(plate_name)
    if plate is None:
        where = (
            "a plate named 'data' or one plate shared by all observed sites"
            if plate_name is None
            else (f"a plate named {plate_name!r}")
        )
        raise ValueError(
            f"deep-ensemble pretraining needs the observations in {where} (numpyro.plate('data', N)); "
            "the model has none. Pass init_params, or pretrain=False."
        )
    plate_name, n = plate.name, plate.size
    model_utils.check_continuous(trace, "deep_ensemble")
    data = _programs.split_data(model_args, model_kwargs)
    shapes = tuple(model_utils.unconstrained_shapes(trace).items())
    nll = partial(_member_nll, model, plate_name)

    probe_params = jax.eval_shape(lambda k: _init_params(k, shapes), jax.random.PRNGKey(0))
    # at least 2 rows: a model that does not index its data broadcasts a 1-row plate against all N rows unnoticed
    probe_rows = jnp.arange(min(max(batch_size, 2), max(n - 1, 1)))
    reason = _minibatch_failure(nll, probe_params, (model_args, model_kwargs), probe_rows, n) if n > 1 else None
    full_batch = reason is not None
    if full_batch and not isinstance(validation, (tuple, list)) and validation is not None:
        validation = None  # rows cannot be held out of a model that cannot be indexed
        validation_note = (
            "with no validation rows held out (early stopping would need indexing), for "
            "max_epochs steps; pass validation=(X_val, y_val) to stop early on separate data"
        )
    else:
        validation_note = "early stopping as configured"
    if full_batch:
        warnings.warn(
            _FULL_BATCH_WARNING.format(
                plate=plate_name, batch=len(probe_rows), n=n, reason=reason, validation=validation_note
            ),
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        logger.info("deep ensemble: full-batch training (%s)", reason)

    train_idx = np.arange(n)
    val_idx = jnp.zeros((0,), jnp.int32)
    val_data = _programs.split_data((), {})
    if validation is None:
        val_kind, n_val = "none", 0
    elif isinstance(validation, (tuple, list)):
        val_kind = "data"
        val_data = _programs.split_data(tuple(validation), model_kwargs)
        n_val = model_utils.plates(model_utils.trace_model(model, tuple(validation), model_kwargs))[plate_name].size
    else:
        fraction = float(validation)
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"validation must be a fraction in (0, 1), model args, or None; got {validation!r}.")
        perm = np.random.default_rng(validation_seed).permutation(n)
        n_val = max(1, int(round(fraction * n)))
        if n - n_val < 1:
            raise ValueError(f"{n} rows are too few to hold out a validation fraction of {fraction}.")
        val_kind = "rows"
        val_idx, train_idx = jnp.asarray(np.sort(perm[:n_val])), np.sort(perm[n_val:])

    train_idx = jnp.asarray(train_idx)
    batch = n if full_batch else min(batch_size, int(train_idx.shape[0]))
    if not full_batch and batch != len(probe_rows):
        reason = _minibatch_failure(nll, probe_params, (model_args, model_kwargs), train_idx[:batch], n)
        if reason is not None:
            raise ValueError(f"deep-ensemble pretraining failed on a minibatch of {batch} rows: {reason}")
    num_batches = 1 if full_batch else int(train_idx.shape[0]) // batch

    setup = _EpochSetup(
        model,
        plate_name,
        n,
        data.key,
        val_kind,
        val_data.key,
        n_val,
        shapes,
        optimizer,
        full_batch,
        batch,
        num_batches,
        early_stopping,
        int(patience),
    )
    init_states = _programs.program(("ensemble-init", setup), lambda: _members_init_program(setup))
    run_epoch = _programs.program(("ensemble-epoch", setup), lambda: _epoch_program(setup))
    num_members = member_keys.shape[0]
    states = init_states(member_keys)
    arrays = (data.arrays, train_idx, val_idx, val_data.arrays)
    if is_concrete(member_keys):
        train_curve, val_curve = [], []
        bar = None
        if _progress_enabled(progress_bar):
            bar = _progress.progress_bar(max_epochs, desc="deep ensemble", leave=False)
            monitored = (
                "train_nll" if val_kind == "none" else ("val_nll" if early_stopping == "mile" else "best_val_nll")
            )
        for e in range(max_epochs):
            states, (train_l, val_l) = run_epoch(states, jnp.asarray(e, jnp.int32), member_keys, arrays)
            train_curve.append(train_l)
            val_curve.append(val_l)
            if bar is not None:
                bar.update(1)
                # refresh=False: redrawn at tqdm's pace, not every epoch (each redraw is a line in a captured log)
                bar.set_postfix({monitored: f"{float(jnp.nanmin(states.best_val)):.4f}"}, refresh=False)
            if bool(jnp.all(states.stopped)):
                break
        if bar is not None:
            bar.close()
        # to_host: members sharded over several processes (numpyro_mile.runs.distributed) are gathered
        train_loss = to_host(jnp.stack(train_curve, axis=1))
        val_loss = to_host(jnp.stack(val_curve, axis=1))
    else:  # traced (e.g. inside pmap): the same epochs in a while loop
        curves = jnp.full((2, num_members, max_epochs), jnp.nan)

        def cond(carry):
            e, s, _ = carry
            return (e < max_epochs) & ~jnp.all(s.stopped)

        def body(carry):
            e, s, c = carry
            s, (train_l, val_l) = run_epoch(s, e, member_keys, arrays)
            return e + 1, s, c.at[:, :, e].set(jnp.stack([train_l, val_l]))

        _, states, curves = jax.lax.while_loop(cond, body, (jnp.asarray(0, jnp.int32), states, curves))
        train_loss, val_loss = curves[0], curves[1]

    init_params = states.best_params
    samples = jax.vmap(lambda p: model_utils.constrain(trace, p))(init_params)
    return DeepEnsemble(
        init_params=init_params,
        samples=samples,
        train_loss=train_loss,
        val_loss=val_loss,
        num_epochs=states.epochs,
        best_val_loss=states.best_val,
        fit_seconds=time.perf_counter() - start,
    )


def deep_ensemble(
    model: Callable,
    rng_key,
    num_members: int,
    *model_args,
    optimizer: optax.GradientTransformation | None = None,
    batch_size: int = 32,
    max_epochs: int = 500,
    patience: int = 10,
    validation=0.1,
    validation_seed: int = 0,
    plate_name: str | None = None,
    early_stopping: str = "mile",
    progress_bar: bool = True,
    **model_kwargs,
) -> DeepEnsemble:
    """Train a deep ensemble of ``num_members`` point estimates of ``model``'s latent sites.

    Each member minimises the mean negative log-likelihood of the observed sites (no prior term)
    with ``optimizer`` on minibatches of ``batch_size`` rows, reshuffled every epoch, for at most
    ``max_epochs`` epochs, with early stopping on the validation NLL (``early_stopping``).

    Minibatches (and held-out validation rows) are drawn by substituting row indices into the
    observation plate. A model that cannot be evaluated on a subset of rows (its observations use
    the full data array inside the plate) is trained full-batch instead, one step per epoch,
    with a ``UserWarning`` that says why; a validation fraction is then ignored (pass
    ``validation=(X_val, y_val)`` to stop early on separate data).

    :param model: a NumPyro model whose observations lie in a plate (see ``plate_name``).
    :param rng_key: a JAX PRNG key; member ``k`` uses ``jax.random.split(rng_key, num_members)[k]``.
    :param num_members: ensemble size ``K`` (MILE: one chain per member).
    :param model_args: the training data, as passed to the model (e.g. ``X_train, y_train``).
    :param optimizer: an optax optimizer; default AdamW(1e-3, weight decay 1e-3).
    :param validation: a fraction of the rows held out for early stopping (the same rows for every
        member, chosen by ``validation_seed``; they are taken out of the training rows), a tuple
        of model args with separate validation data (e.g. ``(X_val, y_val)``; all rows train), or
        ``None`` for no early stopping (``max_epochs`` epochs, final parameters).
    :param plate_name: the plate that holds the observations; default ``"data"`` when the model
        has such a plate, else the one plate shared by all observed sites.
    :param early_stopping: ``"mile"`` (default): the MILE reference code's rule: stop when each of
        the last ``patience`` validation losses is >= the loss just before them (``patience`` epochs
        before the current one), or the loss is not finite, and return the final (last finite)
        parameters. ``"best"``: stop when the validation NLL has not improved on its best for
        ``patience`` epochs and return the best parameters (MILE's test LPPD after either was the same
        within noise on four real data sets, the reference's rule ahead on 7 of 11 splits:
        ``docs/methods/mile.md``).
    :param progress_bar: show a tqdm bar over epochs (off when ``$CI`` is set).
    :param model_kwargs: keyword arguments of the model (e.g. ``hidden=(16, 16)``).
    :return: a :class:`DeepEnsemble`.

    **Example**

    .. doctest::

        >>> import jax
        >>> from numpyro_mile import deep_ensemble
        >>> from numpyro_mile.datasets import toy_regression
        >>> from numpyro_mile.models import mlp_regression
        >>> X, y = toy_regression(100)
        >>> de = deep_ensemble(mlp_regression, jax.random.PRNGKey(0), 4, X, y, max_epochs=20,
        ...                    progress_bar=False)
        >>> de.init_params["w0"].shape
        (4, 1, 16)
    """
    if num_members < 1:
        raise ValueError(f"num_members must be at least 1, got {num_members}.")
    return fit_members(
        model,
        jax.random.split(rng_key, num_members),
        model_args,
        model_kwargs,
        optimizer=optimizer,
        batch_size=batch_size,
        max_epochs=max_epochs,
        patience=patience,
        validation=validation,
        validation_seed=validation_seed,
        plate_name=plate_name,
        early_stopping=early_stopping,
        progress_bar=progress_bar,
    )


def pretraining_plate(trace: dict, plate_name: str | None, kernel_name: str):
    """The plate a kernel's deep-ensemble pretraining would minibatch, or ``None`` (the kernel then starts
    from its ``init_strategy``), warning once with the reason: no single plate holds the observed sites,
    or latent sites lie inside it (one value per row, which a likelihood-only fit cannot estimate)."""
    plate = model_utils.observation_plate(trace) if plate_name is None else model_utils.plates(trace).get(plate_name)
    observed = list(model_utils.observed_sites(trace))
    if plate is None:
        if observed:
            warnings.warn(
                f"{kernel_name} found no single plate holding the observed site(s) {observed} (none, or several "
                "nested ones), so it does not pretrain a deep ensemble and starts from init_strategy. Name the plate: "
                f"{kernel_name}(model, ensemble_options=dict(plate_name=...)), or pass init_params.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return None
    local = [
        name
        for name, site in model_utils.latent_sites(trace).items()
        if any(frame.name == plate.name for frame in site.get("cond_indep_stack", ()))
    ]
    if local:
        warnings.warn(
            f"{kernel_name} does not pretrain a deep ensemble for this model: latent site(s) {local} lie inside the "
            f"observation plate {plate.name!r} (one value per row), which the ensemble's likelihood-only fit "
            "cannot estimate. It starts from init_strategy; pass init_params to start elsewhere.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        return None
    return plate
