r"""Round-off tolerances: how far two computations that are equal in exact arithmetic, but accumulate in
another order, may differ (a grouped convolution against one per chain, vmap against a loop, a compiled
graph against the eager run, a GPU against a CPU).

A sum of :math:`n` terms in floating point with unit roundoff :math:`u` errs by at most

.. math::  |\hat s - s| \le \gamma_n \sum_i |x_i|, \qquad \gamma_n = \frac{n u}{1 - n u},

but that bound is attained only when every rounding errs the same way. The roundings of a real sum are
independent enough that their errors add as a random walk: the error is about :math:`\sqrt{n}\, u` times
the magnitude of the partial sums, and beyond :math:`\lambda \sqrt{n}\, u` of it with a probability of order
:math:`e^{-\lambda^2/2}`. Two orders of one sum each err so, hence the rule

.. math::  \mathrm{rtol} = c \sqrt{n}\, u, \qquad \mathrm{atol} = c \sqrt{n}\, u \cdot \mathrm{scale},

with :math:`c = 8` (:data:`SAFETY`): :math:`e^{-32} \approx 10^{-14}` leaves room for millions of compared
elements and for the few layers a network passes a rounding through, and a difference of real
consequence (a wrong weight, a wrong random number) is still far above it (``tests/test_roundoff.py``
measures other orders of float32 sums at 1-6% of the bound, at every length). The deterministic
:math:`\gamma_n` is not used: it grows as :math:`n`, not :math:`\sqrt{n}`, and would hide such differences in
long reductions.

- :math:`n` is the longest reduction behind one output: for a network, its largest fan-in times its depth;
  for a chain's draw after :math:`T` iterations, :math:`T` times the longest reduction of an iteration
  (each iteration adds its round-off to the state).
- ``scale`` is the size of the partial sums, by default the largest :math:`|\mathrm{expected}|`; ``atol``
  covers the outputs near zero whose sums were not. Pass it where a sum cancels far below its terms.
- :math:`u` is ``torch.finfo(dtype).eps / 2`` (bf16 :math:`2^{-8}`, fp16 :math:`2^{-11}`, fp32 :math:`2^{-24}`),
  or TF32's :math:`2^{-11}` (10 mantissa bits) for float32 on a CUDA device whose matmuls or cuDNN
  convolutions may use it (``tf32=`` says so for tensors that were moved to the CPU before the comparison).
- The random walk needs :math:`n u \ll 1`: float32 up to millions of terms, bf16 (accumulated in bf16)
  only some tens; beyond, a sum of terms of one sign stagnates and errs systematically.

>>> rtol, atol = roundoff_tolerance(torch.float32, length=100, scale=2.0)
>>> round(rtol / 2.0 ** -24, 6), atol == 2 * rtol   # 8 * sqrt(100) units of float32's u
(80.0, True)
>>> x = torch.rand(10_000, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
>>> chunked = torch.stack([c.sum() for c in x.flip(0).split(128)]).sum()  # another order
>>> assert_close_roundoff(chunked, x.sum(), length=10_000)
"""

import math
from typing import Any, Optional, Tuple, Union

import torch

#: ``c`` of the rule: how many random-walk standard deviations of round-off a comparison allows
SAFETY = 8.0

#: the unit roundoff of TensorFloat-32 (10 mantissa bits), which CUDA matmuls and convolutions may use for float32
TF32_UNIT_ROUNDOFF = 2.0 ** -11


def tf32_allowed() -> bool:
    """Whether float32 matmuls or cuDNN convolutions on a CUDA device may run in TF32 (torch's flags, old and new)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    new = (getattr(matmul, "fp32_precision", None), getattr(getattr(cudnn, "conv", None), "fp32_precision", None))
    return "tf32" in new or bool(matmul.allow_tf32) or bool(cudnn.allow_tf32)


def unit_roundoff(dtype: torch.dtype, device: Union[torch.device, str, None] = None,
                  tf32: Optional[bool] = None) -> float:
    """``u`` of ``dtype``: half the gap between 1 and the next number; 0 for integers (exact). float32 gets
    TF32's where ``tf32`` is true, or where it is ``None`` on a CUDA ``device`` that :func:`tf32_allowed`."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0
    u = torch.finfo(dtype).eps / 2
    if tf32 is None:
        tf32 = device is not None and torch.device(device).type == "cuda" and tf32_allowed()
    return max(u, TF32_UNIT_ROUNDOFF) if tf32 and dtype in (torch.float32, torch.complex64) else u


def roundoff_tolerance(dtype: torch.dtype, length: int, scale: float = 1.0,
                       device: Union[torch.device, str, None] = None, *,
                       tf32: Optional[bool] = None) -> Tuple[float, float]:
    """``(rtol, atol)`` for two orders of a reduction of ``length`` terms of magnitude ``scale`` in ``dtype``:
    ``rtol = SAFETY * sqrt(length) * u`` and ``atol = rtol * scale`` (the module's docstring says why)."""
    if length < 1 or scale < 0 or not math.isfinite(scale):
        raise ValueError(f"length must be at least 1 and scale finite and >= 0; got {length} and {scale}")
    rtol = SAFETY * math.sqrt(length) * unit_roundoff(dtype, device, tf32)
    return rtol, rtol * scale


def assert_close_roundoff(actual: Any, expected: Any, *, length: int, dtype: Optional[torch.dtype] = None,
                          scale: Optional[float] = None, msg: Optional[str] = None,
                          tf32: Optional[bool] = None) -> None:
    """``torch.testing.assert_close`` with :func:`roundoff_tolerance`'s ``rtol`` and ``atol``: ``dtype`` by
    default the coarser of the two (two dtypes are compared in the finer), the device CUDA if either is,
    ``scale`` by default the largest finite ``|expected|``. A failure's message names the bound."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if dtype is None:
        dtype = max((actual.dtype, expected.dtype), key=lambda d: unit_roundoff(d))
    if actual.dtype != expected.dtype:
        common = torch.promote_types(actual.dtype, expected.dtype)
        actual, expected = actual.to(common), expected.to(common)
    device = "cuda" if "cuda" in (actual.device.type, expected.device.type) else "cpu"
    if scale is None:
        magnitudes = expected.detach().abs()
        magnitudes = magnitudes[torch.isfinite(magnitudes)]
        scale = float(magnitudes.max()) if magnitudes.numel() else 1.0
    rtol, atol = roundoff_tolerance(dtype, length, scale, device, tf32=tf32)
    u = unit_roundoff(dtype, device, tf32)
    bound = (f"round-off bound for two orders of a {length}-term reduction in {str(dtype).replace('torch.', '')}"
             f" (u = {u:.3g}): rtol = {SAFETY:g} * sqrt({length}) * u = {rtol:.3g}, atol = rtol * scale {scale:.3g}"
             f" = {atol:.3g}")

    def message(text: str) -> str:
        return "\n".join(filter(None, (msg, text, bound)))

    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=message)
