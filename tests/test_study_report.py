"""The MNIST study's verdict and reference comparison say what the numbers say."""

import pandas as pd
import torch

from pyro_flat.experiments.mnist79 import compare_with_reference, convergence_verdict


def _table(rows):
    return pd.DataFrame(rows, columns=["r_hat", "ess_bulk", "ess_tail"],
                        index=[f"w[{i}]" for i in range(len(rows))])


def test_verdict_follows_arviz_thresholds_and_names_the_worst():
    good = _table([[1.00, 2000, 1500], [1.01, 400, 400]])
    verdict = convergence_verdict(good)
    assert verdict["converged"] and verdict["text"].startswith("converged")
    for bad_row in ([1.02, 2000, 2000], [1.00, 399, 2000], [1.00, 2000, 399]):
        verdict = convergence_verdict(_table([[1.00, 2000, 2000], bad_row, [1.00, 1500, 1500]]),
                                      advice="run longer")
        assert not verdict["converged"] and verdict["worst"] == ["w[1]"]
        assert "1 of 3 coordinates" in verdict["text"] and verdict["text"].endswith("Run longer")
    hmc = convergence_verdict(good, {"acceptance_rate": torch.full((2, 5), 0.8),
                                     "diverging": torch.tensor([[0.0, 1.0, 0, 0, 0], [0, 0, 0, 1.0, 0]])})
    assert hmc["divergences"] == 2 and "acceptance rate 0.80, 2 divergent" in hmc["text"]


def test_reference_comparison_measures_shift_and_spread():
    g = torch.Generator().manual_seed(0)
    ref = {"w": torch.randn(4, 5000, 784, generator=g), "b": torch.randn(4, 5000, generator=g)}
    shifted = {k: 0.5 + 2.0 * torch.randn(v.shape, generator=g) for k, v in ref.items()}
    c = compare_with_reference(shifted, ref)["θ"]
    assert abs(c["median_abs_mean_diff"] - 0.5) < 0.05 and abs(c["median_sd_ratio"] - 2.0) < 0.05
    assert set(compare_with_reference(ref, ref)) == {"θ"}  # no θa without twins
