"""Bad inputs that a long run met late or not at all: each is refused up front, by one error naming
the argument and the fix (networks, their data and priors, predictions, draws folders, the image
study's options, CIFAR files)."""

import os
import pickle

import numpy as np
import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro_flat import MCMC, SGLD, OnlineBMA, bma_predict
from pyro_flat.data.cifar_files import ImageFileError, read_cifar, write_cifar
from pyro_flat.experiments.images.config import ImagesConfig
from pyro_flat.experiments.output import StudyError
from pyro_flat.models import BayesianCNN, BayesianMLP, LogisticRegressionPotential, logistic_regression
from pyro_flat.nn import BayesianModule, update_batchnorm
from pyro_flat.storage.draws_folder import DrawsDirError

NAN = float("nan")


def net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batchnorm_net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def one_draw(model):
    return {k: v.unsqueeze(0) for k, v in model.initial_params().items()}


@pytest.fixture
def data():
    torch.manual_seed(0)
    return torch.randn(32, 4), torch.randint(0, 3, (32,))


def test_1_nan_prior_loc_or_scale_names_the_prior(data):
    X, y = data
    with pytest.raises(ValueError, match=r"prior must be a positive prior sd s \(.*; s finite\).* got nan"):
        BayesianModule(net(), prior=NAN)
    nan_loc = lambda name, p: dist.Normal(torch.full(p.shape, NAN), 1.0).to_event(p.dim())  # noqa: E731
    nan_scale = lambda name, p: dist.Normal(0.0, torch.full(p.shape, NAN)).to_event(p.dim())  # noqa: E731
    for prior in (nan_loc, nan_scale):
        with pytest.raises(ValueError, match=r"prior\('0.weight', parameter\) made a distribution of invalid param"):
            BayesianModule(net(), prior=prior)
    with pyro.validation_enabled(False), pytest.raises(ValueError, match=r"prior\('0.weight', parameter\) returned a "
                                                                           "distribution whose Normal's loc holds NaN"):
        BayesianModule(net(), prior=nan_loc)
    for make in (lambda: BayesianMLP(4, [8], 3, prior_scale=NAN), lambda: BayesianCNN(16, [2], 3, prior_scale=NAN),
                 lambda: pyro.poutine.trace(logistic_regression).get_trace(X, (y > 0).float(), prior_scale=NAN)):
        with pytest.raises(ValueError, match="prior_scale must be a positive finite number, got prior_scale=nan"):
            make()
    with pytest.raises(ValueError, match="prior_precision must be finite and >= 0"):
        LogisticRegressionPotential(X, (y > 0).float(), NAN)


def test_2_bernoulli_labels_of_one_half_name_y(data):
    X, _ = data
    half = torch.full((32,), 0.5)
    model = BayesianModule(torch.nn.Linear(4, 1), likelihood="bernoulli")
    with pytest.raises(ValueError, match=r"y must hold the labels 0 and 1 for likelihood='bernoulli', got .*\[0.5\]"):
        model(X, half)
    with pytest.raises(ValueError, match=r"logistic_regression: y must hold the labels 0 and 1 .* \[0.5\]"):
        pyro.poutine.trace(logistic_regression).get_trace(X, half)
    pyro.poutine.trace(logistic_regression).get_trace(X, (half > 1).float())  # 0/1 floats pass


def test_3_inputs_of_the_wrong_shape_name_x_and_the_module_s_shape(data):
    X, y = data
    with pytest.raises(ValueError, match=r"x has rows of shape \(5,\) .*'0' \(Linear.*pass x of shape \(N, 4\)"):
        BayesianModule(net())(torch.randn(32, 5), y)
    model = BayesianModule(batchnorm_net())
    with pytest.raises(ValueError, match=r"batchnorm_data has rows of shape \(5,\) .*pass batchnorm_data of shape \(N, 4"):
        bma_predict(model, one_draw(model), X, batchnorm_data=torch.randn(32, 5))


def test_4_inputs_of_the_wrong_dtype_say_how_to_convert(data):
    X, y = data
    with pytest.raises(ValueError, match=r"x is torch.uint8: convert it, x.float\(\) \(pixels .*: x.float\(\) / 255\)"):
        BayesianModule(net())(torch.randint(0, 255, (32, 4), dtype=torch.uint8), y)
    model = BayesianModule(batchnorm_net())
    with pytest.raises(ValueError, match=r"batchnorm_data is torch.float64 .* pass batchnorm_data.to\(torch.float32\)"):
        bma_predict(model, one_draw(model), X, batchnorm_data=X.double())


def test_5_one_row_or_none_is_too_few_for_batchnorm(data):
    X, y = data
    model = BayesianModule(batchnorm_net())
    for rows, said in ((X[:1], "1 row"), (X[:0], "0 rows")):
        with pytest.raises(ValueError, match=f"batchnorm_data has {said} .* at least 2 rows"):
            bma_predict(model, one_draw(model), X, batchnorm_data=rows)
    with pytest.raises(ValueError, match=r"batch_size=1 gives minibatches of 1 row, but the BatchNorm layers \['1'\]"):
        model(X, y, batch_size=1)
    # the statistics pass takes 512 rows at a time: 513 rows leave no batch of one
    stats = update_batchnorm(model, one_draw(model), torch.randn(513, 4))
    assert torch.isfinite(stats["1.running_var"]).all()


def test_6_nan_in_data_that_is_no_model_argument_is_named(data):
    X, y = data
    bad = X.clone()
    bad[3, 1] = NAN
    model = BayesianModule(batchnorm_net())
    with pytest.raises(ValueError, match=r"batchnorm_data holds 1 NaN/inf value\(s\); clean or impute the data"):
        bma_predict(model, one_draw(model), X, batchnorm_data=bad)
    plain = BayesianModule(net(), transform=lambda x: x / 0.0)
    with pytest.raises(ValueError, match=r"transform's output holds 32 NaN/inf value\(s\)"):
        plain(X, y, batch_size=8)
    with pytest.raises(ValueError, match=r"bma_predict: model argument 0 holds 1 NaN/inf value\(s\); clean or impute"):
        bma_predict(plain, one_draw(plain), bad)
    with pytest.raises(ValueError, match=r"OnlineBMA: model argument 0 holds 1 NaN/inf value\(s\); clean or impute"):
        OnlineBMA(plain, bad, y=y)


def test_7_bad_initial_params_arguments_are_named():
    model = BayesianModule(net())
    wider = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['0.weight'\] has shape \(16, 4\), but the module's parameter "
                                         r"'0.weight' has shape \(8, 4\)"):
        model.initial_params(wider)
    with pytest.raises(ValueError, match="num_chains must be a positive integer, got num_chains=-1"):
        model.initial_params(num_chains=-1)
    with pytest.raises(ValueError, match=r"num_chains: the run would keep about .* GiB of starting weights.*"
                                         "num_chains=1,000,000,000,000 copies .* pass fewer chains"):
        model.initial_params(num_chains=10 ** 12)  # refused before any allocation


def test_8_a_shape_changing_transform_or_a_tuple_output_is_named(data):
    X, y = data
    model = BayesianModule(net(), transform=lambda x: x[..., :2])
    with pytest.raises(ValueError, match=r"transform must return a tensor of its input's shape, here \(8, 4\), got \(8, 2"):
        model(X, y, batch_size=8)

    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(x), x

    with pytest.raises(TypeError, match=r"forward returned a tuple, not a tensor: .*tensor of logits.*net\(x\)\[0\]"):
        BayesianModule(Pair())(X, y)


def logistic(X, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def test_9_unequal_twins_and_an_empty_draw_are_named():
    X = torch.randn(5, 2)
    for use in ("both", "aux"):
        with pytest.raises(ValueError, match=r"samples\['w_aux'\] has shape \(10, 3\), but samples\['w'\] \(10, 2\)"):
            bma_predict(logistic, {"w": torch.zeros(10, 2), "w_aux": torch.zeros(10, 3)}, X, use=use)
    with pytest.raises(ValueError, match=r"OnlineBMA.update: draws must be one draw \{site: \(chains, ...\) tensor\}"):
        OnlineBMA(logistic, X, y=torch.ones(5)).update({})


def gaussian():
    pyro.sample("mu", dist.Normal(torch.zeros(2), 1.0).to_event(1))


def test_10_draws_dir_paths_are_refused_before_any_sampling(tmp_path, monkeypatch):
    real = os.access  # root ignores permissions: take the mode bits as they are
    monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and not (
        mode & os.W_OK and not os.stat(p).st_mode & 0o200))
    steps = []
    make = lambda folder, **kw: MCMC(SGLD(gaussian, step_size=1e-3), num_samples=3, warmup_steps=2,  # noqa: E731
                                     draws_dir=folder, hook_fn=lambda *a: steps.append(a), disable_progbar=True, **kw)
    (tmp_path / "notes.txt").write_text("mine")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        for folder, said in ((tmp_path / "notes.txt", "is a file, not a folder"), (locked, "is read-only"),
                             (locked / "new", "is read-only"), ("", "names no folder")):
            with pytest.raises(ValueError, match=f"draws_dir='.*' .*{said}"):
                make(folder)
    finally:
        locked.chmod(0o700)
    assert (tmp_path / "notes.txt").read_text() == "mine"

    mine = tmp_path / "mine"  # a read-only mu.npy of the user's, then one of an earlier run
    mine.mkdir()
    np.save(mine / "mu.npy", np.arange(3.0))
    (mine / "mu.npy").chmod(0o400)
    with pytest.raises(DrawsDirError, match="draws_dir='.*mine' already holds '.*mu.npy'.*Pass another draws_dir="):
        make(mine).run()
    np.testing.assert_array_equal(np.load(mine / "mu.npy"), np.arange(3.0))
    assert not steps
    earlier = make(tmp_path / "earlier")
    earlier.run()
    (tmp_path / "earlier" / "mu.npy").chmod(0o400)
    kept = (tmp_path / "earlier" / "mu.npy").read_bytes()
    steps.clear()
    for mcmc in (earlier, make(tmp_path / "earlier", overwrite_draws=True)):
        with pytest.raises(DrawsDirError, match="draws_dir='.*earlier': .*mu.npy is read-only .*chmod u\\+w"):
            mcmc.run()
    assert not steps and (tmp_path / "earlier" / "mu.npy").read_bytes() == kept


def test_11_image_study_options_out_of_range_are_named():
    with pytest.raises(StudyError, match="--batch-size 100000 exceeds the training set size, 1,000 images"):
        ImagesConfig(batch_size=100000).validate()
    with pytest.raises(StudyError, match="--batch-size 32 exceeds the training set size, 16 images"):
        ImagesConfig().check_batch_size(16)  # the images loaded, where the files hold fewer than --train-size
    for options, name in ((dict(lr=1e308, eta=1e308), "--lr 1e\\+308"), (dict(temperature=1e308), "--temperature"),
                          (dict(weight_decay=1e308), "--weight-decay"), (dict(coupling=1e-300), "--coupling")):
        with pytest.raises(StudyError, match=f"{name} .*outside float32's range"):
            ImagesConfig(**options).validate()
    ImagesConfig(lr=1e30).validate()  # in range: such a run stops with a DivergenceError, one line on the CLI


@pytest.mark.parametrize("labels", [b"cat", 7])
def test_12_cifar_labels_that_are_no_list_of_integers_name_the_file(tmp_path, labels):
    write_cifar(tmp_path, "cifar10", "test", np.zeros((4, 3, 32, 32), np.uint8), np.arange(4))
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch = pickle.loads(path.read_bytes())
    batch[b"labels"] = labels
    path.write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(ImageFileError, match=f"{path}: b'labels' must be a list of integer class labels, one per "
                                             f"image, got {type(labels).__name__}"):
        read_cifar(tmp_path, "cifar10", "test")
