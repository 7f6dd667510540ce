"""No host-device sync on the steady-state path of BayesianModule, Batches and an augmentation (issue 70): on a GPU each
read of a tensor's value in Python waits for the device, so the host cannot queue the next step's work. The reads
are counted on the CPU (tests/host_syncs.py) over the extra iterations of a longer run: a step's only read is the
kernel's own divergence check (one per iteration, naming the iteration that diverged), and a kept draw's copy to
host memory."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyro
from pyro_flat import MCMC, SGLD
from pyro_flat.nn import Batches, BayesianModule, random_crop_flip

from host_syncs import HostReads

CHAINS, EXTRA = 3, 10
KERNEL_READS = {"kernels/divergence.py:tolist"}  # the divergence check of every eager iteration, read a step late


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))


def _reads(data_kind: str, iterations: int, model_maker=None) -> HostReads:
    g = torch.Generator().manual_seed(0)
    X, y = torch.rand(96, 1, 6, 6, generator=g), torch.randint(0, 3, (96,), generator=g)
    model = (model_maker or (lambda: BayesianModule(_cnn(), transform=random_crop_flip)))()
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=iterations, warmup_steps=2, num_chains=CHAINS,
                disable_progbar=True)
    pyro.set_rng_seed(0)
    with HostReads() as reads:
        if data_kind == "tensors":
            mcmc.run(X, y, batch_size=16)
        else:
            mcmc.run(Batches(DataLoader(TensorDataset(X, y), batch_size=16, shuffle=True, drop_last=True)))
    return reads


def _per_extra_iterations(data_kind: str, model_maker=None):
    short, long = _reads(data_kind, 5, model_maker), _reads(data_kind, 5 + EXTRA, model_maker)
    return {k: long.where[k] - short.where[k] for k in long.where if long.where[k] != short.where[k]}


@pytest.mark.parametrize("data_kind", ["tensors", "loader"])
def test_a_step_of_a_module_with_an_augmentation_reads_nothing_but_its_divergence_check(data_kind):
    extra = _per_extra_iterations(data_kind)
    stepping = {k: n for k, n in extra.items() if not k.startswith(("kernels/recording.py", "infer/"))}
    assert stepping == {k: EXTRA for k in KERNEL_READS}, extra
    # the loader's batches are checked on the host as they come (Batches._pull), before they move to the device
    assert not any(k.startswith(("nn/module.py", "nn/functional.py", "nn/transforms.py", "targets/")) for k in extra)


def test_a_label_check_on_every_loader_batch_would_be_counted():
    """The counter can fail: a model that checks each loader batch's labels on the device reads at every step."""
    class CheckingEveryBatch(BayesianModule):
        def _observe(self, out, y, full_y):
            self._check_labels(y, out)  # the per-batch check this issue removed
            return super()._observe(out, y, full_y)

    extra = _per_extra_iterations("loader", lambda: CheckingEveryBatch(_cnn()))
    assert extra.get("nn/module.py:_check_label_values", 0) >= EXTRA, extra
