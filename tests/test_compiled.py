"""The compiled fast path (jit_compile=True): the traced graph against the eager target, the same
random stream, and the fallback for models a trace cannot capture."""

import math
import warnings

import pytest
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
from pyro_flat import MCMC as VectorizedMCMC
from pyro_flat import SGHMC, SGLD, DivergenceError, EntropyHMC, EntropySGLD, LocalEntropySGLD
from pyro_flat.diagnostics import mcmc_sample_stats
from pyro_flat.models import BayesianMLP, logistic_regression
from pyro_flat.roundoff import assert_close_roundoff
from pyro_flat.schedules import cyclical_cosine
from pyro_flat.targets import CompiledTarget, CoupledPotential, ModelPotential, compile_target


def _data(n=300, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    y = torch.bernoulli(torch.sigmoid(X @ torch.randn(d, generator=g)), generator=g)
    return X, y


@pytest.mark.parametrize("num_chains", [None, 3])
def test_the_graph_gives_the_eager_energy_and_gradient(num_chains):
    X, y = _data()
    eager = CoupledPotential(ModelPotential(logistic_regression, (X, y), {"batch_size": 50}, num_chains=num_chains),
                             eta=0.5)
    params = eager.initial_params()
    compiled, reason = compile_target(CoupledPotential(eager.base, eta=0.5), params)
    assert reason is None and isinstance(compiled.base, CompiledTarget)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # new points and new minibatches: nothing of the trace's own is baked in
        point = {k: v + torch.randn(v.shape, generator=g) for k, v in params.items()}
        indices = eager.base.draw_indices()
        want_energy, want_grads = eager.base.potential_and_grad({k: point[k] for k in ("w", "b")}, indices)
        energy, grads = compiled.base.potential_and_grad({k: point[k] for k in ("w", "b")}, indices)
        assert energy.shape == want_energy.shape == (() if num_chains is None else (num_chains,))
        # the graph may sum in another order: the energy and each gradient gather 50 rows' products with 6 weights
        assert_close_roundoff(energy, want_energy, length=50 * 6)
        for name in want_grads:
            assert_close_roundoff(grads[name], want_grads[name], length=50 * 6, msg=name)


def test_a_network_compiles_and_matches():
    X, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    eager = ModelPotential(BayesianMLP(5, [8], 3), (X, y), {"batch_size": 16}, num_chains=2)
    params = eager.initial_params()
    compiled, reason = compile_target(eager, params)
    assert reason is None
    indices = eager.draw_indices()
    want, want_grads = eager.potential_and_grad(params, indices)
    got, grads = compiled.potential_and_grad(params, indices)
    # at most every one of the network's 75 weights meets every one of the minibatch's 16 rows
    assert_close_roundoff(got, want, length=16 * 75)
    for name in want_grads:
        assert_close_roundoff(grads[name], want_grads[name], length=16 * 75, msg=name)


def _run(kernel, seed, X, y, num_samples=200, warmup_steps=50, batch_size=30):
    pyro.set_rng_seed(seed)
    mcmc = VectorizedMCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, num_chains=2,
                          disable_progbar=True)
    mcmc.run(X, y, batch_size=batch_size)
    stats = {k: torch.stack([torch.as_tensor(d["sample_stats"][k]) for d in mcmc._diagnostics])
             for k in mcmc._diagnostics[0]["sample_stats"]}
    return mcmc.get_samples(), stats


def _entropy_run(jit, seed, X, y, **kwargs):
    kernel = EntropySGLD(logistic_regression, eta=0.1, step_size=1e-3, jit_compile=jit, **kwargs)
    draws, stats = _run(kernel, seed, X, y)
    assert kernel.is_compiled == bool(jit)
    return draws, stats, kernel


def _assert_same(a, b, iterations=250, batch_size=30):
    """The same draws (or statistics) up to round-off: each of the ``iterations`` gradients (:func:`_run`'s
    250 by default) gathers ``batch_size`` rows' products with 6 weights, and a draw adds them all up."""
    for name in a:
        assert_close_roundoff(b[name], a[name], length=iterations * batch_size * 6, msg=name)


@pytest.mark.parametrize("jit", ["fx", True])
def test_compiled_and_eager_runs_draw_the_same_stream(jit):
    """The graph draws its noise with the eager random operations, in the eager order (inductor's
    own random numbers are switched off), so a seeded compiled run repeats the eager one, draws and
    per-draw statistics (the minibatch energy, |θ - θa|) alike."""
    X, y = _data()
    eager, eager_stats, _ = _entropy_run(False, 3, X, y)
    compiled, stats, kernel = _entropy_run(jit, 3, X, y)
    other, _, _ = _entropy_run(jit, 4, X, y)
    assert kernel.compile_seconds > 0 and len(kernel._steps.graphs) == 1
    _assert_same(eager, compiled)
    assert set(stats) >= {"potential_energy", "coupling_distance"}
    _assert_same(eager_stats, stats)
    for name in eager:
        assert not torch.allclose(other[name], eager[name])


@pytest.mark.parametrize("jit", ["fx", True])
def test_a_kernel_drawing_several_minibatches_gets_them_all(jit):
    """LocalEntropySGLD draws a minibatch for each inner step: each must be its own graph input.
    With one epoch of data left (no reshuffle between the draws) the stream equals the eager one."""
    X, y = _data(n=6000)
    runs = []
    for flag in (False, jit):
        kernel = LocalEntropySGLD(logistic_regression, eta=0.5, step_size=1e-3, inner_step_size=1e-4,
                                  num_inner_steps=3, jit_compile=flag)
        runs.append(_run(kernel, 5, X, y, num_samples=30, warmup_steps=5, batch_size=20)[0])
        assert kernel.is_compiled == bool(flag)
    _assert_same(*runs, iterations=35 * 4, batch_size=20)  # each iteration: 3 inner gradients and the outer one


class _Blocks:
    """A constant step with alternating noise-free (exploration) and sampling blocks of 20."""

    def __call__(self, k):
        return 1.0

    def is_sampling(self, k):
        return (k // 20) % 2 == 1


def test_the_temperature_gets_its_own_graph():
    X, y = _data()
    eager, _, _ = _entropy_run(False, 6, X, y, schedule=_Blocks())
    compiled, _, kernel = _entropy_run("fx", 6, X, y, schedule=_Blocks())
    assert sorted(key[1] for key in kernel._steps.graphs) == [0.0, 1.0]
    _assert_same(eager, compiled)


def test_a_schedule_that_settles_is_compiled_once_it_repeats():
    X, y = _data()
    settling = lambda k: 1.0 / (1 + k) if k < 50 else 0.5  # noqa: E731  (warm-up: a new step each time)
    eager, _, _ = _entropy_run(False, 7, X, y, schedule=settling)
    compiled, _, kernel = _entropy_run("fx", 7, X, y, schedule=settling)
    assert len(kernel._steps.graphs) == 1
    _assert_same(eager, compiled)


class _FloatStepSGLD(SGLD):
    """A user's update that needs a Python-number step (``math.sqrt`` reads the tensor's value)."""

    def update(self, params, grads, step_size, temperature):
        scale = math.sqrt(step_size) * 0.0 + 1.0  # 1, but only computable from a number
        return self.langevin(params, grads, step_size * scale, temperature)


def test_an_update_that_needs_a_number_step_gets_a_graph_per_step_after_one_warning():
    X, y = _data()
    settling = lambda k: 1.0 / (1 + k) if k < 50 else 0.5  # noqa: E731
    draws = []
    for jit in (False, "fx"):
        kernel = _FloatStepSGLD(logistic_regression, step_size=1e-3, jit_compile=jit, schedule=settling)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            draws.append(_run(kernel, 7, X, y)[0])
        messages = [str(w.message) for w in caught if "jit_compile" in str(w.message)]
        if jit:
            assert len(messages) == 1 and "does not trace with the step size as a tensor" in messages[0]
            assert "the model reads" not in messages[0]  # the kernel's update does, not the model
            assert list(kernel._steps.graphs) and all(key[0] == 0.5e-3 for key in kernel._steps.graphs)
            assert kernel.is_compiled and not kernel._steps.step_input
    _assert_same(*draws)


def test_each_baked_step_size_gets_its_graph_up_to_a_limit():
    from pyro_flat.kernels.compiled_step import MAX_GRAPHS

    X, y = _data()
    declared = type("DeclaredFloatStepSGLD", (_FloatStepSGLD,), {"step_size_input": False})  # no trace to fail
    kernel = declared(logistic_regression, step_size=1e-3, jit_compile="fx",
                      schedule=lambda k: 1.0 / (1 + k // 10))  # a new step every 10 iterations
    with pytest.warns(RuntimeWarning, match=f"{MAX_GRAPHS} graphs compiled already"):
        draws, _ = _run(kernel, 0, X, y)
    assert len(kernel._steps.graphs) == MAX_GRAPHS and not kernel.is_compiled
    assert all(torch.isfinite(v).all() for v in draws.values())


def _cyclical_run(kernel_class, jit, seed=8, thinning=1, pyro_driver=False, **kwargs):
    X, y = _data()
    schedule = cyclical_cosine(num_steps=400, num_cycles=4, exploration=0.5)
    kwargs.setdefault("step_size", 2e-3)
    kernel = kernel_class(logistic_regression, jit_compile=jit, schedule=schedule, **kwargs)
    pyro.set_rng_seed(seed)
    if pyro_driver:  # one chain: the bias is a 0-d tensor
        mcmc = MCMC(kernel, 40, 20, disable_progbar=True)
    else:
        mcmc = VectorizedMCMC(kernel, 40, 20, num_chains=2, thinning=thinning, disable_progbar=True)
    mcmc.run(X, y, batch_size=50)
    return kernel, mcmc


@pytest.mark.parametrize("kernel_class, kwargs", [
    (EntropySGLD, {"eta": 0.1}),
    (SGHMC, {"momentum": 0.9}),
    (EntropySGLD, {"eta": 0.1, "preconditioner": "dense"}),
    (LocalEntropySGLD, {"eta": 0.5, "inner_step_size": 1e-4, "num_inner_steps": 2}),
    (EntropySGLD, {"eta": 0.1, "pyro_driver": True, "jit": True}),
    (SGHMC, {"momentum": 0.9, "pyro_driver": True}),
], ids=["EntropySGLD", "SGHMC", "EntropySGLD-dense", "LocalEntropySGLD", "EntropySGLD-pyro-inductor", "SGHMC-pyro"])
def test_a_cyclical_schedule_runs_compiled_with_the_step_as_an_input(kernel_class, kwargs):
    """A cosine schedule changes the step at every iteration: one graph per phase (temperature) serves
    them all, and the compiled run repeats the eager one. A graph that kept the step it was traced
    at would drift from it within a few iterations."""
    kwargs = dict(kwargs)
    jit = kwargs.pop("jit", "fx")
    if "preconditioner" in kwargs:
        kwargs["step_size"] = 0.05  # in the metric's units
    eager_kernel, eager = _cyclical_run(kernel_class, False, **kwargs)
    kernel, compiled = _cyclical_run(kernel_class, jit, **kwargs)
    assert all(v.dtype == torch.float32 for v in compiled.get_samples().values())
    assert kernel._steps.step_input and kernel.is_compiled
    assert sorted(key[1] for key in kernel._steps.graphs) == [0.0, 1.0]  # exploration and sampling
    assert all(key[0] is None for key in kernel._steps.graphs)
    want, got = eager.get_samples(group_by_chain=True), compiled.get_samples(group_by_chain=True)
    # 60 iterations of up to 3 gradients (LocalEntropySGLD's 2 inner steps and its own), each 50 rows * 6 weights
    for name in want:
        assert_close_roundoff(got[name], want[name], length=60 * 3 * 50 * 6, msg=name)
    steps = mcmc_sample_stats(compiled)["step_size"]
    torch.testing.assert_close(steps, mcmc_sample_stats(eager)["step_size"])
    assert len(set(steps.flatten().tolist())) > 10  # the step did change between draws


@pytest.mark.parametrize("backend", ["fx", True])
def test_fused_iterations_take_a_step_each(backend):
    """Thinning 4 under a cosine schedule: each fused call's 4 iterations have 4 step sizes, inputs of
    one graph; the draws and their recorded steps are the one-at-a-time run's."""
    runs = []
    for fused_steps in (1, None):
        kernel_class = type("Fused", (EntropySGLD,), {"fused_steps": fused_steps})
        kernel, mcmc = _cyclical_run(kernel_class, backend, thinning=4, eta=0.1)
        runs.append((kernel, mcmc))
    (one_kernel, one), (fused_kernel, fused) = runs
    assert [key for key in fused_kernel._steps.graphs if len(key) == 4] == [(None, 1.0, id(None), 4)]
    assert not any(len(key) == 4 for key in one_kernel._steps.graphs)
    want, got = one.get_samples(group_by_chain=True), fused.get_samples(group_by_chain=True)
    for name in want:  # 60 iterations, each a gradient over 50 rows * 6 weights
        assert_close_roundoff(got[name], want[name], length=60 * 50 * 6, msg=name)
    torch.testing.assert_close(mcmc_sample_stats(fused)["step_size"], mcmc_sample_stats(one)["step_size"])


def test_sghmc_with_friction_bakes_its_step_in():
    """``friction=`` derives the momentum from each step by a bisection in Python: graphs per step size,
    so a cosine schedule runs eagerly (without a warning), fused draws included, and a constant step compiles."""
    _, eager = _cyclical_run(SGHMC, False, friction=1.0, thinning=4)
    with pytest.warns(RuntimeWarning, match="no step size repeated in 50 iterations"):  # said once, not silent
        kernel, compiled = _cyclical_run(SGHMC, "fx", friction=1.0, thinning=4)
    assert not kernel._steps.step_input and not kernel._steps.graphs
    want, got = eager.get_samples(group_by_chain=True), compiled.get_samples(group_by_chain=True)
    for name in want:
        assert torch.equal(got[name], want[name])  # eager throughout: the same numbers
    X, y = _data()
    runs = []
    for jit in (False, "fx"):
        kernel = SGHMC(logistic_regression, step_size=1e-3, friction=1.0, jit_compile=jit)
        runs.append(_run(kernel, 2, X, y)[0])
        assert kernel.is_compiled == bool(jit)
    assert [key[0] for key in kernel._steps.graphs] == [1e-3]
    _assert_same(*runs)


def test_hmc_trajectories_use_the_graph_and_keep_the_stream():
    """With a fixed step: adaptation's trial trajectories with too large a step are unstable and
    amplify the graph's round-off (1e-6) until a Metropolis decision flips."""
    X, y = _data(n=80)
    draws = []
    for jit in (False, True):
        pyro.set_rng_seed(4)
        kernel = EntropyHMC(logistic_regression, eta=0.5, num_steps=4, step_size=0.05, adapt_step_size=False,
                            adapt_mass_matrix=False, jit_compile="fx" if jit else False)
        mcmc = MCMC(kernel, num_samples=50, warmup_steps=30, disable_progbar=True)
        mcmc.run(X, y, batch_size=None)
        assert kernel.is_compiled == jit
        draws.append(mcmc.get_samples())
    for name in draws[0]:  # 80 iterations of 4 leapfrog gradients and an energy, each over the 80 rows * 6 weights
        assert_close_roundoff(draws[1][name], draws[0][name], length=80 * 5 * 80 * 6, msg=name)


def _branchy(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    scale = 1.0 if mu > 0 else 2.0  # reads mu's value in Python: a trace cannot follow this
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, scale), obs=y)


def test_a_model_that_reads_values_runs_eagerly_after_one_warning():
    y = torch.randn(50) + 1.0
    draws = []
    for jit in (False, True):
        pyro.set_rng_seed(5)
        kernel = SGLD(_branchy, step_size=1e-3, jit_compile=jit)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc = VectorizedMCMC(kernel, num_samples=30, warmup_steps=0, num_chains=2,
                                  chain_method="sequential", disable_progbar=True)  # setup twice, warned once
            mcmc.run(y)
        messages = [str(w.message) for w in caught if "jit_compile" in str(w.message)]
        assert len(messages) == (1 if jit else 0)  # once for the kernel, not once per chain
        if jit:
            assert "runs eagerly" in messages[0] and "torch.where" in messages[0]
            assert not kernel.is_compiled
        draws.append(mcmc.get_samples()["mu"])
    torch.testing.assert_close(draws[1], draws[0])


def test_a_model_with_python_state_is_caught_by_the_comparison():
    calls = {"n": 0}

    def stateful(y):  # a different constant at every call: the trace would freeze the first one
        calls["n"] += 1
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu + calls["n"], 1.0), obs=y)

    target = ModelPotential(stateful, (torch.zeros(5),))
    same, reason = compile_target(target, target.initial_params())
    assert same is target and "control flow depends on values" in reason
    kernel = SGLD(stateful, step_size=1e-3, jit_compile="fx")  # the whole iteration, checked the same way
    with pytest.warns(RuntimeWarning, match="runs eagerly: the traced graph gives"):
        MCMC(kernel, num_samples=5, warmup_steps=0, disable_progbar=True).run(torch.zeros(5))
    assert not kernel.is_compiled and kernel._steps.disabled is not None


def test_bad_jit_compile_is_refused():
    with pytest.raises(ValueError, match="jit_compile must be True, False, 'fx' or 'inductor'"):
        SGLD(logistic_regression, step_size=1e-3, jit_compile="yes")
    with pytest.raises(ValueError, match="backend must be 'fx' or 'inductor'"):
        compile_target(ModelPotential(_branchy, (torch.zeros(3),)), {"mu": torch.zeros(())}, backend="xla")


def _fused_run(fused_steps, backend, **kernel_kwargs):
    X, y = _data()
    kernel = EntropySGLD(logistic_regression, eta=0.5, step_size=1e-3, jit_compile=backend, **kernel_kwargs)
    kernel.fused_steps = fused_steps
    pyro.set_rng_seed(0)
    mcmc = VectorizedMCMC(kernel, 60, 10, num_chains=2, thinning=4, disable_progbar=True)
    mcmc.run(X, y, batch_size=50)  # 6 minibatches an epoch: reshuffles fall inside fused blocks
    return kernel, mcmc


@pytest.mark.parametrize("backend", ["fx", True])
def test_fused_iterations_give_the_one_at_a_time_draws(backend):
    """Four iterations per graph call (thinning 4) give the draws and statistics of one iteration
    per call, on the same seed, up to round-off."""
    one_kernel, one = _fused_run(1, backend)
    fused_kernel, fused = _fused_run(None, backend)
    assert any(len(key) == 4 and key[-1] == 4 for key in fused_kernel._steps.graphs)  # a fused graph ran
    assert not any(len(key) == 4 for key in one_kernel._steps.graphs)
    want, got = one.get_samples(group_by_chain=True), fused.get_samples(group_by_chain=True)
    for name in want:  # 70 iterations, each a gradient over 50 rows * 6 weights
        assert_close_roundoff(got[name], want[name], length=70 * 50 * 6, msg=name)
    for name, value in mcmc_sample_stats(one).items():
        assert_close_roundoff(mcmc_sample_stats(fused)[name], value, length=70 * 50 * 6, msg=name)
    assert fused_kernel.num_grad_evals == one_kernel.num_grad_evals == 10 + 60


def _exploding(params):  # curvature 50: a step of 0.05 multiplies x by -1.5 each iteration
    return 25.0 * (params["x"] ** 2).sum(-1)


def test_a_divergence_inside_a_fused_graph_names_its_iteration_and_keeps_the_draws():
    def run(fused_steps):
        kernel = SGLD(potential_fn=_exploding, step_size=0.05, jit_compile="fx")
        kernel.fused_steps = fused_steps
        pyro.set_rng_seed(0)
        mcmc = VectorizedMCMC(kernel, 2000, 4, num_chains=3, thinning=8, disable_progbar=True,
                              initial_params={"x": torch.ones(3, 2)})
        with pytest.raises(DivergenceError) as info:
            mcmc.run()
        return kernel, info.value

    one_kernel, one = run(1)
    fused_kernel, fused = run(None)
    assert any(len(key) == 4 for key in fused_kernel._steps.graphs)
    assert (fused.iteration, fused.chain) == (one.iteration, one.chain)
    assert fused.iteration > 100 and (fused.iteration - 4) % 8 not in (0, 7)  # inside a fused block of 8
    assert fused.samples["x"].shape == one.samples["x"].shape and fused.samples["x"].shape[0] >= 12  # the draws made before iteration 104
    for i, draw in enumerate(one.samples["x"]):  # x grows 1.5-fold an iteration: each draw on its own scale
        assert_close_roundoff(fused.samples["x"][i], draw, length=fused.iteration * 2, msg=f"draw {i}")
    assert "iteration" in str(fused) and "chain" in str(fused)


def test_a_build_that_differs_from_its_matching_traced_graph_is_not_blamed_on_control_flow():
    from pyro_flat.tracing import mismatch

    pair = [("the new value", torch.tensor([1.0]), torch.tensor([2.0]))]
    assert "control flow depends on values" in mismatch(pair)
    built = mismatch(pair, built=True)
    assert built.startswith("inductor gives the new value 2 where the eager run gives 1")
    assert "traced graph it built matches the eager run" in built and "control flow" not in built.replace(
        "not the model's control flow", "")


def test_noise_follows_the_logical_order_of_a_channels_last_tensor():
    """Inside a compiled graph inductor may lay a convolution weight out channels-last; the noise drawn
    for it must be the eager run's, element for element (a fused EntropySGLD graph of a CNN was refused
    for this: randn_like fills memory in storage order)."""
    from pyro_flat.chains import chain_rand_like, chain_randn_like

    x = torch.zeros(2, 3, 4, 5)
    for draw in (chain_randn_like, chain_rand_like):
        torch.manual_seed(0)
        eager = draw(x)
        torch.manual_seed(0)
        laid_out = draw(x.to(memory_format=torch.channels_last))
        assert torch.equal(eager, laid_out)


def _mixed_dtypes(params):
    a, b, c = params["a"], params["b"], params["c"]
    return 0.5 * (a ** 2).sum(-1) + 0.5 * b.double() ** 2 * 4.0 + 0.5 * c ** 2


def test_each_site_takes_the_step_in_its_own_dtype():
    """A float32 vector, a float64 scalar and a float32 scalar under a cosine schedule: the graph's float64
    step is cast to each site's dtype, as ``alpha=`` casts a number, so no site changes dtype (a 0-d float32
    site times a 0-d float64 step would become float64) and the float64 site moves at float64 precision."""
    init = {"a": torch.ones(3), "b": torch.tensor(1.0, dtype=torch.float64), "c": torch.tensor(1.0)}
    draws = []
    for jit in (False, "fx"):
        pyro.set_rng_seed(3)
        kernel = SGLD(potential_fn=_mixed_dtypes, step_size=1e-3, jit_compile=jit,
                      schedule=cyclical_cosine(num_steps=200, num_cycles=2))
        mcmc = VectorizedMCMC(kernel, 40, 10, initial_params={k: v.clone() for k, v in init.items()},
                              disable_progbar=True)
        mcmc.run()
        assert kernel.is_compiled == bool(jit)
        assert {k: v.dtype for k, v in kernel._last_draw.items()} == {k: v.dtype for k, v in init.items()}
        draws.append(mcmc.get_samples())  # (Pyro's driver stacks the sites' draws in one dtype)
    for name, value in draws[0].items():  # 50 iterations, each summing a's 3 squares, in the site's own dtype
        assert_close_roundoff(draws[1][name], value, length=50 * 3, dtype=init[name].dtype, msg=name)
