"""BNN model builders: ordinary NumPyro models with a ``"data"`` plate."""

from .mlp import layer_shapes, mlp_apply, mlp_classification, mlp_regression

__all__ = ["layer_shapes", "mlp_apply", "mlp_classification", "mlp_regression"]

from .attention import attention, attention_apply, attention_shapes
from .cnn import cnn, cnn_apply, cnn_shapes

__all__ += ["attention", "attention_apply", "attention_shapes", "cnn", "cnn_apply", "cnn_shapes"]
