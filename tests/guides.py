"""The law of an autoguide at given parameters, for tests that measure the exact KL of a perturbation."""

import torch

import pyro.distributions as dist
from pyro.infer.autoguide import AutoDiagonalNormal


def guide_law(guide, params):
    """The Gaussian of ``guide`` (``AutoDiagonalNormal`` or ``AutoLowRankMultivariateNormal``) at the
    unconstrained parameters ``params`` (by their param-store names)."""
    name = guide._pyro_name
    sigma = torch.nn.functional.softplus(params[f"{name}.scale"])
    if isinstance(guide, AutoDiagonalNormal):
        return dist.Normal(params[f"{name}.loc"], sigma)
    return dist.LowRankMultivariateNormal(params[f"{name}.loc"], params[f"{name}.cov_factor"] * sigma[:, None],
                                          sigma ** 2)
