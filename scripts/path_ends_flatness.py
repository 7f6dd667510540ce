"""Can the path study's two ends be made to differ in flatness?  ``python scripts/path_ends_flatness.py``

The drift claim of ``pyro-flat paths`` ("noise pushes SGD toward the flatter end") needs two minima
of the path's loss whose curvatures differ beyond their error. The study's ends are two SGLD draws
each descended by Adam to a minimum, and their Hessian traces tie. This script starts from the same
draw and reaches an end in other ways known to favour flat regions (SAM, small-batch SGD at a large
learning rate), then descends to a minimum as the study does, and prints the loss, the gradient
norm, the trace (30 Hutchinson probes, ± its standard error) and the top eigenvalue of each point,
before and after the descent. ``docs/studies/paths.md`` quotes its table. About 3 minutes on 2 cores.
"""

import time

import torch

from pyro_flat import flatness
from pyro_flat.datasets import load_mnist_ood
from pyro_flat.experiments.configs import PathConfig
from pyro_flat.experiments.paths.study import _descend, _last_draws, _subset
from pyro_flat.models import BayesianMLP

PROBES = 30


def main() -> None:
    start = time.perf_counter()
    config = PathConfig(progress=False)
    data = _subset(load_mnist_ood(config.data_dir, in_digits=config.in_digits), config.train_size)
    n = len(data.X_train)
    model = BayesianMLP(data.X_train.shape[1], config.hidden, len(data.in_digits), prior_scale=config.prior_scale)
    draws = _last_draws("sgld", config, model, data, lambda line: None)["SGLD"]
    nll = flatness.FlatLoss.from_model(model, draws[0], data.X_train, data.y_train, likelihood_only=True)
    decay = 1.0 / (2 * n * config.decay_scale ** 2)
    loss = flatness.FlatLoss(lambda x: nll.fn(x) / n + decay * x.square().sum(), nll.params, nll.blocks,
                             nll.model_target)

    def batch_loss(x, idx):
        part = flatness.FlatLoss.from_model(model, draws[0], data.X_train[idx], data.y_train[idx],
                                            likelihood_only=True)
        return part.fn(x) / len(idx) + decay * x.square().sum()

    def sgd(x, steps, lr, batch):
        generator = torch.Generator().manual_seed(config.seed)
        x = x.detach().clone().requires_grad_(True)
        optimiser = torch.optim.SGD([x], lr=lr)
        for _ in range(steps):
            optimiser.zero_grad()
            batch_loss(x, torch.randint(0, n, (batch,), generator=generator)).backward()
            optimiser.step()
        return x.detach()

    def sam(x, steps, lr, rho):
        x = x.detach().clone().requires_grad_(True)
        optimiser = torch.optim.Adam([x], lr=lr)
        for _ in range(steps):
            gradient, = torch.autograd.grad(loss.fn(x), x)
            optimiser.zero_grad()
            loss.fn(x + (rho * gradient / (gradient.norm() + 1e-12)).detach()).backward()
            optimiser.step()
        return x.detach()

    def row(label, point):
        here = loss.at(point)
        trace = flatness.hessian_trace(here, num_probes=PROBES, seed=config.seed)
        top = flatness.top_eigenvalues(here, k=1, tol=1e-3, seed=config.seed)[0]
        gradient = float(torch.func.grad(loss.fn)(point).norm())
        print(f"| {label} | {float(loss.fn(point)):.4g} | {gradient:.1e} | {trace.value:.2f} ± {trace.stderr:.2f} "
              f"| {top:.3g} |", flush=True)

    print(f"| end | loss per image | gradient norm | trace ({PROBES} probes) | top eigenvalue |")
    print("|---|---|---|---|---|")
    x0, x1 = (loss.flatten(d) for d in draws)
    row("draw 0, Adam descent (the study's end 0)", _descend(loss.fn, x0, config.descent_steps, config.descent_lr))
    row("draw 1, Adam descent (the study's end 1)", _descend(loss.fn, x1, config.descent_steps, config.descent_lr))
    for label, point in (("draw 1, SAM (ρ = 2) with Adam", sam(x1, 3000, 1e-3, 2.0)),
                         ("draw 1, SGD lr 0.5, batch 10", sgd(x1, 3000, 0.5, 10)),
                         ("draw 1, SGD lr 1, batch 10", sgd(x1, 3000, 1.0, 10))):
        row(label, point)
        row(f"  then {config.descent_steps} Adam steps", _descend(loss.fn, point, config.descent_steps,
                                                                  config.descent_lr))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
