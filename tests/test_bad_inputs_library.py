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


# ----------------------------------------------------------------------------- stress holes, second round
def _idx_root(root, images):
    """An MNIST folder of the IDX files of ``images`` (sevens and nines) for both splits."""
    from pyro_flat.datasets import MNIST_FILES, write_idx

    root.mkdir(exist_ok=True)
    labels = np.array([7, 9] * (len(images) // 2), np.uint8)
    for images_name, labels_name, _ in MNIST_FILES.values():
        write_idx(root / images_name, images)
        write_idx(root / labels_name, labels)
    return root


def test_idx_float_pixels_in_0_1_are_not_divided_by_255_again(tmp_path):
    images = np.random.default_rng(0).random((6, 28, 28)).astype(">f4")
    X, _ = load_mnist79(_idx_root(tmp_path / "mnist", images), verify=False)
    assert float(X.max()) == pytest.approx(float(images.max()), rel=1e-6)  # as the .npz path reads them


def test_idx_pixels_beyond_255_are_refused_naming_the_file(tmp_path):
    images = np.zeros((6, 28, 28), ">i2")
    images[0, 3, 4] = 1000
    match = r"train-images-idx3-ubyte: pixels range over 0\.\.1000; expected 0\.\.255"
    with pytest.raises(MNISTFileError, match=match):
        load_mnist79(_idx_root(tmp_path / "mnist", images), verify=False)


Y3 = torch.tensor([0, 1, 1])


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m.ece(torch.full((3, 2), 0.9), Y3), ValueError, r"probs rows must sum to 1 .* row 0 sums to 1\.8"),
    (lambda m: m.ece(torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), Y3), ValueError,
     r"probs must be probabilities in \[0, 1\], got an entry 3"),
    (lambda m: m.ece(torch.tensor([2.0, 3.0, 4.0]), Y3), ValueError,
     r"probs must be probabilities in \[0, 1\], got an entry 2"),
    (lambda m: m.ece(torch.empty(0), torch.empty(0)), ValueError, r"probs must be .* with N >= 1; got shape \(0,\)"),
    (lambda m: m.ece(torch.tensor([0.2, 0.7, 0.9]), Y3, n_bins=2.5), ValueError,
     "n_bins must be a positive integer, got n_bins=2.5"),
    (lambda m: m.auroc(torch.tensor([float("nan"), 0.5]), torch.tensor([0.1, 0.2])), ValueError,
     r"positive_scores holds NaN or inf \(at index 0\)"),
    (lambda m: m.ood_auroc(torch.tensor([[0.5, 0.5]]), torch.tensor([[float("nan"), 0.5]])), ValueError,
     r"probs_out must be probabilities in \[0, 1\], got an entry nan"),
    (lambda m: m.accuracy(torch.tensor([0.9, 0.1]), torch.tensor([0.7, 0.2])), ValueError,
     r"y must hold integer class labels 0\.\.1, got 0\.7"),
    (lambda m: m.accuracy(torch.tensor([0.9, 0.1]), torch.tensor([0.0, float("nan")])), ValueError,
     r"y must hold integer class labels 0\.\.1, got nan"),
    (lambda m: m.accuracy(torch.empty(0), torch.empty(0)), ValueError, r"probs must be .* with N >= 1"),
])
def test_metrics_refuse_what_is_not_probabilities_and_labels(call, error, match):
    from pyro_flat import metrics

    with pytest.raises(error, match=match):
        call(metrics)


def test_metrics_still_take_float32_rows_that_sum_to_1_up_to_rounding():
    from pyro_flat import metrics

    probs = torch.softmax(torch.randn(200, 10), -1).float() * (1 + 1e-6)  # averaged float32 rows drift
    labels = torch.randint(0, 10, (200,))
    assert 0.0 <= metrics.ece(probs, labels) <= 1.0 and 0.0 <= metrics.accuracy(probs, labels.double()) <= 1.0
    assert metrics.accuracy(torch.tensor([0.9, 0.2]), torch.tensor([True, False])) == 1.0


def test_logistic_regression_refuses_uint8_images_and_takes_integer_0_1_labels():
    from pyro_flat.models import logistic_regression

    X = torch.randint(0, 256, (10, 4), dtype=torch.uint8)
    with pytest.raises(TypeError, match=r"X must be a floating-point tensor, got dtype torch.uint8.*X.float\(\) / 255"):
        pyro.poutine.trace(logistic_regression).get_trace(X, None)
    Xf, y = X.float() / 255, torch.tensor([0, 1] * 5)
    for batch_size in (None, 4):
        trace = pyro.poutine.trace(logistic_regression).get_trace(Xf, y, batch_size=batch_size)
        assert trace.nodes["y"]["value"].dtype == torch.float32
    log_p = [pyro.poutine.trace(pyro.poutine.seed(logistic_regression, rng_seed=0)).get_trace(
        Xf, labels, batch_size=None).log_prob_sum() for labels in (y, y.float())]
    assert torch.equal(*log_p)  # read as the 0./1. floats
    with pytest.raises(ValueError, match=r"y must hold the labels 0 and 1 \(Bernoulli\), got the values \[0, 1, 2\]"):
        pyro.poutine.trace(logistic_regression).get_trace(Xf, torch.tensor([0, 1, 2] * 3 + [0]))


def test_bma_predict_takes_numpy_draws():
    draws = np.random.default_rng(0).normal(size=(4, 3))  # float64, the model float32
    expected = bma_predict(bernoulli_model, {"w": torch.as_tensor(draws, dtype=torch.float32)}, XT)
    assert torch.allclose(bma_predict(bernoulli_model, {"w": draws}, XT), expected)


@pytest.mark.parametrize("seed", [2 ** 70, 2 ** 64, -1])
def test_a_seed_out_of_range_is_refused_naming_seed(seed):
    match = rf"seed must be an integer from 0 to 2\*\*64 - 1 \(or None\), got seed={seed}"
    with pytest.raises(ValueError, match=match):
        hessian_trace(F3, Z3, seed=seed)
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 2"):
        power_iteration(F3, Z3, seed=seed)
    assert hessian_trace(F3, Z3, seed=2 ** 64 - 1).value == pytest.approx(6.0)


@pytest.mark.parametrize("eta", [float("inf"), float("nan"), -1.0])
def test_a_mixture_smoothing_eta_that_is_not_finite_and_nonnegative_names_eta(eta):
    from pyro_flat.mixtures import sharp_flat_1d

    with pytest.raises(ValueError, match=rf"eta must be >= 0 and finite .*got eta={eta}"):
        sharp_flat_1d().distribution(eta=eta)


def test_sam_elbo_with_a_guide_without_parameters_says_so():
    from pyro.infer import SVI

    from pyro_flat import SAM_ELBO

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    def guide(y):
        pyro.sample("mu", dist.Normal(0.0, 1.0))

    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), SAM_ELBO(rho=0.05))
    with pytest.raises(ValueError, match=r"the guide has no parameters to optimise: its draws of \['mu'\]"):
        svi.step(torch.randn(5))


def test_sam_elbo_evaluates_its_loss_under_svi_evaluate_loss():
    from pyro.infer import SVI
    from pyro.infer.autoguide import AutoNormal

    from pyro_flat import SAM_ELBO

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    pyro.clear_param_store()
    svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 0.05}), SAM_ELBO(rho=0.05))
    svi.step(torch.randn(5))
    assert np.isfinite(svi.evaluate_loss(torch.randn(5)))  # SVI runs it under torch.no_grad()


@pytest.mark.parametrize("args, needle", [
    (["--rotations", "nan"], "--rotations must be finite angles in degrees, got nan"),
    (["--rotations", "30", "inf"], "--rotations must be finite angles in degrees, got 30.0, inf"),
    (["--noise-sds", "inf"], "--noise-sds must be finite, got inf"),
])
def test_bnn_refuses_non_finite_shifts_before_fitting(tmp_path, capsys, monkeypatch, args, needle):
    from pyro_flat.experiments.bnn import study as bnn
    from pyro_flat.experiments.cli import main

    def fit(*_, **__):
        raise AssertionError("the study started fitting")

    monkeypatch.setattr(bnn, "across_ranks", fit)
    assert main(["bnn", *args, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and not (tmp_path / "o").exists()
