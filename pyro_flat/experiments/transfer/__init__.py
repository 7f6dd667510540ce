"""The transfer study (``pyro-flat transfer``): :mod:`.study` runs it; :mod:`.config` its options, :mod:`.data` the
splits, :mod:`.pretrain` the cached pre-trained network, :mod:`.fits` each method's fit, :mod:`.report` the claims.

The package's attributes are :mod:`.study`'s (as when the study was one module); importing the package imports
neither torch nor Pyro.
"""

from importlib import import_module


def __getattr__(name: str):
    return getattr(import_module(f"{__name__}.study"), name)
