"""Device placement without a GPU (issue 70): checkpoints read onto the run's device, torchrun ranks on their
LOCAL_RANK's GPU, a ``Batches`` loader's device deciding the backend, and no global reseeding in the library.

CUDA is never touched here: the CUDA calls are mocked, and checkpoints whose tensors claim a GPU are written with
torch's storage tag patched (``torch.serialization.location_tag``).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from pyro_flat.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from pyro_flat.storage.devices import checkpoint_location, random_state, set_random_state

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


def _cuda_machine(monkeypatch, count: int) -> None:
    """CUDA as this test's machine has it: ``count`` GPUs (0: none)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def _written_on(path, location: str, payload: dict) -> None:
    """A checkpoint of ``payload`` whose tensors say they were saved on ``location``."""
    with mock.patch("torch.serialization.location_tag", return_value=location):
        write_checkpoint(path, payload)


# ----------------------------------------------------------------- 1. checkpoints onto the run's device
def test_a_cuda_location_goes_to_the_runs_gpu_and_the_cpu_stays():
    assert checkpoint_location("cuda:1", [CUDA0]) == "cuda:0"
    assert checkpoint_location("cuda:0", [CUDA0]) == "cuda:0"
    assert checkpoint_location("cuda:1", [CUDA0, CUDA1]) == "cuda:1"  # a device the run has stays
    assert checkpoint_location("cpu", [CUDA0]) == "cpu"
    assert checkpoint_location("cpu", []) == "cpu"


def test_a_cuda_checkpoint_on_a_run_off_the_gpu_stays_where_the_gpu_exists_else_is_refused_by_name(monkeypatch):
    _cuda_machine(monkeypatch, 2)
    assert checkpoint_location("cuda:1", [], "run.ckpt") == "cuda:1"  # as before: the model may hold it there
    _cuda_machine(monkeypatch, 1)
    with pytest.raises(CheckpointError, match=r"checkpoint 'run.ckpt' was written by a run on cuda:1, and this "
                                              r"machine has 1 CUDA device \(cuda:0 to cuda:0\) .* on a CUDA device, "
                                              r"e.g. .to\('cuda'\).* delete the file"):
        checkpoint_location("cuda:1", [], "run.ckpt")
    _cuda_machine(monkeypatch, 0)
    with pytest.raises(CheckpointError, match=r"'run.ckpt' was written by a run on cuda:0, and this machine has no "
                                              r"CUDA device .* To continue it on a machine with a CUDA device"):
        checkpoint_location("cuda:0", [], "run.ckpt")


def test_read_checkpoint_loads_with_a_map_location(tmp_path):
    write_checkpoint(tmp_path / "run.ckpt", {"done": 3})
    with mock.patch("torch.load", wraps=torch.load) as load:
        assert read_checkpoint(tmp_path / "run.ckpt")["done"] == 3
    assert callable(load.call_args.kwargs.get("map_location"))


def test_a_gpu_checkpoint_read_on_a_machine_without_cuda_is_refused_by_name(tmp_path, monkeypatch):
    """Before: torch's 'Attempting to deserialize object on a CUDA device ...', which names neither the file nor
    what to do."""
    _written_on(tmp_path / "run.ckpt", "cuda:1", {"params": {"x": torch.ones(3)}})
    _cuda_machine(monkeypatch, 0)
    with pytest.raises(CheckpointError, match=r"run.ckpt' was written by a run on cuda:1.*delete the file"):
        read_checkpoint(tmp_path / "run.ckpt")


def test_a_checkpoint_written_on_cuda1_goes_to_cuda0_tensors_devices_and_streams_alike(tmp_path):
    """The tensors go to the run's GPU, and so do the devices the state names (a kernel's ``_draw_device``, the
    per-chain streams' keys, the CUDA random states): ``map_location`` alone moves tensors only."""
    from pyro_flat.chains.streams import ChainStreams

    payload = {"params": {"x": torch.ones(3)}, "kernel": {"_draw_device": CUDA1, "cpu": torch.device("cpu"),
                                                          "chain_streams": {"states": {CUDA1: [1]}}},
               "random": {"cuda": {CUDA1: torch.zeros(16, dtype=torch.uint8)}}}
    _written_on(tmp_path / "run.ckpt", "cuda:1", payload)
    placed = []

    def restore(storage, location):  # where torch would put the storage (no GPU here to put it on)
        placed.append(location)
        return storage

    with mock.patch("torch.serialization.default_restore_location", side_effect=restore):
        saved = read_checkpoint(tmp_path / "run.ckpt", [CUDA0])
    assert placed and set(placed) == {"cuda:0"}
    assert saved["kernel"]["_draw_device"] == CUDA0 and saved["kernel"]["cpu"] == torch.device("cpu")
    assert list(saved["kernel"]["chain_streams"]["states"]) == [CUDA0]
    assert list(saved["random"]["cuda"]) == [CUDA0]
    # the per-chain streams are saved by torch.device (so mapped as above), not by name
    streams = ChainStreams(seed=1, chains=range(2))
    streams.generators(torch.device("cpu"))
    assert list(streams.state_dict()["states"]) == [torch.device("cpu")]


def test_cuda_random_states_go_only_to_gpus_this_machine_has(monkeypatch):
    """A checkpoint's CUDA streams of GPUs this machine lacks are left out (before: set_rng_state_all set them all,
    failing obscurely, or queued for CUDA's start); without CUDA none is set, and the CPU's are back."""
    state = random_state()
    expected = torch.rand(3)
    calls = []

    def set_rng_state(new_state, device="cuda"):
        calls.append(device)

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # what set_rng_state_all calls
    cuda = torch.zeros(16, dtype=torch.uint8)
    _cuda_machine(monkeypatch, 1)
    set_random_state({**state, "cuda": [cuda, cuda]})  # written on two GPUs, read on one
    assert calls == [0]
    calls.clear()
    set_random_state({**state, "cuda": {CUDA0: cuda, torch.device("cuda", 3): cuda}})
    assert calls == [0]
    calls.clear()
    _cuda_machine(monkeypatch, 0)
    set_random_state({**state, "cuda": {CUDA0: cuda}})
    assert calls == [] and torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------- 2. torchrun ranks on LOCAL_RANK's GPU
class _Started(Exception):
    """The group would start here (the test stops there)."""


@pytest.fixture
def torchrun(monkeypatch):
    """Rank 1 of 2 under torchrun (LOCAL_RANK=1), with the group's start and torch.cuda.set_device mocked:
    ``calls`` records set_device's argument and the backend, in order."""
    import torch.distributed as dist

    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    calls = []

    def init_process_group(backend, **kwargs):
        calls.append(("backend", backend))
        raise _Started

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    _cuda_machine(monkeypatch, 2)
    return calls


@pytest.mark.parametrize("device, backend", [(torch.device("cuda"), None), (CUDA1, None), ("cuda", "gloo"),
                                             (None, "nccl")])
def test_a_torchrun_rank_sets_its_local_rank_gpu_before_the_group_starts(torchrun, device, backend):
    from pyro_flat.distributed import init_from_env

    with pytest.raises(_Started):
        init_from_env(backend, device=device)
    assert torchrun == [("set_device", 1), ("backend", backend or "nccl")]


def test_a_rank_whose_tensors_are_on_another_ranks_gpu_is_refused_where_its_own_exists(torchrun, monkeypatch):
    from pyro_flat.distributed import init_from_env

    with pytest.raises(ValueError, match=r"rank 1: the run's tensors are on cuda:0, but torchrun started this process "
                                         r"as LOCAL_RANK=1, whose GPU is cuda:1; .*torch.cuda.set_device\(int\("
                                         r"os.environ\['LOCAL_RANK'\]\)\)"):
        init_from_env(device=CUDA0)
    assert torchrun == []
    _cuda_machine(monkeypatch, 1)  # one GPU visible per process: the data's is the rank's
    with pytest.raises(_Started):
        init_from_env(device=CUDA0)
    assert torchrun == [("set_device", 0), ("backend", "nccl")]


# ----------------------------------------------------------------- 3. a Batches loader's device
def _cuda_batches():
    from pyro_flat.nn import Batches

    return Batches([(torch.zeros(2, 3), torch.zeros(2))] * 2, num_data=4, batch_size=2, device="cuda")


def test_data_behind_a_cuda_batches_loader_are_the_runs_device():
    from pyro_flat.infer.arguments import run_cuda_devices as _cuda_devices

    assert _cuda_devices((_cuda_batches(),), {}) == [torch.device("cuda")]
    assert _cuda_devices((), {"data": _cuda_batches(), "x": torch.zeros(1)}) == [torch.device("cuda")]
    assert _cuda_devices((torch.zeros(1),), {}) == []


def test_a_distributed_run_on_a_cuda_batches_loader_starts_nccl_on_its_local_rank_gpu(torchrun):
    """Before: the loader's device was not seen, and the run started gloo (and no GPU was set)."""
    import pyro
    import pyro.distributions as dist

    from pyro_flat import MCMC, SGLD

    def model(data):
        pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))

    mcmc = MCMC(SGLD(model, step_size=0.1), num_samples=2, num_chains=2, chain_method="distributed",
                disable_progbar=True)
    with pytest.raises(_Started):
        mcmc.run(_cuda_batches())
    assert torchrun == [("set_device", 1), ("backend", "nccl")]


# ----------------------------------------------------------------- 4. no global reseeding
def test_path_dynamics_without_a_seed_draws_it_from_the_global_stream_without_reseeding(monkeypatch):
    """seed=None advanced the global stream by a fresh random seed (torch.seed()): a seeded script did not repeat."""
    from pyro_flat.flatness import straight_path
    from pyro_flat.flatness.path_dynamics import projected_dynamics

    line = straight_path(lambda x: (x ** 2).sum(), torch.tensor([-1.0]), torch.tensor([1.0]), num_points=5)

    def seeded_script():
        torch.manual_seed(0)
        run = projected_dynamics(line, lambda x: 2 * x, start=0.9, step_size=0.1, num_steps=5, temperature=0.1,
                                 num_chains=3, seed=None)
        return torch.as_tensor(run.position), torch.rand(2)

    (first, after), (again, after_again) = seeded_script(), seeded_script()
    assert torch.equal(first, again) and torch.equal(after, after_again)
    torch.manual_seed(0)
    torch.randint(0, 2**62, ())  # the one draw the seed takes
    assert torch.equal(after, torch.rand(2))
