"""Every tutorial notebook executes end to end in reduced mode (PYRO_FLAT_REDUCED=1), so none can rot."""

import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "tutorials").glob("[0-9]*.ipynb"))


#: seconds a cell may run: the slowest reduced cell takes about 90 s on an idle 2-core machine, so
#: this leaves a margin of 20x for a busy one
CELL_TIMEOUT = 1800


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PYRO_FLAT_REDUCED", "1")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # no spinning threads in the kernel (see conftest)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend draws the figures
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError with the failing cell and its traceback
    with capsys.disabled():  # each notebook's cost, visible in the test log
        print(f"\n{path.name}: {time.perf_counter() - start:.0f} s in reduced mode", end=" ")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                  for o in c.get("outputs", []))
    assert figures >= 3, f"{path.name} drew {figures} figures"


def test_there_are_seven_tutorials():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]
