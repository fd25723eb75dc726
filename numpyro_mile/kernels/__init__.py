"""NumPyro MCMC kernels of numpyro_mile, one per module."""

from .mile import MILE, MILEState

__all__ = ["MILE", "MILEState"]
