"""Run a notebook over a grid with papermill: one worker process per run, rows appended as runs finish.

The runner's main loop is the only writer of `results.jsonl` (workers write their own
result and metrics files, which the loop folds into a row), so concurrent workers need no
shared lock on it; a file lock on the folder keeps a second sweep out.

Signals: SIGINT / SIGTERM only set a flag (no exception can land inside a write); the loop
then stops launching, kills the runs in flight (they were not finished, so they get no row
and rerun on resume), and returns an outcome whose exit code is 128 + the signal number.
A second Ctrl-C skips the grace period.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nwor_lab.sweep.grid import SweepInputError
from nwor_lab.sweep.plan import Run, check_out_dir, plan_runs, split_done
from nwor_lab.sweep.record import METRICS_ENV, read_metrics
from nwor_lab.sweep.results import ResultsLog

KILL_GRACE_S = 5.0
POLL_S = 0.1


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


@dataclass
class _Active:
    run: Run
    slot: int
    proc: subprocess.Popen
    work: Path
    log: Any
    started: float
    started_at: str


class _StopFlag:
    """SIGINT/SIGTERM -> a flag (and a count) while a sweep runs; previous handlers restored after."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        self.signum, self.count = signum, self.count + 1
        self.event.set()

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _FolderLock:
    """An exclusive `flock` on `<out>/.lock` for the sweep's lifetime (released if it dies)."""

    def __init__(self, out: Path) -> None:
        self.path, self._f = out / ".lock", None

    def __enter__(self) -> _FolderLock:
        import fcntl

        self._f = open(self.path, "w")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.close()
            raise SweepInputError(f"--out {self.path.parent}: another sweep is writing there; wait for it or use another --out") from None
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the worker leads its own session: this reaches its children too
    except ProcessLookupError:
        pass


def run_sweep(notebook: str | os.PathLike, grid: dict[str, list[Any]], out: str | os.PathLike, *,
              fixed: dict[str, Any] | None = None, workers: int = 1, timeout: float | None = None,
              kernel_name: str | None = None, progress: bool = True,
              resume_hint: str = "run the same sweep again") -> SweepOutcome:
    """Run every combination of `grid` through `notebook`; rows go to `<out>/results.jsonl`.

    `grid`: name -> values (swept); `fixed`: name -> value (every run). Runs with an "ok"
    row in `out` are skipped, failed ones retried. `timeout`: seconds of wall clock per run
    (kernel start included), after which the run is killed and recorded as failed.
    Raises `SweepInputError` for bad input, before anything runs.
    """
    if workers < 1:
        raise SweepInputError(f"--workers {workers}: give 1 or more")
    if timeout is not None and timeout <= 0:
        raise SweepInputError(f"--timeout {timeout}: give a positive number of seconds")
    notebook, out = Path(notebook).resolve(), check_out_dir(out)
    runs = plan_runs(notebook, grid, fixed)
    out.mkdir(parents=True, exist_ok=True)
    with _FolderLock(out):
        done, todo = split_done(runs, out)
        outcome = SweepOutcome(out, len(runs), skipped=[r.run_id for r in done])
        say = _printer(progress)
        if done:
            say(f"skipping {len(done)} of {len(runs)} runs already ok in {out / 'results.jsonl'}; running {len(todo)}")
        if todo:
            _execute(notebook, todo, out, outcome, workers, timeout, kernel_name, progress)
        _summarise(outcome, say, resume_hint)
    return outcome


def _printer(progress: bool):
    from tqdm import tqdm

    return (lambda msg: tqdm.write(msg, file=sys.stderr)) if progress else (lambda msg: print(msg, file=sys.stderr))


def _execute(notebook: Path, todo: list[Run], out: Path, outcome: SweepOutcome, workers: int,
             timeout: float | None, kernel_name: str | None, progress: bool) -> None:
    from tqdm import tqdm

    from nwor_lab.sweep.environment import Environment

    env = Environment()
    for sub in ("notebooks", "logs", ".work"):
        (out / sub).mkdir(exist_ok=True)
    queue, active, free = list(todo), [], list(range(workers))
    bar = tqdm(total=len(todo), desc=out.name, unit="run", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    with ResultsLog(out) as results, _StopFlag() as stop:
        while (queue or active) and not stop.event.is_set():
            while queue and free:
                active.append(_start(queue.pop(0), free.pop(0), notebook, out, env, kernel_name))
            for job in list(active):
                rc = job.proc.poll()
                timed_out = rc is None and timeout is not None and time.monotonic() - job.started > timeout
                if rc is None and not timed_out:
                    continue
                if timed_out:
                    _kill_group(job.proc, signal.SIGKILL)
                    job.proc.wait()
                row = _finish(job, out, env, timeout if timed_out else None)
                results.append(row)  # the row is durable before the run counts as done
                active.remove(job)
                free.append(job.slot)
                if row["status"] == "ok":
                    outcome.ok.append(row["run_id"])
                else:
                    outcome.failed[row["run_id"]] = row["error"]
                    bar.write(f"failed: {row['run_id']}: {row['error']}", file=sys.stderr)
                bar.set_postfix(failed=len(outcome.failed), refresh=False)
                bar.update(1)
            stop.event.wait(POLL_S)
        bar.close()
        if queue or active:  # left the loop on a signal with work outstanding
            outcome.interrupted_by = stop.signum
            _stop_all(active, stop)
    if not any((out / ".work").iterdir()):
        (out / ".work").rmdir()


def _start(run: Run, slot: int, notebook: Path, out: Path, env, kernel_name: str | None) -> _Active:
    work = out / ".work" / run.run_id
    shutil.rmtree(work, ignore_errors=True)  # leftovers of an interrupted attempt
    work.mkdir(parents=True)
    job = {"input": str(notebook), "output": str((out / "notebooks" / f"{run.run_id}.ipynb").resolve()),
           "parameters": run.params, "cwd": str(notebook.parent), "kernel_name": kernel_name,
           "result": str((work / "result.json").resolve())}
    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
    run_env = {**os.environ, METRICS_ENV: str((work / "metrics.json").resolve()), **env.device_env(slot)}
    log = open(out / "logs" / f"{run.run_id}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "nwor_lab.sweep.worker", str(work / "job.json")],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=run_env,
                            start_new_session=True)  # Ctrl-C reaches the runner only; it stops the workers
    return _Active(run, slot, proc, work, log, time.monotonic(), _now())


def _finish(job: _Active, out: Path, env, timed_out_after: float | None) -> dict[str, Any]:
    job.log.close()
    duration = time.monotonic() - job.started
    result_path = job.work / "result.json"
    if timed_out_after is not None:
        status, error = "failed", f"TimeoutError: run exceeded --timeout {timed_out_after:g} s and was killed"
    elif result_path.exists():
        result = json.loads(result_path.read_text(encoding="utf-8"))
        status, error = result["status"], result["error"]
    else:
        status, error = "failed", f"WorkerDied: exit code {job.proc.returncode}; see logs/{job.run.run_id}.log"
    try:
        metrics = read_metrics(job.work / "metrics.json")
    except ValueError as err:
        metrics, error = {}, error or f"ValueError: {err}"
    shutil.rmtree(job.work, ignore_errors=True)
    return {"run_id": job.run.run_id, "params": job.run.params, "metrics": metrics, "status": status,
            "error": error, "duration_s": round(duration, 3), "started_at": job.started_at,
            "notebook": f"notebooks/{job.run.run_id}.ipynb", "env": env.row_facts(job.slot)}


def _stop_all(active: list[_Active], stop: _StopFlag) -> None:
    for job in active:
        _kill_group(job.proc, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    for job in active:
        while job.proc.poll() is None and time.monotonic() < deadline and stop.count < 2:
            time.sleep(POLL_S)
        if job.proc.poll() is None:
            _kill_group(job.proc, signal.SIGKILL)
            job.proc.wait()
        job.log.close()
        shutil.rmtree(job.work, ignore_errors=True)


def _summarise(outcome: SweepOutcome, say, resume_hint: str) -> None:
    results = outcome.run_dir / "results.jsonl"
    finished = len(outcome.ok) + len(outcome.failed)
    if outcome.interrupted_by is not None:
        left = outcome.total - len(outcome.skipped) - finished
        say(f"interrupted: {finished} runs finished and recorded in {results} ({len(outcome.ok)} ok, "
            f"{len(outcome.failed)} failed); {left} not run. Resume: {resume_hint}")
        return
    say(f"{finished} runs finished ({len(outcome.ok)} ok, {len(outcome.failed)} failed), "
        f"{len(outcome.skipped)} skipped: {results}")
    if outcome.failed:
        say(f"{len(outcome.failed)} failed runs (executed notebooks in {outcome.run_dir / 'notebooks'}):")
        for rid, error in outcome.failed.items():
            say(f"  {rid}: {error}")
