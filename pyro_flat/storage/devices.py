r"""Where a checkpoint goes on the machine that reads it: its CUDA tensors and the devices it names go to the
reading run's GPU (:func:`checkpoint_location`), and the run's random streams, device by device
(:func:`random_state`, :func:`set_random_state`). :mod:`pyro_flat.storage.checkpoint` reads and writes the file.

>>> checkpoint_location("cuda:1", [torch.device("cuda", 0)])
'cuda:0'
"""

from __future__ import annotations

import os
import pickle
import random
import types
from typing import Callable, Sequence, Union

import numpy as np
import torch

from ..errors import CheckpointError


def checkpoint_location(location: str, devices: Sequence[torch.device] = (),
                        path: Union[str, os.PathLike, None] = None) -> str:
    """Where a checkpoint's tensor (or device) saved at ``location`` (torch's tag: ``"cpu"``, ``"cuda:1"``) goes in
    a run whose CUDA devices are ``devices`` (:class:`pyro_flat.MCMC` finds them in the model's data, a
    :class:`~pyro_flat.nn.Batches` loader's device, ``initial_params`` and an ``nn.Module`` model's weights).

    - a CPU location stays (random states, draws kept in host memory);
    - a run on a CUDA device: a CUDA location among ``devices`` stays, any other goes to ``devices[0]``
      (``cuda:1`` to ``cuda:0`` for a run on ``cuda:0``);
    - a run whose data are not on a GPU: a CUDA location this machine has stays (the model may hold its
      tensors there); one it lacks is refused, a :class:`CheckpointError` that names ``path``, the device the
      checkpoint was written on and what to do.

    >>> checkpoint_location("cuda:1", [torch.device("cuda", 0)]), checkpoint_location("cpu", [torch.device("cuda", 0)])
    ('cuda:0', 'cpu')
    """
    if not location.startswith("cuda"):
        return location
    saved = torch.device(location)
    run = [_with_index(d) for d in devices if torch.device(d).type == "cuda"]
    if run:
        return location if saved in run else str(run[0])
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count and (saved.index is None or saved.index < count):
        return location
    here = ("this machine has no CUDA device" if not count else
            f"this machine has {count} CUDA device{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})")
    go_on = ("continue it on a machine with a CUDA device, with the run's data there" if not count else
             "give the run its data (or initial_params) on a CUDA device, e.g. .to('cuda'): the checkpoint's "
             "tensors go to that device")
    raise CheckpointError(f"checkpoint {str(path)!r} was written by a run on {location}, and {here} and this run's "
                          f"data are not on a GPU. To {go_on}; or delete the file (or pass another checkpoint= path) "
                          "to start a new run here.")


def _with_index(device) -> torch.device:
    """``device`` with its index where CUDA can say it (``cuda`` is the current CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def pickle_with_devices(device: Callable[..., torch.device]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` that makes the ``torch.device`` objects of the file with
    ``device(*args)``: ``map_location`` moves tensors only, not the devices a state names."""

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "torch" and name == "device":
                return device
            return super().find_class(module, name)

    module = types.ModuleType("pyro_flat_checkpoint_pickle")
    module.Unpickler = Unpickler
    module.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    return module


def random_state(devices: Sequence[torch.device] = ()) -> dict:
    """Every random generator a run draws from: torch's CPU one, Python's, numpy's, and CUDA's where it is in
    use: those of the run's CUDA ``devices``, ``{device: state}`` (a run that reads the checkpoint elsewhere
    gets them on its own device, as the tensors: :func:`checkpoint_location`), else every device's, in order."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [_with_index(d) for d in devices if torch.device(d).type == "cuda"]
        state["cuda"] = {d: torch.cuda.get_rng_state(d) for d in cuda} if cuda else torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict) -> None:
    """Put back :func:`random_state`'s streams. CUDA's are set on the devices this machine has; the others are
    left out: a run whose tensors were on a GPU this machine lacks is refused when its checkpoint is read
    (:func:`checkpoint_location`), so they are the streams of GPUs the run did not compute on (a CPU run where CUDA
    was in use, read on a machine without it, or with fewer GPUs)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        for device, saved in (cuda.items() if isinstance(cuda, dict) else enumerate(cuda)):
            index = device if isinstance(device, int) else torch.device(device).index
            if index is None or index < count:
                torch.cuda.set_rng_state(saved, "cuda" if index is None else index)


__all__ = ["checkpoint_location", "pickle_with_devices", "random_state", "set_random_state"]
