"""Input checks shared by models, datasets and kernels.

Every public entry point that takes user data calls these, so the messages are the same
everywhere and say what to do.
"""

from __future__ import annotations

import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

#: folders whose frames a warning skips to reach the user's line (this package, NumPyro, JAX)
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(module_file)) + os.sep for module_file in (__file__, numpyro.__file__, jax.__file__)
)


def is_pandas(value) -> bool:
    """Whether ``value`` is a pandas ``DataFrame`` / ``Series`` (anything with ``to_numpy`` that is not an array)."""
    return hasattr(value, "to_numpy") and not isinstance(value, (np.ndarray, jax.Array))


def as_array(value):
    """A pandas ``DataFrame`` / ``Series`` as a NumPy array, so data can be passed as users hold them; any other
    value unchanged."""
    return value.to_numpy() if is_pandas(value) else value


def check_finite(name: str, array) -> None:
    """Raise ``ValueError`` when ``array`` holds NaN or infinite values.

    :param name: how the array is called in the message (e.g. ``"X"``).
    :param array: any array-like; a concrete (non-traced) value.
    """
    try:
        values = np.asarray(array)
    except Exception:  # a JAX tracer: the check cannot run inside jit
        return
    if values.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(values)
    if bad.any():
        where = np.argwhere(bad)[0].tolist()
        if name in ("X", "y"):  # the rows to keep, by the array at fault, applied to both
            rows = "np.isfinite(X).reshape(len(X), -1).all(axis=1)" if name == "X" else "np.isfinite(y)"
            advice = f"e.g. keep = {rows}; X, y = X[keep], y[keep]"
        else:
            advice = "e.g. with np.isfinite"
        raise ValueError(
            f"{name} contains {int(bad.sum())} NaN or infinite value(s) (first at index {where}). "
            f"Drop or impute those rows before fitting, {advice}."
        )


def check_xy(X, y=None, *, x_ndim: int | None = 2, y_ndim: int = 1) -> None:
    """Check ranks, matching lengths and finiteness of inputs ``X`` and targets ``y``.

    :param X: inputs, shape ``(N, ...)``; rank ``x_ndim`` when given.
    :param y: targets, shape ``(N,)`` (rank ``y_ndim``), or ``None`` for prediction.
    """
    try:
        x_shape = np.shape(X)
    except Exception:
        return
    if x_ndim is not None and len(x_shape) != x_ndim:
        raise ValueError(
            f"X must have rank {x_ndim} (shape (N, num_features)), got shape {tuple(x_shape)}. "
            "Reshape a single feature with X[:, None]."
        )
    check_finite("X", X)
    if y is None:
        return
    y_shape = np.shape(y)
    if len(y_shape) != y_ndim:
        raise ValueError(
            f"y must have rank {y_ndim} (shape (N,)), got shape {tuple(y_shape)}. "
            "Flatten a column vector with y.ravel()."
        )
    if y_shape[0] != x_shape[0]:
        raise ValueError(
            f"X and y have different numbers of rows: {x_shape[0]} vs {y_shape[0]}. "
            "They must describe the same observations."
        )
    check_finite("y", y)


def is_concrete(array) -> bool:
    """True when ``array`` is a concrete value (not a JAX tracer)."""
    try:
        np.asarray(array)
        return True
    except Exception:
        return False


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called here that points at the first frame outside this package,
    NumPyro and JAX: the user's line (e.g. ``mcmc.run(...)``), not NumPyro's source."""
    frame, level = inspect.currentframe(), 0
    while frame is not None and (level == 0 or os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARY_DIRS)):
        frame, level = frame.f_back, level + 1
    return max(level, 1)


#: the start of NumPyro's own model-check warning (``numpyro.util._validate_model``)
MISSING_PLATE = "Missing a plate statement"


def check_plates(trace: dict) -> None:
    """NumPyro's model check, as its kernels run it in ``initialize_model``: a batch dimension of a site inside
    a plate that no plate declares warns "Missing a plate statement ...", here at the user's line."""
    import warnings

    from numpyro.util import _validate_model  # NumPyro's own check (private, used by initialize_model)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _validate_model(trace, plate_warning="loose")
        except ValueError:  # shapes that do not broadcast: the kernels' own checks say what to change
            pass
    for warning in caught:
        warnings.warn(warning.message, warning.category, stacklevel=user_stacklevel())


def check_init_params(init_params, shapes: dict, lead: tuple = (), *, dtype=None, hint: str = "") -> dict:
    """User ``init_params`` checked against the model's latent sites, as JAX arrays.

    :param init_params: what the user passed: a dict of unconstrained values, one per latent site.
    :param shapes: each latent site's unconstrained shape, ``{name: shape}``.
    :param lead: the leading axes every value must have first (``(num_chains,)`` for batched chains).
    :param dtype: convert the values to this dtype (``None``: keep theirs).
    :param hint: advice appended to a shape error (e.g. how to index one ensemble member).
    :return: ``{name: array of shape lead + shapes[name]}``.
    :raises ValueError: naming the sites or the site whose shape is wrong, and the shape expected.
    """
    if not isinstance(init_params, dict) or set(init_params) != set(shapes):
        got = sorted(init_params) if isinstance(init_params, dict) else type(init_params).__name__
        raise ValueError(
            f"init_params must be a dict with one unconstrained array per latent site {sorted(shapes)}, got {got}. "
            "Use deep_ensemble(...).init_params or numpyro.infer.util.initialize_model(...).param_info.z."
        )
    checked = {}
    for name, shape in shapes.items():
        value = jnp.asarray(init_params[name], dtype)
        expected = tuple(lead) + tuple(shape)
        if tuple(value.shape) != expected:
            raise ValueError(
                f"init_params[{name!r}] has shape {tuple(value.shape)}, expected {expected}"
                + (f" ({hint})." if hint else ".")
            )
        checked[name] = value
    return checked
