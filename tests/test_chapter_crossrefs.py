"""Cross-references between chapters name a chapter that exists and holds that topic.

A reference is "chapter NN" / "ch. NN" / "chapters NN" or a chapter's file stem in backticks (`NN_name`,
"Next: `NN_name`"), in a chapter's markdown, in the text its code cells print or render, or in the
instructor notes. It must name an existing chapter (a stem must be exact), and the sentence around it
must share a topic word with that chapter: a word of four letters or more from its title, its `##`
headings or its row in notebooks/README.md, leaving out words that half the chapters share (cache,
window, policy, ...), which say nothing about where a topic lives. So "the fork's host loop (chapter
01)" fails (01 is about what rejected K/V costs), "launch-bound (chapter 11)" passes.
"""
import re
from collections import Counter
from pathlib import Path

import pytest

from nwor_lab.workshop import chapters as ch
from nwor_lab.workshop import notes

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = {p.stem: p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
BY_NUMBER = {stem[:2]: stem for stem in CHAPTERS}
REF = re.compile(r"\b(?:[Cc]hapters?|ch\.)\s+(\d\d)\b|`(\d\d_\w+?)(?:\.ipynb)?`")


CONTEXT = {"chapter", "vllm", "nwor"}     # the lab's subject in every chapter: never a topic of one


def words(text: str) -> set[str]:
    return {w.rstrip("s") for w in re.findall(r"[a-z][a-z0-9-]{3,}", text.lower().replace("`", ""))} - CONTEXT


def _readme_rows() -> dict[str, str]:
    rows = {}
    for line in (ROOT / "notebooks" / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*`(\d\d_\w+)(?:\.ipynb)?`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = rows.get(m.group(1), "") + " " + m.group(2)
    return rows


def topics() -> dict[str, set[str]]:
    rows = _readme_rows()
    raw = {}
    for stem, path in CHAPTERS.items():
        nb = ch.read(path)
        raw[stem] = words(" ".join(t for _, t in ch.headings(nb)) + " " + stem.replace("_", " ") + " " + rows.get(stem, ""))
    common = {w for w, n in Counter(w for ws in raw.values() for w in ws).items() if n >= len(raw) / 2}
    return {stem: ws - common for stem, ws in raw.items()}


def sentence(text: str, start: int, end: int) -> str:
    """The sentence (or list item, or table row) around text[start:end]."""
    ends = (". ", "\n\n", "\n- ", "\n|", "? ", "! ")       # a table row is one sentence
    left = max(text.rfind(c, 0, start) for c in ends)
    rights = [i for i in (text.find(c, end) for c in ends) if i != -1]
    return text[left + 1: min(rights) if rights else len(text)]


def texts():
    """(where, text) of every chapter's markdown and code cells, and of every chapter's instructor notes."""
    for stem, path in CHAPTERS.items():
        for i, cell in enumerate(ch.read(path).cells):
            yield f"{stem} cell {i}", stem, cell.source
    for n in notes.NOTES.values():
        yield f"notes {n.stem}", n.stem, " ".join((*n.say, n.misconception, *n.questions, *n.answers))


def references():
    for where, stem, text in texts():
        for m in REF.finditer(text):
            yield where, stem, m.group(1) or m.group(2), sentence(text, m.start(), m.end())


def test_every_cross_reference_names_an_existing_chapter_that_holds_the_topic():
    topic = topics()
    wrong = []
    for where, home, ref, around in references():
        target = BY_NUMBER.get(ref) if len(ref) == 2 else (ref if ref in CHAPTERS else None)
        if target is None:
            wrong.append(f"{where}: {ref!r} names no chapter: {around.strip()[:120]}")
            continue
        if target == home:
            continue
        if not words(around) & topic[target]:
            wrong.append(f"{where}: {ref!r} ({target}) shares no topic word with: {around.strip()[:160]}")
    assert not wrong, "\n".join(wrong)


def test_every_chapter_but_the_last_says_what_comes_next():
    stems = sorted(CHAPTERS)
    for stem, following in zip(stems, stems[1:]):
        text = "\n".join(c.source for c in ch.read(CHAPTERS[stem]).cells)
        nexts = re.findall(r"Next: `(\d\d_\w+)`", text)
        assert nexts, f"{stem}: no 'Next: `NN_name`' line"
        assert all(n in CHAPTERS and n > stem for n in nexts), (stem, nexts)


@pytest.mark.parametrize("text, ok", [
    ("the vLLM fork's original path (chapter 01)", False),
    ("the write path is launch-bound (chapter 11 shows the GPU measurements)", True),
    ("Next: `07_sliding_window` — ring caches", True),
    ("see chapter 42", False),
])
def test_the_check_itself(text, ok):
    topic = topics()
    m = REF.search(text)
    ref = m.group(1) or m.group(2)
    target = BY_NUMBER.get(ref) if len(ref) == 2 else (ref if ref in CHAPTERS else None)
    assert (target is not None and bool(words(sentence(text, m.start(), m.end())) & topic[target])) == ok
