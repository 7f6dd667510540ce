"""Execute the tutorial notebooks in full and store them with their outputs, small enough to commit.

    .venv/bin/python scripts/run_tutorials.py            # all of them (about half an hour on 2 cores)
    .venv/bin/python scripts/run_tutorials.py 02 04      # some of them

Figures are drawn at 80 dpi; progress bars are reduced to their last state; execution timings
and the kernel's environment are not stored. The tests execute the same notebooks in reduced mode
(``PYRO_FLAT_REDUCED=1``) without writing them.
"""

from __future__ import annotations

import base64
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
FIGURE_DPI = 80
#: Figures are stored as palette PNGs of this many colours (a third of the size, the same to the eye).
FIGURE_COLOURS = 64


def _last_state(text: str) -> str:
    """What a terminal would show: each line's text after its last carriage return."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def _small_png(data: str) -> str:
    """A base64 PNG re-encoded with a palette of :data:`FIGURE_COLOURS` colours."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(colors=FIGURE_COLOURS).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _merge_streams(outputs: list) -> list:
    """Consecutive outputs of one stream as one (a progress bar writes one per update)."""
    merged = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and previous is not None
                and previous.get("output_type") == "stream" and previous["name"] == output["name"]):
            previous["text"] += output["text"]
        else:
            merged.append(output)
    return merged


def _tidy(nb) -> None:
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = _merge_streams(cell.outputs)
        for output in cell.outputs:
            if output.get("output_type") == "stream":
                output["text"] = _last_state(output["text"])
            if "image/png" in output.get("data", {}):
                output["data"]["image/png"] = _small_png(output["data"]["image/png"])
    nb.metadata.pop("widgets", None)


def run(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "matplotlibrc").write_text(f"figure.dpi: {FIGURE_DPI}\n")
        env = {k: v for k, v in os.environ.items() if k not in ("PYRO_FLAT_REDUCED", "MPLBACKEND")}
        env["MATPLOTLIBRC"] = work
        os.environ.clear()
        os.environ.update(env)  # the kernel inherits this process's environment
        client = nbclient.NotebookClient(nb, timeout=3600, kernel_name="python3",
                                         resources={"metadata": {"path": work}})
        client.execute()
    _tidy(nb)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def tidy(path: Path) -> None:
    """Tidy a stored notebook's outputs again, without executing it."""
    nb = nbformat.read(path, as_version=4)
    _tidy(nb)
    nbformat.write(nb, path)


def main(argv) -> int:
    chosen = [p for p in sorted(TUTORIALS.glob("[0-9]*.ipynb"))
              if not argv or any(p.name.startswith(prefix) for prefix in argv)]
    if not chosen:
        print(f"no tutorial matches {argv}; they are {[p.name for p in TUTORIALS.glob('*.ipynb')]}")
        return 2
    for path in chosen:
        seconds = run(path)
        size = path.stat().st_size / 1024
        print(f"{path.name}: executed in {seconds:.0f} s, stored {size:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
