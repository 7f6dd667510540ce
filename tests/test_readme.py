"""The README's "Use" example runs as written and converges by the verdict it prints."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_use_example_runs_and_converges(capsys):
    text = README.read_text()
    use = text[text.index("## Use"):]
    code = re.search(r"```python\n(.*?)```", use, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md (Use)", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.startswith("converged (max R-hat"), printed
    metrics = namespace["pyro_flat"].metrics.classification_metrics(namespace["probs"], namespace["y_test"])
    assert metrics["accuracy"] > 0.8  # 5 informative features: the Bayes rate is about 0.85
