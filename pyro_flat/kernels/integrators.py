r"""Update rules shared by the stochastic-gradient kernels.

Each rule maps ``(params, grads)`` to new params and never modifies its inputs in place, so a
sample returned by a kernel is never aliased by a later one.
"""

from __future__ import annotations

import math
from typing import Dict

import torch

Params = Dict[str, torch.Tensor]


def langevin_step(params: Params, grads: Params, step_size: float, temperature: float) -> Params:
    r"""One Euler-Maruyama step of the overdamped Langevin diffusion at temperature :math:`T`.

    .. math:: z \leftarrow z - \alpha \nabla U(z) + \sqrt{2 \alpha T}\, \xi,
              \qquad \xi \sim \mathcal N(0, I),

    whose stationary law, as :math:`\alpha \to 0`, is :math:`\propto \exp(-U/T)`. ``step_size`` is
    :math:`\alpha` (BlackJAX's convention; Welling & Teh's :math:`\epsilon` equals :math:`2\alpha`).
    With ``temperature=0`` this is gradient descent.
    """
    noise_scale = math.sqrt(2.0 * step_size * temperature)
    names = list(params)
    # torch._foreach_* (as in torch.optim) updates every site in one dispatch per operation.
    new = torch._foreach_add([params[n] for n in names], [grads[n] for n in names], alpha=-step_size)
    if noise_scale > 0:
        torch._foreach_add_(new, [torch.randn_like(z) for z in new], alpha=noise_scale)
    return dict(zip(names, new))
