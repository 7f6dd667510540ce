"""The studies' frame: the registry the command line reads, the rank-0 / other-ranks split written
once (``output.across_ranks``), and every study's samplers built with only the settings they take."""

import json
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from pyro_flat.experiments import output, registry
from pyro_flat.experiments.cli import build_parser, main
from pyro_flat.experiments.configs import BNN_SAMPLERS, SAMPLERS, BNNConfig, MNIST79Config, Synthetic2DConfig
from pyro_flat.experiments.output import MARKER
from pyro_flat.experiments.registry import STUDIES, Study, completed_or_interrupted
from pyro_flat.experiments.study_config import StudyConfig, option


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_is_one_entry_the_command_line_reads(name):
    study = STUDIES[name]
    assert study.name == name == study.config.COMMAND
    assert callable(study.run_function())  # the dotted path resolves
    parser = build_parser().commands[name]
    assert parser.description == study.description
    study.config.reduced().validate()


def test_the_mnist_study_exits_130_or_143_when_interrupted_and_the_others_0():
    assert STUDIES["mnist79"].exit_code is completed_or_interrupted
    assert completed_or_interrupted({"interrupted": True, "interrupted_by": "Ctrl-C"}) == 130
    assert completed_or_interrupted({"interrupted": True, "interrupted_by": "SIGTERM"}) == 143
    assert completed_or_interrupted({"interrupted": False}) == 0
    assert completed_or_interrupted({"rank": 1}) == 0  # another rank's record: rank 0's report decides
    assert {STUDIES[n].exit_code({"interrupted": True}) for n in STUDIES if n != "mnist79"} == {0}


@dataclass
class ToyConfig(StudyConfig):
    size: int = option(2, "how many things")
    out: str = "toy-out"

    COMMAND: ClassVar[str] = "toy"


def test_adding_a_study_is_adding_one_registry_entry(tmp_path, monkeypatch, capsys):
    (tmp_path / "toy_study.py").write_text(textwrap.dedent("""
        def run(config):
            print(f"ran with size {config.size} and seed {config.seed}")
            return {"interrupted": True, "interrupted_by": "SIGTERM"}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = Study(ToyConfig, "toy_study.run", "a toy study", "A toy study for the test.",
                exit_code=completed_or_interrupted)
    monkeypatch.setitem(STUDIES, "toy", toy)
    assert main(["toy", "--size", "5", "--seed", "3"]) == 143
    assert "ran with size 5 and seed 3" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["toy", "--help"])
    assert "how many things (default 2)" in capsys.readouterr().out
    assert main(["toy", "--size", "5", "--seed", "-1"]) == 2  # the frame's checks, before the run
    assert "--seed must be an integer" in capsys.readouterr().err


class _Ranks:
    """A rank of a two-process group, without the group: what ``across_ranks`` reads of it."""

    def __init__(self, rank, error=None):
        self.rank, self.world_size, self.distributed, self.error = rank, 2, True, error
        self.is_main = rank == 0
        self.finished = None

    def check(self, error):
        return error if error is not None else self.error

    def finish(self, wait=True):
        self.finished = "waited" if wait else "at once"


def _lead(config, staging, ranks):
    (staging / "report.json").write_text(json.dumps({"seed": config.seed}))
    return {"interrupted": False, "rank_seen": ranks.rank}


def test_rank_0_writes_the_folder_and_says_what_it_wrote(tmp_path, monkeypatch):
    ranks = _Ranks(0)
    monkeypatch.setattr("pyro_flat.distributed.init_from_env", lambda: ranks)
    lines = []
    config = MNIST79Config(out=str(tmp_path / "run"), threads=1)
    report = output.across_ranks(config, _lead, lambda *a: pytest.fail("rank 0 followed"), lines.append)
    assert report == {"interrupted": False, "rank_seen": 0} and ranks.finished == "waited"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted([MARKER, "report.json"])
    assert lines[-1] == f"wrote {tmp_path / 'run'}: report.json"


def test_the_other_ranks_run_their_share_and_write_nothing(tmp_path, monkeypatch):
    ranks = _Ranks(1)
    monkeypatch.setattr("pyro_flat.distributed.init_from_env", lambda: ranks)
    seen = []

    def follow(config, ranks):
        seen.append((ranks.rank, torch.get_num_threads()))

    config = MNIST79Config(out=str(tmp_path / "run"), threads=1)
    assert output.across_ranks(config, _lead, follow) == {"rank": 1}
    assert seen == [(1, 1)] and ranks.finished == "waited" and not list(tmp_path.iterdir())


def test_an_error_of_rank_0_stops_the_others_before_their_share(tmp_path, monkeypatch):
    ranks = _Ranks(1, error=output.StudyError("--out x is a file"))
    monkeypatch.setattr("pyro_flat.distributed.init_from_env", lambda: ranks)
    config = MNIST79Config(out=str(tmp_path / "run"))
    with pytest.raises(output.StudyError, match="--out x is a file"):
        output.across_ranks(config, _lead, lambda *a: pytest.fail("the rank followed"))
    assert ranks.finished == "at once"


def test_every_studys_sampler_builds_with_the_settings_it_takes():
    """make_kernel refuses a setting a kernel does not take: each study passes each sampler its own."""
    from pyro_flat import mixtures
    from pyro_flat.experiments.bnn import families as bnn_families
    from pyro_flat.experiments.mnist79 import study as mnist79
    from pyro_flat.experiments.synthetic2d import study as synthetic2d
    from pyro_flat.models import BayesianMLP, logistic_regression

    for preconditioner in ("dense", "none"):
        config = MNIST79Config(preconditioner=preconditioner, eta=0.02, coupling_metric="joint")
        for name in SAMPLERS:
            kernel = mnist79.make_study_kernel(name, config, logistic_regression)
            assert getattr(kernel, "eta", 0.02) == 0.02, name
    entropy = mnist79.make_study_kernel("entropy-sgld", config, logistic_regression)
    assert entropy.coupling_metric == "joint" and entropy.step_size == config.step_size

    net = BayesianMLP(4, [3], 2)
    potential = lambda p: (p["theta"] ** 2).sum()  # noqa: E731
    config = BNNConfig(eta=0.002, rho=0.4, sigma=0.02, toy_eta=0.9, toy_rho=0.2, toy_sigma=0.25)
    own = {"entropy-sgld": "eta", "sasgld": "rho", "flat-sgld": "sigma"}
    for name in BNN_SAMPLERS:
        on_mlp = bnn_families.make_bnn_kernel(name, config, net)
        on_toy = bnn_families.make_bnn_kernel(name, config, potential, toy=True)
        assert (on_mlp.step_size, on_toy.step_size) == (config.step_size, config.toy_step_size), name
        if name in own:
            assert getattr(on_mlp, own[name]) == getattr(config, own[name]), name
            assert getattr(on_toy, own[name]) == getattr(config, "toy_" + own[name]), name

    config = Synthetic2DConfig.reduced()
    for sampler in synthetic2d._samplers(config):
        sampler.kernel(mixtures.sharp_flat_2d(), config.step_size)
