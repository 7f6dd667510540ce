"""scripts/gpu_check.py, the one command a GPU machine runs, works: every check it names runs and passes on the CPU
here (in a process of its own: it starts a process group)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_check_of_the_gpu_script_runs_and_passes_on_the_cpu():
    names = _script().check_names()
    assert len(names) == len(set(names)) >= 35 and not any(" | " in name for name in names), names
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick"], capture_output=True,
                          text=True, timeout=300)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    cells = [row[2:].split(" | ") for row in rows]
    assert [cell[0] for cell in cells] == names, done.stdout  # every named check ran, once, in the table's order
    failed = [row for row, cell in zip(rows, cells) if cell[1] != "yes"]
    assert not failed, "\n".join(failed) + "\n\n" + done.stderr[-3000:]
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"{len(names)} of {len(names)} checks passed" in done.stdout
