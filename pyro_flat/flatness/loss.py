r"""The object every flatness measure works on: a scalar loss of one flat parameter vector.

:class:`FlatLoss` holds ``fn`` (``(d,) -> scalar``), the point ``params`` and the named ``blocks``
of that vector (a model's sites, a network's layers), which the ``per_site=True`` measures use.
It comes from a Pyro model at a draw (:meth:`FlatLoss.from_model`: the full-data potential in
unconstrained coordinates), from an ``nn.Module`` and a criterion (:meth:`FlatLoss.from_module`),
or from any function of a flat tensor.

:class:`HessianOperator` is the Hessian of ``fn`` at ``params`` as a linear map, applied by
forward-over-reverse differentiation (``torch.func.jvp`` of ``torch.func.grad``): each
product :math:`Hv` costs a few gradient evaluations and never forms :math:`H`.

Example::

    >>> import torch
    >>> from pyro_flat.flatness import FlatLoss, HessianOperator
    >>> A = torch.diag(torch.tensor([3., 1.]))
    >>> H = HessianOperator(FlatLoss(lambda x: 0.5 * x @ A @ x, torch.ones(2)))
    >>> H.matvec(torch.tensor([1., 1.]))
    tensor([3., 1.])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Union

import torch
from torch.func import functional_call, grad, jvp, vmap

from ..targets import ModelPotential, SiteLayout
from ..targets.precision import check_autocast

__all__ = ["FlatLoss", "HessianOperator", "as_flat_loss"]

LossFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class FlatLoss:
    """A scalar loss of a flat parameter vector, at a point, with named blocks.

    :param fn: maps a ``(d,)`` tensor to a scalar tensor, differentiably.
    :param params: the point, a 1-D floating tensor of length ``d``.
    :param blocks: ``{name: slice}`` of ``params`` (a model's sites, a module's parameters);
        empty for a plain function.
    :param model_target: the model's potential, for losses made by :meth:`from_model`.
    """

    fn: LossFn
    params: torch.Tensor
    blocks: Mapping[str, slice] = field(default_factory=dict)
    model_target: Optional[object] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        params = self.params
        if not torch.is_tensor(params) or not params.is_floating_point():
            raise TypeError(
                f"params must be a floating-point torch tensor, got {type(params).__name__}"
                f"{'' if not torch.is_tensor(params) else ' of dtype ' + str(params.dtype)}."
            )
        if params.dim() != 1:
            raise ValueError(
                f"params must be a flat 1-D tensor, got shape {tuple(params.shape)}; flatten it "
                "(torch.nn.utils.parameters_to_vector) and have fn take the flat vector, or use "
                "FlatLoss.from_module / FlatLoss.from_model."
            )
        object.__setattr__(self, "params", params.detach())

    @property
    def dim(self) -> int:
        return self.params.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def at(self, params: torch.Tensor) -> "FlatLoss":
        """The same loss at another point (e.g. another draw, from :meth:`flatten`)."""
        return FlatLoss(self.fn, params, self.blocks, self.model_target)

    def under_autocast(self, autocast: Union[None, str, torch.dtype]) -> "FlatLoss":
        """The same loss with its forward pass, and so every gradient and Hessian product of it, under
        ``torch.autocast(dtype=torch.bfloat16)`` (``autocast="bf16"``), its value in fp32 and the point fp32: a
        flatness measure in the precision a network was sampled in (:mod:`~pyro_flat.targets.precision`);
        ``None``: this loss."""
        dtype = check_autocast(autocast)
        if dtype is None:
            return self
        fn, device = self.fn, self.params.device.type

        def mixed(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device, dtype=dtype):
                return fn(x).float()

        return FlatLoss(mixed, self.params, self.blocks, self.model_target)

    def restrict(self, name: str) -> "FlatLoss":
        """The loss as a function of block ``name`` alone, the other blocks held at ``params``.

        Its Hessian is the diagonal block :math:`H_{ss}` of the full Hessian: this is what the
        ``per_site=True`` measures use.
        """
        if name not in self.blocks:
            raise KeyError(f"no block named {name!r}; the blocks are {list(self.blocks)}.")
        where = self.blocks[name]
        base, fn = self.params, self.fn

        def restricted(x: torch.Tensor) -> torch.Tensor:
            return fn(torch.cat([base[: where.start], x, base[where.stop:]]))

        return FlatLoss(restricted, base[where])

    # ------------------------------------------------------------------ constructors
    def per_block(self, measure: Callable, **kwargs) -> Dict[str, object]:
        """``{name: measure(self.restrict(name), **kwargs)}`` for every named block (a Pyro site or
        a module parameter); ``k`` is capped at a small block's dimension."""
        if not self.blocks:
            raise ValueError(
                "per_site=True needs named blocks: pass a FlatLoss from FlatLoss.from_model / "
                "FlatLoss.from_module, or FlatLoss(fn, params, blocks={name: slice})."
            )
        out = {}
        for name in self.blocks:
            block = self.restrict(name)
            if "k" in kwargs and kwargs["k"] > block.dim:  # a small site has fewer eigenvalues
                out[name] = measure(block, **{**kwargs, "k": block.dim})
            else:
                out[name] = measure(block, **kwargs)
        return out

    @classmethod
    def from_module(cls, module: torch.nn.Module, loss: Callable[[torch.nn.Module], torch.Tensor]
                    ) -> "FlatLoss":
        """The loss of a network as a function of its trainable parameters, one block per tensor.

        :param module: any ``nn.Module`` (a ``PyroModule`` too); the parameters with
            ``requires_grad=True`` form the flat vector, in ``named_parameters()`` order.
        :param loss: ``module -> scalar``, e.g. ``lambda net: F.cross_entropy(net(X), y)``; it is
            called with the module's parameters replaced (``torch.func.functional_call``).

        >>> import torch
        >>> net = torch.nn.Linear(3, 1)
        >>> X = torch.randn(10, 3)
        >>> L = FlatLoss.from_module(net, lambda m: m(X).square().mean())
        >>> L.dim, list(L.blocks)
        (4, ['weight', 'bias'])
        """
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(
                f"{type(module).__name__} has no parameters with requires_grad=True; there is "
                "nothing to differentiate. Unfreeze them (p.requires_grad_(True))."
            )
        shapes = {n: p.shape for n, p in named}
        blocks, start = {}, 0
        for n, p in named:
            blocks[n] = slice(start, start + p.numel())
            start += p.numel()
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])

        def fn(x: torch.Tensor) -> torch.Tensor:
            values = {n: x[blocks[n]].view(shapes[n]) for n in shapes}
            return loss(_Bound(module, values))

        return cls(fn, flat, blocks)

    @classmethod
    def from_model(cls, model: Callable, sample: Mapping[str, torch.Tensor], *args,
                   likelihood_only: bool = False, **kwargs) -> "FlatLoss":
        r"""The full-data potential :math:`U(z) = -\log p(D, t(z)) - \log|J_t(z)|` of a Pyro
        model, in unconstrained coordinates, at one draw; one block per latent site.

        :param sample: ``{site: value}`` in the constrained space (one draw of
            ``mcmc.get_samples()``); sites the model does not have (e.g. ``*_aux`` twins) are
            ignored.
        :param args, kwargs: the model's data, as passed to ``mcmc.run``. A subsampled plate is
            evaluated on all its data (:meth:`~pyro_flat.targets.ModelPotential.full_data`).
        :param likelihood_only: the negative log-likelihood :math:`-\log p(D \mid t(z))` alone (the
            training loss summed over the data), without the prior: a Gaussian prior adds
            :math:`I/\sigma_p^2` to the Hessian, which dominates the trace of a large network.

        Other draws of the same model: ``loss.at(loss.flatten(other_sample))``.
        """

        target = ModelPotential(model, args, kwargs)
        missing = [n for n in target.sites if n not in sample]
        if missing:
            raise ValueError(
                f"sample has no value for the model's latent site(s) {missing}; pass one draw "
                f"with every latent site (its keys are {sorted(sample)})."
            )
        layout = SiteLayout({n: site.shape for n, site in target.sites.items()})

        def fn(x: torch.Tensor) -> torch.Tensor:
            return target.full_data(layout.unpack(x), likelihood_only=likelihood_only)

        return cls(fn, _flatten_sites(target, sample), layout.slices, target)

    def flatten(self, sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """A draw ``{site: constrained value}`` of the model as this loss's flat vector
        (only for losses made by :meth:`from_model`)."""
        if self.model_target is None:
            raise TypeError("flatten() needs a FlatLoss made by FlatLoss.from_model.")
        return _flatten_sites(self.model_target, sample)


def _flatten_sites(target, sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
    parts = {}
    for name, site in target.sites.items():
        value = torch.as_tensor(sample[name]).to(target.device)  # draws kept in host memory: to the model's device
        if value.shape != site.shape:
            raise ValueError(
                f"site {name!r} has shape {tuple(site.shape)} in the model but "
                f"{tuple(value.shape)} in sample; pass one draw (e.g. {{k: v[i] for k, v in "
                "samples.items()}}), not all of them."
            )
        parts[name] = site.transform.inv(value).detach()
    return SiteLayout({n: site.shape for n, site in target.sites.items()}).pack(parts)


class _Bound(torch.nn.Module):
    """``module`` called with its parameters replaced by ``values`` (``functional_call``)."""

    def __init__(self, module: torch.nn.Module, values: Dict[str, torch.Tensor]):
        super().__init__()
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_values", values)

    def forward(self, *args, **kwargs):
        return functional_call(self._module, self._values, args, kwargs)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_module"), name)


def as_flat_loss(loss_fn: Union[FlatLoss, LossFn], params: Optional[torch.Tensor]) -> FlatLoss:
    """``loss_fn`` and ``params`` as a checked :class:`FlatLoss`.

    Raises a ``ValueError`` that says what to change if the loss is not a scalar, is not finite,
    or does not depend on ``params`` (no gradient reaches them).
    """
    if isinstance(loss_fn, FlatLoss):
        loss = loss_fn if params is None else loss_fn.at(params)
    else:
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable or a FlatLoss, got {type(loss_fn).__name__}.")
        if params is None:
            raise TypeError("params is required with a plain loss_fn (the point to measure at).")
        loss = FlatLoss(loss_fn, params)
    x = loss.params.detach().clone().requires_grad_(True)
    value = loss.fn(x)
    if not torch.is_tensor(value) or value.numel() != 1:
        shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
        raise ValueError(
            f"loss_fn must return a scalar tensor, got {shape}; reduce it (e.g. .sum() or "
            ".mean() over the data)."
        )
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"loss_fn(params) is {float(value.detach())}; measure flatness at a point where the loss is finite.")
    if not value.requires_grad:
        raise ValueError(
            "loss_fn(params) does not depend on params: no gradient reaches them. Compute the loss "
            "from the tensor it receives with torch operations (no .item(), .detach(), numpy), and "
            "make sure the parameters it uses have requires_grad."
        )
    return loss


class HessianOperator:
    r"""The Hessian :math:`H = \nabla^2 \ell(\theta)` of a :class:`FlatLoss` as a linear operator.

    :meth:`matvec` is one Hessian-vector product (forward-over-reverse, ``torch.func``; reverse-over-reverse,
    the same product, for a loss whose forward-mode derivative fails, such as a BatchNorm network under bf16
    autocast, said once in a warning; those products then also fail under ``vmap``, so :meth:`matmat` loops);
    :meth:`matmat` applies :math:`H` to the rows of a matrix, vectorized with ``torch.func.vmap``
    in chunks of ``chunk_size`` rows when the loss allows it (a loss with data-dependent Python
    control flow does not: it falls back to a loop, once, with a warning).
    :attr:`num_hvps` counts the products made.
    """

    def __init__(self, loss: FlatLoss, *, chunk_size: int = 16):
        self.loss, self.chunk_size = loss, int(chunk_size)
        self.dim, self.dtype, self.device = loss.dim, loss.params.dtype, loss.params.device
        self.num_hvps = 0
        grad_fn, point = grad(loss.fn), loss.params
        self.forward_mode = True  # False once forward-over-reverse failed: reverse-over-reverse from then on

        def hvp(v: torch.Tensor) -> torch.Tensor:
            if self.forward_mode:
                try:
                    return jvp(grad_fn, (point,), (v,))[1]
                except RuntimeError as err:  # torch 2.13: BatchNorm then a convolution under autocast
                    if isinstance(err, torch.OutOfMemoryError):
                        raise
                    self.forward_mode = False
                    warnings.warn(f"Hessian-vector products: forward-over-reverse differentiation fails for this loss "
                                  f"({str(err).splitlines()[0][:120]}); they run reverse-over-reverse, the same "
                                  "products at about twice the memory, and unvectorized where vmap cannot map them.",
                                  RuntimeWarning, stacklevel=4)
            return grad(lambda z: torch.dot(grad_fn(z), v))(point)

        self._hvp = hvp
        self._batched: Optional[Callable] = vmap(hvp)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        self.num_hvps += 1
        return self._hvp(v.to(self.dtype)).to(self.dtype)

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        """``H`` applied to each row of ``V`` (shape ``(n, d)``)."""
        out = []
        for chunk in V.to(self.dtype).split(max(1, self.chunk_size)):
            if self._batched is not None:
                try:
                    out.append(self._batched(chunk).to(self.dtype))
                    self.num_hvps += len(chunk)
                    continue
                except Exception as err:  # vmap cannot trace this loss: loop instead
                    warnings.warn(f"Hessian-vector products are not vectorizable for this loss "
                                  f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                                  "computing them one at a time.", RuntimeWarning, stacklevel=3)
                    self._batched = None
            out.append(torch.stack([self.matvec(v) for v in chunk]))
        return torch.cat(out)

    def dense(self) -> torch.Tensor:
        """The full ``(d, d)`` Hessian, column block by column block, symmetrised."""
        H = self.matmat(torch.eye(self.dim, dtype=self.dtype, device=self.device))
        return 0.5 * (H + H.T)
