"""Start real torch.distributed process groups (localhost) for the tests, bounded in time.

``run_ranks(fn, world_size, *args)`` starts ``world_size`` processes with torchrun's environment
variables set (so the library's own ``init_from_env`` joins the group), runs ``fn(rank, *args)`` in
each, and returns every rank's result or exception, in rank order. A run past ``timeout`` seconds
kills every process and fails; no process outlives the call. The library picks the backend from the
run's device: gloo for CPU tensors, nccl when ``fn`` puts rank r's tensors on ``cuda:r`` (``LOCAL_RANK``).
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list:
    """Every process below ``pid`` (children first found, then theirs), from Linux's /proc."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found += children
            frontier += children
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything below it at once, as a pre-emption does. torchrun starts each worker in a
    session of its own, so killing torchrun's process group would leave the workers running."""
    import signal

    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _entry(rank: int, fn, world_size: int, port: int, out_dir: str, env: dict, args: tuple) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        result = ("ok", fn(rank, *args))
    except BaseException as err:  # handed back to the test, which decides
        result = ("error", (type(err).__name__, str(err), getattr(err, "__dict__", {}), traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)


class RankResults(list):
    """Each rank's ``("ok", value)``, ``("error", (type name, message, attributes, traceback))`` or
    ``("died", exit code)``."""

    def values(self):
        bad = [(r, res[1]) for r, res in enumerate(self) if res[0] != "ok"]
        assert not bad, "\n".join(f"rank {r}: {e[0]}: {e[1]}\n{e[3]}" for r, e in bad)
        return [res[1] for res in self]


def run_ranks(fn, world_size: int = 2, *args, timeout: float = 120.0, env: dict | None = None) -> RankResults:
    """``fn(rank, *args)`` on ``world_size`` ranks of a process group on localhost (see the module docstring)."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_entry, args=(fn, world_size, free_port(), out_dir, env or {}, args),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not all(not p.is_alive() for p in context.processes):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {world_size} ranks did not finish within {timeout:g} s")
                time.sleep(0.05)
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
                p.join(10)
        results = RankResults()
        for rank in range(world_size):
            path = os.path.join(out_dir, f"{rank}.pkl")
            if not os.path.exists(path):  # the process died: its exit code
                results.append(("died", context.processes[rank].exitcode))
                continue
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        return results
