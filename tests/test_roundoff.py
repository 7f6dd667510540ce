"""The round-off tolerance (pyro_flat/roundoff.py) bounds what another order of a sum changes, and no more:
one term at a time against torch.sum and against chunks of the reversed vector, over lengths and seeds."""

import numpy as np
import pytest
import torch

from pyro_flat.roundoff import assert_close_roundoff, roundoff_tolerance, unit_roundoff

LENGTHS = (10, 100, 1000, 10_000)
SEEDS = range(5)


def _one_at_a_time(x: torch.Tensor) -> torch.Tensor:
    """Recursive summation, each partial sum rounded to ``x``'s dtype (numpy's float32 scalars; bf16 through torch)."""
    if x.dtype == torch.float32:
        total = np.float32(0)
        for value in x.numpy():
            total = total + value
        return torch.tensor(total)
    total = torch.zeros((), dtype=x.dtype)
    for value in x:
        total = total + value
    return total


def _reversed_in_chunks(x: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    return torch.stack([part.sum() for part in x.flip(0).split(chunk)]).sum()


def _draw(kind: str, length: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(length, generator=g) if kind == "uniform" else torch.randn(length, generator=g)
    return x.to(dtype)


@pytest.mark.parametrize("kind", ["uniform", "normal"])  # all terms positive; terms that cancel
@pytest.mark.parametrize("length", LENGTHS)
def test_the_tolerance_bounds_other_orders_of_a_float32_sum_and_ten_times_it_fails(kind, length):
    for seed in SEEDS:
        x = _draw(kind, length, seed)
        scale = float(x.cumsum(0).abs().max())  # the partial sums' size: a normal sum may cancel to near zero
        expected = x.sum()
        for other in (_one_at_a_time(x), _reversed_in_chunks(x)):
            assert_close_roundoff(other, expected, length=length, scale=scale)
        rtol, atol = roundoff_tolerance(torch.float32, length, scale)
        beyond = expected + 10 * (atol + rtol * expected.abs())
        with pytest.raises(AssertionError, match=rf"round-off bound .* {length}-term reduction in float32"):
            assert_close_roundoff(beyond, expected, length=length, scale=scale)


@pytest.mark.parametrize("length", (10, 100))
def test_the_tolerance_bounds_bf16_sums_and_grows_with_the_length(length):
    """bf16 one term at a time (each partial sum rounded) against torch.sum (fp32 inside, rounded once)."""
    for seed in SEEDS:
        x = _draw("uniform", length, seed, torch.bfloat16)
        assert_close_roundoff(_one_at_a_time(x), x.sum(), length=length)
    four_times_longer = roundoff_tolerance(torch.bfloat16, 4 * length)
    assert four_times_longer == pytest.approx([2 * t for t in roundoff_tolerance(torch.bfloat16, length)])  # sqrt(n)


def test_coarser_dtypes_get_larger_tolerances_and_tf32_where_it_is_said_or_allowed_on_cuda():
    tolerances = [roundoff_tolerance(dtype, 1000, scale=3.0) for dtype in
                  (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(tolerances, tolerances[1:]))
    assert unit_roundoff(torch.bfloat16) == 2.0 ** -8 and unit_roundoff(torch.float32) == 2.0 ** -24
    assert unit_roundoff(torch.float32, "cuda", tf32=True) == unit_roundoff(torch.float16) == 2.0 ** -11
    assert unit_roundoff(torch.float32, "cpu", tf32=True) == 2.0 ** -11  # a GPU's result, moved to the CPU
    assert unit_roundoff(torch.float32, "cuda", tf32=False) == unit_roundoff(torch.float32, "cpu") == 2.0 ** -24
    assert unit_roundoff(torch.float64, "cuda", tf32=True) == 2.0 ** -53 and unit_roundoff(torch.int64) == 0.0


def test_mixed_dtypes_compare_at_the_coarser_ones_round_off():
    x = torch.rand(100, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert_close_roundoff(x.float().sum(), x.sum(), length=100)  # float32's sum against float64's
    with pytest.raises(AssertionError, match="in float64"):
        assert_close_roundoff(x.float().sum(), x.sum(), length=100, dtype=torch.float64)


@pytest.mark.parametrize("length, scale", [(0, 1.0), (10, -1.0), (10, float("nan"))])
def test_a_bad_length_or_scale_is_refused(length, scale):
    with pytest.raises(ValueError, match="length must be at least 1"):
        roundoff_tolerance(torch.float32, length, scale)
