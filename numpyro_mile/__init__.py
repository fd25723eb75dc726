"""numpyro_mile: MILE, SGLD and ICSGLD kernels for Bayesian neural networks in NumPyro, and scikit-learn estimators
over them."""

from . import approx, datasets, diagnostics, metrics, models, uncertainty
from ._programs import enable_compilation_cache
from ._version import __version__
from .baselines import bde
from .ensemble import DeepEnsemble, deep_ensemble
from .estimators import MILEClassifier, MILERegressor
from .inference_data import load_inference_data, to_inference_data
from .kernels import ICSGLD, MILE, SGLD, SMILE, ICSGLDState, MILEState, SGLDState, SMILEState
from .kernels.icsgld import importance_weights
from .predictive import log_likelihood, predict
from .runs.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .runs.chunked import ChunkedRun, run_chunked
from .runs.distributed import DistributedRun, chain_mesh, run_distributed, sharded_deep_ensemble
from .sample_store import SampleStore, load_samples

__all__ = [
    "__version__",
    # kernels and their states
    "MILE",
    "MILEState",
    "SGLD",
    "SGLDState",
    "ICSGLD",
    "ICSGLDState",
    "SMILE",
    "SMILEState",
    # scikit-learn estimators
    "MILERegressor",
    "MILEClassifier",
    # deep ensembles and the BDE baseline
    "DeepEnsemble",
    "deep_ensemble",
    "bde",
    # predictions and reporting
    "predict",
    "log_likelihood",
    "to_inference_data",
    "importance_weights",
    # long runs: checkpoints, chunked runs, sample stores
    "save_checkpoint",
    "load_checkpoint",
    "CheckpointError",
    "run_chunked",
    "ChunkedRun",
    "SampleStore",
    "load_samples",
    "load_inference_data",
    # chains over devices
    "run_distributed",
    "DistributedRun",
    "chain_mesh",
    "sharded_deep_ensemble",
    # compilation
    "enable_compilation_cache",
    # submodules
    "approx",
    "datasets",
    "diagnostics",
    "metrics",
    "models",
    "uncertainty",
]
