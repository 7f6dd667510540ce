"""Every tutorial runs end to end in reduced mode, so none can rot."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).parent.parent / "tutorials").glob("[0-9]*.py"))


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path):
    env = dict(os.environ, PYRO_FLAT_REDUCED="1", MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote" in result.stdout


def test_there_are_tutorials():
    assert TUTORIALS
