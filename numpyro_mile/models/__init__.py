"""BNN model builders: ordinary NumPyro models with a ``"data"`` plate."""

from .mlp import layer_shapes, mlp_apply, mlp_classification, mlp_regression

__all__ = ["layer_shapes", "mlp_apply", "mlp_classification", "mlp_regression"]
