"""``pyro-flat transfer``: a reduced run's files, tables and claim counts; the pre-trained cache reused, and one of
another network refused; the claims' verdicts follow the numbers; the CIFAR-100 preset on generated files of the
official layout; bad options refused by name."""

import copy
import json

import numpy as np
import pytest

from pyro_flat.data.cifar_files import write_cifar
from pyro_flat.experiments.output import MARKER, StudyError
from pyro_flat.experiments.transfer.study import run_transfer_study
from pyro_flat.experiments.transfer.config import TRANSFER_METHODS, TransferConfig
from pyro_flat.experiments.transfer.report import CLAIMS, METRICS, claims


@pytest.fixture(scope="module")
def reduced_run(tmp_path_factory, once_per_run):
    def make():
        out = tmp_path_factory.mktemp("transfer") / "out"
        lines = []
        report = run_transfer_study(TransferConfig.reduced(out=str(out)), log=lines.append)
        return out, report, lines

    return once_per_run("transfer-reduced-run", make)


def test_a_reduced_run_writes_its_files_tables_and_claim_counts(reduced_run):
    out, report, lines = reduced_run
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.json", "transfer.png", "pretrained.pt"}
    config = TransferConfig.reduced()
    assert len(report["rows"]) == len(config.shots) * config.seeds * len(TRANSFER_METHODS)
    assert set(report["summary"]) == {str(k) for k in config.shots}
    for methods in report["summary"].values():
        assert set(methods) == set(TRANSFER_METHODS)
    assert len(report["claims"]) == len(config.shots) * len(CLAIMS) * len(METRICS)
    text = (out / "report.md").read_text()
    for label in ("SGD (last block)", "SA-BMA (last block)", "Entropy-MCMC (adapters)", "Laplace (last layer)"):
        assert label in text
    assert f"t = {12.71:.2f} standard errors" in text  # 2 seeds: the t critical value of 1 degree of freedom
    on_disk = json.loads((out / "report.json").read_text())
    assert [c["verdict"] for c in on_disk["claims"]] == [c["verdict"] for c in report["claims"]]
    rows = {(r["method"], r["seed"]): r for r in report["rows"]}
    # tiny-resnet's last (only) stage: two 3x3 convolutions of 4 channels (288 weights), two BatchNorms (16), and the
    # new head of 5 classes on 4 features (25); its rank-4 adapters: A (4, 36) and B (4, 4) per convolution
    head = 4 * 5 + 5
    assert rows["sgd-block", 0]["parameters"] == 2 * 4 * 4 * 9 + 4 * 4 + head
    assert rows["sgd-adapters", 0]["parameters"] == rows["emcmc-adapters", 0]["parameters"] == 2 * (4 * 36 + 4 * 4) + head
    assert rows["laplace-head", 0]["parameters"] == head
    # SA-BMA's step costs two gradient evaluations, every other fit one per step
    assert rows["sabma-block", 0]["grad_evals"] == 2 * rows["vi-block", 0]["grad_evals"]
    assert any("pre-trained tiny-resnet on" in line for line in lines)


def test_the_pretrained_cache_is_reused_and_one_of_another_network_refused(reduced_run, tmp_path):
    out, report, _ = reduced_run
    second = tmp_path / "again"
    second.mkdir()
    (second / "pretrained.pt").write_bytes((out / "pretrained.pt").read_bytes())
    (second / MARKER).write_text("transfer\npretrained.pt\n")  # what an earlier run's folder says it wrote
    lines = []
    config = TransferConfig.reduced(out=str(second), methods=("sgd-block",), seeds=1)
    again = run_transfer_study(config, log=lines.append)
    assert again["pretrained"]["cached"] is True
    assert any("from " + str(second / "pretrained.pt") in line for line in lines)
    assert (second / "pretrained.pt").exists()  # the new run's folder keeps it for the next
    with pytest.raises(StudyError, match=r"pretrained.pt holds a pre-trained tiny-resnet .* small-resnet"):
        run_transfer_study(TransferConfig.reduced(out=str(second), methods=("sgd-block",), seeds=1,
                                                  network="small-resnet"), log=lines.append)


def test_the_claims_verdicts_follow_the_numbers(reduced_run):
    rows = copy.deepcopy(reduced_run[1]["rows"])
    which = [CLAIMS[0]]
    nll = (("nll", "NLL", True),)
    for r in rows:
        r["converged"] = True
    vi = {r["seed"]: r["nll"] for r in rows if r["method"] == "vi-block"}

    def verdict_with(shift):
        for r in rows:  # SA-BMA's NLL set to VI's plus a seed-dependent shift
            if r["method"] == "sabma-block":
                r["nll"] = vi[r["seed"]] + shift + 0.01 * r["seed"]
        return claims(rows, which, nll)[0]

    sabma_pair = lambda claim: next(p for p in claim["pairs"] if p["ours"] == "sabma-block")  # noqa: E731
    assert sabma_pair(verdict_with(-1.0))["verdict"] == "for"
    lower = verdict_with(+1.0)
    assert sabma_pair(lower)["verdict"] == "against" and lower["verdict"] == "contradicted"
    for r in rows:
        if r["method"] == "vi-block" and r["seed"] == 0:
            r["converged"] = False
    assert claims(rows, which, nll)[0]["verdict"] == "not tested (not converged)"


def test_the_cifar100_preset_runs_on_generated_files_of_the_official_layout(tmp_path):
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 12), ("test", 3)):
        labels = np.repeat(np.arange(100), per_class)
        images = rng.integers(0, 256, (len(labels), 3, 32, 32), dtype=np.uint8)
        images[:, 0] = (labels[:, None, None] * 2).astype(np.uint8)  # a class signal in the red channel
        write_cifar(tmp_path / "data", "cifar100", split, images, labels)
    config = TransferConfig.reduced(preset="cifar100", data_dir=str(tmp_path / "data"), out=str(tmp_path / "out"),
                                    methods=("sgd-block", "laplace-head", "emcmc-adapters"), seeds=1, shots=(2,),
                                    test_size=40, pretrain_size=None)
    report = run_transfer_study(config, log=lambda line: None)
    assert report["data"]["pretrain_classes"] == list(range(50)) and report["data"]["new_classes"][0] == 50
    assert report["data"]["pretrain_images"] == 600 and report["data"]["test"] == 40
    assert {r["method"] for r in report["rows"]} == {"sgd-block", "laplace-head", "emcmc-adapters"}
    assert all(np.isfinite(r["nll"]) for r in report["rows"])


@pytest.mark.parametrize("overrides,message", [
    (dict(shots=(0,)), "--shots"),
    (dict(methods=("laplace-head",)), "add sgd-block"),
    (dict(preset="cifar100"), "--data-dir"),
    (dict(iterations=6, draws_per_cycle=2), "--iterations"),
    (dict(rank=0), "--rank"),
    (dict(device="gpu"), "--device"),
    (dict(batch_size=1), "--batch-size"),
])
def test_bad_options_are_refused_by_name(overrides, message):
    with pytest.raises(StudyError, match=message):
        TransferConfig.reduced(**overrides).validate()


def test_a_pattern_the_network_lacks_is_refused_by_name():
    from pyro_flat.nn import BayesianModule, ResNet

    net = ResNet(blocks=(1,), width=4, in_channels=1, num_classes=3)
    with pytest.raises(ValueError, match=r"sampled: \['layer4\.\*'\] match no parameter"):
        BayesianModule(net, sampled=["layer4.*", "linear.*"])


def _numbers(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_a_stopped_run_continues_with_resume_to_the_uninterrupted_runs_numbers(tmp_path, monkeypatch):
    """Stopped at its fifth fit (seed 1's Laplace, after seed 1's SGD), the run keeps the four fits done and the
    pre-trained network beside --out; --resume reads them, fits the rest, Laplace from the kept SGD network, and
    writes the uninterrupted run's numbers."""
    from pyro_flat.experiments.transfer import study as transfer

    settings = dict(methods=("sgd-block", "laplace-head", "emcmc-block"), seeds=2)
    whole = run_transfer_study(TransferConfig.reduced(out=str(tmp_path / "whole"), **settings), log=lambda line: None)
    fit, calls = transfer.fit_method, []

    def stop_at_the_fifth(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 5:
            raise KeyboardInterrupt
        return fit(*args, **kwargs)

    monkeypatch.setattr(transfer, "fit_method", stop_at_the_fifth)
    out, lines = tmp_path / "stopped", []
    with pytest.raises(KeyboardInterrupt):
        run_transfer_study(TransferConfig.reduced(out=str(out), **settings), log=lines.append)
    assert not out.exists()  # --out is written only by a complete run
    kept = tmp_path / ".stopped.checkpoints"
    assert {p.name for p in kept.iterdir()} >= {"pretrained.pt", "shots5-seed1-sgd-block.pt",
                                                "shots5-seed0-emcmc-block.json", "shots5-seed1-sgd-block.json"}
    assert any("--resume continues the run" in line for line in lines)
    calls.clear()
    lines.clear()
    resumed = run_transfer_study(TransferConfig.reduced(out=str(out), resume=True, **settings), log=lines.append)
    assert calls == ["laplace-head", "emcmc-block"]  # only seed 1's last two fits ran again
    assert resumed["pretrained"]["cached"] is True
    assert _numbers(resumed["rows"]) == _numbers(whole["rows"])
    assert [c["verdict"] for c in resumed["claims"]] == [c["verdict"] for c in whole["claims"]]
    assert not kept.exists()  # the complete run removed its checkpoints
    with pytest.raises(StudyError, match="--resume: the killed run had other options"):
        monkeypatch.setattr(transfer, "fit_method", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            run_transfer_study(TransferConfig.reduced(out=str(tmp_path / "other"), **settings), log=lambda line: None)
        run_transfer_study(TransferConfig.reduced(out=str(tmp_path / "other"), resume=True, **{**settings, "seeds": 3}),
                           log=lambda line: None)


def test_a_test_set_that_leaves_no_images_to_pre_train_on_is_refused_by_name():
    from pyro_flat.experiments.transfer.data import load_transfer_data

    with pytest.raises(StudyError, match=r"--test-size 100000 leaves 0 pre-training images"):
        load_transfer_data(TransferConfig.reduced(test_size=100_000))
