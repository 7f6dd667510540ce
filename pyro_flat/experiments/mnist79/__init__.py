"""The main job (``pyro-flat mnist79``): :mod:`.study` samples MNIST 7 vs 9 and checks the samplers against the
exact reference; :mod:`.report` writes what it found.

The package's attributes are :mod:`.study`'s (as when the study was one module); importing the package imports
neither torch nor Pyro.
"""

from importlib import import_module


def __getattr__(name: str):
    return getattr(import_module(f"{__name__}.study"), name)
