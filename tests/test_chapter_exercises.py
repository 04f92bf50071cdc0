"""Every chapter carries its exercises (09's runs in vLLM's kernel: its exercise is checked in
tests/test_exercises_l_to_p.py), and they run as a
learner finds them: the untouched stubs report "not attempted yet" (never FAIL), the references
pass (use_solutions=True, as CI and instructors run them). The exercise cells need nothing from the
rest of their chapter, so they run here without a kernel."""
import contextlib
import io
from pathlib import Path

import pytest

from nwor_lab import exercises
from nwor_lab.workshop import chapters as ch

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ("00_tour", "01_why", "02_paged_cache", "03_verify_window", "04_scv", "05_stage", "06_cow",
            "07_sliding_window", "08_eagle", "09_vllm", "10_sweep", "11_performance", "12_exercises",
            "13_state", "14_trees", "15_prefix", "16_stage_read_path", "17_sampling")


def exercise_cells(stem):
    nb = ch.read(ROOT / "notebooks" / f"{stem}.ipynb")
    return nb, [c.source for c in nb.cells if c.cell_type == "code" and "exercises." in c.source]


def run_cells(sources, use_solutions):
    scope = {"use_solutions": use_solutions, "n_cases": 300, "seed": 0}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in sources:
            exec(compile(source, "<cell>", "exec"), scope)   # noqa: S102 - the chapter's own cells
    return out.getvalue()


@pytest.mark.parametrize("stem", [s for s in TEACHING if (ROOT / "notebooks" / f"{s}.ipynb").exists()])
def test_chapter_exercises_run_as_stubs_and_as_references(stem):
    nb, sources = exercise_cells(stem)
    mine = [e.name for e in exercises.by_chapter().get(stem, [])]
    assert mine, f"{stem}: no exercise lives here"
    text = "\n".join(sources)
    for name in mine:
        assert f'exercises.check("{name}"' in text or f"check_{name}(" in text, f"{stem} does not check {name}"
        assert f'exercises.predict("{name}"' in text and f'exercises.hints("{name}")' in text, name
    assert ch.exercises(nb), f"{stem}: no 'Exercise' heading for the kit's index"
    stub = run_cells(sources, use_solutions=False)
    assert "FAIL" not in stub and all(f"not attempted yet: {name}" in stub for name in mine), stub
    solved = run_cells(sources, use_solutions=True)
    assert all(f"PASS {name} (300 cases)" in solved for name in mine), solved


def test_every_exercise_lives_in_a_chapter_that_exists():
    for stem in exercises.by_chapter():
        assert (ROOT / "notebooks" / f"{stem}.ipynb").exists(), stem


@pytest.mark.parametrize("stem", [s for s in TEACHING if (ROOT / "notebooks" / f"{s}.ipynb").exists()])
def test_the_kit_index_lists_each_chapters_exercises_by_name(stem):
    from nwor_lab.workshop import kit
    nb = ch.read(ROOT / "notebooks" / f"{stem}.ipynb")
    entries = kit.exercise_entries(nb, stem, None)
    assert sorted(e["name"] or "?" for e in entries) == sorted(e.name for e in exercises.by_chapter()[stem])
    assert all(e["anchor"] for e in entries), "each links to its heading in the chapter's page"
