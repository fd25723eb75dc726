"""numpyro_mile: MILE, SGLD and ICSGLD kernels for Bayesian neural networks in NumPyro."""

from . import approx, datasets, diagnostics, metrics, models
from ._programs import enable_compilation_cache
from .baselines import bde
from .ensemble import DeepEnsemble, deep_ensemble
from .kernels import ICSGLD, MILE, SGLD, ICSGLDState, MILEState, SGLDState
from .predictive import log_likelihood, predict
from .reporting import to_inference_data
from .weights import importance_weights

__version__ = "0.1.0.dev0"

__all__ = ["MILE", "MILEState", "DeepEnsemble", "bde", "deep_ensemble", "datasets", "diagnostics", "metrics", "models",
           "log_likelihood", "predict", "to_inference_data",
           "SGLD", "SGLDState", "ICSGLD", "ICSGLDState", "importance_weights", "enable_compilation_cache"]

from .distributed import DistributedRun, chain_mesh, run_distributed, sharded_deep_ensemble  # noqa: E402

__all__ += ["DistributedRun", "chain_mesh", "run_distributed", "sharded_deep_ensemble"]
from .checkpoint import CheckpointError, ChunkedRun, load_checkpoint, run_chunked, save_checkpoint  # noqa: E402
from .streaming import SampleStore, load_inference_data, load_samples  # noqa: E402

__all__ += ["save_checkpoint", "load_checkpoint", "run_chunked", "ChunkedRun", "CheckpointError",
            "SampleStore", "load_samples", "load_inference_data"]
