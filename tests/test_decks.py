"""Every chapter's deck carries the chapter: each `##` section has a slide, no slide is blank, every table
of a section on the deck is on a slide (not only in the speaker notes), the title slide keeps the
chapter's "You will learn" list, the deck is titled after the chapter, and the Discuss notes carry the
run's expected outputs. In headless Chromium (one launch for every deck), every slide of every deck
fits its 1280 x 720 slide (`nwor_lab.workshop.fit`); a deck with one slide made to overflow shows the
check fails. Those decks carry stand-in figures, not the run's printed output: with NWOR_LAB_KIT set
to a built kit, its real decks are checked too (the builder moves long output to the notes). The browser tests skip without Chromium (`apt-get install -y chromium`) or Playwright.

Cheap by design: the decks are built from the chapters as committed (no kernel runs). A code cell
authored onto the deck gets a stand-in output (a small figure, which every deck shows), as running it
would give it a figure or printed text; a code cell left off the deck gets nothing. The real decks, of
executed chapters, are built by `nwor-lab workshop build` (tests/test_workshop_kit.py builds one).
"""
import os
import re
from pathlib import Path

import nbformat
import pytest

from nwor_lab import exercises
from nwor_lab.workshop import chapters as ch
from nwor_lab.workshop import figures, fit, notes, slides, vendor

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _stand_in_figure():
    spec = {"data": [{"type": "bar", "x": [1], "y": [1]}], "layout": {"width": 600, "height": 300}}
    return nbformat.v4.new_output("display_data", data={figures.PLOTLY_MIME: spec, "text/plain": "<Figure>"})


def as_if_run(nb):
    for cell in nb.cells:
        st = cell.metadata.get("slideshow", {}).get("slide_type")
        if cell.cell_type == "code" and st not in (None, "skip", "notes"):
            cell.outputs = [_stand_in_figure()]
    return nb


def slides_of(deck):
    """[(slide cells, notes cells)] in order: a slide starts at a `slide` or `subslide` cell."""
    out = []
    for cell in deck.cells:
        st = cell.metadata.get("slideshow", {}).get("slide_type")
        if st in ("slide", "subslide") or not out:
            out.append(([], []))
        (out[-1][1] if st == "notes" else out[-1][0]).append(cell)
    return out


def visible(cell) -> bool:
    if cell.cell_type == "markdown":
        return bool(cell.source.strip())
    return bool(cell.get("outputs"))


def built(path, metrics=None):
    nb = as_if_run(ch.read(path))
    return nb, slides.deck(nb, notes.for_chapter(path.stem), exercises.by_chapter().get(path.stem, []), metrics)


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_section_is_on_a_slide_no_slide_is_blank_tables_are_shown(path):
    nb, deck = built(path)
    shown = [s for s in slides_of(deck)]
    blank = [i for i, (cells, _) in enumerate(shown) if not any(visible(c) for c in cells)]
    assert not blank, f"{path.name}: slides {blank} show nothing"
    on_slides = "\n".join(c.source for cells, _ in shown for c in cells if c.cell_type == "markdown")
    sections = [t for level, t in ch.headings(nb) if level == 2]
    missing = [t for t in sections if not re.search(r"^## " + re.escape(t) + r"\s*$", on_slides, flags=re.M)]
    assert not missing, f"{path.name}: sections with no slide of their own: {missing}"
    for cell in nb.cells:
        st = cell.metadata.get("slideshow", {}).get("slide_type")
        if cell.cell_type != "markdown" or st in (None, "skip", "notes"):
            continue
        for table in slides.tables(cell.source):
            assert table in on_slides, f"{path.name}: a table is only in the speaker notes: {table[:80]}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_authors_its_slides(path):
    nb = ch.read(path)
    authored = [c for c in nb.cells if c.metadata.get("slideshow", {}).get("slide_type")]
    assert authored, f"{path.name}: no slide metadata (View → Property Inspector → Slide Type)"


def test_the_discuss_notes_carry_this_runs_expected_outputs():
    path = ROOT / "notebooks" / "05_stage.ipynb"
    run = {"window_tokens": 17, "drafts": 8, "accepted": 5, "written_bytes": 57344, "skipped_bytes": 12288,
           "baseline_written_bytes": 69632, "launches_per_window": 1, "num_layers": 4, "attention_max_abs_diff": 0.0}
    _, deck = built(path, run)
    discuss = deck.cells[-1].source
    assert "the random window: 17 tokens, 8 drafts, 5 accepted" in discuss and "57,344 B" in discuss
    assert "not recorded in this run" not in discuss
    _, without = built(path)
    assert "not recorded in this run" in without.cells[-1].source


def test_a_table_under_a_slide_heading_stays_on_the_slide_and_sections_inside_a_cell_split():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# T", metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_markdown_cell("## 1 · Hooks\n\nProse for the notes.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                                      "More prose.\n\n## 2 · Next section\n\nIts prose.",
                                      metadata={"slideshow": {"slide_type": "slide"}, "tags": ["slide-heading"]})])
    deck = slides.deck(nb)
    kinds = [(c.metadata["slideshow"]["slide_type"], c.source.splitlines()[0]) for c in deck.cells]
    assert kinds == [("slide", "# T"), ("slide", "## 1 · Hooks"), ("notes", "Prose for the notes."),
                     ("slide", "## 2 · Next section"), ("notes", "Its prose.")]
    assert "| 1 | 2 |" in deck.cells[1].source and "| 1 | 2 |" not in deck.cells[2].source


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_title_slide_keeps_the_chapters_intro_and_the_deck_its_title(path):
    nb, deck = built(path)
    title = ch.title(nb)
    assert deck.metadata["title"] == re.sub(r"[*_`]", "", title)
    if "you will learn" in nb.cells[0].source.lower():
        title_slide = slides_of(deck)[0][0]
        assert any("you will learn" in c.source.lower() for c in title_slide), \
            f"{path.name}: the title slide dropped the chapter's 'You will learn' list"


def test_long_printed_output_goes_to_the_notes_and_a_table_output_keeps_only_its_table():
    long_text = "".join(f"line {i}\n" for i in range(80))
    table = nbformat.v4.new_output("display_data", data={
        "text/markdown": "| a | b |\n|---|---|\n| 1 | 2 |\n\nA note the room does not need to read.", "text/plain": "x"})
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# T", metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_code_cell("print()", metadata={"slideshow": {"slide_type": "slide"}, "tags": ["slide-text"]},
                                  outputs=[nbformat.v4.new_output("stream", name="stdout", text=long_text), table])])
    deck = slides.deck(nb)
    shown = [o for c in deck.cells if c.cell_type == "code" for o in c.outputs]
    assert "line 3" in shown[0]["text"] and "line 79" not in shown[0]["text"] and "speaker notes" in shown[0]["text"]
    assert shown[1]["data"]["text/markdown"].startswith("| a | b |") and "A note" not in shown[1]["data"]["text/markdown"]
    notes_text = "\n".join(c.source for c in deck.cells if c.metadata["slideshow"]["slide_type"] == "notes")
    assert "line 79" in notes_text and "A note the room" in notes_text


# --- in a browser: every slide fits ------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not fit.chromium():
        pytest.skip(f"chromium not found: {fit.INSTALL}")
    pytest.importorskip("playwright.sync_api", reason="playwright missing: pip install playwright (dev extra)")
    with fit.open_browser() as b:
        yield b


@pytest.fixture(scope="module")
def deck_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("decks")
    vendor.install(out)
    return out


def write_deck(nb, folder, name, path=None):
    html = slides.export(nb, plotly_js=vendor.PLOTLY_JS, reveal_prefix=vendor.REVEAL_DIR,
                         chapter_notes=notes.for_chapter(path.stem) if path else None,
                         exercises_here=exercises.by_chapter().get(path.stem, []) if path else ())
    (folder / f"{name}.slides.html").write_text(html)
    return folder / f"{name}.slides.html"


@pytest.mark.browser
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_slide_fits(path, browser, deck_folder):
    deck = write_deck(as_if_run(ch.read(path)), deck_folder, path.stem, path)
    bad = fit.overflows(browser, deck)
    assert not bad, "\n".join(map(str, bad))


KIT = os.environ.get("NWOR_LAB_KIT")      # a built kit (`nwor-lab workshop build`): its real decks, run outputs and all


@pytest.mark.browser
@pytest.mark.skipif(not KIT, reason="set NWOR_LAB_KIT=runs/workshop (after `nwor-lab workshop build`) to check a built kit's decks")
def test_every_slide_of_a_built_kit_fits(browser):
    decks = sorted(Path(KIT).glob("*.slides.html"))
    assert decks, f"{KIT}: no *.slides.html (build the kit first: nwor-lab workshop build --out {KIT})"
    bad = [o for deck in decks for o in fit.overflows(browser, deck)]
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.browser
def test_the_fit_check_fails_on_a_slide_that_overflows(browser, deck_folder):
    prose = "\n".join(f"- point {i}: a sentence long enough to take a line of the slide" for i in range(30))
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A deck", metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_markdown_cell("## Fits\n\nOne line.", metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_markdown_cell("## Too long\n\n" + prose, metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_markdown_cell("| " + " | ".join(f"column {i}" for i in range(40)) + " |\n|" + "---|" * 40,
                                      metadata={"slideshow": {"slide_type": "slide"}})])
    bad = fit.overflows(browser, write_deck(nb, deck_folder, "planted"))
    assert [(o.slide, o.heading) for o in bad] == [(3, "Too long"), (4, "")]
    assert bad[0].past_bottom > 100 and bad[1].past_right > 100
