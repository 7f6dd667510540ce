"""The BNN study (``pyro-flat bnn``): :mod:`.study` runs it over seeds; :mod:`.families` fits each family, plain and
sharpness-aware; :mod:`.report` its claims and figures.

The package's attributes are :mod:`.study`'s (as when the study was one module); importing the package imports
neither torch nor Pyro.
"""

from importlib import import_module


def __getattr__(name: str):
    return getattr(import_module(f"{__name__}.study"), name)
