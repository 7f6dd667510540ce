#!/usr/bin/env bash
# Create .venv and install pyro-flat with its test dependencies.
# torch is installed FIRST and pinned to the local CPU wheel (torch==2.13.0): an unpinned torch,
# also when pulled in by pyro-ppl, would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    "${PIP[@]}" "torch==${TORCH_VERSION:-2.13.0}"
fi
"${PIP[@]}" -e ".[test]"
.venv/bin/python -c "import torch, pyro, arviz, pyro_flat; print(f'pyro-flat {pyro_flat.__version__}: torch {torch.__version__}, pyro {pyro.__version__}, arviz {arviz.__version__}')"
