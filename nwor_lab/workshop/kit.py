"""The workshop kit: every chapter executed (papermill, `interactive=False`), exported as a static
HTML page and as reveal.js slides, and one `index.html` that lists them.

    out/index.html             chapters: title, status, run time, HTML, slides, exercises
    out/index.json             the same, for scripts and tests
    out/<chapter>.html         executed chapter, CSS and images inlined (nbconvert 'lab' template)
    out/<chapter>.slides.html  reveal.js slides (reveal.js from a CDN)
    out/executed/<chapter>.ipynb  the executed notebook (papermill's output)

A chapter that fails is still exported (up to its failing cell, error shown) and listed as
failed with its error; the other chapters build; `build` then returns 1.

Every file is replaced atomically (`nwor_lab.atomic`); papermill writes a chapter's executed
notebook in `out/.work/` as it runs, moved into `executed/` when the chapter is over, so the kit
never holds a half-written file, whenever it is stopped. Kernels die with the build
(`nwor_lab.lifeline.kernel_manager_class`), even when it is killed with SIGKILL.
"""
from __future__ import annotations

import contextlib
import copy
import glob
import html
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nwor_lab import atomic

# nbformat, nbconvert and papermill are imported where they are used: `nwor-lab` builds its
# parser from this module, and they take seconds to import.

DEFAULT_CHAPTERS = "notebooks/*.ipynb"
DEFAULT_OUT = "runs/workshop"
DEFAULT_TIMEOUT = 600.0  # seconds one cell may run (papermill's execution_timeout)
# Kernels started by the kit show plotly figures as JupyterLab's mimetype *and* as HTML with
# plotly.js inlined once per chapter, so the exported page draws them offline (in a kernel,
# plotly's default is the mimetype alone, which nbconvert cannot render).
PLOTLY_RENDERER = "plotly_mimetype+notebook"


@dataclass
class Built:
    """One chapter in the kit."""
    name: str  # file stem, e.g. 05_stage
    source: str
    title: str
    ok: bool
    seconds: float
    html: str | None = None  # paths relative to the kit's folder
    slides: str | None = None
    executed: str | None = None
    exercises: list[dict] = field(default_factory=list)  # {"title", "anchor"}
    error: str | None = None


def find_chapters(pattern: str = DEFAULT_CHAPTERS) -> list[Path]:
    """Chapters named by a glob, a folder (its *.ipynb) or one file; sorted, checkpoints skipped."""
    path = Path(pattern)
    if path.is_dir():
        pattern = str(path / "*.ipynb")
    found = [Path(p) for p in glob.glob(pattern, recursive=True)]
    return sorted(p for p in found if p.suffix == ".ipynb" and ".ipynb_checkpoints" not in p.parts)


def error_text(err: Exception) -> str:
    """One line: the exception a cell raised (papermill's ename/evalue) or what stopped the run."""
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    where = getattr(err, "exec_count", None)
    if ename:
        return f"{ename}: {evalue}" + (f" (cell [{where}])" if where is not None else "")
    text = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _with_slide_breaks(nb):
    """A copy where, unless the author set slide types, each heading cell starts a new slide."""
    nb = copy.deepcopy(nb)
    if any("slideshow" in c.metadata for c in nb.cells):
        return nb
    for cell in nb.cells:
        starts = cell.cell_type == "markdown" and cell.source.lstrip().startswith(("# ", "## "))
        cell.metadata["slideshow"] = {"slide_type": "slide" if starts else "-"}
    return nb


def export(nb, out: Path, name: str) -> tuple[str, str]:
    """Write `<name>.html` (self-contained as far as nbconvert allows) and `<name>.slides.html`."""
    from nbconvert import HTMLExporter, SlidesExporter

    page, _ = HTMLExporter(template_name="lab", embed_images=True).from_notebook_node(nb)
    atomic.write_text(out / f"{name}.html", page)
    slides, _ = SlidesExporter().from_notebook_node(_with_slide_breaks(nb))
    atomic.write_text(out / f"{name}.slides.html", slides)
    return f"{name}.html", f"{name}.slides.html"


@contextlib.contextmanager
def _environment(**values):
    """Set environment variables for the kernels started inside (they inherit ours)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_chapter(path: Path, out: Path, timeout: float = DEFAULT_TIMEOUT, kernel_name: str | None = None,
                  parameters: dict | None = None) -> Built:
    """Execute one chapter with papermill and export it; never raises for a failing chapter."""
    import nbformat
    import papermill

    from nwor_lab.lifeline import kernel_manager_class
    from nwor_lab.workshop import chapters as ch

    path = Path(path)
    name = path.stem
    executed = out / "executed" / f"{name}.ipynb"
    running = out / ".work" / f"{name}.ipynb"          # papermill saves after every cell: not in place
    for folder in (executed.parent, running.parent):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise atomic.OutputError(folder, err) from None
    try:
        info = ch.chapter(path)
    except Exception as err:  # not even readable: list it, build the rest
        return Built(name, str(path), name, False, 0.0, error=f"unreadable notebook: {error_text(err)}")
    built = Built(name, str(path), info.title, True, 0.0, executed=str(executed.relative_to(out)),
                  exercises=[asdict(e) for e in info.exercises])
    start = time.perf_counter()
    try:
        with _environment(PLOTLY_RENDERER=os.environ.get("PLOTLY_RENDERER", PLOTLY_RENDERER)):
            papermill.execute_notebook(
                str(path), str(running), parameters=dict(parameters or {"interactive": False}),
                kernel_name=kernel_name, cwd=str(path.parent.resolve()), execution_timeout=timeout,
                progress_bar=False, log_output=False, request_save_on_cell_execute=False,
                kernel_manager_class=kernel_manager_class())
    except Exception as err:
        _raise_if_disk(err, running)               # the machine's problem, not the chapter's
        built.ok, built.error = False, error_text(err)
    built.seconds = round(time.perf_counter() - start, 2)
    if running.exists():
        atomic.move_into_place(running, executed)
    try:  # export what ran, error cell included, so the failure can be read in the page
        nb = nbformat.read(str(executed), as_version=4) if executed.exists() else ch.read(path)
        built.html, built.slides = export(nb, out, name)
    except Exception as err:
        _raise_if_disk(err, out)
        built.ok = False
        built.error = (built.error + "; " if built.error else "") + f"export failed: {error_text(err)}"
    return built


def _raise_if_disk(err: Exception, path: Path) -> None:
    """A full disk stops the build in one line naming the file; any other error is the chapter's."""
    if isinstance(err, atomic.OutputError):
        raise err
    if atomic.no_space(err):
        raise atomic.OutputError(getattr(err, "filename", None) or path, err) from None


def build(chapters, out=DEFAULT_OUT, timeout: float = DEFAULT_TIMEOUT, kernel_name: str | None = None,
          log=print) -> list[Built]:
    """Build the kit from chapter paths into `out`; writes index.html and index.json."""
    import shutil
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise atomic.OutputError(out, err) from None
    shutil.rmtree(out / ".work", ignore_errors=True)          # what a killed build left half-written
    kit = []
    try:
        for path in chapters:
            log(f"workshop: {path} ...")
            built = build_chapter(Path(path), out, timeout=timeout, kernel_name=kernel_name)
            log(f"workshop: {path} {'ok' if built.ok else 'FAILED: ' + built.error} ({built.seconds:.1f} s)")
            kit.append(built)
        write_index(kit, out)
    finally:                                                   # Ctrl-C, SIGTERM, a full disk: no partial file
        shutil.rmtree(out / ".work", ignore_errors=True)
    return kit


def write_index(kit: list[Built], out: Path) -> Path:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = {"built": when, "python": platform.python_version(), "parameters": {"interactive": False}}
    atomic.write_json(out / "index.json", {**meta, "chapters": [asdict(b) for b in kit]}, indent=2, newline=True)
    e = html.escape
    rows = []
    for b in kit:
        link = (lambda href, text: f'<a href="{e(href)}">{e(text)}</a>' if href else e(text))
        exercises = "".join(f'<li><a href="{e(b.html)}#{e(x["anchor"])}">{e(x["title"])}</a></li>' if b.html
                            else f'<li>{e(x["title"])}</li>' for x in b.exercises)
        status = "ok" if b.ok else f'failed<pre class="error">{e(b.error or "")}</pre>'
        rows.append(
            f'<tr class="{"ok" if b.ok else "failed"}"><td>{link(b.html, b.title)}<div class="file">{e(b.source)}</div></td>'
            f'<td class="status">{status}</td><td class="time">{b.seconds:.1f} s</td>'
            f'<td>{link(b.slides, "slides")}</td><td><ul>{exercises}</ul></td></tr>')
    failed = sum(not b.ok for b in kit)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nwor_lab workshop</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ text-align: left; vertical-align: top; padding: .5em .8em; border-bottom: 1px solid #ddd; }}
tr.failed td.status {{ color: #b00020; font-weight: bold; }}
pre.error {{ white-space: pre-wrap; font-weight: normal; font-size: .85em; }}
.file {{ color: #777; font-size: .8em; }} td.time {{ white-space: nowrap; }} ul {{ margin: 0; padding-left: 1.2em; }}
</style></head><body>
<h1>nwor_lab workshop</h1>
<p>{len(kit)} chapters, {failed} failed. Executed with <code>interactive=False</code>
on {e(when)} (Python {e(meta["python"])}). Run time includes the kernel's start.</p>
<table><thead><tr><th>chapter</th><th>status</th><th>run time</th><th>slides</th><th>exercises</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table></body></html>
"""
    index = out / "index.html"
    atomic.write_text(index, page)
    return index
