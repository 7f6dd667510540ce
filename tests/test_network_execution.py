"""How a BayesianModule's networks run (pyro_flat/nn/execution.py): the activations' memory layout and vmap against
a loop chosen by measurement. Neither may change the model: the numbers agree with the other way up to round-off,
and a measured choice is part of a run's state, so a resumed run goes on the same way, bit for bit."""

import os
import signal

import pytest
import torch
from torch import nn

import pyro
from pyro_flat import MCMC, SGLD
from pyro_flat.nn import BayesianModule
from pyro_flat.nn import execution
from pyro_flat.nn import functional as batched
from pyro_flat.roundoff import assert_close_roundoff

CHAINS = 48
# the kind of pass a sampler's step makes: 48 networks, each on its own 16 rows of 4 inputs
SAMPLING = execution.Pass(CHAINS, backward=True, autocast=None, inputs=(CHAINS, 16, 4))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_measure_times_each_way_after_one_warm_up_call_with_its_backward_pass():
    clock, backwards = FakeClock(), []
    x = torch.ones(3, requires_grad=True)
    x.register_hook(lambda g: backwards.append(1))

    def way(cost):
        def run():
            clock.now += cost
            return (2 * x).sum()
        return run

    seconds = execution.measure({"slow": way(2.0), "fast": way(0.5)}, (x,), calls=3, clock=clock)
    assert seconds == {"slow": 2.0, "fast": 0.5}  # per call, the warm-up call not counted
    assert len(backwards) == 2 * 4  # each way: a warm-up call and 3 timed, each with its backward pass
    with torch.no_grad():
        execution.measure({"a": way(1.0)}, (x,), calls=3, clock=clock)
    assert len(backwards) == 8  # no gradient is taken under no_grad


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(96, 4, generator=g), torch.randint(0, 3, (96,), generator=g)


def _run(networks, path=None, interrupt_at=None, num_samples=12):
    def hook(kernel, params, stage, i):
        if kernel.iteration == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C during the run: its checkpoint, then the stop

    model = BayesianModule(_mlp(), networks=networks)
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=num_samples, warmup_steps=4, num_chains=CHAINS,
                disable_progbar=True, checkpoint=path, checkpoint_every=3600 if path else None, hook_fn=hook)
    mcmc.run(*_data(), batch_size=16)
    return model, mcmc.get_samples(group_by_chain=True)


def test_measured_networks_keep_vmap_for_many_small_networks_and_give_vmaps_draws():
    """48 networks of 59 weights: one vmap-ed pass against 48 calls (measured 0.2 ms against 2.2 ms, 10x apart)."""
    model, measured = _run("measure")
    chosen = model.network_choices["sampling"][SAMPLING]
    assert chosen.way == "vmap" and chosen.seconds["loop"] > chosen.seconds["vmap"], chosen
    # the chains' check (no gradient) is a pass of another kind, measured on its own
    assert set(model.network_choices["sampling"]) == {SAMPLING, SAMPLING._replace(backward=False)}
    _, mapped = _run("vmap")
    _, looped = _run("loop")
    for name in measured:
        assert torch.equal(measured[name], mapped[name]), name
        # 16 iterations, each a reduction over its 16 rows (and fan-ins of 8 and 4): 16 * 16 roundings a draw
        assert_close_roundoff(looped[name], mapped[name], length=16 * 16, msg=name)


def _timed(faster, calls=None):
    """``choose`` as if ``faster`` had been measured faster; ``calls`` records whether each took a gradient."""
    def choose(ways, inputs):
        if calls is not None:
            calls.append(torch.is_grad_enabled())
        return execution.Choice(faster, {w: 1.0 if w == faster else 2.0 for w in ways})
    return choose


def test_a_resumed_run_goes_on_the_way_its_checkpoint_measured(tmp_path, monkeypatch):
    """The first part of the run measures the loop faster; the resumed process would measure vmap faster, yet it
    continues with the loop, to the uninterrupted loop run's draws bit for bit (the ways differ in round-off).
    The choice is back before the set-up (where EntropyHMC traces its graph): no step's pass is measured again."""
    monkeypatch.setattr(batched, "choose", _timed("loop"))
    _, reference = _run("measure", tmp_path / "reference.ckpt")
    _, mapped = _run("vmap")
    assert any(not torch.equal(reference[n], mapped[n]) for n in reference)  # the test can tell the ways apart
    with pytest.raises(KeyboardInterrupt):
        _run("measure", tmp_path / "run.ckpt", interrupt_at=9)
    calls = []
    monkeypatch.setattr(batched, "choose", _timed("vmap", calls))
    model, resumed = _run("measure", tmp_path / "run.ckpt")
    assert model.network_choices["sampling"][SAMPLING].way == "loop"
    assert calls == [False]  # only the chains' check (no gradient, before the checkpoint is read) measured
    for name, value in reference.items():
        assert torch.equal(resumed[name], value), name


SEEN = []  # module level: BayesianModule runs deep copies of the network


class LayoutProbe(nn.Module):
    """A CNN that records (in ``SEEN``) whether its input arrives in channels_last memory."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(8 * 6 * 6, 4))

    def forward(self, x):
        try:
            SEEN.append(x.is_contiguous(memory_format=torch.channels_last))
        except RuntimeError:  # inside vmap, which cannot say
            SEEN.append(None)
        return self.net(x)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("networks", ["loop", "vmap"])
def test_channels_last_hands_nhwc_images_to_the_network_and_keeps_its_numbers(networks):
    X, y = torch.randn(64, 3, 6, 6), torch.randint(0, 4, (64,))
    results = {}
    for layout in ("contiguous", "channels_last"):
        SEEN.clear()
        torch.manual_seed(0)
        model = BayesianModule(LayoutProbe(), memory_format=layout, networks=networks)
        pyro.set_rng_seed(0)
        mcmc = MCMC(SGLD(model, step_size=1e-4), num_samples=5, warmup_steps=3, num_chains=3, disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
        results[layout] = mcmc.get_samples()
        passes = SEEN[1:]  # after the check of the inputs on two rows (the module itself, in its own layout)
        if layout == "contiguous":
            assert passes and not any(passes), SEEN
        elif networks == "loop":
            assert passes and all(passes), SEEN
        else:
            # vmap-ed passes (no fall-back to the loop), and single networks (the chains' check) in NHWC
            assert None in passes and set(passes) <= {None, True}, SEEN
    for name, value in results["contiguous"].items():
        # 8 iterations, each with the convolution's weight gradient (and BatchNorm's statistics) over 16 * 6 * 6 pixels
        assert_close_roundoff(results["channels_last"][name], value, length=8 * 16 * 36, msg=name)


class AsksItsLayout(nn.BatchNorm2d):
    """A BatchNorm that asks its input's layout where the input has channels-last strides, as cuDNN's does on a GPU:
    inside ``vmap`` that question fails ("NYI: querying is_contiguous inside of vmap")."""

    def forward(self, x):
        if x.dim() == 4 and x.stride(1) == 1 and x.shape[1] > 1:
            x.is_contiguous(memory_format=torch.channels_last)
        return super().forward(x)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("networks", ["vmap", "measure"])
def test_a_batchnorm_that_cannot_ask_its_layout_in_vmap_runs_vmap_in_nchw_not_a_loop(networks):
    """What the H200 found (tests/test_cuda.py): cuDNN's BatchNorm under vmap on NHWC images fails, which made every
    vmap-ed pass of a BatchNorm CNN fall back to the loop on a GPU. vmap now runs NCHW there, without a warning, with
    the loop's numbers; the loop keeps NHWC."""
    X, y = torch.randn(64, 3, 6, 6), torch.randint(0, 4, (64,))
    torch.manual_seed(0)
    net = nn.Sequential(AsksItsLayout(3), nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4))
    draws = {}
    for way in (networks, "loop"):
        model = BayesianModule(net, memory_format="channels_last", networks=way)
        pyro.set_rng_seed(0)
        mcmc = MCMC(SGLD(model, step_size=1e-4), num_samples=4, warmup_steps=2, num_chains=3, disable_progbar=True)
        mcmc.run(X, y, batch_size=16)
        draws[way] = mcmc.get_samples()
        if way != "loop":
            assert model._sampling.use_vmap and model._sampling.vmap_memory_format == "contiguous"
            if way == "measure":
                chosen = model.network_choices["sampling"][execution.Pass(3, True, None, (3, 16, 3, 6, 6))]
                assert set(chosen.seconds) == {"vmap", "loop"}, chosen  # both ways ran and were timed
    for name, value in draws["loop"].items():  # a 288-long sum is the longest reduction
        torch.testing.assert_close(draws[networks][name], value, rtol=1e-4, atol=1e-5)


class Viewing(nn.Module):
    """A CNN whose forward flattens with .view, which NHWC activations cannot take."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        h = self.conv(x)
        return self.head(h.view(h.shape[0], -1))


def test_a_network_that_cannot_take_nhwc_is_refused_by_name_or_runs_nchw_under_auto():
    X, y = torch.randn(32, 3, 6, 6), torch.randint(0, 2, (32,))
    model = BayesianModule(Viewing(), memory_format="channels_last")
    with pytest.raises(ValueError, match=r"memory_format='channels_last'.*\.reshape\(\).*memory_format='contiguous'"):
        MCMC(SGLD(model, step_size=1e-4), num_samples=2, warmup_steps=1, disable_progbar=True).run(X, y, batch_size=8)
    with pytest.warns(RuntimeWarning, match="runs in NCHW"):  # "auto" chose channels_last (a GPU's choice)
        assert execution.checked_layout(Viewing(), X[:2], "channels_last", "auto") == "contiguous"
    assert execution.checked_layout(nn.Conv2d(3, 4, 3), X[:2], "channels_last", "auto") == "channels_last"


def test_auto_layout_and_ways_follow_the_device_and_bad_values_are_refused():
    conv = nn.Conv2d(3, 8, 3)
    assert execution.check_memory_format("auto", conv, torch.device("cuda")) == "channels_last"
    assert execution.check_memory_format("auto", nn.Linear(3, 2), torch.device("cuda")) == "contiguous"
    assert execution.check_memory_format("auto", conv, torch.device("cpu")) == "contiguous"
    # a CPU: a fixed way (a seeded run repeats bit for bit), the one measured faster there
    assert BayesianModule(conv).networks == "loop" and BayesianModule(nn.Linear(3, 2)).networks == "vmap"
    with pytest.raises(ValueError, match="memory_format must be one of .*channels_last"):
        BayesianModule(conv, memory_format="nhwc")
