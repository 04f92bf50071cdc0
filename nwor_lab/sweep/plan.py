"""What a sweep will run: the notebook and grid checked up front, combinations, what is already done."""
from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nwor_lab import atomic
from nwor_lab.sweep.grid import SweepInputError, check_parameters, expand_grid, run_id
from nwor_lab.sweep.results import latest_rows

OWNER_FILE = "sweep.json"   # which notebook a sweep folder belongs to


@dataclass(frozen=True)
class Run:
    """One combination: its id and every parameter injected (swept, then fixed)."""

    run_id: str
    params: dict[str, Any]


def notebook_parameters(notebook: str | Path) -> dict[str, Any]:
    """The names declared in the notebook's `parameters` cell (papermill's own inspection)."""
    import papermill

    path = Path(notebook)
    if not path.is_file():
        raise SweepInputError(f"NOTEBOOK {notebook}: no such file; give the path of an .ipynb")
    if path.suffix != ".ipynb":
        raise SweepInputError(f"NOTEBOOK {notebook}: not an .ipynb file; give a Jupyter notebook")
    try:
        return papermill.inspect_notebook(str(path))
    except Exception as err:  # noqa: BLE001 - any parse failure is bad input here
        raise SweepInputError(f"NOTEBOOK {notebook}: cannot be read as a notebook ({type(err).__name__}: {err})") from None


def parameters_cells(nb) -> list:
    """The code cells tagged `parameters` (papermill injects its values after the first)."""
    return [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]


def parameters(cell) -> dict:
    """Literal assignments of a parameters cell (`name = value`, `name: type = value`)."""
    found = {}
    for node in ast.parse(cell.source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    found[target.id] = ast.unparse(value)  # not a literal: keep its text
    return found


def assigned_parameters(notebook: str | Path) -> set[str]:
    """Names the `parameters` cell assigns, as Python reads it (papermill reads the cell line by
    line and skips a line it cannot parse)."""
    import nbformat

    try:
        cells = parameters_cells(nbformat.read(str(notebook), as_version=4))
        return set(parameters(cells[0])) if cells else set()
    except Exception:  # noqa: BLE001 - only used to explain a refusal; papermill's view decides
        return set()


def check_kernel(notebook: str | Path, kernel_name: str | None) -> str:
    """The Jupyter kernel the runs will use (`kernel_name`, else the notebook's), checked to exist:
    a missing kernel would otherwise fail every run the same way."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager

    name = kernel_name or nbformat.read(str(notebook), as_version=4).metadata.get("kernelspec", {}).get("name")
    flag = "--kernel" if kernel_name else f"NOTEBOOK {notebook}"
    if not name:
        raise SweepInputError(f"{flag}: the notebook names no kernel (metadata.kernelspec); pass --kernel python3")
    installed = KernelSpecManager().find_kernel_specs()
    if name not in installed:
        raise SweepInputError(f"{flag}: no Jupyter kernel named {name!r} (installed: {', '.join(sorted(installed)) or 'none'}); "
                              f"pass --kernel NAME or install one: python -m ipykernel install --sys-prefix --name {name}")
    return name


def check_out_dir(out: str | Path) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SweepInputError(f"--out {out}: is a file; give a folder (created if missing), e.g. --out runs/{out.stem}")
    existing = next((p for p in [out, *out.parents] if p.exists()), Path("."))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SweepInputError(f"--out {out}: {existing} is not writable (read-only file system or permissions); "
                              f"choose a folder you can write")
    return out


def check_owner(out: Path, notebook: Path) -> None:
    """A sweep folder belongs to the notebook that first swept into it: refuse another one, whose
    runs would be skipped as "already ok" (same run ids) or appended to the wrong results."""
    owner = _owner(out)
    if owner is not None and owner != notebook.name:
        raise SweepInputError(f"--out {out}: holds the runs of {owner}, not {notebook.name}; a folder holds one "
                              f"notebook's sweep, use another --out (e.g. runs/{notebook.stem})")


def claim_folder(out: Path, notebook: Path) -> None:
    """Record `notebook` as the folder's owner (under the folder lock, before any row is written)."""
    check_owner(out, notebook)
    if not (out / OWNER_FILE).exists():
        atomic.write_json(out / OWNER_FILE, {"notebook": notebook.name, "path": str(notebook)}, indent=1, newline=True)


def _owner(out: Path) -> str | None:
    path = out / OWNER_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise SweepInputError(f"--out {out}: {path} is damaged ({type(err).__name__}); restore it or use "
                              f"another --out") from None
    name = data.get("notebook") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise SweepInputError(f"--out {out}: {path} names no notebook; restore it or use another --out")
    return name


def run_parameters(run: Run, declared: dict[str, Any]) -> dict[str, Any]:
    """What papermill injects for `run`: its parameters, plus `interactive=False` when the notebook
    declares `interactive` and the sweep does not set it (saved notebooks hold static figures,
    not widgets that need a live kernel)."""
    if "interactive" in declared and "interactive" not in run.params:
        return {**run.params, "interactive": False}
    return dict(run.params)


def plan_runs(notebook: str | Path, grid: dict[str, list[Any]], fixed: dict[str, Any] | None = None,
              declared: dict[str, Any] | None = None) -> list[Run]:
    """Every combination of `grid` (plus `fixed`), each checked against the notebook's parameters."""
    fixed = fixed or {}
    check_parameters(grid, fixed, notebook_parameters(notebook) if declared is None else declared, str(notebook),
                     assigned_parameters(notebook))
    names = list(grid)
    runs = [Run(run_id(params, names), params) for params in expand_grid(grid, fixed)]
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):  # only possible through the length cap; say so rather than overwrite
        raise SweepInputError("--grid: two combinations map to one run id; shorten the values")
    return runs


def split_done(runs: list[Run], out: Path) -> tuple[list[Run], list[Run]]:
    """(runs with an "ok" row already, runs to execute); failed and missing runs are (re)run.

    Refuses a folder whose row for a run id carries other parameters (a changed `--set`):
    skipping it would report results of parameters that were not asked for.
    """
    latest = latest_rows(out)
    done, todo = [], []
    for run in runs:
        row = latest.get(run.run_id)
        if row is not None and _canon(row.get("params")) != _canon(run.params):
            raise SweepInputError(
                f"--out {out}: run {run.run_id} there has parameters {json.dumps(row.get('params'))}, "
                f"not {json.dumps(run.params)}; use a new --out, or the --set values of that sweep")
        (done if row is not None and row.get("status") == "ok" else todo).append(run)
    return done, todo


def _canon(params: Any) -> str:
    return json.dumps(params, sort_keys=True)
