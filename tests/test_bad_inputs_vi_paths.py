"""Bad input to the flat-seeking ELBOs, transfer_model and the path functions gets one error that
names the argument and says what to pass (each case here failed, or gave a raw or misleading error,
before the checks)."""

import warnings

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro_flat import SABMA_ELBO, SAM_ELBO, transfer_model
from pyro_flat.flatness.path_dynamics import projected_dynamics
from pyro_flat.flatness.paths import curvature_along_path, minimum_energy_path, straight_path

BOWL = lambda x: (x ** 2).sum()  # noqa: E731
X = torch.tensor([1.0, 0.0])


@pytest.fixture(scope="module")
def line():
    return straight_path(BOWL, X, -X, num_points=5)


# ----------------------------------------------------------------------------- SAM_ELBO, SABMA_ELBO
@pytest.mark.parametrize("eta", ["x", "0.5", None, True])
def test_fisher_eta_of_the_wrong_type_is_named(eta):
    with pytest.raises(TypeError, match=r"fisher_eta must be a number, got .*fisher_eta=.*pass e.g. fisher_eta=1.0"):
        SABMA_ELBO(0.1, ball="fisher-sam", fisher_eta=eta)


@pytest.mark.parametrize("make, name", [(SAM_ELBO, "rho"), (SABMA_ELBO, "gamma")])
@pytest.mark.parametrize("bad", ["0.1", None, True, [0.1]])
def test_a_ball_size_of_the_wrong_type_is_a_type_error(make, name, bad):
    with pytest.raises(TypeError, match=f"{name} must be a number.*pass e.g. {name}="):
        make(bad)


@pytest.mark.parametrize("size", [torch.tensor(0.1), np.float32(0.1)])
def test_a_positive_tensor_or_numpy_ball_size_is_accepted(size):
    assert SAM_ELBO(size).rho == pytest.approx(0.1)
    assert SABMA_ELBO(size, ball="fisher-sam", fisher_eta=torch.tensor(0.5)).fisher_eta == 0.5


@pytest.mark.parametrize("make", [SAM_ELBO, SABMA_ELBO])
def test_a_base_elbo_without_particles_is_refused(make):
    with pytest.raises(ValueError, match="base.num_particles must be a positive integer.*Trace_ELBO"):
        make(0.1, base=Trace_ELBO(num_particles=0))


# ----------------------------------------------------------------------------- transfer_model
def two_layer(y=None):
    body = pyro.sample("body.weight", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    head = pyro.sample("head.weight", dist.Normal(0.0, 1.0))
    pyro.sample("y", dist.Normal(body.sum() * head, 1.0), obs=torch.tensor(1.0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_pretrained_values_are_refused_at_once(bad):
    with pytest.raises(ValueError, match=r"pretrained\['body.weight'\] has 1 non-finite entries of 3.*index \(1,\)"):
        transfer_model(two_layer, {"body.weight": torch.tensor([1.0, bad, 0.0])}, variational=["head"])
    # a value under a variational prefix is not used: it is not checked
    fitted = transfer_model(two_layer, {"body.weight": torch.ones(3), "head.weight": torch.tensor(bad)}, ["head"])
    pyro.clear_param_store()
    SVI(fitted, AutoNormal(fitted), pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step()


def test_a_non_finite_module_parameter_is_named():
    net = torch.nn.Linear(3, 1)
    with torch.no_grad():
        net.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"pretrained\['bias'\] has 1 non-finite"):
        transfer_model(two_layer, net, variational=["head"])


@pytest.mark.parametrize("pretrained", [None, torch.ones(3), [torch.ones(3)]])
def test_pretrained_must_be_a_dict_or_module(pretrained):
    with pytest.raises(TypeError, match="pretrained must be a dict"):
        transfer_model(two_layer, pretrained, variational=["head"])


def test_a_pretrained_value_that_is_not_a_tensor_is_named():
    with pytest.raises(TypeError, match=r"pretrained\['body.weight'\] must be a tensor"):
        transfer_model(two_layer, {"body.weight": "weights.pt"}, variational=["head"])


@pytest.mark.parametrize("variational", [None, 3])
def test_variational_of_the_wrong_type_is_named(variational):
    with pytest.raises(TypeError, match="variational must be a list of site names"):
        transfer_model(two_layer, {}, variational=variational)


def test_a_model_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="model must be a callable"):
        transfer_model("model", {}, variational=["head"])


# ----------------------------------------------------------------------------- minimum_energy_path's settings
@pytest.mark.parametrize("rounds", [-1, 1.5, True])
def test_insertion_rounds_must_be_a_non_negative_integer(rounds):
    with pytest.raises(ValueError, match="insertion_rounds must be a non-negative integer"):
        minimum_energy_path(BOWL, X, -X, num_points=5, insertion_rounds=rounds)


@pytest.mark.parametrize("steps", [-5, 0, 2.5, True])
def test_max_steps_must_be_a_positive_integer(steps):
    with pytest.raises(ValueError, match=f"max_steps must be a positive integer, got max_steps={steps}"):
        minimum_energy_path(BOWL, X, -X, num_points=5, max_steps=steps)


@pytest.mark.parametrize("points", ["x", -1, 2.5, 4])
def test_max_points_must_be_an_integer_of_at_least_num_points(points):
    with pytest.raises(ValueError, match="max_points must be an integer >= 5"):
        minimum_energy_path(BOWL, X, -X, num_points=5, max_points=points)


@pytest.mark.parametrize("name", ["spring", "step_size", "tol"])
@pytest.mark.parametrize("bad", [True, "1", None])
def test_float_settings_of_the_wrong_type_are_named(name, bad):
    with pytest.raises(TypeError, match=f"{name} must be a number"):
        minimum_energy_path(BOWL, X, -X, num_points=5, **{name: bad})


def test_numpy_numbers_are_accepted():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 5 steps do not converge
        path = minimum_energy_path(BOWL, X, -X, num_points=np.int64(5), step_size=np.float32(0.01),
                                   max_steps=np.int64(5), insertion_rounds=0)
    assert len(path.points) == 5


def test_a_gradient_fn_that_is_not_callable_is_named():
    with pytest.raises(TypeError, match="gradient_fn must be a function"):
        minimum_energy_path(BOWL, X, -X, num_points=5, gradient_fn=3)


# ----------------------------------------------------------------------------- gradients and losses during relaxation
@pytest.mark.parametrize("wrong, got", [(lambda z: torch.ones(3), r"shape \(3,\)"),
                                        (lambda z: z.sum(), r"shape \(\)"),
                                        (lambda z: z[None], r"shape \(1, 2\)")])
def test_a_gradient_of_the_wrong_shape_says_which_shape(wrong, got):
    with pytest.raises(ValueError, match=rf"gradient_fn must return a tensor of shape \(2,\) .*got {got}"):
        minimum_energy_path(BOWL, X, -X, num_points=5, gradient_fn=wrong)


def test_a_gradient_that_is_not_a_tensor_is_a_type_error():
    with pytest.raises(TypeError, match=r"gradient_fn must return a tensor of shape \(2,\).*got ndarray"):
        minimum_energy_path(BOWL, X, -X, num_points=5, gradient_fn=lambda z: (2 * z).numpy())


def test_a_nan_gradient_fn_is_reported_as_a_gradient_not_a_loss():
    with pytest.raises(ValueError, match=r"the gradient is nan at image 1 of the path \(of 5\) at relaxation step 1, "
                                         r"where the loss is finite.*gradient_fn"):
        minimum_energy_path(BOWL, X, -X, num_points=5, gradient_fn=lambda z: z * float("nan"))


def test_a_nan_autograd_gradient_of_a_finite_loss_blames_differentiability():
    cone = lambda z: torch.sqrt((z ** 2).sum()) + (z ** 2).sum()  # noqa: E731  finite at 0, gradient nan
    with pytest.raises(ValueError, match=r"the gradient is nan at image 1 of the path \(of 3\) at relaxation step 1, "
                                         r"where the loss is finite \(0\): loss_fn is not differentiable there"):
        minimum_energy_path(cone, X, -X, num_points=3)


def test_a_loss_that_turns_nan_during_relaxation_is_reported_as_the_loss_with_its_step():
    cliff = lambda z: torch.where(z[1] > 0.3, torch.tensor(float("nan")), (z ** 2).sum())  # noqa: E731
    uphill = lambda z: 2 * z - torch.tensor([0.0, 10.0])  # noqa: E731  pushes the images into the cliff
    with pytest.raises(ValueError, match=r"the loss is nan at image \d of the path \(of 5\) at relaxation step \d+"):
        minimum_energy_path(cliff, X, -X, num_points=5, gradient_fn=uphill)


# ----------------------------------------------------------------------------- the two ends
@pytest.mark.parametrize("start, end, error, message", [
    (torch.tensor([float("nan"), 0.0]), -X, ValueError, r"start must be finite, got start\[0\]=nan"),
    (X, torch.tensor([float("nan"), 0.0]), ValueError, r"end must be finite, got end\[0\]=nan"),
    (X, torch.tensor([float("inf"), 0.0]), ValueError, r"end must be finite, got end\[0\]=inf"),
    (torch.tensor([1, 0]), torch.tensor([-1, 0]), TypeError, "start must be a floating-point tensor.*int64"),
    (1.0, -1.0, ValueError, r"start must be a non-empty flat 1-D tensor, got shape \(\)"),
    (torch.ones(1, 2), -torch.ones(1, 2), ValueError, r"start must be a non-empty flat 1-D tensor, got shape \(1, 2\)"),
    (torch.ones(0), torch.ones(0), ValueError, r"start must be a non-empty flat 1-D tensor, got shape \(0,\)"),
    (None, -X, TypeError, "start must be a 1-D tensor"),
    (X, None, TypeError, "end must be a 1-D tensor"),
    (X, "far away", TypeError, "end must be a 1-D tensor"),
])
@pytest.mark.parametrize("function", [straight_path, minimum_energy_path])
def test_bad_ends_are_named(function, start, end, error, message):
    with pytest.raises(error, match=message):
        function(BOWL, start, end, num_points=5)


# ----------------------------------------------------------------------------- curvature_along_path
def test_curvature_along_path_checks_its_arguments(line):
    with pytest.raises(TypeError, match="path must be an EnergyPath"):
        curvature_along_path(BOWL, line.points)
    for tol in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="tol must be a positive finite number"):
            curvature_along_path(BOWL, line, tol=tol)
    with pytest.raises(TypeError, match="seed must be an integer or None"):
        curvature_along_path(BOWL, line, seed="x")


# ----------------------------------------------------------------------------- projected_dynamics
def dynamics(path, gradient_fn=lambda z: 2 * z, **kwargs):
    settings = dict(start=0.5, step_size=0.1, num_steps=3)
    return projected_dynamics(path, gradient_fn, **{**settings, **kwargs})


@pytest.mark.parametrize("name, bad", [("start", "0.5"), ("start", True), ("step_size", "x"), ("step_size", True),
                                       ("temperature", "x"), ("temperature", True)])
def test_projected_dynamics_names_numbers_of_the_wrong_type(line, name, bad):
    with pytest.raises(TypeError, match=f"{name} must be a number"):
        dynamics(line, **{name: bad})


def test_projected_dynamics_checks_its_path_gradient_fn_and_seed(line):
    with pytest.raises(TypeError, match="path must be an EnergyPath"):
        dynamics(line.points)
    with pytest.raises(TypeError, match="gradient_fn must be a function"):
        dynamics(line, None)
    with pytest.raises(TypeError, match="seed must be an integer or None"):
        dynamics(line, seed="x")
    assert dynamics(line, num_steps=np.int64(3), num_chains=np.int64(2)).position.shape == (4, 2)


@pytest.mark.parametrize("settings, shape, got", [
    ({}, r"\(2,\) like its input \(one chain\)", r"shape \(3,\)"),
    ({"constrained": True}, r"\(2,\) like its input \(one chain\)", r"shape \(3,\)"),
    ({"vectorized": True, "num_chains": 3}, r"\(3, 2\) like its input \(all chains", r"shape \(3,\)"),
])
def test_projected_dynamics_says_which_gradient_shape_it_expected(line, settings, shape, got):
    with pytest.raises(ValueError, match=f"gradient_fn must return a tensor of shape {shape}.*got {got}"):
        dynamics(line, lambda z: torch.ones(3), **settings)
    with pytest.raises(ValueError, match=r"got shape \(\)"):  # a scalar no longer broadcasts silently
        dynamics(line, lambda z: z.sum(), **settings)


def test_a_nan_gradient_in_projected_dynamics_blames_gradient_fn_not_the_step_size(line):
    with pytest.warns(RuntimeWarning, match="gradient_fn returned a non-finite gradient at finite weights.*Check "
                                            "gradient_fn"):
        run = dynamics(line, lambda z: z * float("nan"))
    assert run.diverged


def test_positions_and_points_of_the_wrong_kind_are_named(line):
    with pytest.raises(TypeError, match="position must be a number"):
        line.at("middle")
    with pytest.raises(ValueError, match=r"x must be points \(..., d\) with d=2.*got shape \(3,\)"):
        line.project(torch.ones(3))
