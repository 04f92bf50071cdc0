"""What a chapter notebook is, read from its file: title, parameters, exercises, hygiene problems.

A *chapter* is one `notebooks/NN_name.ipynb`. It is committed clean: no outputs, no execution
counts, no saved widget state — except in cells marked `# NBVAL_CHECK_OUTPUT`, which keep their
expected text output *and* an execution count (nbval compares a fresh run against that output,
and silently skips a cell whose execution count is empty; `clean` numbers them 1, 2, ...).
It has one code cell tagged `parameters` (papermill injects overrides after it) that assigns
`interactive = True|False` (False: static figures, as in the workshop kit), and runs on the
`python3` kernel that `make setup` registers in `.venv`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import nbformat

from nwor_lab.sweep.plan import parameters, parameters_cells  # the parameters cell is papermill's (the sweep's) contract

KERNEL_NAME = "python3"
# The kernels a chapter may name: the lab's own, and the one `make setup-vllm` registers for the
# chapters that run real vLLM (vLLM pins its own torch, so it has its own environment).
KERNELS = {KERNEL_NAME: "the lab's .venv", "nwor-lab-vllm": ".venv-vllm (make setup-vllm): chapters that run vLLM"}
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


@dataclass
class Exercise:
    title: str
    anchor: str  # the id nbconvert gives the heading in the exported HTML


@dataclass
class Chapter:
    path: Path
    title: str
    parameters: dict = field(default_factory=dict)  # names the parameters cell assigns -> literal values
    exercises: list[Exercise] = field(default_factory=list)


def read(path) -> nbformat.NotebookNode:
    """The notebook as nbformat v4 (raises on unreadable JSON)."""
    return nbformat.read(str(path), as_version=4)


def headings(nb) -> list[tuple[int, str]]:
    """(level, text) of every markdown heading, in order (fenced code blocks ignored)."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        text = re.sub(r"```.*?```", "", cell.source, flags=re.S)
        out += [(len(m.group(1)), m.group(2)) for m in _HEADING.finditer(text)]
    return out


def title(nb, default: str = "") -> str:
    """The chapter's title: its first markdown heading."""
    found = headings(nb)
    return found[0][1] if found else default


def html_anchor(heading: str) -> str:
    """The id nbconvert's HTML templates give a heading: its text, spaces as '-', URL-quoted
    (as `nbconvert.filters.strings.add_anchor` does; markdown markup dropped first)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[*_`]|<[^>]+>", "", text)
    return quote(text.strip().replace(" ", "-"), safe="?/:@!$&'()*+,;=")


def exercises(nb) -> list[Exercise]:
    """Headings whose title starts with 'Exercise', plus cells tagged `exercise` (first line)."""
    found = [Exercise(t, html_anchor(t)) for _, t in headings(nb) if t.lower().startswith("exercise")]
    for cell in nb.cells:
        if "exercise" in cell.metadata.get("tags", []) and cell.source.strip():
            first = cell.source.strip().splitlines()[0].lstrip("#").strip()
            if not any(e.title == first for e in found):
                found.append(Exercise(first, html_anchor(first)))
    return found


def checked(cell) -> bool:
    """nbval compares this cell's output (a `# NBVAL_CHECK_OUTPUT` line, or the tag `nbval-check-output`)."""
    marked = any(line.strip().startswith("#") and line.strip().lstrip("#").strip() == "NBVAL_CHECK_OUTPUT"
                 for line in cell.source.splitlines())
    return cell.cell_type == "code" and (marked or "nbval-check-output" in cell.metadata.get("tags", []))


def _text_only(output) -> bool:
    if output.output_type == "stream":
        return True
    return output.output_type in ("execute_result", "display_data") and set(output.get("data", {})) <= {"text/plain"}


def problems(path) -> list[str]:
    """Everything that keeps a committed chapter from being clean; [] when it is."""
    path = Path(path)
    try:
        nb = read(path)
        nbformat.validate(nb)
    except Exception as err:  # unreadable JSON, wrong schema: nothing else is worth checking
        return [f"not a valid nbformat notebook: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"]
    found = []
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    with_outputs = [i for i, c in code if c.outputs and not checked(c)]
    not_text = [i for i, c in code if checked(c) and not all(_text_only(o) for o in c.outputs)]
    unexpected = [i for i, c in code if checked(c) and (not c.outputs or c.execution_count is None)]
    counted = [i for i, c in code if c.execution_count is not None and not checked(c)]
    fix = "(python -m nwor_lab.workshop clean --execute FILE)"
    if with_outputs:
        found.append(f"cells {with_outputs} have outputs and are not marked NBVAL_CHECK_OUTPUT {fix}")
    if not_text:
        found.append(f"NBVAL_CHECK_OUTPUT cells {not_text} store more than text (print the numbers you check)")
    if unexpected:
        found.append(f"NBVAL_CHECK_OUTPUT cells {unexpected} store no expected output and execution count, "
                     f"so nbval compares nothing {fix}")
    if counted:
        found.append(f"cells {counted} have execution counts {fix}")
    if "widgets" in nb.metadata:
        found.append("metadata holds saved widget state (turn off 'Save Widget State Automatically')")
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    if kernel not in KERNELS:
        found.append(f"kernelspec is {kernel!r}, not one of {', '.join(map(repr, KERNELS))} (nbval and papermill "
                     f"start the kernel by name)")
    cells = parameters_cells(nb)
    if not cells:
        found.append("no code cell tagged 'parameters' (papermill injects interactive=False after it)")
    elif len(cells) > 1:
        found.append(f"{len(cells)} cells tagged 'parameters'; papermill uses the first, keep one")
    else:
        try:
            params = parameters(cells[0])
        except SyntaxError as err:
            found.append(f"parameters cell does not parse: {err}")
        else:
            if not isinstance(params.get("interactive"), bool):
                found.append("parameters cell does not assign interactive = True or False")
    if not title(nb):
        found.append("no markdown heading (the first one is the chapter's title)")
    return found


def clean(nb) -> nbformat.NotebookNode:
    """The notebook as it should be committed: NBVAL_CHECK_OUTPUT cells keep their text output,
    numbered 1, 2, ... (so a re-run changes nothing else); every other output, every other
    execution count and saved widget state are dropped."""
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        keep = checked(cell) and cell.execution_count is not None
        cell.outputs = [o for o in cell.outputs if _text_only(o)] if keep else []
        number += keep
        cell.execution_count = number if keep else None
        for output in cell.outputs:
            if output.output_type == "execute_result":
                output.execution_count = cell.execution_count
    nb.metadata.pop("widgets", None)
    return nb


def execute(path, timeout: float = 600.0, kernel_name: str | None = None) -> nbformat.NotebookNode:
    """Run a notebook as committed (its own parameters) in its folder; raises on a failing cell."""
    from nbclient import NotebookClient

    path = Path(path)
    nb = read(path)
    NotebookClient(nb, timeout=timeout, kernel_name=kernel_name or nb.metadata.get("kernelspec", {}).get("name", KERNEL_NAME),
                   resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    return nb


def chapter(path) -> Chapter:
    path = Path(path)
    nb = read(path)
    cells = parameters_cells(nb)
    try:
        params = parameters(cells[0]) if cells else {}
    except SyntaxError:
        params = {}
    return Chapter(path, title(nb, default=path.stem), params, exercises(nb))


def unlisted(chapters, *documents) -> list[Path]:
    """Chapters whose file name appears in none of the given documents (README.md, notebooks/README.md)."""
    text = "\n".join(Path(d).read_text() for d in documents if Path(d).exists())
    return [Path(c) for c in chapters if Path(c).name not in text]
