"""A model's latent sites as the samplers see them: unconstrained shapes and support maps.

>>> import torch, pyro.distributions as dist
>>> support_transform("s", dist.Gamma(2.0, 2.0).support)(torch.tensor(0.0))
tensor(1.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from pyro.distributions.transforms import biject_to


@dataclass(frozen=True)
class SiteInfo:
    """A latent site as a kernel sees it: unconstrained shape and the map back to its support."""

    name: str
    shape: torch.Size
    transform: torch.distributions.Transform  # unconstrained -> constrained
    batch_rank: int = 0  # len(fn.batch_shape): how many leading dims of `shape` are plate/batch dims
    is_identity: bool = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "is_identity", _is_identity(self.transform))


def _is_identity(transform: torch.distributions.Transform) -> bool:
    if isinstance(transform, torch.distributions.transforms.IndependentTransform):
        return _is_identity(transform.base_transform)
    return isinstance(transform, torch.distributions.transforms.ComposeTransform) and not transform.parts


def is_subsample_site(msg) -> bool:
    """Whether a trace site or message is the index site of a subsampled ``pyro.plate``."""
    return type(msg["fn"]).__name__ == "_Subsample"


def support_transform(site_name: str, support) -> torch.distributions.Transform:
    """``biject_to(support)``: the map from the unconstrained space onto a site's support.

    Unwraps supports that torch does not register (a ``MixtureSameFamily`` shares its components'
    support) and says which site is at fault when no bijection exists.
    """
    while type(support).__name__.lstrip("_") == "MixtureSameFamilyConstraint":
        support = support.base_constraint
    try:
        return biject_to(support)
    except NotImplementedError as err:
        raise ValueError(
            f"site {site_name!r} has support {support}, which has no bijection to the real space "
            "registered with torch.distributions.biject_to; reparameterise it (e.g. sample an "
            "unconstrained value and transform it) or register one."
        ) from err


def distribution_parameters(d) -> List[Tuple[str, torch.Tensor]]:
    """``[("Normal's loc", tensor), ...]``: the floating-point parameters of ``d``, or of the distribution it wraps
    (``.to_event``, ``.expand``, ``.mask``, a transformed distribution's base)."""
    while hasattr(d, "base_dist"):
        d = d.base_dist
    values = {k: d.__dict__.get(k) for k in getattr(d, "arg_constraints", {})}
    return [(f"{type(d).__name__}'s {k}", v) for k, v in values.items()
            if torch.is_tensor(v) and v.is_floating_point()]


def nonfinite_parameter(d) -> Optional[str]:
    """``"Normal's loc"``: a parameter of ``d`` (or of the distribution it wraps) that holds NaN or inf, else
    ``None``."""
    return next((label for label, v in distribution_parameters(d) if not bool(torch.isfinite(v).all())), None)


def nonfinite_prior(trace) -> Optional[Tuple[str, str, List[str]]]:
    """``(site, "Normal's loc", earlier)``: the first latent site of a Pyro trace whose distribution has a parameter
    that holds NaN or inf, and the latent sites traced before it (whose values it may be computed from), else
    ``None``. Made for a set-up check: all the sites' parameters are tested on the device and read back once (one
    host sync), the culprit looked for only when there is one."""
    latent = [(name, site["fn"]) for name, site in trace.nodes.items()
              if site["type"] == "sample" and not site["is_observed"] and not is_subsample_site(site)]
    flags = [torch.isfinite(v).all() for _, d in latent for _, v in distribution_parameters(d)]
    if not flags or bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
        return None
    for i, (name, d) in enumerate(latent):
        bad = nonfinite_parameter(d)
        if bad is not None:
            return name, bad, [n for n, _ in latent[:i]]
    return None


def check_finite_priors(trace, cause: Optional[BaseException] = None) -> None:
    """A ``ValueError`` naming the first latent site of ``trace`` whose prior has a parameter that is NaN or inf (a
    NaN prior draws NaN starts, and no step or start can mend it)."""
    found = nonfinite_prior(trace)
    if found is not None:
        name, bad, earlier = found
        upstream = "" if not earlier else (
            f" If they are computed from the latent sites traced before it ({', '.join(map(repr, earlier[:4]))}"
            f"{', ...' if len(earlier) > 4 else ''}), those sites' starting values may be the cause: start them "
            "elsewhere (initial_params=, or init_strategy=init_to_median).")
        raise ValueError(
            f"the prior of latent site {name!r} has parameters that are not finite: its {bad} holds NaN or inf. "
            f"Give pyro.sample({name!r}, ...) a distribution of finite parameters (a positive scale), e.g. "
            "dist.Normal(0., 1.); check what they are computed from (a NaN in a hyperparameter or a division "
            f"by zero).{upstream}") from cause
