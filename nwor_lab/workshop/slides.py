"""A chapter's slide deck: authored per cell, exported by nbconvert's reveal exporter.

Authoring is cell metadata, set in JupyterLab's property inspector ("Slide Type") or in the JSON:

- `slideshow.slide_type`: `slide`, `subslide`, `fragment`, `-` (continue), `skip`, `notes` — nbconvert's
  own meaning. In a chapter that authors any cell, a cell without it stays out of the deck (opt-in:
  a chapter is a lab, its deck shows a few cells of it).
- tags: `slide-code` shows the code of a code cell (hidden otherwise); `slide-text` shows its printed
  text (figures and images are always shown); `slide-heading` keeps a markdown cell's first heading
  and its tables on the slide and moves the rest of its prose into the speaker notes.

A markdown cell holding a `## ` heading after other text is split there first (`split_sections`): each
section starts a slide of its own when its cell is on the deck.

A chapter that authors nothing (a new one) gets a generated deck: its title, each `## ` section's
heading (its prose in the speaker notes, its tables on the slide) with the section's first figure (or,
without one, its first short printed output), and its exercises.

The kit adds the instructor's speaker notes (press S in a deck): on the title slide what to say and
the misconception to watch for; on each exercise slide its "predict, then run" question with the
answer; and a closing "Discuss" slide with the discussion questions (the expected outputs in its
notes). Figures are zoomed into the room left under the slide's heading (`figures.figure_html`), a cell
with several figures becomes one sub-slide per figure, and every slide is 1280 x 720.
"""
from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import nbformat

from nwor_lab.workshop import figures

TEMPLATES = Path(__file__).resolve().parent / "templates"
HEADING_PX = {1: 72, 2: 60, 3: 44}
LINE_PX = 31                      # one line of slide prose (22 px font, 1.35 line height)
CHARS_PER_LINE = 95
TABLE_ROW_PX = 44                 # one table row, at least (padding and rule)
TEXT_LINE_PX = 25                 # one line of printed output (19 px monospace)
TEXT_CHARS_PER_LINE = 95          # where printed output wraps on a slide
MIN_FIGURE_HEIGHT = 260
USABLE_HEIGHT = figures.SLIDE[1] - 50   # reveal's margin and the slide's padding
INTRO = "you will learn"          # how every chapter's intro list starts (kept on its title slide)


def _type(cell) -> str | None:
    return cell.metadata.get("slideshow", {}).get("slide_type")


def _set(cell, slide_type: str):
    cell.metadata["slideshow"] = {"slide_type": slide_type}
    return cell


def split_heading(source: str) -> tuple[str, str]:
    """(the first heading line, the rest) of a markdown cell; ("", source) without a heading."""
    lines = source.strip().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^#{1,6}\s", line):
            return line, "\n".join(lines[:i] + lines[i + 1:]).strip()
    return "", source


def tables(markdown: str) -> list[str]:
    """The markdown's pipe tables (header, rule and rows), each as one string."""
    return ["\n".join(m.group(0).strip().splitlines())
            for m in re.finditer(r"(?:^\|.*\|[ \t]*\n?)+", markdown, flags=re.M)
            if re.search(r"^\|[\s:|-]+\|\s*$", m.group(0), flags=re.M)]


def heading_slide(source: str) -> tuple[str, str]:
    """What a `slide-heading` cell puts on its slide and in the speaker notes: the heading and any
    table stay on the slide (a table read aloud is lost), and on a title slide (`# `) the chapter's
    "You will learn" list; the rest of the prose goes to the notes."""
    heading, rest = split_heading(source)
    kept = tables(rest)
    if heading.startswith("# "):          # a title slide keeps what the chapter promises: its intro list
        kept = [p for p in re.split(r"\n\s*\n", rest) if p.strip().lower().startswith(INTRO)] + kept
    for t in kept:
        rest = rest.replace(t, "")
    on_slide = "\n\n".join([heading or ""] + kept).strip()
    return (on_slide or source), re.sub(r"\n{3,}", "\n\n", rest).strip()


def titled(nb):
    """Name the page after the chapter (in place): nbconvert titles a page `nb.metadata.title`, else
    the file's name, which an in-memory notebook lacks ("Notebook")."""
    from nwor_lab.workshop import chapters
    if not nb.metadata.get("title"):
        nb.metadata["title"] = re.sub(r"[*_`]", "", chapters.title(nb, "nwor_lab chapter"))
    return nb


def split_sections(nb) -> None:
    """Split every markdown cell at its `## ` headings (in place): a section that starts inside a cell
    gets a cell of its own, a slide with its heading (`slide-heading`) when the cell it came from is on the
    deck, so no section hides inside the slide or the notes of the one before it."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            cells.append(cell)
            continue
        text = re.sub(r"```.*?```", lambda m: "\0" * len(m.group(0)), cell.source, flags=re.S)  # not in code
        starts = [m.start() for m in re.finditer(r"^## ", text, flags=re.M) if m.start() > 0]
        if not starts:
            cells.append(cell)
            continue
        bounds = [0] + starts + [len(cell.source)]
        st = _type(cell)
        for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
            part = copy.deepcopy(cell)
            part.source = cell.source[a:b].strip()
            if n and "id" in part:
                part["id"] = f"{cell['id']}-{n}"[:64]          # cell ids stay unique
            if n and st and st != "skip":
                part.metadata["slideshow"] = {"slide_type": "slide"}
                part.metadata["tags"] = ["slide-heading"]
            if part.source:
                cells.append(part)
    nb.cells = cells


def generated(nb) -> None:
    """Slide types for a chapter that authors none (in place): title, sections, their first figure,
    exercises; everything else skipped."""
    section_open = full = False
    for i, cell in enumerate(nb.cells):
        tags = cell.metadata.setdefault("tags", [])
        if cell.cell_type == "markdown" and (i == 0 or cell.source.lstrip().startswith("## ")):
            _set(cell, "slide")
            exercise = split_heading(cell.source)[0].lstrip("# ").lower().startswith("exercise")
            if not exercise and (i > 0 or len(cell.source.splitlines()) > 12):
                tags.append("slide-heading")
            section_open = i > 0 and not exercise
            full = bool(tables(cell.source))          # a table fills the slide: what follows gets its own
        elif cell.cell_type == "code" and section_open and any(figures.is_figure(o) for o in cell.outputs):
            _set(cell, "subslide" if full else "-")
            section_open = False
        elif cell.cell_type == "code" and section_open and _short_text(cell):
            _set(cell, "subslide" if full else "-")
            tags.append("slide-text")
            section_open = False
        else:
            _set(cell, "skip")


def _short_text(cell, most: int = 14) -> bool:
    """A code cell whose printed output fits under a heading (a section without a figure shows it)."""
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return bool(text.strip()) and len(text.splitlines()) <= most and all(
        o.get("output_type") == "stream" for o in cell.get("outputs", []))


def _row_px(row: str) -> int:
    """A table row's height: its longest cell wrapped in a column of about its share of the width
    (columns size to their content, so a share is taken a little wider than even)."""
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    width = 1.3 * CHARS_PER_LINE / max(1, len(cells))
    return max(TABLE_ROW_PX, 12 + LINE_PX * max(math.ceil(len(c) / width) for c in cells))


def _markdown_px(source: str) -> int:
    """About how tall markdown is on a slide: headings, wrapped prose lines, table rows (which wrap
    in narrow columns, so a row is counted taller than a line)."""
    px = 0
    for line in source.splitlines():
        m = re.match(r"^(#{1,6})\s", line)
        if m:
            px += HEADING_PX.get(len(m.group(1)), 40)
        elif re.match(r"^\|[\s:|-]+\|\s*$", line):
            continue                                          # a table's rule: no height of its own
        elif line.lstrip().startswith("|"):
            px += _row_px(line)
        elif line.strip():
            px += LINE_PX * max(1, math.ceil(len(line) / CHARS_PER_LINE))
    return px + 10


def _kept(output, tags) -> bool:
    """What a slide shows of a code cell's output: figures and images always; text when tagged."""
    if output.output_type == "error":
        return True
    if output.output_type == "stream":
        return "slide-text" in tags
    data = output.get("data", {})
    if figures.is_figure(output) or any(k.startswith("image/") for k in data):
        return True
    return "slide-text" in tags and bool(data)


def _text_lines_px(text: str) -> int:
    """Printed output on a slide: monospace lines, wrapped at the slide's width."""
    return TEXT_LINE_PX * sum(max(1, math.ceil(len(line) / TEXT_CHARS_PER_LINE)) for line in text.splitlines()) + 16


def _output_px(output) -> int:
    if output.output_type == "stream":
        return _text_lines_px(output.get("text", ""))
    if output.output_type == "error":
        return TEXT_LINE_PX * 12
    data = output.get("data", {})
    if figures.is_figure(output) or any(k.startswith("image/") for k in data):
        return 0
    if "text/markdown" in data:
        return _markdown_px(str(data["text/markdown"]))
    if "text/html" in data:
        html = str(data["text/html"])
        return TABLE_ROW_PX * html.count("<tr") + LINE_PX * html.count("<p") + LINE_PX
    if "text/plain" in data:
        return _text_lines_px(str(data["text/plain"]))
    return 0


def _fit_output(output, room: int):
    """(what of a text output a slide shows, what goes to the speaker notes): a markdown output that
    holds a table keeps the table on the slide and gives its prose to the notes (as a `slide-heading`
    cell does); printed output taller than a whole slide keeps its first lines, the rest to the notes."""
    data = output.get("data", {})
    if output.output_type == "display_data" and "text/markdown" in data:
        text = str(data["text/markdown"])
        kept = tables(text)
        prose = text
        for t in kept:
            prose = prose.replace(t, "")
        prose = re.sub(r"\n{3,}", "\n\n", prose).strip()
        if kept and prose:
            output = copy.deepcopy(output)
            output["data"] = {"text/markdown": "\n\n".join(kept), "text/plain": "\n\n".join(kept)}
            return output, prose
        return output, ""
    if output.output_type == "stream" and _output_px(output) > room:
        lines = output.get("text", "").splitlines()
        shown = []
        while lines and _text_lines_px("\n".join(shown + lines[:1] + ["…"])) <= room:
            shown.append(lines.pop(0))
        output = copy.deepcopy(output)
        output["text"] = "\n".join(shown + [f"… {len(lines)} more lines in the speaker notes (press S)"]) + "\n"
        return output, "```text\n" + "\n".join(lines) + "\n```"
    return output, ""


def _pieces(kept, room: int) -> list[tuple[list, list[str]]]:
    """A code cell's shown outputs laid out on slides: [(outputs, notes)], the first piece under what
    the slide already holds (`room` px left), each next one a sub-slide of its own. A figure takes at
    least `MIN_FIGURE_HEIGHT`; a second figure, or text that does not fit the room left, starts the
    next sub-slide. The first piece is empty when nothing fits under the slide's heading."""
    pieces, piece, notes, left = [], [], [], room
    for o in kept:
        note = ""
        if figures.is_figure(o):
            need = MIN_FIGURE_HEIGHT
            new = any(figures.is_figure(p) for p in piece) or left < need
        else:
            o, note = _fit_output(o, USABLE_HEIGHT - 20)
            need = _output_px(o)
            new = left < need
        if new and (piece or (not pieces and left < USABLE_HEIGHT)):
            pieces.append((piece, notes))
            piece, notes, left = [], [], USABLE_HEIGHT
        piece.append(o)
        notes += [note] if note else []
        left -= need
    pieces.append((piece, notes))
    return pieces


def notes_cell(text: str):
    return _set(nbformat.v4.new_markdown_cell(text), "notes")


def deck(nb, chapter_notes=None, exercises_here=(), metrics=None):
    """A copy of the executed chapter `nb`, ready for the reveal exporter: only slide cells, code
    hidden, figures rendered to fit, speaker notes added. `chapter_notes`: the chapter's
    `notes.ChapterNotes` (or None); `exercises_here`: its `Exercise`s (for the exercise slides' notes);
    `metrics`: what the run recorded (`record_metrics`), which fills the Discuss slide's expected outputs."""
    nb = copy.deepcopy(nb)
    titled(nb)
    split_sections(nb)
    if not any(_type(c) for c in nb.cells):
        generated(nb)
    out, used = [], 0

    def start(slide_type, px=0):
        nonlocal used
        if slide_type in ("slide", "subslide"):
            used = 0
        used += px

    for cell in nb.cells:
        st = _type(cell)
        if not st or st == "skip":
            continue
        tags = set(cell.metadata.get("tags", []))
        if st == "notes":
            out.append(cell)
            continue
        if cell.cell_type == "markdown":
            text, notes = cell.source, ""
            if "slide-heading" in tags:
                text, notes = heading_slide(cell.source)
            ex = _exercise_of(text, exercises_here)
            if ex is not None:        # the notebook's how-to paragraph becomes notes; the room gets the question
                paragraphs = text.split("\n\n")
                text = "\n\n".join(p for p in paragraphs if not p.startswith("**Predict, then run"))
                notes = "\n\n".join([notes] + [p for p in paragraphs if p.startswith("**Predict, then run")]).strip()
            cell.source = text
            start(st, _markdown_px(text))
            out.append(cell)
            if notes:
                out.append(notes_cell(notes))
            if ex is not None and ex.predict is not None:
                question = f"**Predict, then run:** {ex.predict.question}"
                start("fragment", _markdown_px(question))
                out.append(_set(nbformat.v4.new_markdown_cell(question), "fragment"))
                out.append(notes_cell(_exercise_notes(ex)))
            continue
        if cell.cell_type != "code":
            continue
        if "slide-code" in tags:
            code = _set(nbformat.v4.new_markdown_cell(f"```python\n{cell.source}\n```"), st)
            start(st, 30 + 24 * len(cell.source.splitlines()))
            out.append(code)
            st = "-"
        kept = [o for o in cell.get("outputs", []) if _kept(o, tags)]
        if not kept:
            continue
        for n, (piece, piece_notes) in enumerate(_pieces(kept, USABLE_HEIGHT - (0 if st in ("slide", "subslide") else used))):
            if not piece:
                continue
            kind = st if n == 0 else "subslide"
            start(kind)
            text_px = sum(_output_px(o) for o in piece)
            box = (figures.SLIDE_FIGURE[0], max(MIN_FIGURE_HEIGHT, min(figures.SLIDE_FIGURE[1] if used else
                                                                      USABLE_HEIGHT - 20, USABLE_HEIGHT - used - text_px)))
            rendered = []
            for o in piece:
                o = copy.deepcopy(o)
                if figures.is_figure(o):
                    o["data"] = {"text/html": figures.figure_html(o["data"][figures.PLOTLY_MIME], "slide", box)}
                    used += box[1]
                else:
                    used += _output_px(o)
                rendered.append(o)
            piece_cell = nbformat.v4.new_code_cell("", metadata={"slideshow": {"slide_type": kind}})
            piece_cell.outputs = rendered
            out.append(piece_cell)
            if piece_notes:
                out.append(notes_cell("\n\n".join(piece_notes)))
    if out and chapter_notes is not None:
        out.insert(1, notes_cell(chapter_notes.title_slide_notes()))
        out.append(_set(nbformat.v4.new_markdown_cell(chapter_notes.discuss_markdown()), "slide"))
        out.append(notes_cell(chapter_notes.discuss_notes(metrics)))
    nb.cells = out
    return nb


def _exercise_of(text: str, exercises_here):
    """The exercise a markdown cell introduces: its heading starts with "Exercise" and names the
    exercise (`name` in backticks) or its letter; with one exercise in the chapter, that one."""
    heading = split_heading(text)[0].lstrip("# ")
    if not heading.lower().startswith("exercise"):
        return None
    here = list(exercises_here)
    return next((e for e in here if f"`{e.name}`" in heading), None) or \
        next((e for e in here if e.letter and e.letter in heading.split("·")[0]), None) or \
        (here[0] if len(here) == 1 else None)


def _exercise_notes(ex) -> str:
    from nwor_lab import exercises
    p = exercises.predict(ex.name)
    return (f"**Exercise {ex.letter} · {ex.name}** — {ex.title}.\n\n"
            f"Predict first: {p.question}\n\nAnswer: {p.explain}\n\n"
            f"The untouched stub prints *not attempted yet*; `exercises.hints(\"{ex.name}\")` opens hint 1, hint 2, "
            f"then the reference. `use_solutions = True` runs the reference.")


def export(nb, *, plotly_js: str, reveal_prefix: str, chapter_notes=None, exercises_here=(), metrics=None) -> str:
    """The deck of an executed chapter as one HTML file (scripts by relative path, none from a CDN)."""
    from nbconvert import SlidesExporter

    exporter = SlidesExporter(template_name="nwor_slides", extra_template_basedirs=[str(TEMPLATES)],
                              reveal_url_prefix=reveal_prefix, reveal_width=str(figures.SLIDE[0]),
                              reveal_height=str(figures.SLIDE[1]), reveal_theme="white",
                              exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(deck(nb, chapter_notes, exercises_here, metrics),
                                          resources={"nwor": {"plotly_js": plotly_js}})
    return body
