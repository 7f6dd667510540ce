"""The MNIST study's verdict and reference comparison say what the numbers say."""

import pandas as pd
import torch

from pyro_flat.diagnostics import convergence_verdict
from pyro_flat.experiments.mnist79.study import compare_with_reference


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


def test_verdict_reads_unrounded_r_hat_between_1_010_and_1_015():
    """az.summary rounds R-hat to 1.01, which passed the 1.01 threshold before. The chains' offsets
    are scaled until the unrounded split R-hat of one coordinate is 1.0125."""
    import arviz as az
    import numpy as np

    from pyro_flat import to_arviz
    from pyro_flat.diagnostics import convergence_verdict as verdict_of, diagnostics_table

    draws = np.random.default_rng(0).standard_normal((4, 4000, 2))  # (chain, draw, coordinate)
    centred = draws[..., 0] - draws[..., 0].mean(1, keepdims=True)
    offsets = np.array([-1.0, -0.3, 0.3, 1.0])[:, None]  # chain means apart: R-hat grows with the scale
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisect the scale to R-hat(w[0]) = 1.0125
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(az.rhat(centred + mid * offsets)) < 1.0125 else (lo, mid)
    draws[..., 0] = centred + lo * offsets
    idata = to_arviz({"w": torch.as_tensor(draws)})
    table = diagnostics_table(idata)
    assert 1.010 < table["r_hat"].max() < 1.015
    assert az.summary(idata, kind="diagnostics")["r_hat"].max() == 1.01  # what the old verdict read
    verdict = verdict_of(table)
    assert not verdict["converged"] and verdict["worst"] == ["w[0]"] and "R-hat 1.012" in verdict["text"]
