"""A sweep worker process: `python -m nwor_lab.sweep.worker`, one JSON job per stdin line.

The runner keeps one worker per slot (`--workers N`), started in a new session with the slot's
environment (`CUDA_VISIBLE_DEVICES` when it pins a GPU). A long-lived worker pays papermill's
import once per sweep instead of once per run; each run still gets a fresh kernel.

A job is `{"input", "output", "parameters", "cwd", "kernel_name", "metrics", "log", "result"}`,
every output path inside the run's scratch folder (`.work/<run_id>/`); the runner moves the
executed notebook and the log into `notebooks/` and `logs/` once the run is over, so those
folders never hold a half-written file. For each job the worker points its stdout/stderr at
`log` (the kernel started for the run inherits them), sets `NWOR_LAB_METRICS_OUT` to `metrics`
(the kernel inherits it too), runs papermill with a kernel that dies with this worker
(`nwor_lab.lifeline.kernel_manager_class`), and writes `{"status", "error", "duration_s",
"no_space"}` to `result` atomically: the file's appearance is the runner's signal that the run
finished. The runner stops a run by killing the worker's process group and the kernel's
(`nwor_lab.sweep.pool.Worker.kill`). A worker that cannot write a result (a full disk) exits
with `EXIT_NO_SPACE`, so the runner can say why instead of "the worker died".
"""
from __future__ import annotations

import errno
import json
import os
import sys
import time

from nwor_lab import atomic
from nwor_lab.sweep.pool import EXIT_NO_SPACE
from nwor_lab.sweep.record import METRICS_ENV

MAX_ERROR_CHARS = 400
_NO_SPACE_TEXT = ("No space left on device", "ENOSPC", "Disk quota exceeded", "EDQUOT")


def ran_out_of_space(err: BaseException) -> bool:
    """The run failed because the disk is full: an ENOSPC anywhere in the exception's chain, or
    (a cell's exception, which crosses from the kernel as text) its name in the message."""
    seen = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    text = f"{getattr(err, 'evalue', '')} {err}"
    return any(t in text for t in _NO_SPACE_TEXT)


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


def run_job(job: dict, execute_notebook, kernel_manager_class=None) -> dict:
    """Execute one run with `papermill.execute_notebook`; never raises for a failure of the run."""
    _redirect_output(job["log"])
    os.environ[METRICS_ENV] = job["metrics"]
    status, error, no_space = "ok", None, False
    start = time.perf_counter()
    extra = {} if kernel_manager_class is None else {"kernel_manager_class": kernel_manager_class}
    try:
        execute_notebook(
            job["input"], job["output"], parameters=job["parameters"], kernel_name=job.get("kernel_name"),
            cwd=job["cwd"], progress_bar=False, log_output=False, **extra,
        )
    except Exception as err:  # noqa: BLE001 - every failure of the run is the run's result
        status, error, no_space = "failed", one_line_error(err), ran_out_of_space(err)
    return {"status": status, "error": error, "duration_s": round(time.perf_counter() - start, 3),
            "no_space": no_space}


def main() -> int:
    # jsonschema (imported by nbformat) imports `rfc3987_syntax` when installed, only to offer
    # "iri" format checks that notebook validation never asks for; building that package's
    # grammar takes 2-3 s per process, three quarters of a worker's start. None in sys.modules
    # makes the import fail, which jsonschema expects and skips.
    sys.modules.setdefault("rfc3987_syntax", None)
    from papermill import execute_notebook  # once, before the first run: not part of its duration

    from nwor_lab.lifeline import kernel_manager_class

    manager = kernel_manager_class()
    for line in sys.stdin:  # the runner closes stdin when the sweep is done
        if line.strip():
            job = json.loads(line)
            result = run_job(job, execute_notebook, manager)
            try:
                atomic.write_json(job["result"], result)
            except OSError as err:
                print(f"sweep worker: {err}", file=sys.stderr)
                return EXIT_NO_SPACE if atomic.no_space(err) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
