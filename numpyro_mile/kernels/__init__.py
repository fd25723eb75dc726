"""NumPyro MCMC kernels of numpyro_mile, one per module."""

from .icsgld import ICSGLD, ICSGLDState
from .mile import MILE, MILEState
from .sgld import SGLD, SGLDState
from .smile import SMILE, SMILEState

__all__ = ["ICSGLD", "ICSGLDState", "MILE", "MILEState", "SGLD", "SGLDState", "SMILE", "SMILEState"]
