"""The image study (``pyro-flat images`` and ``images-eta``): :mod:`.study` runs the fits and writes the folder;
:mod:`.config` its options, :mod:`.data` the images (MNIST digits, CIFAR files), :mod:`.scores` what each fit scores,
:mod:`.report` the claims and figures, :mod:`.eta` the η sweep.

The package's attributes are :mod:`.study`'s (as when the study was one module); importing the package imports
neither torch nor Pyro.
"""

from importlib import import_module


def __getattr__(name: str):
    return getattr(import_module(f"{__name__}.study"), name)
