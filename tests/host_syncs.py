"""Counting what would make the host wait on a GPU: reading a tensor's values in Python (``item``, ``tolist``,
``cpu``, ``numpy``, a truth test, ``float``/``int``), recorded with the project's frame that asked for it."""

import os
import sys
from collections import Counter

from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__"}
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyro_flat") + os.sep


#: the functions that handle a loader's items on the host, before they move to the device: reads there wait on nothing
HOST_SIDE = {"nn/batches.py:_pull", "nn/batches.py:_start_pass"}


class HostReads(TorchFunctionMode):
    """``with HostReads() as reads:`` counts each read by where in ``pyro_flat`` it was asked for (``file:function``,
    the innermost project frame; ``"elsewhere"`` for a read outside the project), leaving out the reads of a loader's
    items on the host (:data:`HOST_SIDE` among the callers)."""

    def __init__(self):
        super().__init__()
        self.where = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in READS:
            callers = self._callers()
            if not HOST_SIDE & set(callers):
                self.where[callers[0] if callers else "elsewhere"] += 1
        return func(*args, **(kwargs or {}))

    @staticmethod
    def _callers() -> list:
        frame, found = sys._getframe(2), []
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE):
                found.append(f"{path[len(PACKAGE):]}:{frame.f_code.co_name}")
            frame = frame.f_back
        return found
