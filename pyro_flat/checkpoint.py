r"""Checkpoints of a run: what :class:`pyro_flat.MCMC` writes every ``checkpoint_every`` seconds, and reads
back to continue a run exactly where it stopped.

A checkpoint holds everything the next iteration depends on: the chains' parameters, the kernel's
:meth:`~pyro_flat.kernels.base.TargetKernel.state_dict` (iteration, adapted step sizes and metric,
SGHMC's momenta, the minibatch streams, the per-draw records), every random generator's state, the
draws kept so far, and a fingerprint of the run's configuration (kernel and settings, chains and
lengths, the data's shapes and a hash of their bytes). So a run killed at any moment and started
again with the same ``checkpoint=`` gives the draws of the run that was never stopped, bit for bit
on the same machine.

The file is written atomically: the new checkpoint goes to a temporary file in the same folder,
which is flushed to disk and renamed over the old one, so a kill during the write leaves the previous
checkpoint whole. The bytes carry a SHA-256 checksum: a truncated or corrupt file is refused by name,
never silently replaced by a new run. It is a pickle (``torch.save``): load only checkpoints you wrote.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
>>> write_checkpoint(path, {"done": 3})
>>> read_checkpoint(path)["done"]
3
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from .targets import Params

#: the first bytes of a pyro-flat checkpoint, then the format version
MAGIC = b"pyro-flat checkpoint\n"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot continue this run: unreadable, corrupt, or of another configuration."""


def check_checkpoint_arguments(checkpoint, checkpoint_every) -> Optional[Path]:
    """``checkpoint`` as a path (``None``: no checkpoints) after checking both arguments; the folder must
    exist and be writable."""
    if checkpoint is None:
        return None
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ValueError(f"checkpoint must be a file path (str or pathlib.Path), got {type(checkpoint).__name__}.")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, float)) \
            or not checkpoint_every > 0 or checkpoint_every != checkpoint_every:
        raise ValueError(f"checkpoint_every must be a positive number of seconds, got {checkpoint_every!r} (e.g. 60: "
                         "a checkpoint at the first draw after every minute).")
    path = Path(checkpoint).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"checkpoint={str(checkpoint)!r}: the folder {str(folder)!r} does not exist; create it first.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"checkpoint={str(checkpoint)!r} cannot be written (read-only); point it at a writable "
                         "folder.")
    return path


def write_checkpoint(path: Union[str, os.PathLike], payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename), with a checksum."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    header = MAGIC + f"{FORMAT_VERSION} {len(body)} {hashlib.sha256(body).hexdigest()}\n".encode()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(header + body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    try:  # the rename itself survives a power cut once the folder is synced (not possible everywhere)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        pass


def read_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """The payload of a checkpoint written by :func:`write_checkpoint`; a :class:`CheckpointError` that
    names the file if it is not one, is truncated, or fails its checksum."""
    path = Path(path)
    data = path.read_bytes()
    fix = "delete it to start a new run, or pass another checkpoint= path"
    if not data.startswith(MAGIC):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a pyro-flat checkpoint (it does not start with "
                              f"{MAGIC!r}); {fix}.")
    try:
        line, body = data[len(MAGIC):].split(b"\n", 1)
        version, length, digest = line.decode().split()
        version, length = int(version), int(length)
    except ValueError:
        raise CheckpointError(f"checkpoint {str(path)!r} has a damaged header; {fix}.") from None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r} has format {version}, this pyro-flat reads {FORMAT_VERSION}; "
                              f"{fix}.")
    if len(body) != length:
        raise CheckpointError(f"checkpoint {str(path)!r} is truncated ({len(body):,} of {length:,} bytes): it was cut "
                              f"short while being copied or written; {fix}.")
    if hashlib.sha256(body).hexdigest() != digest:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt (its checksum does not match); {fix}.")
    return torch.load(io.BytesIO(body), weights_only=False)


def random_state() -> dict:
    """Every random generator a run draws from: torch's (CPU, and CUDA's where it is in use), Python's, numpy's."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def describe(value) -> object:
    """A value of a run's configuration as something a checkpoint can compare: numbers and strings as they
    are, tensors by shape, dtype and a hash of their bytes, functions by name, other objects by type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if torch.is_tensor(value):
        data = value.detach().cpu().contiguous()
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()[:16]
        return f"tensor{tuple(data.shape)} {data.dtype} sha256:{digest}"
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    spec = getattr(value, "spec", None)  # a Preconditioner: what it was asked to be
    if spec is not None:
        return describe(spec)
    if hasattr(value, "__dataclass_fields__"):  # a schedule such as cyclical_cosine: its fields
        return repr(value)
    return getattr(value, "__qualname__", type(value).__qualname__)


def differences(saved: Dict[str, object], current: Dict[str, object]) -> List[str]:
    """What differs between two fingerprints, one line per setting: ``name: here ..., in the checkpoint ...``."""
    lines = []
    for name in sorted(set(saved) | set(current)):
        if saved.get(name) != current.get(name):
            lines.append(f"{name}: {current.get(name)!r} here, {saved.get(name)!r} in the checkpoint")
    return lines


class Checkpointer:
    """Writes a vectorized run's state to ``path`` every ``every`` seconds (:mod:`pyro_flat.checkpoint`); holds
    the checkpoint the run continues from (``saved``), refused if its configuration is not this run's."""

    def __init__(self, path, every: float, fingerprint: dict):
        self.path, self.every, self.fingerprint = path, every, fingerprint
        self.saved = read_checkpoint(path) if path.exists() else None
        if self.saved is not None:
            changed = differences(self.saved["fingerprint"], fingerprint)
            if changed:
                raise CheckpointError(f"checkpoint {str(path)!r} was written by another run configuration: "
                                      + "; ".join(changed) + ". Pass the same settings and data to continue it, or "
                                      "another checkpoint= path (or delete the file) to start a new run.")
        self.last = time.monotonic()

    def restore(self, kernel) -> Tuple[Params, int]:
        """After the kernel's set-up: its state, the random streams and the parameters of the checkpoint."""
        saved = self.saved
        kernel.load_state_dict(saved["kernel"])
        set_random_state(saved["random"])
        return saved["params"], saved["done"]

    def maybe_write(self, kernel, params: Params, done: int, draws, kept: int) -> None:
        if time.monotonic() - self.last >= self.every:
            self.write(kernel, params, done, draws, kept)

    def write(self, kernel, params: Params, done: int, draws, kept: int) -> None:
        """Write the state after ``done`` iterations, ``kept`` of whose draws are in ``draws`` (a
        :class:`~pyro_flat.draws.DrawBuffers` or :class:`~pyro_flat.draws.DrawFiles`)."""
        write_checkpoint(self.path, {
            "fingerprint": self.fingerprint, "done": done, "params": params, "kernel": kernel.state_dict(),
            "random": random_state(), "draws": draws.for_checkpoint(max(kept, 0))})
        self.last = time.monotonic()



def run_fingerprint(kernel, *, num_chains: int, num_samples: int, warmup_steps: int, thinning: int, minibatches: str,
                    initial_params, args: tuple, kwargs: dict) -> dict:
    """What a checkpoint must share with a run to continue it: the kernel, its settings, the chains and
    lengths, the data (shapes and hashes of their bytes) and the initial point."""
    from .kernels.base import constructor_signature

    model = kernel.model if getattr(kernel, "model", None) is not None else getattr(kernel, "potential_fn", None)
    left_out = {"model", "potential_fn", "init_strategy", "record_draws"}  # the initial point is checked itself
    settings = {f"{type(kernel).__name__}.{name}": describe(getattr(kernel, name, None))
                for name in constructor_signature(type(kernel)).parameters if name not in left_out}
    return {"kernel": type(kernel).__name__, "model": describe(model), **settings, "num_chains": num_chains,
            "num_samples": num_samples, "warmup_steps": warmup_steps, "thinning": thinning, "minibatches": minibatches,
            "args": describe(list(args)), "kwargs": describe(kwargs), "initial_params": describe(initial_params)}


__all__ = ["Checkpointer", "run_fingerprint", "CheckpointError", "check_checkpoint_arguments", "write_checkpoint", "read_checkpoint", "random_state",
           "set_random_state", "describe", "differences", "FORMAT_VERSION"]
