r"""The log joint of a Pyro model at given unconstrained values, in one pass of one light handler.

:class:`LogJoint` substitutes the values of the latent sites (and the minibatch indices of the
subsampled plates) while the model runs, and sums the log-density terms as they come, instead of
``poutine.trace`` followed by ``log_prob_sum``: that is what keeps a kernel step within a small
factor of a hand-written torch loop. :class:`~pyro_flat.targets.ModelPotential` is its one user.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import SubsampleMessenger

from .layout import Params
from .sites import SiteInfo, is_subsample_site


class NotBroadcasting(ValueError):
    """The model does not broadcast over a leading chain dimension (see :class:`~pyro_flat.targets.ModelPotential`)."""


class ChangedSitesError(ValueError):
    """The model sampled other latent sites than at set-up: the set a kernel samples must stay fixed."""


class LogJoint(Messenger):
    """Substitute unconstrained values and minibatch indices; accumulate the log joint.

    With ``chains=(C, max_plate_nesting)`` the values carry a leading dimension of ``C`` chains at
    ``dim=-(max_plate_nesting + 1)`` of the batch shape (the layout of Pyro's
    ``vectorize_particles``) and the log joint is a ``(C,)`` vector. No plate is added for the
    chains: the distributions stay unexpanded and broadcast, which saves a pass over every
    ``(C, ...)`` parameter; a term without the chain dimension is the same for every chain.

    Per-chain minibatches: an index tensor of shape ``(C, B)`` gives chain ``c`` the indices of
    row ``c``. ``pyro.plate`` then hands the model ``(C, B)`` indices, so a model that gathers its
    data as ``X[idx]`` gets ``(C, B, ...)`` data, one batched pass for all chains (Pyro's plate
    expects ``len(subsample) == subsample_size``; while such indices are in use it checks the
    last dimension instead, see :func:`_chain_subsample`).

    With ``block=(plate, keep, first)`` it evaluates one block of a full-data pass (see
    :meth:`~pyro_flat.targets.ModelPotential.full_data`): terms inside ``plate`` lose the plate's ``N/B`` scale and
    keep only the indices marked in ``keep``; terms outside it count in the ``first`` block only.
    With ``observed_only=True`` only the observed sites count: the log-likelihood. ``latent_weight``
    multiplies the terms of the latent sites (their prior densities and Jacobians): ``1/R`` on each of
    ``R`` data-parallel ranks, whose sum then counts the prior once (see
    :class:`~pyro_flat.distributed.DataParallelTarget`).
    """

    def __init__(self, sites: Dict[str, SiteInfo], params: Params, indices: Dict[str, torch.Tensor],
                 chains: Optional[Tuple[int, int]] = None,
                 block: Optional[Tuple[str, torch.Tensor, bool]] = None, observed_only: bool = False,
                 latent_weight: float = 1.0):
        super().__init__()
        self.latent_weight = latent_weight
        self.sites, self.params, self.indices, self.chains = sites, params, indices, chains
        self.block, self.observed_only = block, observed_only
        self.terms: list = []
        self.seen: set = set()  # the latent sites the model sampled in this pass
        self._per_chain = any(i.dim() > 1 for i in indices.values())
        self._plate_check = None

    def __enter__(self):
        if self._per_chain:  # let pyro.plate take (C, B) indices while the model runs
            # Pyro offers no public way for a plate to take them; the per-chain minibatch tests
            # (tests/test_minibatch.py) fail if a Pyro release changes SubsampleMessenger._subsample
            self._plate_check = SubsampleMessenger.__dict__["_subsample"]
            SubsampleMessenger._subsample = staticmethod(_chain_subsample)
        return super().__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        if self._plate_check is not None:
            SubsampleMessenger._subsample, self._plate_check = self._plate_check, None
        result = super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and len(self.seen) != len(self.sites):
            self._missing_sites()
        return result

    def _missing_sites(self) -> None:
        """A site sampled at set-up and not in this pass would get no potential: a kernel would move it
        by its noise alone (a random walk) and return that as draws."""
        missing = sorted(set(self.sites) - self.seen)
        raise ChangedSitesError(
            f"the model did not sample latent site {missing[0]!r} in this evaluation of its potential, though it "
            f"did when the kernel was set up{f' (nor {missing[1:]})' if len(missing) > 1 else ''}: without its "
            "density the site would random-walk and be returned as draws. A model must sample the same latent "
            "sites on every call; sample it every time (to switch a term off, use poutine.mask or a scale), "
            "and keep no state between calls that changes which sites it samples.")

    def _reduce(self, name: str, term: torch.Tensor) -> torch.Tensor:
        """Sum a log-density term over everything but the chain dimension."""
        if self.chains is None:
            return term if term.dim() == 0 else term.sum()
        num_chains, nesting = self.chains
        if term.dim() <= nesting:  # does not depend on the chain's parameters
            return term.sum().expand(num_chains)
        if term.dim() != nesting + 1 or term.shape[0] != num_chains:
            raise NotBroadcasting(
                f"site {name!r} has log-density shape {tuple(term.shape)} with {num_chains} "
                f"vectorized chains; expected ({num_chains}, ...) with {nesting + 1} dims"
            )
        return term.reshape(num_chains, -1).sum(-1)

    def _value(self, site: SiteInfo) -> torch.Tensor:
        z = self.params[site.name]
        if self.chains is None:
            return z
        num_chains, nesting = self.chains  # pad with the plate dims the site is not in
        return z.reshape((num_chains,) + (1,) * (nesting - site.batch_rank) + tuple(site.shape))

    @property
    def log_joint(self) -> torch.Tensor:
        """The sum of the terms (one stacked sum: a network's dozens of sites are two kernels, not dozens)."""
        terms = self.terms
        return sum(terms[1:], terms[0]) if len(terms) < 4 else torch.stack(terms).sum(0)

    def _pyro_sample(self, msg) -> None:
        name, fn = msg["name"], msg["fn"]
        if is_subsample_site(msg):
            if name in self.indices:
                msg["value"] = self.indices[name]
                msg["done"] = True
            return
        if msg["is_observed"]:
            value = msg["value"]
        else:
            site = self.sites.get(name)
            if site is None:
                raise ChangedSitesError(
                    f"the model sampled latent site {name!r}, which it did not sample during "
                    "setup; models must have a fixed set of latent sites."
                )
            self.seen.add(name)
            unconstrained = self._value(site)
            value = unconstrained if site.is_identity else site.transform(unconstrained)
            msg["value"] = value
            msg["done"] = True
            if self.observed_only:
                return
            if not site.is_identity and (self.block is None or self.block[2]):
                jacobian = site.transform.log_abs_det_jacobian(unconstrained, value)
                jacobian = jacobian.sum() if self.chains is None else jacobian.reshape(self.chains[0], -1).sum(-1)
                self.terms.append(jacobian if self.latent_weight == 1.0 else self.latent_weight * jacobian)
        scale, mask = msg["scale"], msg["mask"]
        if not msg["is_observed"] and self.latent_weight != 1.0:
            scale = scale * self.latent_weight
        if self.block is not None:
            plate, keep, first = self.block
            frame = next((f for f in msg["cond_indep_stack"] if f.name == plate), None)
            if frame is None:
                if not first:
                    return
            else:  # undo the plate's N/B and drop the indices an earlier block has counted
                scale = scale * frame.size / frame.full_size
                # on the site's device: a user's plate without device= draws its indices on the CPU
                keep = keep.reshape((-1,) + (1,) * (-frame.dim - 1)).to(msg["value"].device)
                mask = keep if mask is None else mask & keep
        if mask is None:  # scale the sum, not every term
            log_prob = self._reduce(name, fn.log_prob(value))
            unscaled = not torch.is_tensor(scale) and scale == 1.0  # no value read: traceable
            self.terms.append(log_prob if unscaled else log_prob * scale)
        else:
            self.terms.append(self._reduce(name, scale_and_mask(fn.log_prob(value), scale, mask)))


_pyro_subsample = SubsampleMessenger._subsample  # Pyro's own (a plain function: a staticmethod's)


def _chain_subsample(name, size=None, subsample_size=None, subsample=None, use_cuda=None, device=None):
    """``SubsampleMessenger._subsample`` that accepts ``(C, B)`` indices for ``subsample_size=B``.

    Pyro checks ``subsample_size == len(subsample)`` after the indices are substituted, which a
    ``(C, B)`` tensor (``len`` = ``C``) fails. Asked for no size, Pyro skips the check and takes
    ``len(subsample)``; the size asked for is then checked against the last dimension here.
    """
    if subsample is not None or subsample_size is None:
        return _pyro_subsample(name, size, subsample_size, subsample, use_cuda, device)
    size, _, subsample = _pyro_subsample(name, size, None, None, use_cuda, device)
    if subsample.shape[-1] != subsample_size:
        raise ValueError(f"subsample_size does not match len(subsample), {subsample_size} vs "
                         f"{subsample.shape[-1]}.")
    return size, subsample_size, subsample


__all__ = ["ChangedSitesError", "LogJoint", "NotBroadcasting"]
