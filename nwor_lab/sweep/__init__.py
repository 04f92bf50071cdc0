"""Papermill sweeps of the lab's notebooks, and their report.

A chapter declares its knobs in a cell tagged `parameters` and records what it measured::

    from nwor_lab.sweep import record_metrics
    record_metrics({"step_ms": step_ms, "acceptance_length": mean_al})   # contract: nwor_lab.sweep.record

then a sweep runs it once per combination and a report plots every metric against the grid::

    nwor-lab sweep notebooks/10_sweep.ipynb --grid nwor_mode=off,cow,stage --grid batch=1,8 --out runs/modes
    nwor-lab report runs/modes                  # -> runs/modes/report.html

`runs/NAME/` holds `results.jsonl` (one row per finished run, see `nwor_lab.sweep.results`),
`notebooks/<run_id>.ipynb` (each executed notebook) and `logs/<run_id>.log` (the worker's output),
both moved there when the run ends, `sweep.json` (the notebook the folder belongs to) and `.lock`
(the running sweep, and what a dead one left to reap). docs/reliability.md says what survives
signals, crashes and full disks.

Importing this package imports neither torch nor papermill nor plotly.
"""
from nwor_lab.sweep.grid import SweepInputError, expand_grid, parse_grid, parse_set, parse_value, run_id
from nwor_lab.sweep.record import METRICS_ENV, record_metrics
from nwor_lab.sweep.report import write_report
from nwor_lab.sweep.results import latest_rows, read_rows
from nwor_lab.sweep.runner import SweepOutcome, run_sweep

__all__ = [
    "METRICS_ENV", "SweepInputError", "SweepOutcome", "expand_grid", "latest_rows", "parse_grid", "parse_set",
    "parse_value", "read_rows", "record_metrics", "run_id", "run_sweep", "write_report",
]
