r"""The process group a run spans: torchrun's environment, a timeout, and checks that all ranks agree.

pyro-flat runs on ``torch.distributed`` as PyTorch users start it: ``torchrun --nproc-per-node R
script.py`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, and
:func:`init_from_env` joins that group (gloo on CPU, nccl when the run's device is a GPU) with a
timeout, so that a rank that stops answering ends the run with an error instead of a hang. A
script that created its own group (``dist.init_process_group``) keeps it.

:class:`Ranks` is the little a driver needs from the group:

- :meth:`Ranks.agree`: every rank passed the same settings (a mismatch names the setting and the rank);
- :meth:`Ranks.check`: the collective error check after every draw. A rank that raised says so, and
  every rank stops with the same error at the same draw;
- :meth:`Ranks.sync_random_state`: rank 0's random stream on every rank, so that one seed gives the
  same draws whatever the number of ranks (up to round-off);
- :meth:`Ranks.gather`: objects to rank 0.
"""

from __future__ import annotations

import atexit
import builtins
import hashlib
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..errors import DivergenceError, OtherRankFailed, RankLost
from ..validation import check_positive

#: seconds a collective may wait for the other ranks before the run stops with an error
DEFAULT_TIMEOUT = 300.0
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (its rendezvous variables are set)."""
    return all(name in os.environ for name in _ENV)


def default_backend(device: Optional[torch.device] = None) -> str:
    """``"nccl"`` for CUDA devices, ``"gloo"`` otherwise (CPU)."""
    return "nccl" if device is not None and torch.device(device).type == "cuda" else "gloo"


def init_from_env(backend: Optional[str] = None, timeout: Optional[float] = None,
                  device: Optional[torch.device] = None) -> "Ranks":
    """Join the default process group described by torchrun's environment, unless one exists.

    :param backend: ``"gloo"`` or ``"nccl"``; default :func:`default_backend` of ``device``.
    :param timeout: seconds a collective waits for the other ranks (default: the environment's
        ``PYRO_FLAT_DIST_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`).
    :param device: the run's device (where its tensors are). With nccl, or a CUDA ``device``, this rank's
        GPU is set before the group starts (:func:`rank_cuda_device`): ``cuda:LOCAL_RANK`` under torchrun.

    Without torchrun's variables and without a group this is a world of one process.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return Ranks(0, 1, None, "none", 0.0)
    if not dist.is_initialized() and not launched_by_torchrun():  # one process: no collective waits
        return Ranks(0, 1, None, "none", DEFAULT_TIMEOUT if timeout is None else timeout)
    timeout = env_timeout() if timeout is None else check_positive(
        "timeout", timeout, hint="It is the seconds a collective waits for the other ranks.")
    if not dist.is_initialized():
        backend = backend or default_backend(device)
        if backend == "nccl" or (device is not None and torch.device(device).type == "cuda"):
            index = rank_cuda_device(device)
            if index is not None:  # before nccl starts: its communicator binds to the current device
                torch.cuda.set_device(index)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        atexit.register(_leave_group)  # a script that never calls Ranks.finish(): the group ends before exit
        return Ranks(dist.get_rank(), dist.get_world_size(), None, dist.get_backend(), timeout, owns_group=True)
    return Ranks(dist.get_rank(), dist.get_world_size(), None, dist.get_backend(), timeout)


def rank_cuda_device(device: Optional[torch.device] = None) -> Optional[int]:
    """The index of this rank's GPU, set before a group on it starts: ``LOCAL_RANK`` (torchrun's number of the
    process on its machine), as PyTorch scripts do, when ``device`` (the run's device) has no index or that one;
    else ``device``'s index, or ``None`` (the current device stays) when neither is known. A ``device`` of another
    index is refused while this machine has a GPU ``cuda:LOCAL_RANK``: every rank would share one GPU (nccl
    refuses that). Where it has none (a GPU made visible per process), ``device``'s index is the rank's."""
    index = None if device is None else torch.device(device).index
    text = os.environ.get("LOCAL_RANK", "").strip()
    if not text:
        return index
    try:
        local_rank = int(text)
    except ValueError:
        local_rank = -1
    if local_rank < 0:
        raise ValueError(f"the environment variable LOCAL_RANK={text!r} is not a process number (torchrun sets it "
                         "to 0, 1, ... on each machine); unset it, or launch the script with torchrun.")
    if index is None or index == local_rank:
        return local_rank
    if local_rank < torch.cuda.device_count():
        rank = os.environ.get("RANK", "?")
        raise ValueError(
            f"rank {rank}: the run's tensors are on {torch.device(device)}, but torchrun started this process as "
            f"LOCAL_RANK={local_rank}, whose GPU is cuda:{local_rank}; nccl cannot run two ranks on one GPU. "
            "Put each rank's data on its own GPU: call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) at the "
            f"start of the script and move the data with .cuda() (or .to('cuda:{local_rank}')).")
    return index


def _leave_group() -> None:
    """Destroy the default group at interpreter exit, if it is still there: a gloo group left to the
    interpreter's teardown aborts the process ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def env_timeout() -> float:
    """The seconds of ``PYRO_FLAT_DIST_TIMEOUT`` (:data:`DEFAULT_TIMEOUT` when unset), read only when a
    run spans ranks; a ``ValueError`` naming the variable when it holds no positive number."""
    text = os.environ.get("PYRO_FLAT_DIST_TIMEOUT")
    if text is None or not text.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"the environment variable PYRO_FLAT_DIST_TIMEOUT={text!r} is not a positive number of "
                         f"seconds (how long a rank waits for the others); set it to one, e.g. "
                         f"PYRO_FLAT_DIST_TIMEOUT={DEFAULT_TIMEOUT:g}, or unset it for that default.")
    return value


@dataclass
class Ranks:
    """This process's place in the group: ``rank`` of ``world_size`` on ``backend``."""

    rank: int
    world_size: int
    group: Any
    backend: str
    timeout: float
    #: whether :func:`init_from_env` created the group (then :meth:`finish` destroys it)
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def collective(self, what: str, fn, *args, **kwargs):
        """``fn(*args, group=..., **kwargs)``, a ``torch.distributed`` collective on this group; a failure
        (a peer died, the timeout passed) becomes :class:`~pyro_flat.errors.RankLost`, which says ``what``."""
        try:
            return fn(*args, group=self.group, **kwargs)
        except RuntimeError as err:  # a peer died (connection closed) or the timeout passed
            raise RankLost(
                f"rank {self.rank}: {what} failed: another rank died or did not answer within "
                f"{self.timeout:g} s ({str(err).splitlines()[0]}). See the other ranks' output for the cause; "
                "a longer wait is the timeout of pyro_flat.distributed.init_from_env (PYRO_FLAT_DIST_TIMEOUT)."
            ) from err

    def all_objects(self, value: Any, what: str) -> List[Any]:
        """``value`` of every rank, in rank order, on every rank."""
        import torch.distributed as dist

        if not self.distributed:
            return [value]
        out: List[Any] = [None] * self.world_size
        self.collective(what, dist.all_gather_object, out, value)
        return out

    def agree(self, what: str, settings: Dict[str, Any]) -> None:
        """Raise on every rank unless every rank passed the same ``settings`` (``{name: value}``)."""
        everyone = self.all_objects(settings, f"comparing {what} across ranks")
        reference = everyone[0]
        for rank, theirs in enumerate(everyone[1:], 1):
            for name in reference:
                if theirs.get(name) != reference[name]:
                    raise ValueError(
                        f"{what}: rank {rank} has {name} = {theirs.get(name)!r}, rank 0 has {reference[name]!r}. "
                        "Every rank must run the same script with the same settings and data (for data-parallel "
                        "chains, the same model on shards of the same kind).")

    def check(self, error: Optional[BaseException]) -> Optional[BaseException]:
        """The collective error check: ``None`` if no rank raised, else the first failing rank's error,
        rebuilt on every rank with its rank in the message (the same type where it can be)."""
        return self.check_and_ask(error, False)[0]

    def check_and_ask(self, error: Optional[BaseException], wish: bool) -> Tuple[Optional[BaseException], bool]:
        """:meth:`check`, and in the same all-reduce whether any rank ``wish``-ed (e.g. that a checkpoint
        be written now): ``(error or None, any wish)``, the same on every rank."""
        failure, wished, _ = self.check_and_share(error, wish, 0)
        return failure, wished

    def check_and_share(self, error: Optional[BaseException], wish: bool, value: int
                        ) -> Tuple[Optional[BaseException], bool, int]:
        """:meth:`check_and_ask`, and in the same all-reduce the largest ``value`` (a non-negative integer)
        of any rank, e.g. rank 0's choice of the next check's interval: ``(error or None, any wish, value)``."""
        import torch.distributed as dist

        if not self.distributed:
            return error, bool(wish), int(value)
        flag = torch.tensor([0 if error is None else 1, int(bool(wish)), int(value)], dtype=torch.int64,
                            device=self._device())
        self.collective("the error check", dist.all_reduce, flag, op=dist.ReduceOp.MAX)
        failed, wished, shared = (int(v) for v in flag.tolist())
        if not failed:
            return None, bool(wished), shared
        report = None if error is None or isinstance(error, OtherRankFailed) else _report(error)
        reports = self.all_objects(report, "sharing an error")
        failing = [(r, rep) for r, rep in enumerate(reports) if rep is not None]
        if not failing:  # every rank blamed another: its own words are all there is
            return (error if error is not None else RuntimeError("a rank failed without a report")), False, 0
        return _rebuild(*failing[0]), False, 0

    def all_sum(self, tensors: List[torch.Tensor], what: str) -> List[torch.Tensor]:
        """Each tensor summed over the ranks, in one all-reduce of them all packed into one vector (one
        dtype and device); every rank gets the same bits."""
        import torch.distributed as dist

        return self._packed(tensors, what, dist.all_reduce)

    def broadcast(self, tensors: List[torch.Tensor], what: str) -> List[torch.Tensor]:
        """Rank 0's tensors on every rank, in one broadcast."""
        import torch.distributed as dist

        return self._packed(tensors, what, dist.broadcast, src=0)

    def _packed(self, tensors: List[torch.Tensor], what: str, collective, **kwargs) -> List[torch.Tensor]:
        if not self.distributed or not tensors:
            return list(tensors)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.collective(what, collective, flat, **kwargs)
        return [part.reshape(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

    def sync_random_state(self, device: Optional[torch.device] = None) -> None:
        """Every rank continues rank 0's random stream (torch's CPU stream, and ``device``'s if CUDA)."""
        import torch.distributed as dist

        if not self.distributed:
            return
        states = [torch.get_rng_state()]
        cuda = device is not None and torch.device(device).type == "cuda"
        if cuda:
            states.append(torch.cuda.get_rng_state(device))
        self.collective("sharing the random state", dist.broadcast_object_list, states, src=0)
        torch.set_rng_state(states[0])
        if cuda:
            torch.cuda.set_rng_state(states[1], device)

    def finish(self, wait: bool = True) -> None:
        """End of a script's work: wait for every rank (``wait``; rank 0 may still be writing), then leave the
        group if :func:`init_from_env` made it (a gloo group left to the interpreter's exit aborts the process)."""
        import torch.distributed as dist

        if self.distributed and wait:
            self.collective("waiting for the other ranks to finish", dist.barrier)
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def gather_rows(self, tensors: List[torch.Tensor], what: str) -> Optional[List[torch.Tensor]]:
        """Every rank's rows of each tensor, concatenated in rank order on rank 0 (``None`` on the others):
        tensors whose first dimension (this rank's chains) may differ between ranks. Each rank sends each
        tensor whole (point to point: several times faster than a ``gather`` over gloo, and no padding),
        and rank 0 receives it straight into its rows of the result: a run's draws can be gigabytes."""
        import torch.distributed as dist

        if not self.distributed:
            return list(tensors)
        device, rows = self._device(), tensors[0].shape[0]
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(self.world_size)]
        self.collective(what, dist.all_gather, counts, torch.tensor([rows], device=device))
        counts = [int(c) for c in counts]
        starts = [sum(counts[:r]) for r in range(self.world_size)]
        gathered = []
        for tensor in tensors:
            if not self.is_main:
                self.collective(what, dist.send, tensor.to(device).contiguous(), dst=0)
                continue
            full = torch.empty((sum(counts), *tensor.shape[1:]), dtype=tensor.dtype, device=device)
            full[:rows] = tensor
            for rank in range(1, self.world_size):  # a slice of the leading dimension: contiguous
                self.collective(what, dist.recv, full[starts[rank]: starts[rank] + counts[rank]], src=rank)
            gathered.append(full.to(tensor.device))
        return gathered if self.is_main else None

    def gather(self, value: Any, what: str) -> Optional[List[Any]]:
        """``value`` of every rank, in rank order, on rank 0 (``None`` on the others)."""
        import torch.distributed as dist

        if not self.distributed:
            return [value]
        out = [None] * self.world_size if self.is_main else None
        self.collective(what, dist.gather_object, value, out, dst=0)
        return out


def fingerprint(value: Any) -> Any:
    """A comparable summary of a model argument: shape, dtype and a digest of a tensor's bytes."""
    if torch.is_tensor(value):
        data = value.detach().cpu().contiguous()
        digest = hashlib.sha1(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()[:16]
        return ("tensor", tuple(value.shape), str(value.dtype), digest)
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(fingerprint(v) for v in value)
    if isinstance(value, dict):
        return {k: fingerprint(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return type(value).__name__


def shard_fingerprint(value: Any) -> Any:
    """:func:`fingerprint` without what may differ between shards of one data set: a tensor's leading
    (row) size and its bytes."""
    if torch.is_tensor(value):
        return ("tensor", tuple(value.shape[1:]), str(value.dtype))
    if isinstance(value, (list, tuple)):
        return tuple(shard_fingerprint(v) for v in value)
    if isinstance(value, dict):
        return {k: shard_fingerprint(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return fingerprint(value)


def _report(error: BaseException) -> tuple:
    """What other ranks need to raise ``error`` again: its type, message and scalar attributes."""
    attrs = {}
    if isinstance(error, DivergenceError):
        attrs = {"site": error.site, "iteration": error.iteration, "chain": error.chain, "step_size": error.step_size}
    return type(error).__module__, type(error).__qualname__, str(error), attrs


def _rebuild(rank: int, report: tuple) -> BaseException:
    module, name, message, attrs = report
    message = f"rank {rank}: {message}"
    if name == "DivergenceError":
        return DivergenceError(message, **attrs)
    cls = getattr(builtins, name, None) if module == "builtins" else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return RuntimeError(f"{message} ({module}.{name})")


__all__ = ["init_from_env", "launched_by_torchrun", "default_backend", "rank_cuda_device", "Ranks", "RankLost",
           "OtherRankFailed", "fingerprint", "shard_fingerprint", "DEFAULT_TIMEOUT", "env_timeout"]
