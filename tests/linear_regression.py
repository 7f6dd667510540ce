"""The small Bayesian linear regression the across-ranks and checkpoint tests sample: N = 400 points, D = 3."""

import torch

import pyro
import pyro.distributions as dist

N, D = 400, 3


def data(n=N):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(n, D, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def model(X, y, batch_size=20):
    """Linear regression; per-chain minibatches gather as X[idx] ((C, B, D) against w (C, 1, D))."""
    w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=X.dtype, device=X.device), 1.0).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=batch_size, device=X.device) as idx:
        pyro.sample("y", dist.Normal((X[idx] * w).sum(-1), 1.0), obs=y[idx])
