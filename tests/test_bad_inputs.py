"""Issue 26's drivers, kernels and data files: each bad input gets one message naming the argument.

Every case here failed on the code before it (a raw traceback, a misleading warning, or silence).
"""

import warnings

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC as PyroMCMC
from pyro_flat import MCMC, SGLD, DivergenceError, EntropyHMC, EntropySGLD, to_arviz
from pyro_flat.datasets import MNISTFileError, load_mnist79, load_mnist_ood


def gaussian():
    pyro.sample("x", dist.Normal(torch.zeros(3), 1.0).to_event(1))


# ----------------------------------------------------------------------------- drivers and kernels
@pytest.mark.parametrize("num_steps", [True, 2.0, 0])
def test_entropy_hmc_refuses_a_bool_or_non_integer_num_steps(num_steps):
    with pytest.raises(ValueError, match=f"num_steps must be a positive integer, got num_steps={num_steps!r}"):
        EntropyHMC(gaussian, eta=0.1, num_steps=num_steps)


def test_pyro_driver_negative_warmup_is_refused_before_any_step():
    mcmc = PyroMCMC(SGLD(gaussian, step_size=0.1), num_samples=5, warmup_steps=-1, disable_progbar=True)
    with pytest.raises(ValueError, match="warmup_steps must be a non-negative integer, got warmup_steps=-1"):
        mcmc.run()


def test_pyro_driver_zero_samples_is_refused_before_the_warmup():
    kernel = SGLD(gaussian, step_size=0.1)
    mcmc = PyroMCMC(kernel, num_samples=0, warmup_steps=50, disable_progbar=True)
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got num_samples=0"):
        mcmc.run()
    assert kernel._iteration == 0  # refused in setup, not after the warm-up


@pytest.mark.parametrize("driver", [MCMC, PyroMCMC])
def test_to_arviz_before_run_says_run_first(driver):
    with pytest.raises(ValueError, match=r"has no draws: call mcmc.run\(...\) first"):
        to_arviz(driver(SGLD(gaussian, step_size=0.1), num_samples=5))


def test_to_arviz_of_something_else_names_what_it_takes():
    with pytest.raises(TypeError, match="to_arviz takes an MCMC object or a dict"):
        to_arviz([1, 2, 3])


def test_nan_initial_values_of_vectorized_chains_give_one_error_and_no_broadcast_warning():
    start = {"x": torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]])}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"initial_params\['x'\] holds NaN or inf \(chain 1\)"):
            MCMC(SGLD(gaussian, step_size=0.1), num_samples=5, num_chains=2, initial_params=start)
    assert not [w for w in caught if "broadcast" in str(w.message)]


@pytest.mark.parametrize("num_chains", [1, 3])
def test_a_finite_blow_up_is_a_divergence_and_keeps_the_draws_before_it(num_chains):
    """The step raised 1e8-fold after 150 iterations: the state jumps from O(1) to O(1e7), finite.
    Before, those draws were kept without a word; now the jump stops the chain like a NaN."""
    kernel = SGLD(gaussian, step_size=0.1, schedule=lambda k: 1.0 if k < 150 else 1e8)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, num_chains=num_chains, disable_progbar=True)
    with pytest.raises(DivergenceError, match=r"grew from .* in one iteration .* more than max_growth = 10000 "
                                              r"times: a finite blow-up") as err:
        mcmc.run()
    assert err.value.iteration == 150 and err.value.site == "x"
    assert err.value.samples["x"].shape == (50, 3) and float(err.value.samples["x"].abs().max()) < 10


def test_max_growth_none_keeps_only_the_nan_check():
    kernel = SGLD(gaussian, step_size=0.1, schedule=lambda k: 1e8 if k == 31 else 1.0)  # one huge step
    kernel.max_growth = None
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=30, disable_progbar=True)
    mcmc.run()  # the jump stays finite and relaxes: allowed when asked for
    assert float(mcmc.get_samples()["x"].abs().max()) > 1e4


def test_ordinary_runs_never_trip_the_growth_rule():
    """A long run from a start far in the tail (|x| = 50, then relaxing) makes no false divergence."""
    pyro.set_rng_seed(1)
    mcmc = MCMC(EntropySGLD(gaussian, eta=0.1, step_size=0.02), num_samples=2000, warmup_steps=0, num_chains=4,
                initial_params={"x": torch.full((4, 3), 50.0)}, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["x"].shape == (8000, 3)


# ----------------------------------------------------------------------------- data files
def _digits(n=60):
    rng = np.random.default_rng(0)
    labels = np.array([7, 9, 1, 7, 9, 3] * (n // 6))
    return rng.integers(0, 256, (n, 28, 28)).astype(np.uint8), labels


def test_a_corrupt_npz_is_named(tmp_path):
    path = tmp_path / "mnist.npz"
    path.write_bytes(b"PK\x03\x04" + b"garbage" * 20)
    with pytest.raises(MNISTFileError, match=r"mnist.npz: not a readable .npz file \(BadZipFile"):
        load_mnist79(path)


def test_float_pixels_already_in_unit_range_are_not_divided_again(tmp_path):
    images, labels = _digits()
    np.savez(tmp_path / "counts.npz", x_train=images, y_train=labels, x_test=images, y_test=labels)
    np.savez(tmp_path / "unit.npz", x_train=images / 255.0, y_train=labels, x_test=images / 255.0, y_test=labels)
    X_counts, y_counts = load_mnist79(tmp_path / "counts.npz")
    X_unit, y_unit = load_mnist79(tmp_path / "unit.npz")
    assert float(X_unit.max()) == pytest.approx(1.0) and torch.allclose(X_unit, X_counts, atol=1e-6)
    assert torch.equal(y_unit, y_counts)


@pytest.mark.parametrize("scale, needle", [(-1.0, r"pixels range over -255..0"), (2.0, "pixels range over 0..510")])
def test_pixels_on_no_known_scale_are_refused(tmp_path, scale, needle):
    images, labels = _digits()
    np.savez(tmp_path / "odd.npz", x_train=images * scale, y_train=labels, x_test=images, y_test=labels)
    with pytest.raises(MNISTFileError, match=needle):
        load_mnist79(tmp_path / "odd.npz")


def test_an_npz_without_sevens_or_nines_says_which_digits_are_missing(tmp_path):
    images, labels = _digits()
    no_nines = np.where(labels == 9, 1, labels)
    np.savez(tmp_path / "d.npz", x_train=images, y_train=no_nines, x_test=images, y_test=no_nines)
    with pytest.raises(MNISTFileError, match=r"has no image of digit\(s\) 9; it needs images of 7, 9"):
        load_mnist79(tmp_path / "d.npz")
    with pytest.raises(MNISTFileError, match=r"has no image of digit\(s\) 9; it needs images of 7, 9"):
        load_mnist_ood(tmp_path / "d.npz", in_digits=(7, 9))


# ----------------------------------------------------------------------------- round 2 (the stress run)
@pytest.mark.parametrize("kwargs, needle", [
    (dict(step_size="0.1"), "step_size must be a positive finite number, got step_size='0.1'"),
    (dict(step_size=1e-3, temperature="1"), "temperature must be a positive finite number, got temperature='1'"),
])
def test_numbers_given_as_strings_are_refused(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SGLD(gaussian, **kwargs)
    with pytest.raises(ValueError, match="eta must be a positive finite number, got eta='0.1'"):
        EntropySGLD(gaussian, eta="0.1", step_size=1e-3)


def test_other_kernel_numbers_are_named():
    from pyro_flat import LocalEntropySGLD

    with pytest.raises(TypeError, match="target_accept_prob must be a number"):
        EntropyHMC(gaussian, eta=0.1, target_accept_prob="abc")
    with pytest.raises(ValueError, match="max_tree_depth must be a positive integer, got max_tree_depth=True"):
        EntropyHMC(gaussian, eta=0.1, use_nuts=True, max_tree_depth=True)
    for weight in ("abc", None):
        with pytest.raises(TypeError, match="mean_weight must be a number"):
            LocalEntropySGLD(gaussian, eta=0.1, step_size=1e-3, mean_weight=weight)


@pytest.mark.parametrize("factor", [float("nan"), -1.0, 0.0, "1"])
def test_a_schedule_that_gives_no_positive_step_is_named(factor):
    mcmc = MCMC(SGLD(gaussian, step_size=1e-2, schedule=lambda k: 1.0 if k < 3 else factor), num_samples=5,
                warmup_steps=5, disable_progbar=True)
    with pytest.raises(ValueError, match=r"schedule\(3\) returned .*; a schedule must give a positive finite factor"):
        mcmc.run()


def test_summary_and_get_samples_without_draws_say_why():
    mcmc = MCMC(SGLD(gaussian, step_size=0.1), num_samples=5, disable_progbar=True)
    for call in (mcmc.summary, mcmc.get_samples):
        with pytest.raises(ValueError, match=r"has no draws: call mcmc.run\(...\) first"):
            call()
    diverging = MCMC(SGLD(gaussian, step_size=0.1, schedule=lambda k: 1.0 if k < 10 else 1e8), num_samples=20,
                     warmup_steps=5, disable_progbar=True)
    with pytest.raises(DivergenceError):
        diverging.run()
    for call in (diverging.summary, lambda: to_arviz(diverging)):
        with pytest.raises(ValueError, match="after a DivergenceError its draws are in err.samples"):
            call()


def test_initial_params_of_the_wrong_shape_or_type_are_named_in_the_users_shapes():
    start = {"x": torch.zeros(2, 5)}
    with pytest.raises(ValueError, match=r"initial_params\['x'\] has shape \(2, 5\), but the site's unconstrained "
                                         r"value has shape \(2, 3\)"):
        MCMC(SGLD(gaussian, step_size=0.1), num_samples=5, num_chains=2, initial_params=start).run()
    with pytest.raises(TypeError, match=r"initial_params\['x'\] must be a tensor"):
        MCMC(SGLD(gaussian, step_size=0.1), num_samples=5, initial_params={"x": "abc"})
