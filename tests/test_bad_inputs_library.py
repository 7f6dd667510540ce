"""Bad input to the flatness measures, the MNIST loaders, check_convergence and bma_predict gets one
error that names the argument and says what to pass (each case here failed before the checks: a
raw error from a dependency, a misleading message, or a silently wrong result)."""

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro_flat import bma_predict, check_convergence
from pyro_flat.datasets import MNISTFileError, load_mnist79, load_mnist_ood
from pyro_flat.flatness import eigenvalue_density, hessian_trace, lanczos, power_iteration, top_eigenvalues
from pyro_flat.flatness.loss import HessianOperator, as_flat_loss
from pyro_flat.theory.problems import GaussianProblem

F3 = lambda x: 0.5 * (x * torch.tensor([1.0, 2.0, 3.0])) @ x  # noqa: E731
Z3 = torch.zeros(3)


# ----------------------------------------------------------------------------- flatness
def test_lanczos_with_zero_max_steps_names_max_steps():
    with pytest.raises(ValueError, match="max_steps must be a positive integer, got max_steps=0"):
        top_eigenvalues(F3, Z3, method="lanczos", max_steps=0)
    with pytest.raises(ValueError, match="max_steps must be a positive integer, got max_steps=0"):
        lanczos(HessianOperator(as_flat_loss(F3, Z3)), torch.ones(3), 0)


@pytest.mark.parametrize("tol", [-1, float("nan"), 0])
def test_a_tolerance_that_is_not_positive_names_tol(tol):
    with pytest.raises(ValueError, match=f"tol must be a positive finite number, got tol={tol!r}"):
        top_eigenvalues(F3, Z3, method="lanczos", tol=tol)
    with pytest.raises(ValueError, match="tol must be a positive finite number"):
        power_iteration(F3, Z3, tol=tol)


def test_a_string_tolerance_is_a_type_error():
    with pytest.raises(TypeError, match="tol must be a number, got str tol='1e-3'"):
        top_eigenvalues(F3, Z3, method="lanczos", tol="1e-3")


def test_power_iteration_with_zero_iterations_names_max_iter():
    with pytest.raises(ValueError, match="max_iter must be a positive integer, got max_iter=0"):
        power_iteration(F3, Z3, max_iter=0)


@pytest.mark.parametrize("chunk_size", [0, -1, 2.5])
def test_hessian_trace_refuses_a_chunk_size_it_would_ignore(chunk_size):
    with pytest.raises(ValueError, match=f"chunk_size must be a positive integer, got chunk_size={chunk_size!r}"):
        hessian_trace(F3, Z3, chunk_size=chunk_size)


@pytest.mark.parametrize("name", ["num_probes", "num_steps"])
def test_eigenvalue_density_refuses_a_bool_count(name):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {name}=True"):
        eigenvalue_density(F3, Z3, **{name: True})


@pytest.mark.parametrize("measure", [
    lambda seed: hessian_trace(F3, Z3, seed=seed),
    lambda seed: top_eigenvalues(F3, Z3, method="exact", seed=seed),  # refused even where unused
    lambda seed: eigenvalue_density(F3, Z3, seed=seed),
    lambda seed: power_iteration(F3, Z3, seed=seed),
])
def test_a_seed_that_is_not_an_integer_is_a_type_error(measure):
    with pytest.raises(TypeError, match="seed must be an integer or None, got str seed='x'"):
        measure("x")


# ----------------------------------------------------------------------------- datasets
def _mnist_npz(path, **override):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)
    labels = np.array([7, 9, 7, 9, 7, 9])
    arrays = dict(x_train=images, y_train=labels, x_test=images, y_test=labels)
    arrays.update(override)
    np.savez(path, **arrays)
    return path


def test_a_root_that_is_not_a_path_is_a_type_error():
    with pytest.raises(TypeError, match="root must be a path .* or None, got int root=5"):
        load_mnist79(root=5)


@pytest.mark.parametrize("in_digits, error", [
    (("a",), TypeError), ((0.5, 1.7), TypeError), ((True, False), TypeError),
    ("01", TypeError), (None, TypeError), (3, TypeError),
])
def test_in_digits_must_be_a_sequence_of_integer_digits(in_digits, error):
    with pytest.raises(error, match=r"in_digits must .*in_digits=.*pass e.g. in_digits=\(0, 1, 2, 3, 4\)"):
        load_mnist_ood(in_digits=in_digits)


def test_complex_pixels_are_refused(tmp_path):
    path = _mnist_npz(tmp_path / "m.npz", x_train=np.zeros((6, 28, 28), np.complex64))
    with pytest.raises(MNISTFileError, match="x_train: pixels must be real numbers"):
        load_mnist79(path)


def test_a_nan_label_is_refused_not_dropped(tmp_path):
    path = _mnist_npz(tmp_path / "m.npz", y_train=np.array([7, 9, np.nan, 9, 7, 9]))
    with pytest.raises(MNISTFileError, match=r"labels hold NaN \(row 2\)"):
        load_mnist79(path)


def test_string_labels_are_refused(tmp_path):
    path = _mnist_npz(tmp_path / "m.npz", y_train=np.array(["7", "9", "7", "9", "7", "9"]))
    with pytest.raises(MNISTFileError, match="labels must be integers 0-9, found dtype <U1"):
        load_mnist79(path)


def test_an_npy_file_is_named_as_a_single_array(tmp_path):
    np.save(tmp_path / "arr.npy", np.zeros((6, 28, 28), np.uint8))
    with pytest.raises(MNISTFileError, match=r"arr.npy: a single array, not an .npz archive"):
        load_mnist79(tmp_path / "arr.npy")


def test_binary_uint8_pixels_warn_that_they_read_as_near_black(tmp_path):
    binary = (np.random.default_rng(0).random((6, 28, 28)) > 0.5).astype(np.uint8)
    path = _mnist_npz(tmp_path / "m.npz", x_train=binary)
    with pytest.warns(UserWarning, match="x_train: integer pixels only take the values 0 and 1"):
        X, _ = load_mnist79(path)
    assert float(X.max()) == pytest.approx(1 / 255)  # read as asked, no error


# ----------------------------------------------------------------------------- check_convergence
GAUSSIAN = GaussianProblem(torch.diag(torch.tensor([1.0, 4.0])))
SMALL = dict(step_size=0.05, num_chains=20, num_iterations=10, progress_bar=False, num_checkpoints=3,
             num_bootstrap=5)


@pytest.mark.parametrize("bad, error, match", [
    ({"estimator": "bogus"}, ValueError, r"estimator must be 'auto' or one of .*got estimator='bogus'"),
    ({"num_checkpoints": 0}, ValueError, "num_checkpoints must be an integer >= 2, got num_checkpoints=0"),
    ({"num_checkpoints": -2}, ValueError, "num_checkpoints must be an integer >= 2, got num_checkpoints=-2"),
    ({"num_bootstrap": 0}, ValueError, "num_bootstrap must be an integer >= 2, got num_bootstrap=0"),
    ({"initial_point": torch.zeros(5)}, ValueError, r"initial_point has shape \(5,\), but the problem has dimension 2"),
    ({"initial_point": torch.tensor([float("nan"), 0.0])}, ValueError, "initial_point holds NaN or inf"),
    ({"seed": "a"}, TypeError, "seed must be an integer or None, got str seed='a'"),
])
def test_check_convergence_names_the_bad_argument(bad, error, match):
    with pytest.raises(error, match=match):
        check_convergence(GAUSSIAN, "sgld", **{**SMALL, **bad})


# ----------------------------------------------------------------------------- bma_predict
def bernoulli_model(X, y=None):
    with pyro.plate("features", X.shape[1]):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=w @ X.T), obs=y)


XT = torch.randn(7, 3)


@pytest.mark.parametrize("samples, match", [
    ({"w": torch.empty(0, 3)}, r"samples hold no draws \(samples\['w'\] has shape \(0, 3\)\)"),
    ({"w": torch.full((4, 3), float("nan"))}, r"samples\['w'\] holds NaN"),
    ({"w": torch.randn(4, 5)}, r"samples\['w'\] has shape \(4, 5\), but the model's site 'w' has shape \(3,\)"),
    ({"w": torch.tensor(0.5)}, r"samples\['w'\] has shape \(\), but the model's site 'w' has shape \(3,\)"),
    ({"w": torch.randn(2, 4, 3)}, r"samples\['w'\] has shape \(2, 4, 3\), grouped by chain.*flatten the chain dim"),
])
def test_bma_predict_checks_the_draws_against_the_sites(samples, match):
    with pytest.raises(ValueError, match=match):
        bma_predict(bernoulli_model, samples, XT, use="theta")


def test_bma_predict_names_an_unknown_site_and_lists_the_sites():
    with pytest.raises(ValueError, match=r"no site 'nope'; the model's sample sites are \['w', 'y'\]"):
        bma_predict(bernoulli_model, {"w": torch.randn(4, 3)}, XT, use="theta", site="nope")


def test_bma_predict_refuses_samples_that_are_not_a_dict():
    with pytest.raises(TypeError, match="samples must be a dict .* got Tensor"):
        bma_predict(bernoulli_model, torch.randn(4, 3), XT)


def test_bma_predict_refuses_a_model_that_is_not_callable():
    with pytest.raises(TypeError, match="model must be the Pyro model .* got NoneType model=None"):
        bma_predict(None, {"w": torch.randn(4, 3)}, XT)


def test_bma_predict_of_good_draws_still_averages_over_them():
    draws = {"w": torch.randn(4, 3), "w_aux": torch.randn(6, 3)}  # twins may be as many or not
    assert bma_predict(bernoulli_model, draws, XT).shape == (7,)
