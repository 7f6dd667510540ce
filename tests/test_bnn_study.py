"""The BNN study's pieces: the shifted test sets, the loss trend, the pairing of every family's two
methods, and the counting of the paper's claim from paired differences over seeds; the study on the
CNN (``--network cnn``)."""

import functools
import math

import numpy as np
import pytest
import torch

from pyro_flat.datasets import DigitsOOD
from pyro_flat.experiments.bnn.families import bnn_network, fit_method, loss_trend
from pyro_flat.experiments.bnn.report import _pair_rows, findings, summarize
from pyro_flat.experiments.configs import BNN_FAMILIES, BNNConfig
from pyro_flat.models import BayesianCNN, BayesianMLP
from pyro_flat.data.shift import add_noise, rotate_images, shifted_test_sets
from pyro_flat.roundoff import assert_close_roundoff


def test_a_quarter_turn_is_numpys_rot90_and_four_give_the_image_back():
    images = torch.rand(3, 784)
    turned = rotate_images(images, 90.0)
    expected = torch.from_numpy(np.rot90(images.reshape(3, 28, 28).numpy(), k=1, axes=(1, 2)).copy()).reshape(3, 784)
    assert torch.allclose(turned, expected, atol=1e-5)
    back = images
    for _ in range(4):
        back = rotate_images(back, 90.0)
    assert torch.allclose(back, images, atol=1e-5)
    assert torch.allclose(rotate_images(images, 0.0), images, atol=1e-5)


def test_a_rotation_keeps_a_centred_blob_and_moves_an_offset_one_on_its_circle():
    yy, xx = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    blob = torch.exp(-((yy - 13.5) ** 2 + (xx - 20.0) ** 2) / 4.0).reshape(1, 784)
    turned = rotate_images(blob, 30.0).reshape(28, 28)
    mass = turned.sum()
    assert float(mass) == pytest.approx(float(blob.sum()), rel=1e-3)  # well inside the frame: nothing lost
    cy, cx = float((turned * yy).sum() / mass), float((turned * xx).sum() / mass)
    # the centre of mass, 6.5 right of the image centre, turns 30 degrees counter-clockwise on screen
    assert cx == pytest.approx(13.5 + 6.5 * math.cos(math.radians(30)), abs=0.05)
    assert cy == pytest.approx(13.5 - 6.5 * math.sin(math.radians(30)), abs=0.05)


def test_noise_has_the_asked_sd_is_clipped_and_seeded():
    grey = torch.full((400, 784), 0.5)
    noisy = add_noise(grey, 0.1, torch.Generator().manual_seed(0))
    n = noisy.numel()
    # 5 sd from both clips: the clipped law is the Gaussian's up to 6e-7 of the mass
    assert float(noisy.mean()) == pytest.approx(0.5, abs=4 * 0.1 / math.sqrt(n))
    assert float(noisy.std()) == pytest.approx(0.1, rel=4 / math.sqrt(2 * n))
    loud = add_noise(grey, 2.0, torch.Generator().manual_seed(0))
    assert float(loud.min()) == 0.0 and float(loud.max()) == 1.0
    assert torch.equal(add_noise(grey, 0.0, torch.Generator()), grey)
    sets = shifted_test_sets(grey[:5], rotations=(), noise_sds=(0.3,), seed=4)
    assert torch.equal(sets[0][2], shifted_test_sets(grey[:5], rotations=(), noise_sds=(0.3,), seed=4)[0][2])
    with pytest.raises(ValueError, match="sd must be >= 0"):
        add_noise(grey, -0.1, torch.Generator())
    with pytest.raises(ValueError, match="not a square number"):
        rotate_images(torch.rand(2, 10), 30.0)


def test_loss_trend_reads_the_last_two_fifths():
    falling = torch.linspace(10.0, 1.0, 50)[None]  # falls by 9/49 per record: 10 records per fifth
    drop, se = loss_trend(falling)
    assert drop == pytest.approx(10 * 9 / 49, rel=1e-6) and se > 0
    two = torch.ones(2, 50)
    two[0, -10:], two[1, -10:] = 0.9, 1.1
    drop, se = loss_trend(two)  # two trajectories: the mean of their drops, 0.1 and -0.1, ± sd/√2
    assert drop == pytest.approx(0.0, abs=1e-12) and se == pytest.approx(0.1, rel=1e-6)


def _runs(effects, seeds=3, noise=0.02):
    """Made-up runs: for each family (top-eigenvalue change, ECE change[, accuracy change, shifted
    NLL change]) of its sharpness-aware method, plus a seed-to-seed wobble shared by both methods of a seed (what pairing removes) and a
    wobble of their own, laid out so that each paired difference has standard error ``noise`` (a
    tenth of it for the ECE) about its effect."""
    rng = np.random.default_rng(0)
    own = {0: (1.0, -1.0, 0.0), 1: (0.0, 1.0, -1.0)}  # plain's and sharp's: differences (-1, 2, -1), sd 3^0.5
    runs = []
    for family, (plain, sharp) in BNN_FAMILIES.items():
        d_top, d_ece, d_acc, d_shift = (tuple(effects[family]) + (0.0, 0.0))[:4]
        for seed in range(seeds):
            shared = rng.normal(0.0, 1.0)  # large: unpaired errors would hide every effect
            for k, method in enumerate((plain, sharp)):
                top, ece, acc, nll = 10.0 + k * d_top, 0.10 + k * d_ece, 0.9 + k * d_acc, 0.5 + k * d_shift
                wobble = own[k][seed % 3]
                runs.append({"label": family if method == plain else "SA-" + family, "method": method,
                             "seed": seed, "steps": 10, "grad_evals": 10, "seconds": 1.0, "loss_drop": 0.0,
                             "loss_drop_se": 0.01, "accuracy": acc + 0.01 * wobble, "nll": 0.3, "ood_auroc": 0.8,
                             "top_eigenvalue": top + shared + noise * wobble,
                             "trace": 100.0 + shared, "ece": ece + 0.1 * shared + noise / 10 * wobble,
                             "shift": [{"kind": "rotation", "strength": 30.0, "accuracy": 0.8,
                                        "nll": nll + shared + noise * wobble, "ece": 0.2}]})
    return runs


def test_the_claim_is_counted_from_paired_differences_beyond_the_t_critical_value():
    effects = {"SGLD": (-1.0, -0.02, 0.05, -0.1), "BBB": (-1.0, 0.0, -0.05, 0.1), "SWAG": (0.0, -0.02),
               "MC-dropout": (1.0, 0.02), "ensemble": (-1.0, -0.02, 0.0, -0.1)}
    report = {"runs": _runs(effects), **summarize(_runs(effects))}
    verdicts = {p["family"]: (p["top_eigenvalue"]["verdict"], p["ece"]["verdict"]) for p in report["pairs"]}
    assert verdicts == {"SGLD": ("better", "better"), "BBB": ("better", "tie"), "SWAG": ("tie", "better"),
                        "MC-dropout": ("worse", "worse"), "ensemble": ("better", "better")}
    text = " ".join(findings(report))
    assert ("holds here for 2 of the 5 comparable families (SGLD, ensemble) over 3 seeds, counting a difference when "
            "the mean paired difference exceeds t = 4.30 standard errors (the 95 % t critical value for 3 seeds)") in text
    assert "Flatter (lower top eigenvalue): 3 (SGLD, BBB, ensemble); sharper: MC-dropout." in text
    assert "Better calibrated (lower ECE): 3 (SGLD, SWAG, ensemble); worse: MC-dropout." in text
    assert "No fit's objective was still falling" in text
    accuracy = {p["family"]: p["accuracy"]["verdict"] for p in report["pairs"]}  # higher is better
    assert accuracy == {"SGLD": "better", "BBB": "worse", "SWAG": "tie", "MC-dropout": "tie", "ensemble": "tie"}
    assert "rotation at its strongest (30°), sharpness-aware against plain over the 5 comparable families and 3 " \
           "seeds: NLL better in 2, worse in 1" in text
    row = next(r for r in report["rows"] if r["label"] == "SGLD")
    pair = next(p for p in report["pairs"] if p["family"] == "SGLD")  # unpaired, the seeds' wobble swamps the effect
    assert row["top_eigenvalue"]["n"] == 3 and row["top_eigenvalue"]["se"] > 5 * pair["top_eigenvalue"]["se"]


@pytest.mark.parametrize("seeds, sigmas, verdict", [(3, 3.0, "tie"), (3, 5.0, "better"), (10, 3.0, "better")])
def test_a_paired_difference_counts_beyond_the_t_critical_value_for_its_seeds(seeds, sigmas, verdict):
    """3 standard errors is a tie over 3 seeds (t = 4.30) and a difference over 10 (t = 2.26): the rule
    is the paired t-test's, not a fixed 2 standard errors."""
    plain = [{"seed": s, **{m: 0.0 for m in ("accuracy", "nll", "ece", "ood_auroc", "top_eigenvalue", "trace")},
              "shift": []} for s in range(seeds)]
    wobble = np.resize([1.0, -1.0], seeds)
    wobble -= wobble.mean()
    wobble /= wobble.std(ddof=1) / np.sqrt(seeds)  # the paired differences' standard error: exactly 1
    sharp = [{**p, "top_eigenvalue": -sigmas + w} for p, w in zip(plain, wobble)]
    pair = _pair_rows(plain, sharp)["top_eigenvalue"]
    assert pair["se"] == pytest.approx(1.0) and pair["mean"] == pytest.approx(-sigmas)
    assert pair["verdict"] == verdict


def test_a_family_with_a_fit_still_improving_is_not_compared():
    """A pair whose plain or sharpness-aware fit was still falling at the end compares budgets: its verdicts
    are 'not converged' and no count includes it (BBB's fits had not converged in the study's run)."""
    runs = _runs({"SGLD": (-1.0, -0.02), "BBB": (-1.0, -0.02), "SWAG": (-1.0, -0.02), "MC-dropout": (-1.0, -0.02),
                  "ensemble": (-1.0, -0.02)})
    for r in runs:
        if r["label"] == "BBB":
            r["loss_drop"], r["loss_drop_se"] = 0.5, 0.01  # still falling, 50 standard errors
    report = {"runs": runs, **summarize(runs)}
    bbb = next(p for p in report["pairs"] if p["family"] == "BBB")
    assert not bbb["converged"] and bbb["top_eigenvalue"]["verdict"] == bbb["ece"]["verdict"] == "not converged"
    text = " ".join(findings(report))
    assert "Not comparable (1 of 5 families: BBB)" in text
    assert "holds here for 4 of the 4 comparable families (SGLD, SWAG, MC-dropout, ensemble)" in text


def test_one_seed_counts_no_claim():
    report = summarize(_runs({f: (-1.0, -0.02) for f in BNN_FAMILIES}, seeds=1))
    assert {p["top_eigenvalue"]["verdict"] for p in report["pairs"]} == {"one seed"}
    assert findings(report)[0].startswith("One seed: no error bars, so no claim is counted")


@pytest.fixture(scope="module")
def small_data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(120, 16, generator=g)
    y = (X[:, 0] > X[:, 1]).long()
    return DigitsOOD(X[:80], y[:80], X[80:], y[80:], torch.rand(20, 16, generator=g), (0, 1), (2,))


@pytest.mark.parametrize("network", ["mlp", "cnn"])
@pytest.mark.parametrize("family", list(BNN_FAMILIES))
def test_a_family_s_two_methods_start_from_the_same_weights(family, network, small_data):
    """The pairing of the report: at one seed the plain and the sharpness-aware method start from
    the same weights (with a vanishing step they end there too), and at another seed elsewhere; on
    either network (small_data's 16 inputs are 4x4 images to the CNN)."""
    # steps small enough to leave the weights within 0.01 of the start, large enough to move SWAG's iterates
    config = BNNConfig(network=network, hidden=(4,), channels=(2, 3), batch_size=20, grad_evals=16, num_chains=2,
                       num_draws=2, step_size=1e-7, svi_lr=1e-7, svi_init_scale=1e-6, rho=1e-6, sam_rho=1e-6,
                       swag_rank=2, progress=False)
    net = bnn_network(config, small_data)
    assert isinstance(net, BayesianCNN if network == "cnn" else BayesianMLP)
    plain, sharp = (fit_method(m, config, net, small_data, seed=3) for m in BNN_FAMILIES[family])
    other = fit_method(BNN_FAMILIES[family][0], config, net, small_data, seed=4)
    for name, value in plain.flat_points.items():
        assert torch.allclose(sharp.flat_points[name], value, atol=0.01), name
    assert not torch.allclose(other.flat_points["layers.0.weight"], plain.flat_points["layers.0.weight"], atol=0.01)
    assert sharp.steps == plain.steps // 2 == 8
    assert (plain.grad_evals, sharp.grad_evals) == (plain.steps, 2 * sharp.steps)


def test_the_sabma_row_is_swag_then_sabma_from_its_posterior_within_the_budget(small_data, monkeypatch):
    """``sabma`` runs the SA-BMA paper's pipeline: the SWAG row's fit (the same SGD trajectory, moments and
    rank) for S1 steps, then SABMA_ELBO(sabma_gamma) for S2 steps from ``low_rank_guide()``: with a vanishing
    Adam step it ends at the SWAG posterior. The gradient evaluations actually made (backward passes and
    ``autograd.grad`` calls, counted) are S1 + 2 S2 = grad_evals, and the records are the SA-BMA phase's."""
    from dataclasses import replace

    from pyro.infer.autoguide import AutoLowRankMultivariateNormal

    import pyro_flat.variational
    from pyro_flat.experiments.bnn.families import sabma_split, steps_for
    from pyro_flat.variational import AutoSWAG, SABMA_ELBO

    config = BNNConfig(hidden=(4,), batch_size=20, grad_evals=43, num_chains=2, num_draws=2, swag_rank=2,
                       svi_lr=1e-9, progress=False)
    swag_steps, sabma_steps = sabma_split(config)
    assert (swag_steps, sabma_steps) == (23, 10) and steps_for("sabma", config) == 33

    losses = []

    class CountedSABMA(SABMA_ELBO):
        def loss_and_grads(self, *args, **kwargs):
            losses.append(self)
            return super().loss_and_grads(*args, **kwargs)

    evaluations = [0]

    def counted(fn):
        def wrapper(*args, **kwargs):
            evaluations[0] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(pyro_flat.variational, "SABMA_ELBO", CountedSABMA)
    monkeypatch.setattr(torch.autograd, "backward", counted(torch.autograd.backward))
    monkeypatch.setattr(torch.autograd, "grad", counted(torch.autograd.grad))
    net = BayesianMLP(16, (4,), 2)
    fit = fit_method("sabma", config, net, small_data, seed=3)
    assert evaluations[0] == fit.grad_evals == swag_steps + 2 * sabma_steps == config.grad_evals
    assert len(losses) == sabma_steps and {e.gamma for e in losses} == {config.sabma_gamma}
    assert fit.steps == swag_steps + sabma_steps
    assert fit.records.shape == (1, sabma_steps - sabma_steps // 2)  # the SWAG phase's second half: 12
    assert isinstance(fit.guide, AutoLowRankMultivariateNormal) and isinstance(fit.swag, AutoSWAG)
    assert fit.swag.iterations_seen == swag_steps

    monkeypatch.undo()
    swag = fit_method("swag", replace(config, grad_evals=swag_steps), net, small_data, seed=3).guide
    expected = swag.posterior()  # the SWAG row's own fit on S1 evaluations: the same law
    torch.testing.assert_close(fit.swag.posterior().loc, expected.loc, rtol=0, atol=0)
    torch.testing.assert_close(fit.swag.posterior().covariance_matrix, expected.covariance_matrix, rtol=0, atol=0)
    assert fit.swag.rank == swag.rank == 2 and expected.cov_factor.abs().sum() > 0
    with torch.no_grad():
        final = fit.guide.get_posterior()
        torch.testing.assert_close(final.loc, expected.loc, rtol=0, atol=1e-6)
        torch.testing.assert_close(final.cov_diag, expected.cov_diag, rtol=1e-4, atol=0)  # 5e-10 to 3e-5
        torch.testing.assert_close(final.covariance_matrix, expected.covariance_matrix, rtol=1e-4, atol=1e-11)
    assert {k: v.shape[0] for k, v in fit.samples.items()} == {k: 4 for k in fit.samples}


def test_plus_minus_rounds_both_to_the_error_s_second_digit():
    from pyro_flat.experiments.bnn.report import plus_minus

    assert plus_minus(7372.0, 170.0) == "7372 ± 170" and plus_minus(3.8116, 0.034) == "3.812 ± 0.034"


def test_evaluate_predicts_with_dropout_and_measures_flatness_without(small_data):
    """MC-dropout's BMA averages fresh masks; its Hessian is the deterministic network's, so it equals
    that of the same weights in a network without dropout."""
    from pyro_flat.experiments.bnn.study import evaluate
    from pyro_flat.experiments.bnn.families import Fit

    config = BNNConfig(flatness_draws=1, trace_probes=4)
    torch.manual_seed(0)
    point = {"layers.0.weight": 2 * torch.randn(1, 8, 16), "layers.0.bias": torch.randn(1, 8),
             "layers.1.weight": 2 * torch.randn(1, 2, 8), "layers.1.bias": torch.randn(1, 2)}
    draws = {k: v.expand(64, *v.shape[1:]) for k, v in point.items()}
    rows = {}
    for p in (0.0, 0.5):
        fit = Fit("dropout", BayesianMLP(16, (8,), 2, dropout=p), draws, point, ("theta",), 1, 1, 0.0,
                  torch.zeros(1, 10))
        torch.manual_seed(1)
        rows[p] = evaluate(fit, "theta", config, small_data, [], seed=0)
    assert rows[0.5]["top_eigenvalue"] == pytest.approx(rows[0.0]["top_eigenvalue"], rel=1e-5)
    assert rows[0.5]["trace"] == pytest.approx(rows[0.0]["trace"], rel=1e-5)
    assert abs(rows[0.5]["nll"] - rows[0.0]["nll"]) > 0.01  # 64 masks averaged: not the deterministic net


def test_the_cnn_runs_its_chains_as_one_grouped_convolution_and_drops_units_as_the_mlp():
    """BayesianCNN's logits for weights (C, 1, *shape) are each chain's own network, on a minibatch per chain
    or on shared inputs; MC-dropout draws a mask per pass, and without_dropout is deterministic."""
    torch.manual_seed(0)
    net = BayesianCNN(784, (4, 8), 5, dropout=0.5)
    assert net.num_weights == 4 * 9 + 4 + 8 * 4 * 9 + 8 + 5 * 8 * 7 * 7 + 5 == 2301
    weights = [(torch.randn(3, 1, *layer.weight.shape), torch.randn(3, 1, *layer.bias.shape)) for layer in net.layers]
    one = lambda c: [(w[c, 0], b[c, 0]) for w, b in weights]  # noqa: E731
    per_chain, shared = torch.rand(3, 6, 784), torch.rand(6, 784)
    # one grouped convolution against one per chain sum in other orders: the longest reduction behind a logit is
    # the head's fan-in (8 * 7 * 7 = 392) times the depth (3); round-off of terms as large as the largest logit
    same_up_to_roundoff = functools.partial(assert_close_roundoff, length=392 * 3)
    with net.without_dropout():
        same_up_to_roundoff(net.logits(per_chain, weights),
                            torch.stack([net.logits(per_chain[c], one(c)) for c in range(3)]))
        same_up_to_roundoff(net.logits(shared, weights), torch.stack([net.logits(shared, one(c)) for c in range(3)]))
        assert torch.equal(net.logits(shared, one(0)), net.logits(shared, one(0)))
    assert not torch.equal(net.logits(shared, one(0)), net.logits(shared, one(0)))
    with pytest.raises(ValueError, match="the 1 standing for the data plate"):
        net.logits(shared, [(w[:, 0], b[:, 0]) for w, b in weights])


def _small_digits(load):
    """The embedded digits, fewer of them: a study of seconds on the real 28x28 images."""
    def small(*args, **kwargs):
        d = load(*args, **kwargs)
        return DigitsOOD(d.X_train[::10], d.y_train[::10], d.X_test[::5], d.y_test[::5], d.X_ood[::5], d.in_digits,
                         d.ood_digits)
    return small


def test_the_study_fits_every_family_on_the_cnn_and_its_report_says_so(tmp_path, monkeypatch):
    """``network="cnn"``: every method of the five families fits the BayesianCNN (MC-dropout its own, with
    dropout), every row has its numbers at both seeds, each family is paired over the seeds, and the
    report names the network."""
    from pyro_flat.experiments.bnn import study as bnn

    monkeypatch.setattr(bnn, "load_mnist_ood", _small_digits(bnn.load_mnist_ood))
    fitted = []

    def spy(method, config, net, data, seed=None):
        fit = fit_method(method, config, net, data, seed)
        fitted.append((method, type(net), type(fit.model), fit.model.dropout, fit.samples["layers.0.weight"].shape))
        return fit

    monkeypatch.setattr(bnn, "fit_method", spy)
    methods = tuple(m for pair in BNN_FAMILIES.values() for m in pair)
    config = BNNConfig.reduced(network="cnn", methods=methods, grad_evals=16, rho=0.1, num_draws=2, trace_probes=2,
                               rotations=(30.0,), noise_sds=(), out=str(tmp_path / "cnn"), progress=False)
    report = bnn.run_bnn_study(config, log=lambda text: None)
    assert [f[0] for f in fitted] == list(methods) * 2
    assert {f[1:3] for f in fitted} == {(BayesianCNN, BayesianCNN)}
    assert {f[0] for f in fitted if f[3] > 0} == {"dropout", "sa-dropout"}
    assert {f[4][-3:] for f in fitted} == {(1, 3, 3)}  # the first convolution's weights: (out, 1, 3, 3)
    assert report["config"]["network"] == "cnn" and report["num_weights"] == 2301
    metrics = ("accuracy", "nll", "ece", "ood_auroc", "top_eigenvalue", "trace")
    assert len(report["rows"]) == len(methods)
    for row in report["rows"]:
        assert row["seeds"] == [0, 1] and all(np.isfinite(row[m]["mean"]) and row[m]["n"] == 2 for m in metrics)
    pairs = {p["family"]: p for p in report["pairs"]}
    assert set(pairs) == set(BNN_FAMILIES) and all(p[m]["n"] == 2 for p in pairs.values() for m in metrics)
    text = (tmp_path / "cnn" / "report.md").read_text()
    assert text.startswith("# Every BNN family, plain and sharpness-aware, on a Bayesian CNN\n")
    assert "network: CNN: 3x3 convolutions of stride 2 (padding 1) with 4, 8 channels" in text
    assert "2,301 weights" in text and all(f"| {family} | " in text for family in BNN_FAMILIES)
    verdicts = {p[m]["verdict"] for p in pairs.values() for m in metrics}
    assert verdicts <= {"better", "worse", "tie", "not converged"}
    assert any(t.startswith("Not comparable") or "holds here for" in t for t in report["findings"])


def test_a_bad_network_is_one_line_naming_the_option(tmp_path, capsys):
    from pyro_flat.experiments.cli import main
    from pyro_flat.experiments.output import StudyError

    with pytest.raises(SystemExit) as exit:  # argparse's choices: refused before any work
        main(["bnn", "--network", "resnet", "--out", str(tmp_path / "o"), "--no-progress"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "--network" in err and "'resnet'" in err and err.count("\n") == 1 and not (tmp_path / "o").exists()
    with pytest.raises(StudyError, match="--network 'resnet' is not one of mlp, cnn"):
        BNNConfig(network="resnet").validate()


def test_the_sam_radius_defaults_to_the_networks_own_and_an_explicit_one_is_kept():
    """ρ = 0.5 keeps the CNN's SAM fits at chance (docs/studies/bnn.md): its default is 0.1, the MLP's stays 0.5."""
    from pyro_flat.experiments.cli import build_parser
    from pyro_flat.experiments.study_config import config_from_args

    for network, rho in (("mlp", 0.5), ("cnn", 0.1)):
        assert BNNConfig(network=network).rho == rho
        assert config_from_args(BNNConfig, build_parser().parse_args(["bnn", "--network", network])).rho == rho
        assert BNNConfig(network=network, rho=0.3).rho == 0.3
