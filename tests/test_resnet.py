"""The residual networks of the image studies (``pyro_flat.nn.resnet``): the CIFAR ResNet-18's size and
shapes, the residual wiring, and a small ResNet as a ``BayesianModule`` with vectorized chains."""

import pytest
import torch

from pyro_flat import MCMC, EntropySGLD, bma_predict
from pyro_flat.nn import BayesianModule, ResNet, resnet18


def test_resnet18_has_the_cifar_networks_size_stages_and_names():
    net = resnet18(num_classes=100)
    # 11,173,962 weights for 10 classes (the published count of the CIFAR ResNet-18), plus 512 x 90 + 90
    assert sum(p.numel() for p in net.parameters()) == 11_173_962 + 512 * 90 + 90
    shapes = {}
    for stage in range(1, 5):
        getattr(net, f"layer{stage}").register_forward_hook(
            lambda module, inputs, out, stage=stage: shapes.__setitem__(stage, tuple(out.shape)))
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    assert shapes == {1: (2, 64, 32, 32), 2: (2, 128, 16, 16), 3: (2, 256, 8, 8), 4: (2, 512, 4, 4)}
    names = dict(net.named_parameters())
    assert {"conv1.weight", "layer1.0.conv1.weight", "layer2.0.shortcut.0.weight", "linear.weight"} <= set(names)
    assert "layer1.0.shortcut.0.weight" not in names  # same shape: the identity shortcut has no weights


def test_a_block_adds_its_shortcut_to_its_residual_branch():
    torch.manual_seed(0)
    net = ResNet(blocks=(1, 1), width=4, in_channels=1).eval()
    block = net.layer1[0]
    x = torch.randn(3, 4, 6, 6)
    with torch.no_grad():
        block.bn2.weight.zero_()  # the residual branch ends in zero: the block is relu(x)
        block.bn2.bias.zero_()
        assert torch.equal(block(x), torch.relu(x))
        down = net.layer2[0]
        down.bn2.weight.zero_()
        down.bn2.bias.zero_()
        assert torch.allclose(down(x), torch.relu(down.shortcut(x)))
        assert down(x).shape == (3, 8, 3, 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(blocks=()), "blocks"), (dict(blocks=(2, 0)), "blocks"), (dict(width=0), "width"),
    (dict(num_classes=0), "num_classes"),
])
def test_bad_shapes_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNet(**kwargs)


def test_a_small_resnet_samples_as_vectorized_chains_and_predicts_with_each_draws_batchnorm():
    torch.manual_seed(0)
    X, y = torch.randn(96, 1, 12, 12), torch.randint(0, 3, (96,))
    model = BayesianModule(ResNet(blocks=(1, 1), width=4, in_channels=1, num_classes=3), prior=1.0)
    mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-5), num_samples=4, warmup_steps=2, num_chains=2,
                disable_progbar=True)
    mcmc.run(X, y, batch_size=16)
    assert mcmc.chain_method == "vectorized"
    samples = mcmc.get_samples()
    assert samples["layer2.0.shortcut.0.weight"].shape == (8, 8, 4, 1, 1)
    probs = bma_predict(model, samples, X[:10], batchnorm_data=X)
    assert probs.shape == (10, 3) and torch.allclose(probs.sum(-1), torch.ones(10))
