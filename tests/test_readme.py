"""The README's Python examples run as written (documentation that cannot rot silently)."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {})
    assert capsys.readouterr().out.strip(), "each example prints something to look at"


def test_readme_names_the_ci_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci and "make test" in README.read_text()
