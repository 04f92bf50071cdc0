"""Run a notebook over a grid with papermill: `--workers N` worker processes, a row per finished run.

The runner's main loop hands runs to workers (`nwor_lab.sweep.pool`) and is the only writer of
`results.jsonl`: workers write each run's result and metrics files, which the loop folds into
a row, so concurrent workers need no shared lock on it; a file lock on the folder keeps a
second sweep out.

Signals: SIGINT / SIGTERM only set a flag (no exception can land inside a write); the loop
then stops launching, kills the runs in flight (they were not finished, so they get no row
and rerun on resume), and returns an outcome whose exit code is 128 + the signal number.
A second Ctrl-C skips the grace period. SIGKILL gives the runner no say: its workers and their
kernels die with it (parent-death signals), and the next sweep in the folder reaps whatever its
marker still finds (`nwor_lab.sweep.guards.FolderLock`) before it reads a row.

Files: a run's executed notebook and log are written in its scratch folder `.work/<run_id>/` and
moved into `notebooks/` and `logs/` when the run is over, before its row is appended; a run
counts as done only once its row is durable (`nwor_lab.sweep.results`). A full disk stops the
sweep with one line naming the folder (finished rows kept, the run that hit it redone on resume).
"""
from __future__ import annotations

import datetime as _dt
import errno
import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nwor_lab import atomic
from nwor_lab.sweep.grid import SweepInputError
from nwor_lab.sweep.guards import FolderLock, StopFlag
from nwor_lab.sweep.plan import (Run, check_kernel, check_out_dir, check_owner, claim_folder, notebook_parameters,
                                 plan_runs, run_parameters, split_done)
from nwor_lab.sweep.pool import EXIT_NO_SPACE, POLL_S, Dispatch, Worker
from nwor_lab.sweep.record import read_metrics
from nwor_lab.sweep.results import RESULTS_FILE, ResultsLog, repair

FREE_BYTES_MIN = 1 << 20      # below this, a run that died is taken to have died of a full disk

KILL_GRACE_S = 5.0


@dataclass
class SweepOutcome:
    """What one invocation did; `exit_code` is the CLI's: 0 all ok, 1 failures, 128+signal."""

    run_dir: Path
    total: int
    skipped: list[str] = field(default_factory=list)
    ok: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # run_id -> one-line error
    interrupted_by: int | None = None  # signal number

    @property
    def exit_code(self) -> int:
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return 1 if self.failed else 0


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def run_sweep(notebook: str | os.PathLike, grid: dict[str, list[Any]], out: str | os.PathLike, *,
              fixed: dict[str, Any] | None = None, workers: int = 1, timeout: float | None = None,
              kernel_name: str | None = None, progress: bool = True,
              resume_hint: str = "run the same sweep again") -> SweepOutcome:
    """Run every combination of `grid` through `notebook`; rows go to `<out>/results.jsonl`.

    `grid`: name -> values (swept); `fixed`: name -> value (every run). Runs with an "ok"
    row in `out` are skipped, failed ones retried. `timeout`: seconds of wall clock per run,
    counted from its hand-over to a worker (kernel start included, and for a worker's first
    run its own start, a few seconds), after which the run is killed and recorded as failed.
    Raises `SweepInputError` for bad input, before anything runs; `OSError` (one line naming
    the file) when the disk fills up or the folder cannot be written.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SweepInputError(f"--workers {workers!r}: give an integer >= 1")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise SweepInputError(f"--timeout {timeout!r}: give a finite number of seconds > 0 (or leave it out: "
                              f"no limit)")
    _check_environment()
    notebook, out = Path(notebook).resolve(), check_out_dir(out)
    declared = notebook_parameters(notebook)
    runs = plan_runs(notebook, grid, fixed, declared)
    check_kernel(notebook, kernel_name)
    check_owner(out, notebook)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SweepInputError(f"--out {atomic.describe(out, err, 'nothing was run')}") from None
    say = _printer(progress)
    with FolderLock(out) as lock:
        if lock.reaped:
            say(f"the previous sweep in {out} (pid {lock.previous.get('pid')}) died without cleaning up; "
                f"stopped {len(lock.reaped)} processes it left running")
        claim_folder(out, notebook)
        shutil.rmtree(out / ".work", ignore_errors=True)   # scratch of runs a dead sweep left unfinished
        try:   # first: a crash's lost newline or torn row, any damaged line (the file kept whole beside)
            repair(out / RESULTS_FILE, say=lambda msg: say(f"warning: {msg}"))
        except atomic.OutputError:
            raise                                          # names the file it could not write
        except OSError as err:
            raise atomic.OutputError(out / RESULTS_FILE, err, "nothing was run, results.jsonl is unchanged") from None
        done, todo = split_done(runs, out)
        outcome = SweepOutcome(out, len(runs), skipped=[r.run_id for r in done])
        if done:
            say(f"skipping {len(done)} of {_runs(len(runs))} already ok in {out / 'results.jsonl'}; running {len(todo)}")
        if todo:
            _execute(notebook, todo, out, outcome, workers, timeout, kernel_name, progress, declared, lock.token)
        _summarise(outcome, say, resume_hint)
    return outcome


def _check_environment() -> None:
    """The NWOR_LAB_* settings every run's kernel inherits, checked once, before any run: a bad
    value would otherwise fail every run the same way."""
    from nwor_lab.config import LabConfig
    try:
        LabConfig.from_env()
    except ValueError as err:
        raise SweepInputError(f"environment: {err}") from None


def _printer(progress: bool):
    from tqdm import tqdm

    return (lambda msg: tqdm.write(msg, file=sys.stderr)) if progress else (lambda msg: print(msg, file=sys.stderr))


def _execute(notebook: Path, todo: list[Run], out: Path, outcome: SweepOutcome, workers: int,
             timeout: float | None, kernel_name: str | None, progress: bool, declared: dict, token: str) -> None:
    from tqdm import tqdm

    from nwor_lab.sweep.environment import Environment

    env = Environment()
    for sub in ("notebooks", "logs", ".work"):
        try:
            (out / sub).mkdir(exist_ok=True)
        except OSError as err:
            raise atomic.OutputError(out / sub, err, "nothing was run") from None
    queue = list(todo)
    pool = [Worker(slot, env.device_env(slot), token) for slot in range(min(workers, len(todo)))]
    bar = tqdm(total=len(todo), desc=out.name, unit="run", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    with ResultsLog(out) as results, StopFlag() as stop:
        try:
            while (queue or any(w.current for w in pool)) and not stop.event.is_set():
                for worker in pool:
                    if worker.current is None and queue:
                        _dispatch(worker, queue.pop(0), notebook, out, kernel_name, declared)
                for worker in pool:
                    row = _poll(worker, env, timeout, out)
                    if row is None:
                        continue
                    if row.pop("no_space"):
                        _stop_for_space(out, row["run_id"], outcome)
                    results.append(row)  # durable before the run counts as done
                    if row["status"] == "ok":
                        outcome.ok.append(row["run_id"])
                    else:
                        outcome.failed[row["run_id"]] = row["error"]
                        bar.write(f"failed: {row['run_id']}: {row['error']}", file=sys.stderr)
                    bar.set_postfix(failed=len(outcome.failed), refresh=False)
                    bar.update(1)
                stop.event.wait(POLL_S)
        finally:  # also on an unexpected error: never leave workers (and their kernels) behind
            bar.close()
            busy = [w for w in pool if w.current is not None]
            if queue or busy:  # left the loop on a signal (or an error) with work outstanding
                outcome.interrupted_by = stop.signum
                _stop_busy(busy, stop)
            for worker in pool:
                worker.close(KILL_GRACE_S)
    if not any((out / ".work").iterdir()):
        (out / ".work").rmdir()


def _dispatch(worker: Worker, run: Run, notebook: Path, out: Path, kernel_name: str | None, declared: dict) -> None:
    work = (out / ".work" / run.run_id).resolve()
    shutil.rmtree(work, ignore_errors=True)  # leftovers of an interrupted attempt
    try:
        work.mkdir(parents=True)
    except OSError as err:
        raise atomic.OutputError(work, err, "the runs not recorded in results.jsonl will be redone") from None
    dispatch = Dispatch(run, work, time.monotonic(), _now())
    job = {"input": str(notebook), "output": str(dispatch.notebook_path), "parameters": run_parameters(run, declared),
           "cwd": str(notebook.parent), "kernel_name": kernel_name, "metrics": str(dispatch.metrics_path),
           "log": str(dispatch.log_path), "result": str(dispatch.result_path)}
    worker.submit(dispatch, job)


def _stop_for_space(out: Path, run_id: str, outcome: SweepOutcome) -> None:
    """The disk is full: every further run would fail the same way, so stop, in one line."""
    done = len(outcome.ok) + len(outcome.failed)
    raise atomic.OutputError(out, OSError(errno.ENOSPC, "no space"),
                             f"run {run_id} could not write its files and will be redone; {_runs(done)} finished "
                             f"before it {'is' if done == 1 else 'are'} recorded in {out / RESULTS_FILE}; free space, "
                             f"then run the same sweep again")


def _disk_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < FREE_BYTES_MIN
    except OSError:
        return False


def _keep_files(dispatch: Dispatch, out: Path) -> None:
    """Move the run's executed notebook and log from its scratch folder to `notebooks/`, `logs/`."""
    rid = dispatch.run.run_id
    for src, dst in ((dispatch.notebook_path, out / "notebooks" / f"{rid}.ipynb"),
                     (dispatch.log_path, out / "logs" / f"{rid}.log")):
        if src.exists():
            try:
                atomic.move_into_place(src, dst)
            except OSError as err:
                raise atomic.OutputError(dst, err, "the runs not recorded in results.jsonl will be redone") from None


def _poll(worker: Worker, env, timeout: float | None, out: Path) -> dict[str, Any] | None:
    """The row of the worker's run if it ended (finished, died or timed out), else None. The row
    carries `no_space` (popped by the caller): the run failed because the disk is full."""
    dispatch = worker.current
    if dispatch is None:
        return None
    state = worker.state()
    elapsed = time.monotonic() - dispatch.started
    if state == "running" and (timeout is None or elapsed <= timeout):
        return None
    no_space = False
    if state == "done":
        result = json.loads(dispatch.result_path.read_text(encoding="utf-8"))
        status, error, duration = result["status"], result["error"], result["duration_s"]
        no_space = bool(result.get("no_space")) or (status != "ok" and _disk_full(out))
    else:
        if state == "running":
            worker.kill(signal.SIGKILL)
            error = f"TimeoutError: run exceeded --timeout {timeout:g} s and was killed"
        else:
            code = worker.proc.returncode
            no_space = code == EXIT_NO_SPACE or _disk_full(out)
            error = (f"WorkerDied: exit code {code}; see logs/{dispatch.run.run_id}.log "
                     "(or the console, if it died starting)")
        worker.reap(time.monotonic() + KILL_GRACE_S)  # a fresh worker takes the slot's next run
        status, duration = "failed", round(elapsed, 3)
    try:
        metrics = read_metrics(dispatch.metrics_path)
    except ValueError as err:
        metrics, error = {}, error or f"ValueError: {err}"
    worker.current = None
    run = dispatch.run
    if not no_space:
        _keep_files(dispatch, out)
    shutil.rmtree(dispatch.work, ignore_errors=True)
    return {"run_id": run.run_id, "params": run.params, "metrics": metrics, "status": status, "error": error,
            "duration_s": duration, "started_at": dispatch.started_at, "notebook": f"notebooks/{run.run_id}.ipynb",
            "env": env.row_facts(worker.slot), "no_space": no_space}


def _stop_busy(busy: list[Worker], stop: StopFlag) -> None:
    """Stop runs in flight: SIGTERM, a grace period (cut short by a second Ctrl-C), SIGKILL."""
    for worker in busy:
        worker.kill(signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    for worker in busy:
        worker.reap(deadline if stop.count < 2 else time.monotonic())
        shutil.rmtree(worker.current.work, ignore_errors=True)
        worker.current = None


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _summarise(outcome: SweepOutcome, say, resume_hint: str) -> None:
    results = outcome.run_dir / "results.jsonl"
    finished = len(outcome.ok) + len(outcome.failed)
    if outcome.interrupted_by is not None:
        left = outcome.total - len(outcome.skipped) - finished
        say(f"interrupted: {_runs(finished)} finished and recorded in {results} ({len(outcome.ok)} ok, "
            f"{len(outcome.failed)} failed), {_runs(left)} not done. Resume (finished runs are skipped): {resume_hint}")
        return
    say(f"{_runs(finished)} finished ({len(outcome.ok)} ok, {len(outcome.failed)} failed), "
        f"{len(outcome.skipped)} skipped as already ok: {results}")
    if outcome.failed:
        say(f"{_runs(len(outcome.failed))} failed (executed notebooks in {outcome.run_dir / 'notebooks'}):")
        for rid, error in outcome.failed.items():
            say(f"  {rid}: {error}")
