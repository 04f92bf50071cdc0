"""The workshop kit (`nwor-lab workshop build`) on the placeholder chapter plus a failing one:
every chapter executed with interactive=False, exported as HTML and slides, listed in index.html;
a failing chapter is listed with its error while the others build, and the exit code says so."""
import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from nwor_lab.workshop import add_parsers, kit, main

from notebook_fixtures import materialise  # noqa: E402

PLACEHOLDER = materialise("stepper")
materialise("dirty", PLACEHOLDER.parent)


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_markdown_cell(sources[0])]
    nb.cells += [nbformat.v4.new_code_cell(s, metadata={"tags": ["parameters"]} if i == 0 else {})
                 for i, s in enumerate(sources[1:])]
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build through the CLI: 01 = the placeholder, 02 = fails in its second code cell."""
    root = tmp_path_factory.mktemp("kit")
    chapters, out = root / "chapters", root / "out"
    chapters.mkdir()
    shutil.copy(PLACEHOLDER, chapters / "01_stepper.ipynb")
    _notebook(chapters / "02_fails.ipynb", "# Fails on purpose\n\n## Exercise A: find the bug",
              "interactive = True", "print('parameters seen:', interactive)\n1 / 0", "print('never runs')")
    (chapters / ".ipynb_checkpoints").mkdir()
    shutil.copy(PLACEHOLDER, chapters / ".ipynb_checkpoints" / "01_stepper-checkpoint.ipynb")
    code = main(["build", "--chapters", str(chapters / "*.ipynb"), "--out", str(out), "--timeout", "120"])
    return code, out, json.loads((out / "index.json").read_text())


@pytest.mark.slow
def test_failing_chapter_fails_the_build_but_not_the_others(built, capsys):
    code, out, index = built
    assert code == 1
    stepper, fails = index["chapters"]
    assert [c["name"] for c in index["chapters"]] == ["01_stepper", "02_fails"]  # sorted, checkpoints skipped
    assert stepper["ok"] and stepper["error"] is None and stepper["seconds"] > 0
    assert not fails["ok"] and "ZeroDivisionError" in fails["error"]
    assert index["parameters"] == {"interactive": False}


@pytest.mark.slow
def test_each_chapter_is_exported_and_ran_with_interactive_false(built):
    _, out, index = built
    for chapter in index["chapters"]:  # the failing one too, up to its error
        assert (out / chapter["html"]).stat().st_size > 10_000 and (out / chapter["slides"]).exists()
    executed = nbformat.read(str(out / index["chapters"][1]["executed"]), as_version=4)
    assert any("parameters seen: False" in o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "ZeroDivisionError" in (out / "02_fails.html").read_text()


@pytest.mark.slow
def test_html_is_self_contained_and_draws_the_static_figures(built):
    _, out, _ = built
    page = (out / "01_stepper.html").read_text()
    assert not re.search(r'<link[^>]+rel="stylesheet"[^>]+href="https?:', page), "CSS is inlined"
    assert page.count('class="plotly-graph-div"') == 3, "interactive=False shows one static figure per phase"
    assert "phase 3\\u002f3: commit" in page and "committed 3 of 5 slots, 1536 bytes" in page  # plotly escapes '/'


@pytest.mark.slow
def test_slides_break_at_headings(built):
    _, out, _ = built
    slides = (out / "01_stepper.slides.html").read_text()
    assert "reveal" in slides.lower()
    assert slides.count("<section") >= 4  # title, "The stepper", "Exercise 1" (+ reveal's wrapper)


@pytest.mark.slow
def test_index_lists_titles_times_links_and_exercises(built):
    _, out, index = built
    page = (out / "index.html").read_text()
    for chapter in index["chapters"]:
        assert chapter["title"] in page and f'href="{chapter["html"]}"' in page and f'href="{chapter["slides"]}"' in page
        assert f'{chapter["seconds"]:.1f} s' in page
    exercise = index["chapters"][0]["exercises"][0]
    assert exercise["title"] == "Exercise 1: count the skipped bytes"
    assert f'href="01_stepper.html#{exercise["anchor"]}"' in page
    assert f'id="{exercise["anchor"]}"' in (out / "01_stepper.html").read_text(), "the link lands on the heading"
    assert "Exercise A: find the bug" in page
    assert "failed" in page and "ZeroDivisionError" in page


@pytest.mark.slow
def test_timeout_fails_the_chapter(tmp_path):
    sleeper = _notebook(tmp_path / "slow.ipynb", "# Slow", "interactive = True", "import time\ntime.sleep(60)")
    built = kit.build_chapter(sleeper, tmp_path / "out", timeout=2)
    assert not built.ok and "timed out" in built.error.lower() and built.seconds < 30, built


def test_no_chapters_is_an_error(tmp_path, capsys):
    assert main(["build", "--chapters", str(tmp_path / "*.ipynb"), "--out", str(tmp_path / "out")]) == 2
    assert "no chapters match" in capsys.readouterr().err


def test_add_parsers_wires_workshop_build_for_the_lab_cli(tmp_path):
    parser = argparse.ArgumentParser(prog="nwor-lab")
    add_parsers(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["workshop", "build", "--chapters", "x/*.ipynb", "--timeout", "5"])
    assert args.cmd == "workshop" and args.chapters == "x/*.ipynb" and args.timeout == 5 and args.out == "runs/workshop"
    assert callable(args.func) and args.func.__name__ == "_build"
    (tmp_path / "a.ipynb").write_text("{}")           # clean checks its files exist when parsing
    args = parser.parse_args(["workshop", "clean", "--execute", str(tmp_path / "a.ipynb")])
    assert args.func.__name__ == "_clean" and args.notebooks == [str(tmp_path / "a.ipynb")]


def test_python_dash_m_entry_point():
    run = subprocess.run([sys.executable, "-m", "nwor_lab.workshop", "build", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "--chapters" in run.stdout and "index.html" in run.stdout


def test_clean_command_strips_a_notebook_in_place(tmp_path, capsys):
    dirty = tmp_path / "dirty.ipynb"
    shutil.copy(PLACEHOLDER.parent / "dirty.ipynb", dirty)
    assert main(["clean", str(dirty)]) == 1  # cleaned, but it still has no parameters cell
    assert "still has problems: no code cell tagged 'parameters'" in capsys.readouterr().out
    nb = nbformat.read(str(dirty), as_version=4)
    assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code")


@pytest.mark.slow
def test_a_chapter_whose_kernel_is_missing_is_skipped_not_failed(tmp_path, capsys):
    """09_vllm runs in kernel nwor-lab-vllm (make setup-vllm): where it is missing the kit says so."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "nwor-lab-no-such-kernel", "display_name": "x",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# Needs another kernel\n\n## 1 · A section"),
                nbformat.v4.new_code_cell("interactive = True", metadata={"tags": ["parameters"]})]
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    nbformat.write(nb, str(chapters / "09_other.ipynb"))
    out = tmp_path / "out"
    assert main(["build", "--chapters", str(chapters), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1 skipped" in printed and "'nwor-lab-no-such-kernel' is not installed here" in printed
    index = json.loads((out / "index.json").read_text())
    (chapter,) = index["chapters"]
    assert chapter["status"] == "skipped" and chapter["executed"] is None and chapter["seconds"] == 0
    assert (out / chapter["slides"]).exists() and (out / chapter["html"]).exists()   # the unexecuted text, still
    page = (out / "index.html").read_text()
    assert "skipped" in page and "is not installed here" in page
    assert main(["build", "--chapters", str(chapters), "--out", str(out), "--strict"]) == 1


@pytest.mark.slow
def test_relative_output_folder_still_stores_figures_as_data(tmp_path, monkeypatch):
    """The kernels run in the chapter's folder: the kit's IPython startup must be found from there."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(PLACEHOLDER, tmp_path / "stepper.ipynb")
    built = kit.build_chapter(Path("stepper.ipynb"), Path("relative-out"), timeout=120)
    assert built.ok, built.error
    ran = nbformat.read(str(tmp_path / "relative-out" / built.executed), as_version=4)
    kinds = [set(o.get("data", {})) for c in ran.cells if c.cell_type == "code" for o in c.outputs]
    assert any("application/vnd.plotly.v1+json" in k for k in kinds)
    assert not any("cdn" in json.dumps(c.outputs) for c in ran.cells if c.cell_type == "code")


def test_the_kits_kernels_are_not_interrupted_when_shut_down(monkeypatch):
    """jupyter_client interrupts a kernel before shutting it down; at the end of a chapter that SIGINT
    can land in ipykernel's reply to the last cell and print "KeyboardInterrupt caught in kernel".
    The kit's kernel manager skips it while shutting down and still interrupts on request."""
    import asyncio

    from jupyter_client.manager import AsyncKernelManager

    from nwor_lab.lifeline import kernel_manager_class
    sent = []

    async def interrupt(self):
        sent.append(self.shutting_down)
    monkeypatch.setattr(AsyncKernelManager, "_async_interrupt_kernel", interrupt)
    km = kernel_manager_class()(kernel_name="python3")
    asyncio.run(km._async_interrupt_kernel())          # a cell timed out: interrupt it
    km.shutting_down = True
    asyncio.run(km._async_interrupt_kernel())          # shutting down: no SIGINT
    assert sent == [False]
