"""``pyro-flat images``: a reduced run writes its files and tables, the paper's claims are counted from the
numbers (a changed number changes the verdict), CIFAR runs from generated files of the official layout, and
bad options are one line."""

import json
import warnings

import numpy as np
import pytest

from pyro_flat.data.cifar_files import write_cifar
from pyro_flat.experiments.cli import main
from pyro_flat.experiments.images.report import CLAIMS, claims
from pyro_flat.roundoff import assert_close_roundoff

#: a tiny ResNet on 160 digits, 2 seeds, 4 epochs in 2 cycles (the convergence rule compares the two cycles'
#: ends; 10 nats accepts any: these runs test the plumbing, not the training)
SMALL = ["--network", "tiny-resnet", "--epochs", "4", "--cycles", "2", "--draw-epochs", "1", "--seeds", "2",
         "--train-size", "160", "--test-size", "40", "--flatness-images", "32", "--trace-probes", "2", "--batch-size",
         "32", "--lr", "0.05", "--inner-steps", "2", "--converged-within", "10", "--no-progress", "--threads", "1"]


def test_a_reduced_run_writes_the_report_tables_claims_and_figures(tmp_path, capsys):
    out = tmp_path / "images"
    assert main(["images", *SMALL, "--methods", "sgd", "sgd-ensemble", "sgld", "emcmc", "--ensemble-size", "2",
                 "--out", str(out)]) == 0
    said = capsys.readouterr().out
    # the paper's per-step coupling: η = lr / (N x 0.025) = 0.05 / (160 x 0.025)
    assert "per-step coupling lr / (N eta) = 0.05 / (160 x 0.0125) = 0.025" in said
    assert {"corruption.png", "interpolation.png", "report.json", "report.md"} <= {p.name for p in out.iterdir()}
    report = json.loads((out / "report.json").read_text())
    labels = ["SGD", "SGD ensemble", "SGLD", "Entropy-MCMC (θ)", "Entropy-MCMC (θa)", "Entropy-MCMC (both)"]
    assert list(report["summary"]) == labels and len(report["rows"]) == 2 * len(labels)
    assert report["data"]["n_train"] == 160 and report["data"]["n_test"] == 40
    assert report["scaled"]["eta"] == pytest.approx(0.05 / (160 * 0.025))
    for row in report["rows"]:
        assert 0 <= row["accuracy"] <= 1 and np.isfinite(row["nll"]) and len(row["corrupted_accuracy"]) == 5
        assert 0 <= row["ood_auroc"] <= 1 and 0 <= row["ood_aupr"] <= 1 and row["distance"] > 0
        assert (row["use"] == "both") == ("top_eigenvalue" not in row) == ("converged" not in row)
        # the same epochs for every method (4 x 5 iterations), the ensemble's 2 networks sharing them
        assert row["grad_evals"] == 4 * 5
        per_network = {"sgd": 1, "sgd-ensemble": 2, "sgld": 4, "emcmc": 4}[row["method"]]
        assert row["draws"] == per_network * (2 if row["use"] == "both" else 1)
    assert [c["metric"] for c in report["claims"]] == [m for m, _, _ in CLAIMS]
    assert all(c["verdict"] in ("reproduced", "tied", "contradicted") for c in report["claims"])
    pairs = report["claims"][0]["pairs"]
    assert {p["other"]: p["counted"] for p in pairs} == {"SGD": True, "SGD ensemble": False, "SGLD": True}
    assert all(p["detectable"] > p["declared_at"] > 0 for p in pairs)
    text = (out / "report.md").read_text()
    assert "| Entropy-MCMC (both) |" in text and "t = 12.71 standard errors" in text  # 2 seeds: df 1
    assert "| **per-step coupling lr / (N η)** | **0.025** |  |" in text  # the paper's: no departure to name
    assert "| training images N | 160 | 50,000 |" in text and "this run declares an NLL difference beyond" in text
    assert report["protocol"]["lr"] == 0.05 and report["scaled"]["step_size"] == pytest.approx(0.05 / 160)


def test_the_convergence_verdict_changes_when_a_fit_is_cut_short():
    """The same SGD fit of the small ResNet on 160 digits, 40 epochs in 2 cycles against 4: the long one ends its two
    cycles at the same training NLL (within 0.05 nats; 0.02 measured), the cut one does not (0.54), so its claims
    would not be tested."""
    from pyro_flat.experiments.images import study as images
    from pyro_flat.experiments.images.config import ImagesConfig

    verdicts = {}
    for epochs in (40, 4):
        config = ImagesConfig.reduced(methods=("sgd",), seeds=1, train_size=160, epochs=epochs, cycles=2, lr=0.5,
                                      network="small-resnet", converged_within=0.05, device="cpu")
        data = images.load_image_data(config)
        fit = images.fit_method("sgd", config, data, seed=0)
        verdicts[epochs] = images.convergence(fit, "theta", data, data.X_train[:64], config.converged_within)
    assert verdicts[40]["converged"] and verdicts[40]["train_nll_change"] < 0.05
    assert not verdicts[4]["converged"] and verdicts[4]["train_nll_change"] > 0.05
    assert verdicts[4]["train_nll"] > verdicts[40]["train_nll"]


def test_a_claim_is_not_tested_where_a_method_did_not_converge():
    rows = _rows([0.95, 0.96, 0.97], [0.90, 0.91, 0.92])
    assert claims(rows, [("accuracy", "x", False)])[0]["verdict"] == "reproduced"
    rows[-1]["converged"] = False  # one SGD fit did not converge
    claim = claims(rows, [("accuracy", "x", False)])[0]
    assert claim["verdict"] == "not tested (not converged)" and claim["not_converged"] == ["SGD"]


def _rows(ours, theirs, metric="accuracy"):
    return ([{"label": "Entropy-MCMC (both)", "seed": s, metric: v} for s, v in enumerate(ours)]
            + [{"label": "SGD", "seed": s, metric: v} for s, v in enumerate(theirs)])


@pytest.mark.parametrize("ours, verdict", [
    ([0.910, 0.921, 0.931], "reproduced"),   # differences 0.010, 0.011, 0.011: 19 standard errors
    ([0.910, 0.890, 0.931], "tied"),         # 0.010, -0.020, 0.011: within t = 4.30 standard errors
    ([0.890, 0.899, 0.911], "contradicted"),  # -0.010, -0.011, -0.009
])
def test_a_claim_follows_the_paired_differences_at_the_t_critical_value(ours, verdict):
    theirs = [0.900, 0.910, 0.920]
    claim = claims(_rows(ours, theirs), [("accuracy", "the highest test accuracy", False)])[0]
    assert claim["verdict"] == verdict
    # lower is better flips the sign: the same numbers as NLLs make the opposite verdict
    nll = claims(_rows(ours, theirs, "nll"), [("nll", "the lowest NLL", True)])[0]["verdict"]
    assert nll == {"reproduced": "contradicted", "contradicted": "reproduced", "tied": "tied"}[verdict]


def test_a_difference_just_inside_the_critical_value_is_a_tie_and_just_outside_is_not():
    theirs = [0.0, 0.0, 0.0]
    spread = np.array([-1.0, 0.0, 1.0])  # sd 1, se 1/sqrt(3)
    se = 1 / np.sqrt(3)
    for factor, verdict in ((4.25, "tied"), (4.36, "reproduced")):  # t(0.975, 2) = 4.303
        ours = list(factor * se + spread)
        assert claims(_rows(ours, theirs), [("accuracy", "x", False)])[0]["verdict"] == verdict


def test_cifar10_runs_from_generated_files_of_the_official_layout_and_resumes(tmp_path, monkeypatch, capsys):
    """The reader and the CIFAR path, one seed; then the same run killed in its second fit and continued with
    --resume gives the uninterrupted run's numbers (the CIFAR path's data are tensors on the device, whose
    minibatches the checkpoint's streams hold)."""
    from scipy.io import savemat
    from pyro_flat.experiments.images import study as study

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    labels = np.arange(100) % 10
    # a learnable set: each class is a colour
    images = (rng.integers(0, 40, size=(100, 3, 32, 32)) + (labels * 20)[:, None, None, None]).astype(np.uint8)
    write_cifar(data, "cifar10", "train", images, labels, parts=5)
    write_cifar(data, "cifar10", "test", images[:40], labels[:40])
    savemat(data / "test_32x32.mat", {"X": images[:20].transpose(2, 3, 1, 0), "y": np.ones((20, 1))})
    out = tmp_path / "out"
    small = [a for a in SMALL if a not in ("--train-size", "160", "--test-size", "40")]
    assert main(["images", "--dataset", "cifar10", "--data-dir", str(data), *small, "--lr", "0.02", "--methods", "sgd", "emcmc",
                 "--seeds", "1", "--out", str(out)]) == 0  # the reader and the CIFAR path: one seed is enough
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["n_train"] == 100 and report["data"]["n_test"] == 40 and report["data"]["ood"] == "SVHN's test set"
    assert report["data"]["corruptions"].startswith("generated here")  # no CIFAR-10-C folder
    assert "95.69 %" in (out / "report.md").read_text()  # the paper's table beside the run

    score = study.evaluate

    def killed_at_emcmc(fit, *a, **k):
        if fit.method == "emcmc":
            raise KeyboardInterrupt
        return score(fit, *a, **k)

    monkeypatch.setattr(study, "evaluate", killed_at_emcmc)
    args = ["images", "--dataset", "cifar10", "--data-dir", str(data), *small, "--lr", "0.02", "--methods", "sgd",
            "emcmc", "--seeds", "1", "--checkpoint-every", "0.005", "--out", str(tmp_path / "killed")]
    main(args)
    assert "seed0-emcmc.ckpt" in {p.name for p in (tmp_path / ".killed.checkpoints").iterdir()}
    monkeypatch.setattr(study, "evaluate", score)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "seed 0 Entropy-MCMC: continuing from its checkpoint" in capsys.readouterr().out
    resumed = json.loads((tmp_path / "killed" / "report.json").read_text())["rows"]
    for mine, want in zip(resumed, report["rows"], strict=True):
        for key in ("accuracy", "nll", "ece", "corrupted_accuracy", "ood_auroc", "top_eigenvalue"):
            assert mine.get(key) == want.get(key), (mine["label"], key)


@pytest.mark.parametrize("args, needle", [
    (["--dataset", "cifar10"], "--dataset cifar10 reads the official files from --data-dir"),
    (["--dataset", "cifar10", "--data-dir", "EMPTY"], "cifar-10-batches-py: missing; get cifar-10-python.tar.gz"),
    (["--preset", "emcmc-cifar", "--dataset", "cifar10", "--data-dir", "EMPTY", "--epochs", "10"],
     "fixes --epochs"),
    (["--preset", "emcmc-cifar"], "pass --dataset cifar10 or cifar100"),
    (["--epochs", "5", "--cycles", "2"], "must be a multiple of --cycles"),
    (["--lr", "5", "--train-size", "100", "--eta", "0.01"], "lower --lr or raise --eta"),
    (["--ood-digits", "12"], "--ood-digits"),
    (["--device", "gpu"], "--device takes auto, cpu, cuda or cuda:N, got 'gpu'"),
    (["--device", "cuda:7"], "--device cuda:7: torch sees"),
    (["--eta", "-1"], "--eta must be a positive number, got -1.0"),
    (["--epochs", "4", "--cycles", "4", "--draw-epochs", "1", "--batch-size", "1000"],  # the whole set: 1 step an epoch
     "SGD would make 4 steps in 4 cycles: raise --epochs"),
    (["--batch-size", "100000"], "--batch-size 100000 exceeds the training set size, 1,000 images"),
    (["--eta", "0.01", "--coupling", "0.05"], "both set η (the coupling is lr / (N η)): give one of them"),
    (["--coupling", "1.5"], "--coupling 1.5 is Entropy-MCMC's per-step coupling lr / (N·η), the fraction of the gap θ − θa "
                            "that θa closes per step: it must lie strictly between 0 and 1"),
    (["--temperature", "0"], "--temperature must be a positive number, got 0.0 (a temperature T > 0 scales the noise"),
    (["--temperature", "inf"], "--temperature must be a positive number, got inf"),
    (["--converged-within", "0"], "--converged-within"),
    (["--ensemble-size", "0"], "--ensemble-size"),
    (["images-eta", "--eta-factors", "2", "2"], "--eta-factors 2.0 2.0 is a sweep of one value: give at least two"),
    (["images-eta", "--eta-factors", "1"], "is a sweep of one value"),
    (["images-eta", "--eta-factors", "0.02", "1"], "--eta-factors 0.02 makes the per-step coupling 1.25, at or above 1"),
    (["images-eta", "--eta-factors", "-1", "1"], "--eta-factors takes positive numbers"),
])
def test_bad_options_are_one_line_that_names_them(tmp_path, capsys, args, needle):
    (tmp_path / "EMPTY").mkdir()
    args = [str(tmp_path / "EMPTY") if a == "EMPTY" else a for a in args]
    command = ["images"] if args[0] != "images-eta" else []
    assert main([*command, *args, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_killed_run_resumes_with_the_fits_it_finished_and_the_rest_as_if_never_stopped(tmp_path, monkeypatch,
                                                                                          capsys):
    """Killed while it scores its second fit: --resume keeps the first fit's rows and continues the second from
    its checkpoints (one every few milliseconds), and the report's numbers equal an uninterrupted run's."""
    from pyro_flat.experiments.images import study as images

    args = [*SMALL, "--seeds", "1", "--methods", "sgd", "emcmc", "--checkpoint-every", "0.005"]
    assert main(["images", *args, "--out", str(tmp_path / "whole")]) == 0
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())["rows"]
    assert not (tmp_path / ".whole.checkpoints").exists()  # a complete run leaves no checkpoints

    score = images.evaluate

    def killed_at_emcmc(fit, *a, **k):
        if fit.method == "emcmc":
            raise KeyboardInterrupt
        return score(fit, *a, **k)

    monkeypatch.setattr(images, "evaluate", killed_at_emcmc)
    out = tmp_path / "killed"
    main(["images", *args, "--out", str(out)])
    kept = sorted(p.name for p in (tmp_path / ".killed.checkpoints").iterdir())
    assert "seed0-sgd.json" in kept and "seed0-emcmc.ckpt" in kept and not out.exists()
    monkeypatch.setattr(images, "evaluate", score)
    capsys.readouterr()
    assert main(["images", *args, "--resume", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "seed 0 SGD: kept from the killed run" in said and "seed 0 Entropy-MCMC: continuing from its checkpoint" in said
    resumed = json.loads((out / "report.json").read_text())["rows"]
    assert [r["label"] for r in resumed] == [r["label"] for r in whole]
    for mine, want in zip(resumed, whole):
        for key in ("accuracy", "nll", "ece", "corrupted_accuracy", "ood_auroc", "top_eigenvalue"):
            assert mine.get(key) == want.get(key), (mine["label"], key)
    assert not (tmp_path / ".killed.checkpoints").exists()


@pytest.mark.parametrize("method", ["sgd", "sam", "entropy-sgd", "emcmc"])
def test_compiled_fits_repeat_the_eager_ones(method, monkeypatch):
    """``--jit fx``: every iteration of the fit, under its cosine schedule (a new step each time), runs through
    one traced graph per phase, the BatchNorm network and its augmentation included, and gives the eager fit's
    draws up to round-off."""
    from pyro_flat.experiments.images import study as images
    from pyro_flat.experiments.images.config import ImagesConfig

    kernels = []
    make = images.make_kernel
    monkeypatch.setattr(images, "make_kernel", lambda *a, **k: kernels.append(make(*a, **k)) or kernels[-1])
    fits = []
    for jit in ("off", "fx"):
        config = ImagesConfig.reduced(methods=(method,), seeds=1, train_size=64, batch_size=16, jit=jit,
                                      device="cpu")
        data = images.load_image_data(config)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a graph that fails says so in a RuntimeWarning
            fits.append(images.fit_method(method, config, data, seed=3))
    eager_kernel, kernel = kernels
    assert eager_kernel.compile_seconds == 0 and kernel.compile_seconds > 0
    assert (fits[0].compiled, fits[1].compiled) == (None, "fx")  # what the report says ran
    assert kernel.is_compiled or method != "emcmc"  # an optimiser's last iteration, its one draw, is eager
    assert kernel._steps.step_input and kernel._steps.graphs
    # 4 epochs of 4 minibatches, up to 3 gradients an iteration (2 inner steps), each convolution's weight gradient
    # (and BatchNorm's statistics) a sum over a minibatch's 16 * 14 * 14 pixels
    for name, want in fits[0].samples.items():
        assert_close_roundoff(fits[1].samples[name], want, length=16 * 3 * 16 * 14 * 14, msg=name)


def test_the_report_says_what_compiled_each_fit():
    """``--jit inductor`` where inductor failed its check on some fits: the report counts what ran, not what
    was asked for."""
    from pyro_flat.experiments.images.report import _compiled_text

    rows = [{"method": m, "seed": s, "use": u, "compiled": c}
            for m, s, c in [("sgd", 0, "inductor"), ("emcmc", 0, "fx"), ("emcmc", 1, "fx")] for u in ("theta", "aux")]
    assert _compiled_text(rows, "inductor") == ("; --jit inductor: 1 of 3 fits compiled by inductor, 2 of 3 fits run "
                                                 "as traced graphs (fx)")
    assert _compiled_text(rows, "off") == ""


def test_the_eta_sweep_writes_its_table_and_figure(tmp_path):
    """``pyro-flat images-eta``: SGD once and Entropy-MCMC at each multiple of the regime's η, one row per η."""
    out = tmp_path / "sweep"
    assert main(["images-eta", *SMALL, "--seeds", "1", "--eta-factors", "0.5", "2", "--out", str(out)]) == 0
    assert {"eta_sweep.png", "report.json", "report.md"} <= {p.name for p in out.iterdir()}
    report = json.loads((out / "report.json").read_text())
    regime = 0.05 / (160 * 0.025)
    assert [e["eta"] for e in report["sweep"]["emcmc"]] == pytest.approx([0.5 * regime, 2 * regime])
    assert report["sweep"]["sgd"]["fits"] == 1 and all(e["fits"] == 2 for e in report["sweep"]["emcmc"])
    text = (out / "report.md").read_text()
    assert f"| {0.5 * regime:.3g} | 0.05 |" in text and f"| {2 * regime:.3g} | 0.0125 |" in text
