"""Chapter hygiene: every committed `notebooks/*.ipynb` is clean, parameterised and listed.

The checker (`nwor_lab.workshop.chapters.problems`) is itself tested on the placeholders in
tests/data/notebooks, so these tests can fail even while `notebooks/` is still empty. The last
test runs nbval exactly as `make test-notebooks` does, to prove the sanitize file masks what
varies between runs and keeps the numbers a chapter checks.
"""
import configparser
import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import nbformat
import pytest

from nwor_lab.workshop import chapters as ch

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
from notebook_fixtures import materialise  # noqa: E402

CLEAN = materialise("stepper")
DIRTY = materialise("dirty", CLEAN.parent)
NO_CHAPTERS = "no chapters in notebooks/ yet (the checker itself is tested on tests/data/notebooks)"


@pytest.mark.parametrize("path", CHAPTERS or [pytest.param(None, marks=pytest.mark.skip(reason=NO_CHAPTERS))],
                         ids=lambda p: p.name if p else "none")
def test_chapter_is_clean(path):
    assert ch.problems(path) == [], f"{path.name}: " + "; ".join(ch.problems(path))


@pytest.mark.skipif(not CHAPTERS, reason=NO_CHAPTERS)
def test_every_chapter_is_listed_in_a_readme():
    missing = ch.unlisted(CHAPTERS, ROOT / "README.md", ROOT / "notebooks" / "README.md")
    assert not missing, f"not named in README.md nor notebooks/README.md: {[p.name for p in missing]}"


# --- the checker, on the placeholders -------------------------------------------------------

def _variant(tmp_path, name, change):
    nb = ch.read(CLEAN)
    change(nb)
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return path


def test_checker_passes_the_clean_placeholder():
    assert ch.problems(CLEAN) == []
    info = ch.chapter(CLEAN)
    assert info.title == "Placeholder: a stepper" and info.parameters == {"interactive": True}
    assert [e.title for e in info.exercises] == ["Exercise 1: count the skipped bytes"]


def test_checker_catches_the_committed_dirty_placeholder():
    found = ch.problems(DIRTY)
    assert any("have outputs" in p for p in found)
    assert any("execution counts" in p for p in found)
    assert any("no code cell tagged 'parameters'" in p for p in found)


def _add_output(nb):
    cell = next(c for c in nb.cells if c.cell_type == "code" and not ch.checked(c))
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]


def _add_image(nb):
    cell = next(c for c in nb.cells if ch.checked(c))
    cell.outputs.append(nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}))


def _untag(nb):
    ch.parameters_cells(nb)[0].metadata["tags"] = []


def _set_params(source):
    return lambda nb: setattr(ch.parameters_cells(nb)[0], "source", source)


@pytest.mark.parametrize("change,expected", [
    (_add_output, "have outputs and are not marked NBVAL_CHECK_OUTPUT"),
    (lambda nb: setattr(nb.cells[1], "execution_count", 3), "execution counts"),
    (lambda nb: next(c for c in nb.cells if ch.checked(c)).update(outputs=[]), "store no expected output"),
    (lambda nb: next(c for c in nb.cells if ch.checked(c)).update(execution_count=None), "nbval compares nothing"),
    (_add_image, "store more than text"),
    (lambda nb: nb.metadata.update(widgets={"state": {}}), "saved widget state"),
    (lambda nb: nb.metadata.kernelspec.update(name="nwor"), "kernelspec is 'nwor'"),
    (_untag, "no code cell tagged 'parameters'"),
    (_set_params("k = 4"), "does not assign interactive"),
    (_set_params("interactive = 'yes'"), "does not assign interactive"),
    (_set_params("interactive = (("), "does not parse"),
    (lambda nb: nb.update(cells=[c for c in nb.cells if c.cell_type == "code"]), "no markdown heading"),
], ids=["outputs", "counts", "checked-empty", "checked-uncounted", "checked-image", "widget-state", "kernel", "no-parameters",
        "no-interactive", "interactive-str", "syntax", "no-title"])
def test_checker_catches_each_defect(tmp_path, change, expected):
    found = ch.problems(_variant(tmp_path, "bad.ipynb", change))
    assert len(found) == 1 and expected in found[0], found


def test_checker_accepts_annotated_false(tmp_path):
    path = _variant(tmp_path, "ok.ipynb", _set_params("interactive: bool = False\nk = 4"))
    assert ch.problems(path) == [] and ch.chapter(path).parameters == {"interactive": False, "k": 4}


@pytest.mark.parametrize("text", ["{ not json", json.dumps(
    {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "id": "a", "source": "", "metadata": {}}]})],
    ids=["json", "schema"])
def test_checker_rejects_invalid_nbformat(tmp_path, text):
    path = tmp_path / "broken.ipynb"
    path.write_text(text)
    found = ch.problems(path)
    assert len(found) == 1 and found[0].startswith("not a valid nbformat notebook")


def test_clean_keeps_only_checked_text_outputs():
    nb = ch.read(DIRTY)
    nb.cells.append(copy.deepcopy(nb.cells[1]))
    nb.cells[-1].source = "# NBVAL_CHECK_OUTPUT\n" + nb.cells[-1].source
    nb.cells[-1].execution_count = 7
    nb.metadata["widgets"] = {"state": {}}
    ch.clean(nb)
    assert nb.cells[1].outputs == [] and nb.cells[1].execution_count is None
    assert nb.cells[-1].outputs[0].text == "4\n" and nb.cells[-1].execution_count == 1
    assert "widgets" not in nb.metadata


def test_unlisted_names_the_missing_chapter(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("- [the stepper](tests/data/notebooks/stepper.ipynb)\n")
    assert ch.unlisted([CLEAN, DIRTY], readme, tmp_path / "absent.md") == [DIRTY]


# --- nbval, as `make test-notebooks` runs it ------------------------------------------------

def _sanitize_patterns():
    from nbval.plugin import get_sanitize_patterns
    return get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())


def _sanitize(text):
    for regex, replace in _sanitize_patterns():
        text = re.sub(regex, replace, text)
    return text


def test_sanitize_file_is_well_formed():
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "tests" / "nbval_sanitize.cfg")
    assert len(_sanitize_patterns()) == len(cfg.sections()) >= 8  # every section yields one pair


@pytest.mark.parametrize("varies", [
    "step 12.3 ms", "total 1.2 s", "5 µs", "7.25us", "3e-05 s", "2 seconds", "817 tok/s", "4.22 TB/s", "2.8 GB/s",
    "<Foo at 0x7f3a2b4c5d60>", "/tmp/tmpab12cd/x.json", "/var/folders/x/T/y", "2025-11-22 05:04:52.123+00:00",
    "2025-11-22T05:04:52Z", "at 05:04:52", "NVIDIA H200", "NVIDIA H100 80GB HBM3", "device='cuda:0'", "device='cpu'",
    "torch 2.14.1+cu130",
])
def test_sanitize_masks_what_varies(varies):
    masked = _sanitize(varies)
    assert not re.search(r"\d{2,}|0x|/tmp|/var|H[12]00|cuda|cpu", masked), (varies, masked)


@pytest.mark.parametrize("kept", [
    "committed 3 of 5 slots, 1536 bytes", "accepted length 3.72, k = 4", "tensor([0, 1, 2, 3, -1])",
    "slot 17 = block 1 * 16 + offset 1", "bytes_written=2048 bytes_skipped=1024", "layers: 32, heads 8 x 128",
    "64 requests x (1 + 4) tokens", "sampled ids [[7, 5, -1, -1]]",
])
def test_sanitize_keeps_the_lab_numbers(kept):
    assert _sanitize(kept) == kept


def _makefile_nbval_flags():
    line = re.search(r"^NBVAL := (.*)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert line, "the Makefile defines NBVAL := ... (the flags test-notebooks passes to pytest)"
    return line.group(1).split()


@pytest.mark.slow      # runs nbval (a Jupyter kernel) twice
def test_nbval_run_masks_timings_and_catches_changed_numbers(tmp_path):
    """Two copies of the clean placeholder under nbval with the Makefile's flags: one whose stored
    output differs only in the timing (must pass), one whose stored count differs (must fail)."""
    def stored(text):
        def change(nb):
            cell = next(c for c in nb.cells if ch.checked(c))
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
            for c in nb.cells:  # skip the stepper: this checks nbval, not the widgets
                if c.cell_type == "code" and "display(" in c.source:
                    c.source = "# NBVAL_SKIP\n" + c.source
        return change
    good = _variant(tmp_path, "timing_differs.ipynb", stored("committed 3 of 5 slots, 1536 bytes\ncounted in 987.654 ms\n"))
    bad = _variant(tmp_path, "count_differs.ipynb", stored("committed 4 of 5 slots, 1536 bytes\ncounted in 0.1 ms\n"))
    report = tmp_path / "junit.xml"
    flags = [f if not f.endswith(".cfg") else str(ROOT / f) for f in _makefile_nbval_flags()]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags, f"--junitxml={report}",
                          "--rootdir", str(tmp_path), str(good), str(bad)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    failures = {"timing": [], "count": []}
    for case in ElementTree.parse(report).iter("testcase"):
        failure = case.find("failure")
        name = case.get("classname", "") + case.get("name", "")
        failures["timing" if "timing_differs" in name else "count"].append(failure.get("message", "") if failure is not None else None)
    assert len(failures["timing"]) == len(failures["count"]) > 3  # every cell collected in both
    assert not any(failures["timing"]), run.stdout[-3000:]
    assert [m for m in failures["count"] if m] and all("Cell outputs differ" in m for m in failures["count"] if m), run.stdout[-3000:]
    assert run.returncode == 1
