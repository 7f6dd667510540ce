r"""Update rules shared by the stochastic-gradient kernels.

Each rule maps ``(params, grads)`` to new params and never modifies its inputs in place, so a
sample returned by a kernel is never aliased by a later one.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, NamedTuple, Tuple, Union

import torch

from ..chains.shard import chain_randn_like_each
from ..targets import Params


#: a step size (or a quantity made from one): a Python number in eager iterations, a 0-d tensor inside a
#: compiled graph that takes the step as an input (:mod:`~pyro_flat.kernels.compiled_step`)
StepSize = Union[float, torch.Tensor]


def _times(ys: List[torch.Tensor], scale: torch.Tensor) -> List[torch.Tensor]:
    """``scale * y`` for each ``y``, the 0-d ``scale`` cast to ``y``'s dtype first (as ``alpha=`` is): a 0-d
    ``y`` is not promoted to ``scale``'s dtype, and each dtype gets the step rounded to its own precision."""
    dtypes = {y.dtype for y in ys}
    if len(dtypes) == 1:
        return torch._foreach_mul(ys, scale.to(dtypes.pop()))
    return [y * scale.to(y.dtype) for y in ys]


def scaled_add(xs: List[torch.Tensor], ys: List[torch.Tensor], scale: StepSize) -> List[torch.Tensor]:
    """``x + scale * y`` for each pair, in one multi-tensor operation for a number (``alpha=``), two for a tensor."""
    if isinstance(scale, torch.Tensor):
        return torch._foreach_add(xs, _times(ys, scale))
    return torch._foreach_add(xs, ys, alpha=scale)


def scaled_add_(xs: List[torch.Tensor], ys: List[torch.Tensor], scale: StepSize) -> None:
    """``x += scale * y`` in place, as :func:`scaled_add`."""
    if isinstance(scale, torch.Tensor):
        torch._foreach_add_(xs, _times(ys, scale))
    else:
        torch._foreach_add_(xs, ys, alpha=scale)


def sqrt(x: StepSize) -> StepSize:
    """The square root of a number or of a tensor."""
    return torch.sqrt(x) if isinstance(x, torch.Tensor) else math.sqrt(x)


class Transition(NamedTuple):
    """One iteration of a stochastic-gradient kernel: the new state, and the energy, gradient and
    target statistics (e.g. ``coupling_distance``) at the state it started from."""

    params: Params
    energy: torch.Tensor
    grads: Params
    stats: Dict[str, torch.Tensor]


def langevin_step(params: Params, grads: Params, step_size: StepSize, temperature: float) -> Params:
    r"""One Euler-Maruyama step of the overdamped Langevin diffusion at temperature :math:`T`.

    .. math:: z \leftarrow z - \alpha \nabla U(z) + \sqrt{2 \alpha T}\, \xi,
              \qquad \xi \sim \mathcal N(0, I),

    whose stationary law, as :math:`\alpha \to 0`, is :math:`\propto \exp(-U/T)`. ``step_size`` is
    :math:`\alpha` (BlackJAX's convention; Welling & Teh's :math:`\epsilon` equals :math:`2\alpha`).
    With ``temperature=0`` this is gradient descent.
    """
    names = list(params)
    # torch._foreach_* (as in torch.optim) updates every site in one dispatch per operation.
    new = scaled_add([params[n] for n in names], [grads[n] for n in names], -step_size)
    if temperature > 0:
        scaled_add_(new, chain_randn_like_each(new), sqrt(2.0 * step_size * temperature))
    return dict(zip(names, new))


def underdamped_step(params: Params, momenta: Params, grads: Params, time_step: StepSize, decay: float,
                     temperature: float) -> Tuple[Params, Params]:
    r"""One BAOAB step of the underdamped Langevin diffusion with unit mass (Leimkuhler & Matthews, 2013),
    :math:`dq = p\,dt`, :math:`dp = -\nabla U\,dt - \gamma p\,dt + \sqrt{2\gamma T}\,dW`:

    .. math::

        p' &= p - h\,\nabla U(q) \qquad \text{(B: the two half-kicks of consecutive steps at } q\text{)},\\
        p'' &= c\,p' + \sqrt{T(1 - c^2)}\,\xi, \qquad c = e^{-\gamma h},\ \xi \sim \mathcal N(0, I)
              \qquad \text{(O)},\\
        q_{\text{new}} &= q + \tfrac h2\,(p' + p'') \qquad \text{(the two half-drifts A around O)},

    returning :math:`(q_{\text{new}}, p'')`. ``time_step`` is :math:`h`, ``decay`` is :math:`c`. Started from
    :math:`p \sim \mathcal N(0, T I)`, the points :math:`q` are BAOAB's, one gradient per step. On a Gaussian
    target with exact gradients the stationary law of :math:`q` is the target's exactly, at every step with
    :math:`h^2\lambda_{\max} < 4`, and that of :math:`p` is :math:`\mathcal N(0, T I)`. With ``temperature=0``
    this is gradient descent with heavy-ball momentum :math:`c`.
    """
    names = list(params)
    kicked = scaled_add([momenta[n] for n in names], [grads[n] for n in names], -time_step)
    new_q = scaled_add([params[n] for n in names], kicked, 0.5 * time_step * (1.0 + decay))
    new_p = torch._foreach_mul(kicked, decay)
    noise_scale = math.sqrt(temperature * (1.0 - decay ** 2))
    if noise_scale > 0:
        noise = chain_randn_like_each(kicked)
        torch._foreach_add_(new_p, noise, alpha=noise_scale)
        scaled_add_(new_q, noise, 0.5 * time_step * noise_scale)
    return dict(zip(names, new_q)), dict(zip(names, new_p))


def leapfrog(
    position: torch.Tensor,
    momentum: torch.Tensor,
    grad: torch.Tensor,
    step_size: torch.Tensor,
    num_steps: int,
    velocity: Callable[[torch.Tensor], torch.Tensor],
    potential_and_grad: Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""``num_steps`` velocity-Verlet steps of Hamiltonian dynamics with kinetic energy
    :math:`\tfrac12 r^\top M^{-1} r` (``velocity(r)`` is :math:`M^{-1} r`):

    .. math:: r \leftarrow r - \tfrac{\epsilon}{2}\nabla U(q),\quad
              q \leftarrow q + \epsilon M^{-1} r,\quad
              r \leftarrow r - \tfrac{\epsilon}{2}\nabla U(q).

    Tensors are ``(chains, D)``; ``step_size`` is ``(chains, 1)``. Returns the final position,
    momentum, potential ``(chains,)`` and gradient. Non-finite values are carried, not raised:
    the caller rejects such trajectories.
    """
    q, r = position, momentum - 0.5 * step_size * grad
    energy = None
    for i in range(num_steps):
        q = q + step_size * velocity(r)
        energy, grad = potential_and_grad(q)
        r = r - (step_size if i + 1 < num_steps else 0.5 * step_size) * grad
    return q, r, energy, grad
