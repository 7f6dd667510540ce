"""Every kernel's seeded draws and per-draw statistics, pinned before the kernel-target contract was
rewritten (``tests/pinned_draws.py`` says how the file was made). A changed random stream, update
rule or statistic fails here; another CPU's summation order (float64, 1e-9 relative) does not."""

import json
import math

import pytest

from pinned_draws import PINNED, pinned_runs


@pytest.fixture(scope="module")
def runs(once_per_run):
    return once_per_run("pinned-runs", pinned_runs)


def _flat(value):
    if isinstance(value, list):
        for item in value:
            yield from _flat(item)
    else:
        yield value


PINNED_RUNS = json.loads(PINNED.read_text())


@pytest.mark.parametrize("case", sorted(PINNED_RUNS))
def test_seeded_draws_are_the_pinned_ones(runs, case):
    want, got = PINNED_RUNS[case], runs[case]
    assert sorted(got) == sorted(want), "the draws or statistics recorded changed"
    for key, values in want.items():
        expected, actual = list(_flat(values)), list(_flat(got[key]))
        assert len(actual) == len(expected), f"{key}: shape changed"
        for e, a in zip(expected, actual):
            assert math.isclose(a, e, rel_tol=1e-9, abs_tol=1e-12), f"{case}, {key}: {a!r} != pinned {e!r}"


def test_the_pinned_file_covers_every_kernel_and_their_statistics():
    from pyro_flat.kernels import KERNELS

    names = {case.split(",")[0] for case in PINNED_RUNS}
    assert names == {cls.__name__ for cls in KERNELS.values()}
    assert "stat coupling_distance" in PINNED_RUNS["EntropySGLD"]
    assert "stat acceptance_rate" in PINNED_RUNS["EntropyHMC"]
    assert "stat tree_depth" in PINNED_RUNS["EntropyHMC, NUTS, Gibbs aux"]
