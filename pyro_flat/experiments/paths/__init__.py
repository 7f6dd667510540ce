"""The path study (``pyro-flat paths``): :mod:`.study` finds the minimum-energy path and its curvature;
:mod:`.dynamics` starts SGD and SGLD on it.

The package's attributes are :mod:`.study`'s (as when the study was one module); importing the package imports
neither torch nor Pyro.
"""

from importlib import import_module


def __getattr__(name: str):
    return getattr(import_module(f"{__name__}.study"), name)
