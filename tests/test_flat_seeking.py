"""SASGLD and FlatSGLD against their documented targets; Entropy-MCMC's θa in the flat mode."""

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_flat import SASGLD, FlatSGLD, MCMC, datasets
from pyro_flat.convergence import run_ensemble

GRID = np.linspace(-10, 10, 400001)


def second_moment(log_density: np.ndarray) -> float:
    w = np.exp(log_density - log_density.max())
    return float((w * GRID ** 2).sum() / w.sum())


def time_average_of_square(kernel, chains=2000, warmup=600, steps=3000, every=20, seed=0):
    """Per-chain time averages of theta^2 after warm-up: their mean and standard error (chains
    are independent, so the error is the spread of the chain averages over sqrt(chains))."""
    torch.manual_seed(seed)
    marks = list(range(warmup, warmup + steps + 1, every))
    states = run_ensemble(kernel, torch.tensor([0.5]), chains, marks, progress_bar=False)
    sq = torch.stack([states[k]["theta"][:, 0].double() ** 2 for k in marks])  # (time, chain)
    per_chain = sq.mean(0)
    return float(per_chain.mean()), float(per_chain.std() / math.sqrt(chains))


def test_sasgld_targets_the_sharpness_aware_posterior_exactly_in_1d():
    """U = theta^2/2: the SAM drift is -(|theta| + rho) sign(theta), the exact gradient of
    U_rho = (|theta| + rho)^2 / 2 = max_{|e| <= rho} U(theta + e)."""
    rho = 0.5
    kernel = SASGLD(potential_fn=lambda p: 0.5 * p["theta"][:, 0] ** 2, rho=rho, step_size=0.005)
    est, se = time_average_of_square(kernel)
    target = second_moment(-0.5 * (np.abs(GRID) + rho) ** 2)  # 0.679
    assert abs(est - target) < 4 * se + 0.01 * target, (est, target, se)
    assert abs(est - 1.0) > 20 * se  # not the posterior's E[theta^2] = 1: a plain SGLD would fail


def test_flat_sgld_targets_the_randomly_smoothed_energy():
    """U = theta^4/4: E U(theta + e) = theta^4/4 + 1.5 sigma^2 theta^2 + const."""
    sigma = 0.7
    kernel = FlatSGLD(potential_fn=lambda p: 0.25 * p["theta"][:, 0] ** 4, sigma=sigma, step_size=0.002)
    est, se = time_average_of_square(kernel, steps=4000)
    target = second_moment(-GRID ** 4 / 4 - 1.5 * sigma ** 2 * GRID ** 2)  # 0.403
    posterior = second_moment(-GRID ** 4 / 4)  # 0.676
    assert abs(est - target) < 4 * se + 0.03 * target, (est, target, se)
    assert abs(est - posterior) > 0.5 * (posterior - target)


def test_both_run_through_pyros_driver_with_minibatches_and_count_gradients():
    torch.manual_seed(0)

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    y = torch.randn(200) + 2.0
    for kernel, per_iter in [(SASGLD(model, rho=0.01, step_size=1e-3), 2), (FlatSGLD(model, sigma=0.01, step_size=1e-3), 1)]:
        mcmc = pyro.infer.MCMC(kernel, num_samples=300, warmup_steps=200, disable_progbar=True)
        mcmc.run(y)
        mu = mcmc.get_samples()["mu"]
        assert abs(float(mu.mean()) - float(y.mean())) < 0.25
        stats = kernel.diagnostics()["sample_stats"]
        assert stats["grad_evals"][-1] == per_iter * 500
        assert torch.isfinite(stats["potential_energy"]).all()
    # vectorized chains through pyro_flat.MCMC
    mcmc = MCMC(SASGLD(model, rho=0.01, step_size=1e-3), num_samples=50, warmup_steps=50, num_chains=3,
                disable_progbar=True)
    mcmc.run(y)
    assert mcmc.chain_method == "vectorized" and mcmc.get_samples(group_by_chain=True)["mu"].shape == (3, 50)


def test_bad_perturbation_sizes_are_refused():
    fn = lambda p: (p["theta"] ** 2).sum()
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="rho must be a positive finite number"):
            SASGLD(potential_fn=fn, rho=bad, step_size=0.1)
        with pytest.raises(ValueError, match="sigma must be a positive finite number"):
            FlatSGLD(potential_fn=fn, sigma=bad, step_size=0.1)


def test_auroc_is_the_pairwise_probability_with_ties_counted_half():
    from pyro_flat import metrics

    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 6, (40,), generator=gen).double()  # many ties
    neg = torch.randint(0, 5, (30,), generator=gen).double()
    brute = float(((pos[:, None] > neg[None]).double() + 0.5 * (pos[:, None] == neg[None]).double()).mean())
    assert metrics.auroc(pos, neg) == pytest.approx(brute, abs=1e-12)
    probs_in = torch.tensor([[0.98, 0.01, 0.01], [0.9, 0.05, 0.05]])
    probs_out = torch.tensor([[0.4, 0.3, 0.3], [0.34, 0.33, 0.33]])
    assert metrics.ood_auroc(probs_in, probs_out) == 1.0 and metrics.ood_auroc(probs_out, probs_in) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        metrics.auroc(torch.tensor([]), neg)


def test_bnn_study_options_are_checked():
    from pyro_flat.experiments.bnn.study import BNNConfig
    from pyro_flat.experiments.cli import main
    from pyro_flat.experiments.output import StudyError

    assert main(["bnn", "--rho", "0", "--no-progress"]) == 2
    with pytest.raises(StudyError, match="warmup-fraction"):
        BNNConfig(warmup_fraction=1.0).validate()
    with pytest.raises(ValueError, match="in_digits holds all ten"):
        datasets.load_mnist_ood(in_digits=range(10))


def test_bnn_study_passes_its_preconditioner_to_every_mlp_sampler():
    from pyro_flat.experiments.bnn.study import BNN_SAMPLERS, BNNConfig, make_bnn_kernel
    from pyro_flat.experiments.output import StudyError
    from pyro_flat.models import BayesianMLP

    net = BayesianMLP(4, [3], 2)
    config = BNNConfig(preconditioner="diagonal", step_size=0.01)
    for name in BNN_SAMPLERS:
        kernel = make_bnn_kernel(name, config, net)
        assert kernel.preconditioner is not None and kernel.preconditioner.spec == "diagonal", name
        assert make_bnn_kernel(name, BNNConfig(), net).preconditioner is None
    with pytest.raises(StudyError, match="--preconditioner 'dense'"):
        BNNConfig(preconditioner="dense").validate()

