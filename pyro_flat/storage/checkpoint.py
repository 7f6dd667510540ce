r"""Checkpoints of a run: what :class:`pyro_flat.MCMC` writes every ``checkpoint_every`` seconds, and reads
back to continue a run exactly where it stopped.

A checkpoint holds everything the next iteration depends on: the chains' parameters, the kernel's
:meth:`~pyro_flat.kernels.base.TargetKernel.state_dict` (iteration, adapted step sizes and metric,
SGHMC's momenta, the minibatch streams, the per-draw records), every random generator's state, the
draws kept so far, the place of data that come from a loader (:class:`~pyro_flat.nn.Batches`), and a
fingerprint of the run's configuration (kernel and settings, chains and lengths, the data's shapes and a
hash of their bytes, the model's code and the module-level numbers, strings and tensors it reads; not
what it reads through other objects, such as a file or a config object). So a run killed at any moment and started
again with the same ``checkpoint=`` gives the draws of the run that was never stopped, bit for bit
on the same machine.

The file is written atomically: the new checkpoint goes to a temporary file in the same folder,
which is flushed to disk and renamed over the old one, so a kill during the write leaves the previous
checkpoint whole. The bytes carry a SHA-256 checksum: a truncated or corrupt file is refused by name,
never silently replaced by a new run. It is a pickle (``torch.save``): load only checkpoints you wrote.

A checkpoint continues on another GPU of the machine, or on another machine's: its CUDA tensors (and the
devices and random streams it names) go to the device of the run that reads it (:func:`checkpoint_location`), so a
run written on ``cuda:1`` continues on ``cuda:0`` when its data are there. A CUDA run's checkpoint read by a
run whose data are not on a GPU, where the GPU it was written on does not exist, is refused by name.

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
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import torch

from ..errors import CheckpointError
from .devices import checkpoint_location, pickle_with_devices, random_state, set_random_state
from .fingerprint import differences
from .locks import exclusive_lock
from ..targets import Params

#: the first bytes of a pyro-flat checkpoint, then the format version
MAGIC = b"pyro-flat checkpoint\n"
FORMAT_VERSION = 1


def check_checkpoint_arguments(checkpoint, checkpoint_every) -> Optional[Path]:
    """``checkpoint`` as a path (``None``: no checkpoints) after checking both arguments; the folder must
    exist and be writable."""
    if checkpoint is None:
        return None
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ValueError(f"checkpoint must be a file path (str or pathlib.Path), got {type(checkpoint).__name__}.")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, float)) \
            or not 0 < checkpoint_every < float("inf"):
        raise ValueError(f"checkpoint_every must be a positive number of seconds, got {checkpoint_every!r} (e.g. 60: "
                         "a checkpoint at the first draw after every minute).")
    if str(checkpoint) == "":  # Path("") is the current folder
        raise ValueError("checkpoint='' is an empty path; pass the file the run keeps its checkpoint in (e.g. "
                         "checkpoint='run.ckpt'), or checkpoint=None for no checkpoints.")
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        raise ValueError(f"checkpoint={str(checkpoint)!r} is a folder; pass a file path in it (e.g. "
                         f"{str(path / 'run.ckpt')!r}).")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"checkpoint={str(checkpoint)!r}: the folder {str(folder)!r} does not exist; create it first.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"checkpoint={str(checkpoint)!r} cannot be written (read-only); point it at a writable "
                         "folder.")
    return path


def write_checkpoint(path: Union[str, os.PathLike], payload: dict, previous: Optional[Path] = None) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename), with a checksum; with
    ``previous``, the checkpoint it replaces is kept there (renamed, so one of the two stays whole)."""
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
        if previous is not None and path.exists():
            os.replace(path, previous)
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


def read_checkpoint(path: Union[str, os.PathLike], devices: Sequence[torch.device] = ()) -> dict:
    """The payload of a checkpoint written by :func:`write_checkpoint`; a :class:`CheckpointError` that
    names the file if it is not one, is truncated, or fails its checksum. ``devices``: the CUDA devices of the
    run that reads it, where its CUDA tensors and the devices it names go (:func:`checkpoint_location`)."""
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
    if len(body) < length:
        raise CheckpointError(f"checkpoint {str(path)!r} is truncated ({len(body):,} of {length:,} bytes): it was cut "
                              f"short while being copied or written; {fix}.")
    if len(body) > length:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {len(body) - length:,} bytes more than its header "
                              f"says; {fix}.")
    if hashlib.sha256(body).hexdigest() != digest:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt (its checksum does not match); {fix}.")

    def storage_location(storage, location: str):
        return torch.serialization.default_restore_location(storage, checkpoint_location(location, devices, path))

    def device(*args) -> torch.device:  # a torch.device the checkpoint names (a kernel's, the streams' keys)
        named = torch.device(*args)
        return named if named.type != "cuda" else torch.device(checkpoint_location(str(named), devices, path))

    return torch.load(io.BytesIO(body), map_location=storage_location, pickle_module=pickle_with_devices(device),
                      weights_only=False)


class Checkpointer:
    """Writes a vectorized run's state to ``path`` every ``every`` seconds (:mod:`pyro_flat.storage.checkpoint`); holds
    the checkpoint the run continues from (``saved``), refused if its configuration is not this run's.

    With ``previous`` (a second path) each write keeps the checkpoint it replaces there, and both are
    read back (``found``, by iterations done): a run across ranks continues from the latest checkpoint
    that every rank holds (:meth:`continue_from`), even when a kill stopped one rank's write halfway.
    ``devices``: the run's CUDA devices, where a checkpoint's CUDA tensors go (:func:`checkpoint_location`)."""

    def __init__(self, path, every: float, fingerprint: dict, previous: Optional[Path] = None, data: list = (),
                 devices: Sequence[torch.device] = ()):
        self.path, self.every, self.fingerprint, self.previous = path, every, fingerprint, previous
        self.data = list(data)  # arguments whose position is part of the state (resumable_data)
        self.devices = list(devices)
        self._lock = _lock(path)  # one run per checkpoint file: another would overwrite this one's state
        try:
            for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a write killed halfway (the lock is ours)
                stale.unlink()
            self.found = {}
            for source in (path, previous):
                if source is not None and source.exists():
                    saved = self._check(source, read_checkpoint(source, self.devices))
                    self.found.setdefault(saved["done"], saved)
            self.saved = self.found[max(self.found)] if self.found else None
        except BaseException:
            self.close()
            raise
        self.last = time.monotonic()

    def _check(self, path: Path, saved: dict) -> dict:
        changed = differences(saved["fingerprint"], self.fingerprint)
        if changed:
            raise CheckpointError(f"checkpoint {str(path)!r} was written by another run configuration: "
                                  + "; ".join(changed) + ". Pass the same settings and data to continue it, "
                                  "or another checkpoint= path (or delete the file) to start a new run.")
        if saved["fingerprint"].get("random start") != self.fingerprint.get("random start"):
            warnings.warn(f"checkpoint {str(path)!r} was started from other random streams (another seed, or "
                          "random numbers drawn before run()): the run continues the checkpoint's streams, "
                          "as it would have without the stop.", RuntimeWarning, stacklevel=5)
        return saved

    def continue_from(self, done: Optional[int]) -> None:
        """Continue from the checkpoint of ``done`` iterations (one of ``found``), or from the start (``None``)."""
        self.saved = None if done is None else self.found[done]
        self.found = {}  # the others are not needed: let them go

    def close(self) -> None:
        """Let another run use the file; the lock's file goes with the lock (a refused run's too)."""
        if self._lock is not None:
            self._lock.close(remove=True)
            self._lock = None

    def prepare(self, kernel) -> None:
        """Before the kernel's set-up: the choices its model made by measurement in the run that wrote the
        checkpoint (a :class:`~pyro_flat.kernels.protocol.RunChoices`), so that the set-up (and a graph traced
        there) goes the same way."""
        if self.saved["kernel"].get("model_choices") is not None:
            kernel.model.load_run_choices(self.saved["kernel"]["model_choices"])

    def restore(self, kernel) -> Tuple[Params, int]:
        """After the kernel's set-up: its state, the random streams and the parameters of the checkpoint."""
        saved = self.saved
        kernel.load_state_dict(saved["kernel"])
        for value, state in zip(self.data, saved.get("data", ())):
            value.load_state_dict(state)
        set_random_state(saved["random"])
        return saved["params"], saved["done"]

    def maybe_write(self, kernel, params: Params, done: int, draws, kept: int) -> None:
        if time.monotonic() - self.last >= self.every:
            self.write(kernel, params, done, draws, kept)

    def write(self, kernel, params: Params, done: int, draws, kept: int) -> None:
        """Write the state after ``done`` iterations, ``kept`` of whose draws are in ``draws`` (a
        :class:`~pyro_flat.infer.draws.DrawBuffers` or :class:`~pyro_flat.infer.draws.DrawFiles`)."""
        try:
            write_checkpoint(self.path, {
                "fingerprint": self.fingerprint, "done": done, "params": params, "kernel": kernel.state_dict(),
                "random": random_state(self.devices), "data": [value.state_dict() for value in self.data],
                "draws": draws.for_checkpoint(max(kept, 0))}, previous=self.previous)
        except OSError as err:  # a full disk must not end the run: its draws are in memory (or draws_dir)
            warnings.warn(f"checkpoint {str(self.path)!r} could not be written ({err}); the run goes on and the "
                          "previous checkpoint stands.", RuntimeWarning, stacklevel=3)
        self.last = time.monotonic()



class StopAfterIteration:
    """While a checkpointed run of one process is in this block, Ctrl-C (SIGINT) asks it to stop after the
    iteration in progress (:attr:`requested`), so that the run writes that iteration's checkpoint and then raises
    ``KeyboardInterrupt``: a stop by hand loses nothing. A second Ctrl-C stops at once. Only in the main thread
    (where Python runs signal handlers), and only when ``enabled``."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested, self._previous = False, None

    def __enter__(self) -> "StopAfterIteration":
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._interrupted)
        return self

    def _interrupted(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)


def rank_checkpoint_paths(path: Path, rank: int) -> Tuple[Path, Path]:
    """The checkpoint file of ``rank`` in a run across ranks, and where it keeps its previous one:
    ``run.ckpt`` gives ``run.rank1.ckpt`` and ``run.rank1.previous.ckpt`` for rank 1."""
    return (path.with_name(f"{path.stem}.rank{rank}{path.suffix}"),
            path.with_name(f"{path.stem}.rank{rank}.previous{path.suffix}"))


def _lock(path: Path):
    """An exclusive lock on ``path + ".lock"`` for this process's run (:func:`pyro_flat.storage.locks.exclusive_lock`)."""
    busy = (f"checkpoint {str(path)!r} is in use by another running process; two runs on one file would overwrite "
            "each other's state. Give each run its own checkpoint= path.")
    return exclusive_lock(path.with_name(path.name + ".lock"), busy, CheckpointError)


def resumable_data(args: tuple, kwargs: dict) -> list:
    """The data arguments whose position is part of a run's state (a :class:`~pyro_flat.nn.Batches`: any
    object with ``state_dict`` and ``load_state_dict`` that is not a module), each asked for its state once
    now, so that one that cannot be restored (a one-shot iterator) is refused before the run."""
    found = [v for v in (*args, *kwargs.values()) if not isinstance(v, torch.nn.Module) and not torch.is_tensor(v)
             and callable(getattr(v, "state_dict", None)) and callable(getattr(v, "load_state_dict", None))]
    for value in found:
        value.state_dict()
    return found


__all__ = ["Checkpointer", "StopAfterIteration", "resumable_data", "rank_checkpoint_paths", "CheckpointError",
           "check_checkpoint_arguments", "write_checkpoint", "read_checkpoint", "FORMAT_VERSION"]
