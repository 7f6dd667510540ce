"""The README's and the docs' Python blocks run as written, as doctests do, and their links hold.

Every ```python block of README.md, docs/*.md and docs/studies/*.md runs, in order, in one namespace
per file (a block may use the names of the blocks before it). A block is left out only when the line
just above its fence is ``<!-- not run: REASON -->`` (torchrun, a GPU, minutes of work); at most
MAX_NOT_RUN blocks in all may be. Every relative link points to a file that exists, and the README
links every page of docs/.
"""

import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "studies").glob("*.md"))
PAGES = [README] + DOCS

#: blocks that may be left out, in all pages together (each with its reason in its marker)
MAX_NOT_RUN = 3

FENCE = re.compile(r"^( *)```(\w*)[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
MARKER = re.compile(r"<!--\s*not run\b")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def python_blocks(path: Path):
    """``[(line, code, reason)]``: each Python block's first code line (1-based), its code and the
    reason it is not run (``None``: it runs)."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(2) != "python":
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.match(before)
        line = text.count("\n", 0, match.start()) + 2
        blocks.append((line, textwrap.dedent(match.group(3)), reason.group(1) if reason else None))
    return blocks


def run_blocks(path: Path):
    """Run the page's blocks in order in one namespace; yield ``(line, printed, namespace)`` after each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace = {"__name__": "__docs__"}
    try:
        for line, code, reason in python_blocks(path):
            if reason is not None:
                continue
            printed = io.StringIO()
            # padded so that a traceback names the page's own line numbers
            compiled = compile("\n" * (line - 1) + code, name(path), "exec")
            with contextlib.redirect_stdout(printed):
                exec(compiled, namespace)
            yield line, printed.getvalue(), namespace
    finally:
        plt.close("all")


TOUR = ROOT / "docs" / "tour.md"


def _converged_and_classifies(printed: str, namespace: dict) -> None:
    """A first example's checks: sampling with MCMC converged, then a useful model average."""
    assert printed.startswith("converged (max R-hat"), printed
    metrics = namespace["pyro_flat"].metrics.classification_metrics(namespace["probs"], namespace["y_test"])
    assert metrics["accuracy"] > 0.8  # 5 informative features: the Bayes rate is about 0.85


def test_the_readme_example_converges_and_classifies(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a block writes stays out of the checkout
    _, printed, namespace = next(run_blocks(README))
    _converged_and_classifies(printed, namespace)


@pytest.mark.parametrize("path", DOCS, ids=name)
def test_the_docs_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, (_, printed, namespace) in enumerate(run_blocks(path)):
        if path == TOUR and i == 0:  # the tour's first example, as the README's
            _converged_and_classifies(printed, namespace)


def test_few_blocks_are_left_out_and_each_says_why():
    left_out = [f"{name(p)}:{line} ({reason})" for p in PAGES for line, _, reason in python_blocks(p) if reason]
    assert len(left_out) <= MAX_NOT_RUN, left_out
    # a marker that is not just above a Python block would leave nothing out: a stale marker
    for page in PAGES:
        markers = sum(1 for line in page.read_text().splitlines() if MARKER.search(line))
        used = sum(1 for _, _, reason in python_blocks(page) if reason)
        assert markers == used, f"{name(page)}: {markers} 'not run' markers, {used} above a Python block"


@pytest.mark.parametrize("path", PAGES, ids=name)
def test_relative_links_point_to_files_that_exist(path):
    text = FENCE.sub("", path.read_text())  # code is not a link
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s), mailto, an anchor in the page
        if not (path.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{name(path)}: links to missing files: {broken}"


def test_the_readme_links_every_page_of_the_docs():
    linked = {(README.parent / t.split("#", 1)[0]).resolve() for t in LINK.findall(README.read_text())}
    missing = [name(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"
