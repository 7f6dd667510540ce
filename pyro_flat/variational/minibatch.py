"""One minibatch for all the evaluations of one step (the SAM ascent and the descent)."""

from __future__ import annotations

from typing import Dict

import torch

from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample


class SameMinibatch(Messenger):
    """Replays every subsampled ``pyro.plate``'s indices drawn under it the first time.

    Wrap the model and the guide with one instance (one ``memory``) and every evaluation inside a
    step sees the same minibatch, as sharpness-aware methods require: the ascent direction and the
    gradient at the perturbed point come from the same data.

    >>> import pyro, torch
    >>> def model():
    ...     with pyro.plate("data", 100, subsample_size=3) as idx:
    ...         return idx
    >>> same = SameMinibatch()
    >>> bool((same(model)() == same(model)()).all())
    True
    """

    def __init__(self, memory: Dict[str, torch.Tensor] = None):
        super().__init__()
        self.memory = {} if memory is None else memory

    def _pyro_sample(self, msg) -> None:
        if site_is_subsample(msg) and msg["name"] in self.memory:
            msg["value"] = self.memory[msg["name"]]
            msg["done"] = True

    def _pyro_post_sample(self, msg) -> None:
        if site_is_subsample(msg):
            self.memory.setdefault(msg["name"], msg["value"])
