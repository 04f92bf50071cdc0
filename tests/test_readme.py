"""The README and the reference it points to: every Python example runs as written (documentation
that cannot rot silently), the README stays short enough to read to the end, names the CI command,
links only to pages that exist, and every section of the reference pages is reachable from the
docs' index (`docs/README.md`) by a link whose anchor is the section's own."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
MOST_LINES = 150
PAGES = [README] + sorted(p for p in DOCS.glob("*.md") if p != INDEX)
MOVED = ["workshop.md", "policies.md", "correctness.md", "cuda.md", "layout.md", "facts.md"]   # the README's old sections
BLOCKS = [(page, block) for page in [README] + [DOCS / m for m in MOVED]
          for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def github_anchor(heading: str) -> str:
    """The id GitHub gives a markdown heading: lower case, markup and punctuation dropped, spaces as '-'."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def sections(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"^## (.+)$", text, flags=re.M)


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(BLOCKS)])
def test_python_examples_run(index, capsys):
    page, block = BLOCKS[index]
    exec(compile(block, f"{page.name}[python block {index}]", "exec"), {})
    assert capsys.readouterr().out.strip(), "each example prints something to look at"


def test_readme_names_the_ci_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "make test" in README.read_text()


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= MOST_LINES, f"README.md has {len(text.splitlines())} lines (at most {MOST_LINES})"
    assert re.search(r"^make run\s+#", text, flags=re.M) and re.search(r"^make test\s+#", text, flags=re.M)
    assert "docs/README.md" in text, "the README points to the reference's index"


@pytest.mark.parametrize("page", [README, INDEX], ids=["README", "docs-index"])
def test_links_reach_existing_pages_and_sections(page):
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#([^)]+))?\)", page.read_text()):
        path, anchor = page.parent / target[0], target[1]
        assert path.exists(), f"{page.name} links to {target[0]}, which does not exist"
        if anchor:
            assert anchor in [github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", path.read_text(), flags=re.M)], \
                f"{page.name} links to {target[0]}#{anchor}, no such heading"


def test_every_reference_page_and_section_is_reachable_from_the_index():
    index = INDEX.read_text()
    for page in PAGES[1:]:
        assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
    for page in MOVED:
        for heading in sections(DOCS / page):
            assert f"]({page}#{github_anchor(heading)})" in index, f"docs/README.md does not reach {page}: {heading}"
