"""The public API after the package's move into folders (``docs/layout.md``): every name the docs import
imports from the path they give, without a warning; the modules that moved keep their old path as an
alias that warns once and gives the same module; a checkpoint written before the move still loads."""

import ast
import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

import pyro_flat

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _documented_imports():
    """Every ``from pyro_flat... import ...`` and ``import pyro_flat...`` line in the README and the docs."""
    found = set()
    for path in DOCUMENTS:
        for line in path.read_text().splitlines():
            match = re.search(r"(from pyro_flat[\w.]* import [\w, ]+|import pyro_flat[\w.]*)", line)
            if match:
                found.add(match.group(1).rstrip(", "))
    return sorted(found)


@pytest.mark.parametrize("statement", _documented_imports())
def test_every_documented_import_works_without_a_warning(statement):
    ast.parse(statement)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(statement, {})


def test_the_public_names_and_modules_resolve_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in pyro_flat.__all__:
            assert getattr(pyro_flat, name) is not None, name
        for name in ("metrics", "datasets", "nn", "diagnostics", "predictive", "mixtures", "models", "schedules",
                     "convergence", "ensembles", "sam"):
            module = importlib.import_module(f"pyro_flat.{name}")
            for exported in getattr(module, "__all__", ()):
                assert hasattr(module, exported), f"pyro_flat.{name}.{exported}"


@pytest.mark.parametrize("old, new", sorted(pyro_flat.MOVED.items()))
def test_a_moved_module_keeps_its_old_path(old, new, monkeypatch):
    """The old path is the same module object (its classes are one); a warning names the new path, except for
    the documented short paths."""
    module = importlib.import_module(f"pyro_flat.{new}")
    # a first import, as in a new process (vars(): getattr would import it through the alias)
    monkeypatch.delitem(vars(pyro_flat), old, raising=False)
    monkeypatch.delitem(sys.modules, f"pyro_flat.{old}", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module(f"pyro_flat.{old}")
    assert alias is module and module.__spec__.name == f"pyro_flat.{new}"
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    if old in pyro_flat.STABLE_PATHS:
        assert said == []
    else:
        assert said == [f"pyro_flat.{old} moved to pyro_flat.{new}: import it from there (the old path will be "
                        "removed in a later release)."]
        # it points at the line that imported the old path, not at importlib's
        assert [w.filename for w in caught if issubclass(w.category, FutureWarning)] == [__file__]


def test_a_checkpoint_written_before_the_move_still_continues(tmp_path):
    """``tests/data/checkpoint_before_the_folders.ckpt``: a finished EntropySGLD run (diagonal preconditioner,
    per-chain streams) written by the package before its modules moved; read now, it gives its draws back,
    which are those of the same run made today."""
    import shutil

    import pyro
    from pyro_flat import MCMC, EntropySGLD
    from pyro_flat.storage.checkpoint import read_checkpoint
    from pyro_flat.storage.fingerprint import differences
    from linear_regression import data, model

    def run(checkpoint):
        pyro.set_rng_seed(0)
        mcmc = MCMC(EntropySGLD(model, eta=0.1, step_size=1e-4, preconditioner="diagonal"), num_samples=5,
                    warmup_steps=3, num_chains=2, checkpoint=checkpoint, disable_progbar=True,
                    random_streams="per_chain")
        mcmc.run(*data())
        return mcmc.get_samples()

    old = tmp_path / "old.ckpt"
    shutil.copy(Path(__file__).with_name("data") / "checkpoint_before_the_folders.ckpt", old)
    before = read_checkpoint(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no other configuration, no other random start
        restored = run(old)
    # a finished run: given back, its state and draws written again as they were (the fingerprint gains the settings
    # added since, at their defaults: EntropySGLD.autocast)
    after = read_checkpoint(old)
    assert after["done"] == before["done"] == 8
    for name in ("w", "w_aux"):
        assert torch.equal(after["draws"][name], before["draws"][name]) and torch.equal(after["params"][name],
                                                                                         before["params"][name])
    assert not differences(before["fingerprint"], after["fingerprint"])
    for name, value in run(tmp_path / "new.ckpt").items():
        assert torch.equal(restored[name], value), name
