"""The kit's pieces without running a chapter: decks built from cell metadata, the agenda, the
instructor notes, the offline check and the vendored reveal.js."""
import json
import math
import re

import nbformat
import pytest

from nwor_lab.workshop import agenda, figures, kit, notes, offline, slides, vendor

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def figure_output(width=900, height=400, title="a figure"):
    spec = {"data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}],
            "layout": {"width": width, "height": height, "title": {"text": title}}}
    return nbformat.v4.new_output("display_data", data={figures.PLOTLY_MIME: spec, "text/plain": "<Figure>"})


def stream(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def code(source, outputs=(), slide=None, tags=()):
    meta = {}
    if slide:
        meta["slideshow"] = {"slide_type": slide}
    if tags:
        meta["tags"] = list(tags)
    cell = nbformat.v4.new_code_cell(source, metadata=meta)
    cell.outputs = list(outputs)
    return cell


def md(source, slide=None, tags=()):
    meta = {"slideshow": {"slide_type": slide}} if slide else {}
    if tags:
        meta["tags"] = list(tags)
    return nbformat.v4.new_markdown_cell(source, metadata=meta)


def types(deck):
    return [(c.cell_type, c.metadata.get("slideshow", {}).get("slide_type")) for c in deck.cells]


def test_an_authored_chapter_keeps_only_its_slide_cells_code_hidden():
    nb = nbformat.v4.new_notebook(cells=[
        md("# Title\n\nYou will learn: things.", "slide"),
        code("x = 1", [stream("noise\n")]),                                      # not authored: left out
        md("## 1 · Section\n\nLong prose that belongs in the notes.", "slide", ["slide-heading"]),
        code("fig", [stream("printed\n"), figure_output()], "-"),                # figure kept, text dropped
        code("print(2)", [stream("kept text\n")], "-", ["slide-text"]),
        code("a = 1\nb = 2", [], "fragment", ["slide-code"]),
        md("A remark for the speaker.", "notes"),
    ])
    deck = slides.deck(nb)
    sources = [c.source for c in deck.cells]
    assert "x = 1" not in "".join(sources) and "noise" not in json.dumps([c.get("outputs") for c in deck.cells])
    assert deck.cells[1].source == "## 1 · Section"
    assert types(deck)[2] == ("markdown", "notes") and "Long prose" in deck.cells[2].source
    fig_cell = deck.cells[3]
    assert [o.output_type for o in fig_cell.outputs] == ["display_data"]
    html = fig_cell.outputs[0]["data"]["text/html"]
    assert 'class="nwor-slide-figure"' in html and "zoom:" in html and figures.PLOTLY_MIME not in fig_cell.outputs[0]["data"]
    assert deck.cells[4].outputs[0]["text"] == "kept text\n"
    assert deck.cells[5].source == "```python\na = 1\nb = 2\n```" and types(deck)[5] == ("markdown", "fragment")
    assert types(deck)[-1] == ("markdown", "notes")


def test_several_figures_in_one_cell_become_sub_slides_and_fit_the_box():
    nb = nbformat.v4.new_notebook(cells=[md("## Frames", "slide"),
                                         code("", [figure_output(1380, 700), figure_output(560, 300)], "-")])
    deck = slides.deck(nb)
    assert types(deck) == [("markdown", "slide"), ("code", "-"), ("code", "subslide")]
    zoom = float(deck.cells[1].outputs[0]["data"]["text/html"].split("zoom: ")[1].split(";")[0])
    assert 1380 * zoom <= figures.SLIDE_FIGURE[0] and 700 * zoom <= figures.SLIDE[1] - 60
    small = float(deck.cells[2].outputs[0]["data"]["text/html"].split("zoom: ")[1].split(";")[0])
    assert small <= figures.MAX_SLIDE_ZOOM


def test_a_chapter_without_authoring_gets_a_generated_deck():
    nb = nbformat.v4.new_notebook(cells=[
        md("# A new chapter\n\nIntro."), code("setup()", [stream("x\n")]),
        md("## 1 · First\n\nProse one."), code("a", [stream("text\n")]), code("fig", [figure_output()]),
        code("fig2", [figure_output()]), md("## Exercise 1: do it\n\nWhat to do.")])
    deck = slides.deck(nb)
    kinds = types(deck)
    assert kinds[0] == ("markdown", "slide") and deck.cells[0].source.startswith("# A new chapter\n\nIntro.")
    assert ("markdown", "notes") in kinds and deck.cells[1].source == "## 1 · First"
    assert sum(1 for c in deck.cells if c.cell_type == "code") == 1, "the section's first figure only"
    assert deck.cells[-1].source.startswith("## Exercise 1: do it\n\nWhat to do.")


def test_the_kit_adds_speaker_notes_a_discuss_slide_and_exercise_answers():
    from nwor_lab import exercises
    nb = nbformat.v4.new_notebook(cells=[md("# 04 · SCV", "slide"),
                                         md("## Exercise (b) · `acceptance_mask`: count as SCV does", "slide")])
    deck = slides.deck(nb, notes.for_chapter("04_scv"), exercises.by_chapter()["04_scv"])
    assert types(deck)[1] == ("markdown", "notes") and "**Say:**" in deck.cells[1].source
    answer = [c.source for c in deck.cells if "Predict first" in c.source]
    assert answer and "Answer: 1:" in answer[0]
    assert deck.cells[-2].source.startswith("## Discuss\n\n1. ") and types(deck)[-1] == ("markdown", "notes")


def test_the_exported_deck_loads_only_local_files():
    nb = nbformat.v4.new_notebook(cells=[md("# T", "slide"), code("", [figure_output()], "-")])
    page = slides.export(nb, plotly_js=vendor.PLOTLY_JS, reveal_prefix=vendor.REVEAL_DIR)
    assert '<script src="reveal.js/dist/reveal.js"></script>' in page and 'src="assets/plotly.min.js"' in page
    assert "width: 1280" in page and "height: 720" in page and "RevealNotes" in page
    assert offline.external_urls(offline.strip_css_comments(page)) == []
    assert "require.min.js" not in page and "mathjax" not in page.lower().replace("mathjaxconfig", "")


def test_offline_check_finds_resources_but_not_links():
    page = ('<link rel="stylesheet" href="https://cdn.example.com/x.css"><a href="https://github.com/a/b">src</a>'
            '<style>/* credit: https://example.org */ .a { background: url(//fonts.example.com/f.woff) }</style>')
    assert offline.external_urls(page) == ["https://cdn.example.com/x.css", "https://example.org",
                                           "//fonts.example.com/f.woff"]
    with pytest.raises(offline.ExternalURL, match="cdn.example.com"):
        offline.check_page(page, "x.html")
    assert offline.external_urls('<a href="https://github.com/a">read it</a>') == []


def test_vendored_reveal_matches_its_record_and_installs(tmp_path):
    assert vendor.check() == []
    record = json.loads(vendor.RECORD.read_text())
    assert record["license"] == "MIT" and record["integrity"].startswith("sha512-")
    assert "Permission is hereby granted" in (vendor.VENDOR / "LICENSE").read_text()
    assert sum((vendor.VENDOR / f).stat().st_size for f in vendor.FILES) < 300_000
    assert "@import url(./fonts" not in (vendor.VENDOR / "dist/theme/white.css").read_text()
    vendor.install(tmp_path)
    for name in vendor.FILES:
        assert (tmp_path / vendor.REVEAL_DIR / name).exists()
    assert (tmp_path / vendor.PLOTLY_JS).stat().st_size > 1_000_000


def test_expected_outputs_are_filled_from_the_run_or_say_they_are_missing():
    n = notes.for_chapter("05_stage")
    lines = n.expected({"window_tokens": 17, "drafts": 8, "accepted": 5, "written_bytes": 57344, "skipped_bytes": 12288,
                        "baseline_written_bytes": 69632, "launches_per_window": 1, "num_layers": 4,
                        "attention_max_abs_diff": 0.0})
    assert lines[0] == "the random window: 17 tokens, 8 drafts, 5 accepted"
    assert "57,344 B" in lines[1] and "12,288 B" in lines[1]
    missing = notes.fill("on a GPU: {scv_off_us:.1f} µs", {"scv_off_us": None})
    assert missing == "on a GPU: scv_off_us µs — not recorded in this run (scv_off_us)"


def test_every_chapter_has_notes_with_questions_and_a_misconception():
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    for stem in stems:
        n = notes.for_chapter(stem)
        assert n is not None, f"{stem}: no instructor notes (nwor_lab/workshop/notes.py)"
        assert 2 <= len(n.questions) <= 3 and n.misconception and len(n.say) >= 3, stem
        source = (ROOT / "notebooks" / f"{stem}.ipynb").read_text()
        for template in n.expect:     # every metric an expected output names is one the chapter records
            for name in re.findall(r"\{(\w+)", template):    # a literal key, or one made in a loop (acceptance_d{j})
                made_in_loop = re.sub(r"\d+$", "", name) + "{" in source          # acceptance_d{j}
                keyed_by_mode = "}_" + name.partition("_")[2] in source               # {m}_rejected_kib_in_blocks
                assert name in source or made_in_loop or keyed_by_mode, (stem, name)
    assert not [n.stem for n in notes.NOTES.values() if n.pending and (ROOT / "notebooks" / f"{n.stem}.ipynb").exists()]


def built(name, seconds, status="ok"):
    return kit.Built(name, f"notebooks/{name}.ipynb", name, status == "ok", seconds, status=status,
                     error=None if status == "ok" else "kernel 'nwor-lab-vllm' is not installed here")


ALL = ("00_tour", "01_why", "02_paged_cache", "03_verify_window", "04_scv", "05_stage", "06_cow",
       "07_sliding_window", "08_eagle", "10_sweep", "11_performance", "12_exercises", "13_state", "14_trees", "15_prefix")


def measured_build(scale=1.0):
    """A build whose every chapter ran, at its notes' run time (measured, or the estimate) times `scale`;
    09 skipped (no vLLM kernel), as on a laptop."""
    return [built(s, notes.for_chapter(s).run_estimate_s * scale) for s in ALL] + [built("09_vllm", 0.0, "skipped")]


def adds_up(p):
    """Every slot of a plan is its parts added up, the slots chain, and the day ends at its total."""
    for s in p.slots:
        if s.kind == "chapter":
            parts = s.run_s / 60 + s.talk_min + s.hands_on_min
            assert parts <= s.minutes < parts + 1, (s.stem, s.minutes, parts)
            assert s.role == agenda.DEMO or s.hands_on_min > 0, s.stem
            assert s.role == agenda.TAUGHT or s.hands_on_min == 0, s.stem
    for a, b in zip(p.slots, p.slots[1:]):
        assert b.start_min == a.start_min + a.minutes
    assert sum(s.minutes for s in p.slots) == p.agenda.total_min and p.fits
    assert p.slots[0].kind == "setup" and p.slots[-1].kind == "wrap-up"
    assert p.slots[-1].minutes >= p.agenda.wrap_up_min


def test_the_three_hour_path_adds_up_from_measured_run_times_with_two_breaks():
    p = agenda.plan(measured_build(), agenda.THREE_HOUR)
    adds_up(p)
    assert p.slots[-1].clock.endswith("3:00")
    assert [s.kind for s in p.slots].count("break") == 2
    by = {s.stem: s for s in p.slots if s.kind == "chapter"}
    assert 18 <= by["13_state"].minutes <= 22 and 18 <= by["14_trees"].minutes <= 22      # about 20 minutes each
    roles = {s.role for s in by.values()}
    assert roles == {agenda.TAUGHT, agenda.DEMO} and "15_prefix" in p.homework + p.self_paced
    assert set(by) | set(p.homework) | set(p.self_paced) >= set(ALL) | {"09_vllm"}     # every chapter is placed
    from nwor_lab import exercises
    for stem, ex in exercises.by_chapter().items():       # a taught chapter has time for its exercises
        if stem in by and by[stem].role == agenda.TAUGHT:
            assert by[stem].hands_on_min >= 4 * len(ex), stem
    vllm = agenda.plan(measured_build(), agenda.FULL_DAY)
    nine = next(s for s in vllm.slots if s.stem == "09_vllm")
    assert not nine.run_measured and "skipped" in nine.note


def test_the_full_day_teaches_every_chapter_and_adds_up():
    p = agenda.plan(measured_build(), agenda.FULL_DAY)
    adds_up(p)
    placed = [s.stem for s in p.slots if s.kind == "chapter"]
    assert set(placed) == set(ALL) | {"09_vllm"} and placed == sorted(placed)
    assert [s.title for s in p.slots if s.kind == "break"] == ["Break", "Lunch", "Break"]
    twelve = next(s for s in p.slots if s.stem == "12_exercises")
    assert twelve.hands_on_min >= 3 * 6, f"{twelve.hands_on_min} min of hands-on for three exercises"


def test_a_longer_measured_run_gets_a_longer_slot_and_a_day_that_overflows_says_by_how_much():
    base = agenda.plan(measured_build(), agenda.THREE_HOUR)
    slower = agenda.plan([built(b.name, 600.0 if b.name == "08_eagle" else b.seconds, b.status)
                          for b in measured_build()], agenda.THREE_HOUR)
    eagle = lambda p: next(s for s in p.slots if s.stem == "08_eagle")  # noqa: E731
    e = eagle(slower)
    assert e.minutes == math.ceil(600 / 60 + e.talk_min + e.hands_on_min) > eagle(base).minutes
    assert eagle(slower).run_measured and eagle(slower).run_s == 600.0
    assert not slower.fits and slower.over_min == sum(s.minutes for s in slower.slots) - 180
    assert slower.slots[-1].minutes == agenda.THREE_HOUR.wrap_up_min       # no slack left: nothing scaled away


def test_a_chapter_the_build_lacks_keeps_its_slot_with_its_estimate():
    p = agenda.plan([built("00_tour", 30.0)], agenda.THREE_HOUR)
    why = next(s for s in p.slots if s.stem == "01_why")
    assert not why.run_measured and "not in this build" in why.note and why.run_s == notes.for_chapter("01_why").run_estimate_s
    tour = next(s for s in p.slots if s.stem == "00_tour")
    assert tour.run_measured and tour.run_s == 30.0


def test_an_agenda_line_refuses_a_role_it_cannot_have():
    with pytest.raises(ValueError, match="role='homework'"):
        agenda.Line("10_sweep", "homework", talk_min=5)
    with pytest.raises(ValueError, match="a demo has no hands-on minutes"):
        agenda.Line("10_sweep", agenda.DEMO, talk_min=5, hands_on_min=3)


def test_every_discussion_question_has_an_answer_key_in_the_notes_and_the_deck():
    for n in notes.NOTES.values():
        assert len(n.answers) == len(n.questions) and all(len(a) > 40 for a in n.answers), n.stem
        discuss = n.discuss_notes({})
        assert "**Answer key:**" in discuss and all(a in discuss for a in n.answers), n.stem


def test_the_day_starts_with_a_setup_slot_and_the_kit_says_what_to_install():
    p = agenda.plan([built("00_tour", 30.0)])
    assert p.slots[0].kind == "setup" and p.slots[0].minutes == notes.SETUP_MIN and p.slots[0].start_min == 0
    assert sum(s.minutes for s in p.slots) == 180
    for needed in ("make setup", "make setup-vllm", "Binder", "09", "environment.yml"):
        assert needed in notes.SETUP, needed


def test_a_self_paced_chapter_gets_no_slot_in_either_agenda(monkeypatch):
    import dataclasses
    monkeypatch.setitem(notes.NOTES, "15_prefix", dataclasses.replace(notes.NOTES["15_prefix"], in_agenda=False))
    for p in agenda.plans(measured_build()).values():
        assert "15_prefix" not in {s.stem for s in p.slots} and "15_prefix" in p.self_paced
        assert sum(s.minutes for s in p.slots) == p.agenda.total_min
