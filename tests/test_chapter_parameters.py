"""Papermill finds every parameter of every chapter (issue 19, item 6): a sweep can set any name the
`parameters` cell assigns. Papermill reads that cell line by line and skips a line it cannot parse
(a comment holding '=', as chapter 02's `(>= 2)` did), which made a sweep refuse the parameter."""
from pathlib import Path

import pytest

from nwor_lab.sweep import SweepInputError
from nwor_lab.sweep.plan import assigned_parameters, notebook_parameters, plan_runs
from nwor_lab.workshop import chapters as ch

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_papermill_finds_every_parameter(chapter):
    cells = ch.parameters_cells(ch.read(chapter))
    assigned = set(ch.parameters(cells[0]))
    assert "interactive" in assigned
    assert set(notebook_parameters(chapter)) == assigned == assigned_parameters(chapter)


def test_an_unreadable_parameter_line_is_named(tmp_path):
    nb = ch.read(ROOT / "tests" / "data" / "sweep_probe.ipynb")
    cell = ch.parameters_cells(nb)[0]
    cell.source = cell.source.replace("x = 1", "x = 1   # at least 1 (>= 1)")
    path = tmp_path / "probe.ipynb"
    import nbformat
    nbformat.write(nb, str(path))
    with pytest.raises(SweepInputError, match=r"--grid x: .*parameters cell assigns it, but papermill cannot read "
                                              r"that line \(its comment holds '='"):
        plan_runs(path, {"x": [1, 2]})
