"""scripts/gpu_check.py, the one command a GPU machine runs, works: every check passes on the CPU here
(in a process of its own: it starts a process group)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu_check.py"


def test_every_check_of_the_gpu_script_passes_on_the_cpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    assert len(rows) >= 14 and all(" | yes | " in row for row in rows), done.stdout
    assert f"{len(rows)} of {len(rows)} checks passed" in done.stdout
