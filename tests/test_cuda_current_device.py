"""CUDA work runs on its tensors' device, not on the current one (issue 70): under torchrun's second rank, or with
``--device cuda:1``, the tensors live on ``cuda:1`` while ``cuda:0`` may be current. Without a GPU here, torch's
CUDA calls are replaced by recorders of the device current at each call."""

from contextlib import contextmanager
from unittest import mock

import torch

from pyro_flat import tracing
from pyro_flat.kernels.compiled_step import CompiledSteps

DEVICE = torch.device("cuda:1")


class OnTheGpu:
    """A stand-in for a tensor on ``cuda:1``."""

    device = DEVICE

    def clone(self):
        return self


class Recorder:
    """torch.cuda's device context, stream, graph capture and seeding, each noting the device current at its call."""

    def __init__(self):
        self.current, self.seen = torch.device("cuda:0"), []

    @contextmanager
    def device(self, device):
        before, self.current = self.current, torch.device(device)
        try:
            yield
        finally:
            self.current = before

    def note(self, what):
        self.seen.append((what, self.current))

    @contextmanager
    def graph(self, graph, stream=None):
        self.note("capture")
        yield

    def patches(self):
        fake_graph = mock.MagicMock()
        fake_graph.replay.side_effect = lambda: self.note("replay")
        return [mock.patch.object(torch.cuda, "device", self.device),
                mock.patch.object(torch.cuda, "Stream", lambda: self.note("stream") or mock.MagicMock()),
                mock.patch.object(torch.cuda, "current_stream", mock.MagicMock()),
                mock.patch.object(torch.cuda, "stream", lambda s: self.device(self.current)),
                mock.patch.object(torch.cuda, "graph", self.graph),
                mock.patch.object(torch.cuda, "CUDAGraph", lambda: fake_graph),
                mock.patch.object(torch.cuda, "manual_seed", lambda seed: self.note("seed")),
                mock.patch.object(torch, "_foreach_copy_", lambda *a: None)]


def test_a_cuda_graph_is_captured_and_replayed_on_its_inputs_device():
    recorder = Recorder()
    patches = recorder.patches()
    for p in patches:
        p.start()
    try:
        replay = tracing.cuda_graph(lambda *xs: recorder.note("call") or [], [OnTheGpu(), OnTheGpu()])
        replay(OnTheGpu(), OnTheGpu())
    finally:
        for p in patches:
            p.stop()
    assert [what for what, _ in recorder.seen] == ["stream", "call", "capture", "call", "replay"]
    assert all(device == DEVICE for _, device in recorder.seen), recorder.seen


def test_the_graph_check_seeds_its_inputs_device():
    recorder = Recorder()
    steps = CompiledSteps.__new__(CompiledSteps)  # _check needs only the kernel's precision
    steps.kernel = None
    same = lambda *xs: [torch.zeros(2)]  # noqa: E731
    patches = recorder.patches()
    for p in patches:
        p.start()
    try:
        steps._check(same, same, [OnTheGpu()], n=1)
    finally:
        for p in patches:
            p.stop()
    assert recorder.seen == [("seed", DEVICE), ("seed", DEVICE)]


def test_the_graph_check_names_a_non_finite_entry_and_an_inf_does_not_switch_it_off():
    want, got = torch.tensor([1e5, 3.0]), torch.tensor([1e5 + 8, float("nan")])
    assert "entry 1" in tracing.mismatch([("the energy", want, got)])  # the NaN, not the in-tolerance gap
    assert tracing.mismatch([("the energy", torch.tensor([float("inf"), 3.0]), torch.tensor([float("inf"), 300.0]))])


def test_under_bf16_a_new_value_may_differ_by_the_steps_round_off_not_by_a_noise_drawn_out_of_order():
    """A step of 1e-6 moves θ by its noise, about 1.4e-3: bf16 round-off of the gradient moves it by 1e-6 x 2e-3;
    another noise by about 2e-3, which the value's own tolerance (TOLERANCE + 8u x the move) catches."""
    old = torch.zeros(1000)
    new = old + 1.4e-3 * torch.randn(1000, generator=torch.Generator().manual_seed(0))
    tol = tracing.move_tolerance(old, new, torch.bfloat16)
    assert tracing.mismatch([("the new value", new, new + 1e-6 * 2e-3, tol)]) is None
    other = old + 1.4e-3 * torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert tracing.mismatch([("the new value", new, other, tol)]) is not None
    assert tracing.mismatch([("the new value", new, other)], tolerance=tracing.graph_tolerance(torch.bfloat16)) is None
