r"""Mixed precision for a target: its energy and gradient evaluated under ``torch.autocast``, the state in fp32.

A stochastic-gradient kernel given ``autocast=torch.bfloat16`` samples :class:`AutocastTarget` around its target:
the potential's forward and backward run under ``torch.autocast(dtype=torch.bfloat16)`` (matrix products and
convolutions in bf16, the rest in fp32), while :math:`\theta`, :math:`\theta_a`, momenta, noise and the update stay
fp32, as PyTorch's mixed-precision training keeps fp32 master weights:

.. math:: \theta_{k+1} = \theta_k - \alpha\,\widetilde{\nabla U}(\theta_k) + \sqrt{2\alpha T}\,\xi_k,
          \qquad \widetilde{\nabla U} = \nabla U \text{ evaluated in bf16 (fp32 leaves, so an fp32 gradient)}.

The update must stay fp32: at the Entropy-MCMC paper's step and temperature the noise :math:`\sqrt{2\alpha T}` is
about 1e-5, below bf16's spacing of 4e-4 at weights near 0.05, so a bf16 state would not move. float16 needs a
gradient scaler (its gradients underflow below 6e-8) and is refused.

>>> import torch
>>> target_dtype = check_autocast(torch.bfloat16)
>>> target_dtype, check_autocast(None), check_autocast("bf16")
(torch.bfloat16, None, torch.bfloat16)
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

from .layout import Params
from .protocol import Evaluation, Target

#: the names ``autocast=`` takes for bf16
BF16_NAMES = ("bf16", "bfloat16")


def check_autocast(value: Union[None, str, torch.dtype]) -> Optional[torch.dtype]:
    """``autocast=`` as a dtype: ``None`` (fp32 throughout) or bf16 (``torch.bfloat16``, ``"bf16"``); float16 and
    anything else refused with the reason."""
    if value is None:
        return None
    if value in BF16_NAMES or value is torch.bfloat16:
        return torch.bfloat16
    if value in ("fp16", "float16", "half") or value is torch.float16:
        raise ValueError("autocast=torch.float16 is not supported: fp16 gradients underflow below 6e-8 and need a "
                         "gradient scaler, which the kernels do not run; pass autocast=torch.bfloat16 (fp32's range, "
                         "no scaler needed) or None.")
    raise ValueError(f"autocast must be None or torch.bfloat16 (or 'bf16'), got {value!r}.")


class AutocastTarget:
    """``target`` with its energy and gradient evaluated under ``torch.autocast(dtype)`` on the parameters' device;
    the energy returned in fp32, the gradient in the parameters' dtype. Every other attribute is ``target``'s."""

    _device: Optional[str] = None  # the parameters' device type, looked up at the first evaluation

    def __init__(self, target: Target, dtype: torch.dtype):
        self.inner = target
        self.dtype = dtype

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        value = getattr(self.inner, name)  # an AttributeError where the target has none (full_data too)
        if name == "full_data":
            def full_data(params: Params, *, likelihood_only: bool = False) -> torch.Tensor:
                with self._autocast(params):
                    return self._fp32(value(params, likelihood_only=likelihood_only))
            return full_data
        return value

    def _autocast(self, params: Params) -> torch.autocast:
        if self._device is None:  # the parameters stay on one device for a run: looked up once
            self._device = next(iter(params.values())).device.type
        return torch.autocast(device_type=self._device, dtype=self.dtype)

    @staticmethod
    def _fp32(energy: torch.Tensor) -> torch.Tensor:
        return energy.float() if energy.dtype in (torch.bfloat16, torch.float16) else energy

    def __call__(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        with self._autocast(params):
            return self._fp32(self.inner(params, indices))

    def evaluate(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None) -> Evaluation:
        with self._autocast(params):
            energy, grads, stats = self.inner.evaluate(params, indices)
        return Evaluation(self._fp32(energy), grads, stats)

    def potential_and_grad(self, params: Params, indices: Optional[Dict[str, torch.Tensor]] = None
                           ) -> Tuple[torch.Tensor, Params]:
        energy, grads, _ = self.evaluate(params, indices)
        return energy, grads


__all__ = ["AutocastTarget", "check_autocast", "BF16_NAMES"]
