"""The 2-D study (``pyro-flat synthetic2d``): :mod:`.study` runs many chains on a sharp/flat energy.

The package's attributes are :mod:`.study`'s (as when the study was one module); importing the package imports
neither torch nor Pyro.
"""

from importlib import import_module


def __getattr__(name: str):
    return getattr(import_module(f"{__name__}.study"), name)
