"""A sweep worker process: `python -m nwor_lab.sweep.worker`, one JSON job per stdin line.

The runner keeps one worker per slot (`--workers N`), started in a new session with the slot's
environment (`CUDA_VISIBLE_DEVICES` when it pins a GPU). A long-lived worker pays papermill's
import once per sweep instead of once per run; each run still gets a fresh kernel.

A job is `{"input", "output", "parameters", "cwd", "kernel_name", "metrics", "log", "result"}`.
For each job the worker points its stdout/stderr at `log` (the kernel started for the run
inherits them), sets `NWOR_LAB_METRICS_OUT` to `metrics` (the kernel inherits it too), runs
papermill, and writes `{"status", "error", "duration_s"}` to `result` atomically: the file's
appearance is the runner's signal that the run finished. The runner stops a run by killing
the worker's process group and the kernel's (`nwor_lab.sweep.pool.Worker.kill`).
"""
from __future__ import annotations

import json
import os
import sys
import time

from nwor_lab.sweep.record import METRICS_ENV, write_json_atomic

MAX_ERROR_CHARS = 400


def one_line_error(err: BaseException) -> str:
    """`ExceptionName: message` on one line; for a failing cell, the cell's own exception."""
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    if ename is None:  # not a PapermillExecutionError: the kernel died, would not start, ...
        ename, evalue = type(err).__name__, str(err)
    text = f"{ename}: {' '.join(str(evalue).split())}" if evalue else str(ename)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _redirect_output(log_path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_job(job: dict, execute_notebook) -> dict:
    """Execute one run with `papermill.execute_notebook`; never raises for a failure of the run."""
    _redirect_output(job["log"])
    os.environ[METRICS_ENV] = job["metrics"]
    status, error = "ok", None
    start = time.perf_counter()
    try:
        execute_notebook(
            job["input"], job["output"], parameters=job["parameters"], kernel_name=job.get("kernel_name"),
            cwd=job["cwd"], progress_bar=False, log_output=False,
        )
    except Exception as err:  # noqa: BLE001 - every failure of the run is the run's result
        status, error = "failed", one_line_error(err)
    return {"status": status, "error": error, "duration_s": round(time.perf_counter() - start, 3)}


def main() -> int:
    # jsonschema (imported by nbformat) imports `rfc3987_syntax` when installed, only to offer
    # "iri" format checks that notebook validation never asks for; building that package's
    # grammar takes 2-3 s per process, three quarters of a worker's start. None in sys.modules
    # makes the import fail, which jsonschema expects and skips.
    sys.modules.setdefault("rfc3987_syntax", None)
    from papermill import execute_notebook  # once, before the first run: not part of its duration

    for line in sys.stdin:  # the runner closes stdin when the sweep is done
        if line.strip():
            job = json.loads(line)
            write_json_atomic(job["result"], run_job(job, execute_notebook))
    return 0


if __name__ == "__main__":
    sys.exit(main())
