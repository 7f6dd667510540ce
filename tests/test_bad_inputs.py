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


def test_pyro_driver_zero_samples_is_refused_after_the_warmup_by_name():
    # Pyro's driver hands num_samples to no kernel: the kernel sees it only when the driver asks for its
    # diagnostics after a warm-up with no draw. A Pyro release that changes that order fails here.
    kernel = SGLD(gaussian, step_size=0.1)
    mcmc = PyroMCMC(kernel, num_samples=0, warmup_steps=50, disable_progbar=True)
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got num_samples=0"):
        mcmc.run()


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


# ----------------------------------------------------------------------------- round 3 (the stress run)
def test_a_chain_count_whose_state_cannot_fit_in_memory_is_refused_before_any_work(monkeypatch):
    """``num_chains=10**9`` was accepted (and would fail or run for hours); now refused at once."""
    with pytest.raises(ValueError, match=r"num_chains: the run would keep about .* GiB .* pass fewer chains"):
        MCMC(SGLD(gaussian, step_size=0.1), num_samples=10, num_chains=10 ** 9)
    # the model's real state size is checked before the model is traced for so many chains
    calls = []

    def wide():
        calls.append(1)
        pyro.sample("x", dist.Normal(torch.zeros(1000), 1.0).to_event(1))

    from pyro_flat import validation

    monkeypatch.setattr(validation, "machine_memory", lambda: 2 ** 27)  # a machine of 128 MiB
    mcmc = MCMC(SGLD(wide, step_size=0.1), num_samples=100, num_chains=300, disable_progbar=True)
    with pytest.raises(ValueError, match=r"num_chains=300 chains of 100 draws cannot be held in memory"):
        mcmc.run()
    assert len(calls) <= 2  # one chain's trace, not one per chain


def test_setup_traces_the_model_a_fixed_number_of_times_whatever_the_chain_count():
    """Setting up 10**6 chains took minutes: the vectorization probe and the initial point traced the
    model once per chain, twice over. The initial points still are independent draws of the prior."""
    calls = []

    def model():
        calls.append(1)
        pyro.sample("x", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        pyro.sample("s", dist.LogNormal(0.0, 1.0))

    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=1e-3)
    mcmc = MCMC(kernel, num_samples=1, warmup_steps=0, num_chains=4000, disable_progbar=True)
    mcmc.run()
    assert mcmc.chain_method == "vectorized" and len(calls) < 20, len(calls)
    start = kernel.initial_params
    assert start["x"].shape == (4000, 2) and start["s"].shape == (4000,)
    assert start["x"].unique(dim=0).shape[0] == 4000  # every chain its own point
    for values in (start["x"].reshape(-1), start["s"]):  # s is unconstrained: log s ~ N(0, 1)
        assert abs(float(values.mean())) < 0.06 and abs(float(values.std()) - 1) < 0.05


def test_many_chains_drawn_in_one_trace_do_not_depend_on_the_split_over_ranks():
    """Above ``TRACED_CHAINS_MAX`` chains the initial points come from one trace with a plate of chains;
    a rank's block of them is the same rows of the one-process draw (so one seed, the same draws)."""
    from pyro_flat.distributed import ChainShard, sharded
    from pyro_flat.targets import ModelPotential
    from pyro_flat.targets.potential import TRACED_CHAINS_MAX

    def model():
        with pyro.plate("features", 3):
            pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("s", dist.Gamma(2.0, 1.0))

    total = 2 * TRACED_CHAINS_MAX
    pyro.set_rng_seed(1)
    whole = ModelPotential(model, num_chains=total).initial_params()
    pyro.set_rng_seed(1)
    with sharded(ChainShard(total, TRACED_CHAINS_MAX, total)):
        mine = ModelPotential(model, num_chains=TRACED_CHAINS_MAX).initial_params()
    assert whole["w"].shape == (total, 3) and whole["s"].shape == (total,)
    for name in whole:
        assert torch.equal(mine[name], whole[name][TRACED_CHAINS_MAX:]), name


def test_a_latent_site_the_model_stops_sampling_is_named_not_random_walked():
    """A model that samples ``b`` at set-up and not afterwards: ``b`` got no potential, random-walked
    and was returned as draws (one chain), or vanished from the draws (vectorized chains)."""
    calls = []

    def model():
        calls.append(1)
        pyro.sample("a", dist.Normal(0.0, 1.0))
        if len(calls) <= 1:
            pyro.sample("b", dist.Normal(0.0, 1.0))

    for num_chains, method in [(1, "auto"), (4, "auto"), (4, "vectorized")]:
        calls.clear()
        mcmc = MCMC(SGLD(model, step_size=0.1), num_samples=20, warmup_steps=5, num_chains=num_chains,
                    chain_method=method, disable_progbar=True)
        with pytest.raises(ValueError, match="did not sample latent site 'b'") as caught:
            mcmc.run()
        assert type(caught.value).__name__ == "ChangedSitesError"


def test_integer_initial_params_of_a_potential_fn_are_read_as_floats():
    def potential(params):
        return 0.5 * (params["x"] ** 2).sum(-1)

    for kernel in (SGLD(potential_fn=potential, step_size=0.1),
                   EntropyHMC(potential_fn=potential, eta=0.5, step_size=0.1, num_steps=3)):
        for num_chains, start in [(1, {"x": torch.tensor([1, 2])}), (2, {"x": torch.tensor([[1, 2], [3, 4]])}),
                                  (1, {"x": [1, 2]})]:
            mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, num_chains=num_chains, initial_params=start,
                        disable_progbar=True)
            mcmc.run()
            assert mcmc.get_samples()["x"].dtype == torch.get_default_dtype()
    with pytest.raises(TypeError, match=r"initial_params\['x'\] is complex"):
        MCMC(SGLD(potential_fn=potential, step_size=0.1), num_samples=5, initial_params={"x": torch.ones(2) * 1j})


@pytest.mark.parametrize("kernel, needle", [
    ("sgld", r"kernel must be a kernel instance, got the string 'sgld'; .* MCMC\(SGLD\(model, step_size=1e-3\)"),
    ("nuts", r"got the string 'nuts'; .*the kernels by name: sgld"),
    (SGLD, r"got the class SGLD; pass one built with its model, e.g. MCMC\(SGLD\(model"),
    (3, r"kernel must be an MCMC kernel such as pyro_flat.SGLD"),
])
def test_a_kernel_given_by_name_or_class_says_to_pass_an_instance(kernel, needle):
    with pytest.raises(TypeError, match=needle):
        MCMC(kernel, num_samples=5)


def test_a_bad_dist_timeout_is_read_only_by_runs_across_ranks_and_named(monkeypatch):
    from pyro_flat.distributed import init_from_env

    monkeypatch.setenv("PYRO_FLAT_DIST_TIMEOUT", "abc")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert init_from_env().world_size == 1  # one process: the variable is not needed, not read
    mcmc = MCMC(SGLD(gaussian, step_size=0.1), num_samples=5, num_chains=2, chain_method="distributed",
                disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples(group_by_chain=True)["x"].shape == (2, 5, 3)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(ValueError, match=r"PYRO_FLAT_DIST_TIMEOUT='abc' is not a positive number of seconds .*"
                                         r"set it to one, e.g. PYRO_FLAT_DIST_TIMEOUT=300, or unset it"):
        init_from_env()


def test_synthetic2d_chains_beyond_memory_are_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """``pyro-flat synthetic2d --num-chains 1000000000`` ended in a 31-line MemoryError after 72 s."""
    from pyro_flat.experiments.synthetic2d import study as synthetic2d
    from pyro_flat.experiments.cli import main

    monkeypatch.setattr(synthetic2d, "run_synthetic2d", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["synthetic2d", "--num-chains", "1000000000", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--num-chains x --num-steps: the run would keep about" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
