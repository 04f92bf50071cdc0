"""One run of a sweep, in a process of its own: `python -m nwor_lab.sweep.worker JOB.json`.

The runner starts one worker per run, in a new session, with the run's environment
(`NWOR_LAB_METRICS_OUT`, and `CUDA_VISIBLE_DEVICES` when it assigns a GPU); the notebook's
kernel inherits it. A process per run gives each run a fresh environment and lets the runner
stop a run (timeout, Ctrl-C) by killing its process group; ipykernel's parent poller then
ends the orphaned kernel within a second.

JOB.json holds `input`, `output`, `parameters`, `cwd`, `kernel_name`, `result`. The worker
writes `{"status", "error"}` to `result` atomically and exits 0 whether or not the notebook
failed; a missing result file means the worker itself died.
"""
from __future__ import annotations

import json
import sys

from nwor_lab.sweep.record import write_json_atomic

MAX_ERROR_CHARS = 400


def one_line_error(err: BaseException) -> str:
    """`ExceptionName: message` on one line; for a failing cell, the cell's own exception."""
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    if ename is None:  # not a PapermillExecutionError: the kernel died, would not start, ...
        ename, evalue = type(err).__name__, str(err)
    text = f"{ename}: {' '.join(str(evalue).split())}" if evalue else str(ename)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def run_job(job: dict) -> dict:
    status, error = "ok", None
    try:
        import papermill

        papermill.execute_notebook(
            job["input"], job["output"], parameters=job["parameters"], kernel_name=job.get("kernel_name"),
            cwd=job["cwd"], progress_bar=False, log_output=False,
        )
    except Exception as err:  # noqa: BLE001 - every failure of the run is the run's result
        status, error = "failed", one_line_error(err)
    return {"status": status, "error": error}


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    write_json_atomic(job["result"], run_job(job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
