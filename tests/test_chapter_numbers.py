"""The number rule: every number with a unit in a chapter's markdown is rendered from the run or cited.

The rule, precisely (`nwor_lab.workshop.numbers` implements it):

- A *number with a unit* is a number (digits, `,` thousands, a decimal point; a leading `~`, `≈` or
  minus; or a range `a–b`) followed, with or without a space, by a unit: ns µs us ms min minutes, `%`,
  KB MB GB TB KiB MiB GiB TiB, GB/s TB/s, tok/s tokens/s, or a multiplier `×`/`x` ("2.4×",
  "64× the bytes"). `B` and `s` count after a space only ("57,344 B", "30 s"). A × followed by a number
  or "(" ("8 × 128"), or a spaced × followed by a name ("2 × head_size"), is a multiplication and does
  not count.
- Such a number in a **markdown cell** fails unless its paragraph *cites* its source: an existing
  file of `benchmarks/results/` (by path, by its file name, or by its path below that folder, e.g.
  `kernels_h200.json`, `tree_window_launch/warps8_h200.json`), a URL, a pull
  request or issue of a named project ("vLLM #1234", "pull request #8"), or a paper ("arXiv:…",
  "Li et al.").
- A paragraph is a block between blank lines; each list item is its own paragraph; a table is one.
  Fenced code blocks are skipped.
- *Rendered* numbers never appear in markdown cells: a code cell displays them
  (`display(Markdown(f"..."))`) or prints them, from the chapter's variables, so they are this run's.
"""
import json
from pathlib import Path

import nbformat
import pytest

from nwor_lab.workshop import numbers

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_number_in_a_chapters_markdown_is_rendered_or_cited(path):
    found = numbers.scan(nbformat.read(str(path), as_version=4))
    assert not found, (f"{path.name}: numbers with a unit in markdown, neither rendered from the run nor cited "
                       f"(render them from variables with display(Markdown(...)), or name the stored result):\n"
                       + "\n".join(map(str, found)))


@pytest.mark.parametrize("text, bare", [
    ("Eager it costs ~20 µs per layer.", ["~20 µs"]),
    ("It drops 7.0–9.5× under a graph.", ["7.0–9.5×"]),
    ("stage saves 0.5 to 0.8 % of the step", ["0.8 %"]),
    ("at 4.2 TB/s the bytes take 12 µs", ["4.2 TB/s", "12 µs"]),
    ("57,344 B written, in 30 s, at 600 tok/s; 64× the bytes", ["57,344 B", "30 s", "600 tok/s", "64×"]),
    ("8 × 128 heads, 3.35 × 0.37 / 0.67, 2 × head_size, Llama-3.2-3B, H100, k = 4", []),
])
def test_the_scanner_finds_numbers_with_units_and_only_those(text, bare):
    assert numbers.numbers(text) == bare


@pytest.mark.parametrize("paragraph", [
    "The commit takes 13.1 µs (`kernels_h200.json`).",
    "The commit takes 13.1 µs (benchmarks/results/kernels_h200.json).",
    "stage's attention cost 1.3–1.4× move's (`tree_window_launch/warps8_h200.json`).",
    "The fork measured 4.8 % (its pull request #8).",
    "vLLM #12345 reports 3× on 70B.",
    "around 3× on large models (Li et al., arXiv:2401.15077)",
    "see https://example.org/bench for the 29 µs",
])
def test_a_citation_in_the_paragraph_covers_its_numbers(paragraph):
    assert numbers.scan_markdown(paragraph) == []


def test_a_citation_covers_only_its_own_paragraph_and_must_name_a_stored_file(tmp_path):
    md = "- eager 29 µs (`kernels_h200.json`)\n- graphed 2 µs\n\nAnother paragraph: 7× (`no_such_result.json`)."
    found = numbers.scan_markdown(md)
    assert [f.number for f in found] == ["2 µs", "7×"]
    fenced = "```bash\nnwor-lab bench  # 10 s\n```\n"
    assert numbers.scan_markdown(fenced) == []


def test_a_chapter_with_a_bare_number_fails_and_a_rendered_one_passes():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\nEager: ~20 µs per layer."),
                                         nbformat.v4.new_code_cell('display(Markdown(f"{us:.0f} µs per layer"))')])
    found = numbers.scan(nb)
    assert [(f.cell, f.number) for f in found] == [(0, "~20 µs")]
    nb.cells[0].source = "# T\n\nEager: the host's share per layer is printed below."
    assert numbers.scan(nb) == []
    json.dumps([str(f) for f in found])        # findings print as one line each


# -- a verdict computed from a run carries its scope ---------------------------------------------
# A code cell that renders a ranking or a crossover from a run (faster, slower, no slower, beats,
# ahead of, crossover) must say, in the same sentence, what it was measured on: graphed or eager, the
# device, the batch, the repeats or runs, a stored file, or that it is a demonstration
# (`numbers.scan_verdicts`). "as fast or faster at every measured point" is no scope.

@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_verdict_a_chapter_renders_says_what_it_was_measured_on(path):
    found = numbers.scan_verdicts(nbformat.read(str(path), as_version=4))
    assert not found, (f"{path.name}: verdict sentences rendered from a run without their scope (say graphed or "
                       f"eager, the device, the batch, the repeats, the stored file, or 'demonstration'):\n"
                       + "\n".join(map(str, found)))


@pytest.mark.parametrize("source, bare", [
    ('display(Markdown(f"`stage` is as fast or faster at every measured point ({r:.2f}×)."))',
     ["`stage` is as fast or faster at every measured point ({r}×)."]),
    ('print("EAGLE stops beating " + f"target-only at {c} clients" if c else "never")', []),      # clients: a load
    ('print(f"EAGLE stops beating target-only at {c}")', ["EAGLE stops beating target-only at {c}"]),
    ('x = f"Graphed, stage is faster than move at {n} points. Eager it is slower."', []),   # each names its regime
    ('x = "Graphed, stage is faster. It is also slower than cow."', ["It is also slower than cow."]),
    ('s = ("{} is faster than {}" if a else "x")', ["{} is faster than {}"]),
    ('% timeit f()', []),                             # a magic: not Python, nothing to read
    ('m = {"crossover": 1}', []),                     # a key, not a sentence
])
def test_the_verdict_rule_finds_unscoped_rankings_and_only_those(source, bare):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    assert [f.sentence for f in numbers.scan_verdicts(nb)] == bare


def test_a_scoped_verdict_passes_and_the_finding_names_its_cell():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# T"),
        nbformat.v4.new_code_cell('display(Markdown(f"stage is no slower than move at every point ({lo}–{hi}×)."))'),
        nbformat.v4.new_code_cell('display(Markdown(f"stage\'s graphed step is no slower than move\'s at every point."))'),
        nbformat.v4.new_code_cell('print(f"on {device}, one run: stage was faster (a demonstration)")')])
    found = numbers.scan_verdicts(nb)
    assert [f.cell for f in found] == [1] and str(found[0]).startswith("cell 1: stage is no slower")
