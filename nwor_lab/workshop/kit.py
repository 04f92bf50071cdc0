"""The workshop kit: every chapter executed (papermill, `interactive=False`), exported as a page and a
slide deck, with instructor notes and two agendas added up from the measured run times
(`nwor_lab.workshop.agenda`: the three-hour path and the full day).

    out/index.html                the kit: both agendas (start, end, role, run time, talk, hands-on
                                  per section; homework), then every chapter: status, run time, page, slides,
                                  notes, and its exercises with the state the run left them in
    out/index.json                the same, for scripts and tests (`agenda`: the three-hour path's
                                  slots; `agendas`: both plans, with homework and any overflow)
    out/<chapter>.html            the executed chapter (nbconvert's lab template, CSS and images
                                  inlined, figures responsive: as wide as their cell)
    out/<chapter>.slides.html     its reveal.js deck (authored per cell: `nwor_lab.workshop.slides`),
                                  1280 x 720 slides, speaker notes (press S)
    out/<chapter>.notes.html      instructor notes: what to say, the misconception to watch for,
                                  discussion questions, the expected outputs of THIS run, the
                                  checked facts, the exercises with their predict answers and hints
    out/executed/<chapter>.ipynb  the executed notebook (papermill's output)
    out/reveal.js/, out/assets/   reveal.js (vendored) and plotly.js: no page loads anything from
                                  the network, so the kit works offline (`nwor_lab.workshop.vendor`)

A chapter that fails is still exported (up to its failing cell, error shown) and listed as failed
with its error; the other chapters build; `build` then returns 1. A chapter whose kernel is not
installed here (09_vllm needs `nwor-lab-vllm`, from `make setup-vllm`) is listed as *skipped* with
that reason and keeps its agenda slot with an estimated run time; with `strict=True` it fails the
build instead.

Every file is replaced atomically (`nwor_lab.atomic`); papermill writes a chapter's executed
notebook in `out/.work/` as it runs, moved into `executed/` when the chapter is over, so the kit
never holds a half-written file, whenever it is stopped. Kernels die with the build
(`nwor_lab.lifeline.kernel_manager_class`), even when it is killed with SIGKILL.
"""
from __future__ import annotations

import contextlib
import glob
import html
import json
import platform
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nwor_lab import atomic, lifeline

# nbformat, nbconvert and papermill are imported where they are used: `nwor-lab` builds its
# parser from this module, and they take seconds to import.

DEFAULT_CHAPTERS = "notebooks/*.ipynb"
DEFAULT_OUT = "runs/workshop"
DEFAULT_TIMEOUT = 600.0  # seconds one cell may run (papermill's execution_timeout)
STATUS_LINE = re.compile(r"^(PASS|FAIL|not attempted yet:) (\w+)", re.M)


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
    notes: str | None = None
    executed: str | None = None
    exercises: list[dict] = field(default_factory=list)  # {"title", "anchor", "name", "letter", "status"}
    error: str | None = None
    status: str = ""          # "ok", "failed" or "skipped" (could not run here: its kernel is missing)
    kernel: str = ""
    metrics: dict = field(default_factory=dict)   # what the chapter recorded (record_metrics)
    checked: list[str] = field(default_factory=list)   # text of its NBVAL_CHECK_OUTPUT cells, as run

    def __post_init__(self):
        self.status = self.status or ("ok" if self.ok else "failed")


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


def missing_kernel(path: Path, kernel_name: str | None = None) -> str | None:
    """Why `path` cannot run here (its kernel is not installed), or None."""
    from jupyter_client.kernelspec import KernelSpecManager

    from nwor_lab.workshop import chapters as ch
    name = kernel_name or ch.read(path).metadata.get("kernelspec", {}).get("name")
    if name and name not in KernelSpecManager().find_kernel_specs():
        how = ch.KERNELS.get(name, f"python -m ipykernel install --sys-prefix --name {name}")
        return f"kernel {name!r} is not installed here ({how})"
    return None


def export_page(nb, out: Path, name: str) -> str:
    """`<name>.html`: the executed chapter, figures responsive, nothing loaded from the network."""
    import copy

    from nbconvert import HTMLExporter

    from nwor_lab.workshop import figures, offline, slides, vendor
    nb = slides.titled(copy.deepcopy(nb))
    figures.render(nb, "page")
    exporter = HTMLExporter(template_name="nwor_page", extra_template_basedirs=[str(slides.TEMPLATES)],
                            embed_images=True)
    page, _ = exporter.from_notebook_node(nb, resources={"nwor": {"plotly_js": vendor.PLOTLY_JS,
                                                                  "slides": f"{name}.slides.html",
                                                                  "notes": f"{name}.notes.html"}})
    atomic.write_text(out / f"{name}.html", offline.check_page(page, f"{name}.html"))
    return f"{name}.html"


def export_slides(nb, out: Path, name: str, metrics: dict | None = None) -> str:
    from nwor_lab import exercises
    from nwor_lab.workshop import notes, offline, slides, vendor
    deck = slides.export(nb, plotly_js=vendor.PLOTLY_JS, reveal_prefix=vendor.REVEAL_DIR,
                         chapter_notes=notes.for_chapter(name), exercises_here=exercises.by_chapter().get(name, []),
                         metrics=metrics)
    atomic.write_text(out / f"{name}.slides.html", offline.check_page(deck, f"{name}.slides.html"))
    return f"{name}.slides.html"


def export(nb, out: Path, name: str, metrics: dict | None = None) -> tuple[str, str]:
    """Write `<name>.html` and `<name>.slides.html` for an (executed) notebook; `metrics` (what its run
    recorded) fill the deck's Discuss notes."""
    return export_page(nb, out, name), export_slides(nb, out, name, metrics)


def exercise_entries(nb, stem: str, ran) -> list[dict]:
    """The chapter's exercises for the index: its "Exercise" headings, matched to the lab's exercises
    (`nwor_lab.exercises`, by name in the heading, then by letter, then the one left), with the state
    its run left them in ("pass", "fail", "not attempted", or "" when the run says nothing)."""
    from nwor_lab import exercises as registry
    from nwor_lab.workshop import chapters as ch

    states = {}
    for cell in (ran.cells if ran is not None else []):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            for word, name in STATUS_LINE.findall(o.get("text", "") if o.output_type == "stream" else ""):
                states[name] = {"PASS": "pass", "FAIL": "fail"}.get(word, "not attempted")
    mine = list(registry.by_chapter().get(stem, []))
    entries = []
    for e in ch.exercises(nb):
        ex = next((x for x in mine if f"`{x.name}`" in e.title), None) or \
            next((x for x in mine if x.letter and x.letter in e.title.split("·")[0]), None)
        entries.append({"title": e.title, "anchor": e.anchor, "ex": ex})
        if ex is not None:
            mine.remove(ex)
    unmatched = [en for en in entries if en["ex"] is None]
    if len(unmatched) == 1 and len(mine) == 1:
        unmatched[0]["ex"] = mine.pop()
    out = []
    for en in entries + [{"title": f"Exercise {x.letter} · {x.name}", "anchor": None, "ex": x} for x in mine]:
        ex = en.pop("ex")
        out.append({**en, "name": ex.name if ex else None, "letter": ex.letter if ex else None,
                    "status": states.get(ex.name, "") if ex else ""})
    return out


def build_chapter(path: Path, out: Path, timeout: float = DEFAULT_TIMEOUT, kernel_name: str | None = None,
                  parameters: dict | None = None, strict: bool = False) -> Built:
    """Execute one chapter with papermill and export it; never raises for a failing chapter."""
    import nbformat
    import papermill

    from nwor_lab.sweep.record import read_metrics
    from nwor_lab.workshop import chapters as ch
    from nwor_lab.workshop import figures

    path = Path(path)
    name = path.stem
    executed = out / "executed" / f"{name}.ipynb"
    running = out / ".work" / f"{name}.ipynb"          # papermill saves after every cell: not in place
    metrics_file = out / ".work" / f"{name}.metrics.json"
    for folder in (executed.parent, running.parent):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise atomic.OutputError(folder, err) from None
    try:
        info = ch.chapter(path)
        source_nb = ch.read(path)
    except Exception as err:  # not even readable: list it, build the rest
        return Built(name, str(path), name, False, 0.0, error=f"unreadable notebook: {error_text(err)}")
    kernel = kernel_name or source_nb.metadata.get("kernelspec", {}).get("name", ch.KERNEL_NAME)
    built = Built(name, str(path), info.title, True, 0.0, kernel=kernel)
    why_not = missing_kernel(path, kernel_name)
    ran = None
    if why_not:
        built.ok, built.status, built.error = False, ("failed" if strict else "skipped"), why_not
    else:
        built.executed = str(executed.relative_to(out))
        metrics_file.unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            with lifeline.environment(NWOR_LAB_METRICS_OUT=str(metrics_file.resolve()),
                                      **figures.kernel_environment(out / ".work" / "kernel")):
                papermill.execute_notebook(
                    str(path), str(running), parameters=dict(parameters or {"interactive": False}),
                    kernel_name=kernel_name, cwd=str(path.parent.resolve()), execution_timeout=timeout,
                    progress_bar=False, log_output=False, request_save_on_cell_execute=False,
                    kernel_manager_class=lifeline.kernel_manager_class())
        except Exception as err:
            _raise_if_disk(err, running)               # the machine's problem, not the chapter's
            built.ok, built.status, built.error = False, "failed", error_text(err)
        built.seconds = round(time.perf_counter() - start, 2)
        if running.exists():
            atomic.move_into_place(running, executed)
        with contextlib.suppress(Exception):
            built.metrics = read_metrics(metrics_file)
        if executed.exists():
            ran = nbformat.read(str(executed), as_version=4)
            built.checked = ["".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")
                             for c in ran.cells if ch.checked(c)]
    built.exercises = exercise_entries(source_nb, name, ran)
    try:  # export what ran, error cell included, so the failure can be read in the page
        nb = ran if ran is not None else source_nb
        built.html, built.slides = export(nb, out, name, built.metrics)
    except Exception as err:
        _raise_if_disk(err, out)
        built.ok, built.status = False, "failed"
        built.error = (built.error + "; " if built.error else "") + f"export failed: {error_text(err)}"
    return built


def _raise_if_disk(err: Exception, path: Path) -> None:
    """A full disk stops the build in one line naming the file; any other error is the chapter's."""
    if isinstance(err, atomic.OutputError):
        raise err
    if atomic.no_space(err):
        raise atomic.OutputError(getattr(err, "filename", None) or path, err) from None


def build(chapters, out=DEFAULT_OUT, timeout: float = DEFAULT_TIMEOUT, kernel_name: str | None = None,
          log=print, strict: bool = False) -> list[Built]:
    """Build the kit from chapter paths into `out`; writes the pages, decks, notes and index."""
    import shutil

    from nwor_lab.workshop import vendor
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        vendor.install(out)
    except OSError as err:
        raise atomic.OutputError(out, err) from None
    shutil.rmtree(out / ".work", ignore_errors=True)          # what a killed build left half-written
    kit = []
    start = time.perf_counter()
    try:
        for path in chapters:
            log(f"workshop: {path} ...")
            built = build_chapter(Path(path), out, timeout=timeout, kernel_name=kernel_name, strict=strict)
            what = {"ok": "ok", "failed": f"FAILED: {built.error}", "skipped": f"skipped: {built.error}"}[built.status]
            log(f"workshop: {path} {what} ({built.seconds:.1f} s)")
            kit.append(built)
        write_index(kit, out, build_seconds=time.perf_counter() - start)
    finally:                                                   # Ctrl-C, SIGTERM, a full disk: no partial file
        shutil.rmtree(out / ".work", ignore_errors=True)
    return kit


# ---------------------------------------------------------------------------------------------------
# the index and the notes pages

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; padding: 0 1em; }
table { border-collapse: collapse; width: 100%; margin-bottom: 2em; }
th, td { text-align: left; vertical-align: top; padding: .45em .7em; border-bottom: 1px solid #ddd; }
tr.failed td.status { color: #b00020; font-weight: bold; } tr.skipped td.status { color: #8a5a00; }
pre.error { white-space: pre-wrap; font-weight: normal; font-size: .85em; }
.file, .note { color: #666; font-size: .82em; } td.time, td.clock { white-space: nowrap; }
ul { margin: 0; padding-left: 1.2em; } tr.break td { background: #f6f6f6; font-style: italic; }
.state { font-size: .8em; padding: 0 .4em; border-radius: 3px; background: #eee; }
.state.pass { background: #d7f0e2; } .state.fail { background: #fadbd3; } .state.not-attempted { background: #eee; }
"""


def _link(href, text):
    """A link (or plain text without `href`); `code` in backticks is shown as code."""
    shown = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return f'<a href="{html.escape(href)}">{shown}</a>' if href else shown


def _exercise_items(b: Built) -> str:
    items = []
    for x in b.exercises:
        href = f"{b.html}#{x['anchor']}" if b.html and x.get("anchor") else None
        state = x.get("status") or ""
        badge = f' <span class="state {state.replace(" ", "-")}">{html.escape(state)}</span>' if state else ""
        items.append(f"<li>{_link(href, x['title'])}{badge}</li>")
    return "".join(items)


def write_index(kit: list[Built], out: Path, build_seconds: float | None = None) -> Path:
    import mistune

    from nwor_lab.workshop import agenda as agenda_mod
    from nwor_lab.workshop import notes as notes_mod
    from nwor_lab.workshop import vendor

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    plans = agenda_mod.plans(kit)
    slots = plans[agenda_mod.THREE_HOUR.name].slots
    for b in kit:
        write_notes_page(b, out, next((s for s in slots if s.stem == b.name), None),
                         homework=b.name in plans[agenda_mod.THREE_HOUR.name].homework)
    try:
        reveal = json.loads(vendor.RECORD.read_text())["version"]
    except (OSError, ValueError, KeyError):
        reveal = "?"
    meta = {"built": when, "python": platform.python_version(), "parameters": {"interactive": False},
            "build_seconds": None if build_seconds is None else round(build_seconds, 1), "reveal_js": reveal}
    atomic.write_json(out / "index.json", {**meta, "agenda": [s.as_dict() for s in slots],
                                           "agendas": {k: p.as_dict() for k, p in plans.items()},
                                           "chapters": [asdict(b) for b in kit]}, indent=2, newline=True)
    e = html.escape
    by_stem = {b.name: b for b in kit}
    agendas_html = "\n".join(_agenda_html(p, by_stem) for p in plans.values())
    rows = []
    for b in kit:
        status = {"ok": "ok", "failed": f'failed<pre class="error">{e(b.error or "")}</pre>',
                  "skipped": f'skipped<pre class="error">{e(b.error or "")}</pre>'}[b.status]
        rows.append(
            f'<tr class="{b.status}"><td>{_link(b.html, b.title)}<div class="file">{e(b.source)}</div></td>'
            f'<td class="status">{status}</td><td class="time">{b.seconds:.1f} s</td>'
            f'<td>{_link(b.slides, "slides")}</td><td>{_link(b.notes, "notes")}</td>'
            f'<td><ul>{_exercise_items(b)}</ul></td></tr>')
    failed = sum(b.status == "failed" for b in kit)
    skipped = sum(b.status == "skipped" for b in kit)
    total_ex = sum(len(b.exercises) for b in kit)
    took = f", built in {build_seconds:.0f} s" if build_seconds is not None else ""
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nwor_lab workshop</title>
<style>{_STYLE}</style></head><body>
<h1>nwor_lab workshop kit</h1>
<p>{len(kit)} chapters, {failed} failed, {skipped} skipped; {total_ex} exercises. Executed with
<code>interactive=False</code> on {e(when)} (Python {e(meta["python"])}){took}. Run times include the
kernel's start. Everything here works offline: reveal.js {e(reveal)} and plotly.js are in this folder.
Slides: arrow keys, <kbd>S</kbd> opens the speaker notes, <kbd>F</kbd> full screen, <kbd>Esc</kbd> the overview.</p>
<h2>Before the day</h2>
{mistune.html(notes_mod.SETUP)}
{agendas_html}
<h2>Chapters</h2>
<table class="chapters"><thead><tr><th>chapter</th><th>status</th><th>run time</th><th>slides</th><th>notes</th>
<th>exercises (state after this run)</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table></body></html>
"""
    index = out / "index.html"
    atomic.write_text(index, page)
    return index


def _agenda_html(plan, by_stem: dict) -> str:
    """One agenda as the index shows it: which chapters are taught, which are demos, which are homework."""
    e = html.escape
    rows = []
    for s in plan.slots:
        if s.kind != "chapter":
            rows.append(f'<tr class="break"><td class="clock">{s.clock}</td><td>{e(s.title)}</td>'
                        f'<td colspan="5"></td><td>{s.minutes} min</td></tr>')
            continue
        b = by_stem.get(s.stem)
        links = " · ".join(_link(h, t) for h, t in ((b.html, "page"), (b.slides, "slides"), (b.notes, "notes"))
                           if h) if b else ""
        run = f"{s.run_s:.0f} s" + ("" if s.run_measured else " (estimate)")
        rows.append(
            f'<tr><td class="clock">{s.clock}</td><td>{e(s.stem)} · {e(s.title)}'
            + (f'<div class="note">{e(s.note)}</div>' if s.note else "") + f'</td><td>{e(s.role)}</td><td>{run}</td>'
            f'<td>{s.talk_min:.0f} min</td><td>{s.hands_on_min:.0f} min</td><td>{links}</td><td>{s.minutes} min</td></tr>')
    a = plan.agenda
    over = (f'<p class="error"><strong>Over {a.total_min // 60}:{a.total_min % 60:02d} by {plan.over_min} min</strong> '
            f"with this build's run times: move a chapter to homework or shorten a line in "
            f"<code>nwor_lab/workshop/agenda.py</code>.</p>" if not plan.fits else "")
    after = "".join(f"<p><strong>{label}:</strong> {e(', '.join(stems))}.</p>" for label, stems in (
        ("Homework (their exercises after the day; the demos' exercises too)", plan.homework),
        ("Self-paced (in no day's agenda)", plan.self_paced)) if stems)
    return f"""<h2 id="agenda-{e(a.name)}">Agenda: {e(a.title)} ({a.total_min // 60}:{a.total_min % 60:02d})</h2>
<p class="note">Each slot adds up, unscaled: the chapter's run time measured by this build (the room waits while it
runs live; an estimate where the build did not run it) plus the talk and hands-on minutes the agenda states,
rounded up; what is left goes to the wrap-up's questions. <em>taught</em>: run, explained and exercised;
<em>demo</em>: run and explained, its exercises are homework.</p>{over}
<table class="agenda" data-agenda="{e(a.name)}"><thead><tr><th>time</th><th>section</th><th>role</th><th>run time</th>
<th>talk</th><th>hands-on</th><th>material</th><th>slot</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>{after}"""


def write_notes_page(b: Built, out: Path, slot=None, homework: bool = False) -> str:
    """`<chapter>.notes.html`: the instructor's page for one chapter, bound to this run's numbers."""
    import mistune

    from nwor_lab import exercises as registry
    from nwor_lab.workshop import notes as notes_mod

    e = html.escape
    md = mistune.html
    n = notes_mod.for_chapter(b.name)
    parts = [f"<h1>{e(b.title)} — instructor notes</h1>",
             f'<p class="note">{e(b.source)} · {_link(b.html, "page")} · {_link(b.slides, "slides")} · '
             f'{_link("index.html", "the kit")}</p>']
    if slot is not None:
        run = f"{slot.run_s:.0f} s" + ("" if slot.run_measured else " (estimate)")
        parts.append(f"<p><strong>In the agenda:</strong> {slot.clock}, {slot.minutes} min — run {run}, talk "
                     f"{slot.talk_min:.0f} min, hands-on {slot.hands_on_min:.0f} min ({e(slot.role)}, "
                     f"the three-hour path).</p>")
    elif homework:
        parts.append("<p><strong>In the three-hour path:</strong> homework (no slot; the full day teaches it).</p>")
    if b.status != "ok":
        parts.append(f'<p class="note"><strong>{e(b.status)}:</strong> {e(b.error or "")}</p>')
    if n is None:
        parts.append("<p>No instructor notes for this chapter yet: add them to "
                     "<code>nwor_lab/workshop/notes.py</code>.</p>")
    else:
        parts += ["<h2>What to say</h2><ul>" + "".join(f"<li>{md(s)}</li>" for s in n.say) + "</ul>",
                  f"<h2>The misconception to watch for</h2>{md(n.misconception)}",
                  "<h2>Discussion questions, with the answer key</h2><ol>" + "".join(
                      f"<li>{md(q)}<p><strong>Answer:</strong></p>{md(a)}</li>"
                      for q, a in zip(n.questions, list(n.answers) + [""] * len(n.questions))) + "</ol>",
                  "<h2>Expected outputs (this build's run)</h2><ul>" +
                  "".join(f"<li>{md(x)}</li>" for x in n.expected(b.metrics)) + "</ul>"]
    if b.checked:
        parts.append("<h2>The facts the chapter checks (its NBVAL_CHECK_OUTPUT cells, as run)</h2>" +
                     "".join(f"<pre>{e(t)}</pre>" for t in b.checked if t.strip()))
    ex_here = registry.by_chapter().get(b.name, [])
    if ex_here:
        parts.append("<h2>Exercises</h2>")
        for ex in ex_here:
            p = registry.predict(ex.name)
            state = next((x.get("status") for x in b.exercises if x.get("name") == ex.name), "")
            parts.append(f"<h3>{e(ex.letter)} <code>{e(ex.name)}</code>: {e(ex.title)}"
                         + (f' <span class="state">{e(state)}</span>' if state else "") + "</h3>"
                         f"<p><strong>Predict:</strong> {e(p.question)}<br><strong>Answer:</strong> {e(p.explain)}</p>"
                         "<ol>" + "".join(f"<li>hint {i}: {md(h)}</li>" for i, h in enumerate(ex.hints, start=1))
                         + "</ol>")
    if b.metrics:
        parts.append("<h2>Everything the chapter recorded</h2><table>" + "".join(
            f"<tr><td><code>{e(k)}</code></td><td>{e(str(v))}</td></tr>" for k, v in b.metrics.items()) + "</table>")
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(b.title)} — notes</title>'
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
    atomic.write_text(out / f"{b.name}.notes.html", page)
    b.notes = f"{b.name}.notes.html"
    return b.notes
