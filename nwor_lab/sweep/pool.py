"""The runner's side of a worker process (`nwor_lab.sweep.worker`): spawn, hand over a run, watch, kill.

One `Worker` per slot; it runs one job at a time. The worker leads its own session, so
Ctrl-C in a terminal reaches only the runner (which decides what to stop); `kill` signals the
worker's process group and the kernel's. Workers die with the runner, even when it is killed with
SIGKILL: a parent-death signal (`nwor_lab.lifeline.die_with_parent`, set before the worker's Python
starts), and the runner's marker in their environment, which a later sweep reaps by.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nwor_lab import lifeline
from nwor_lab.sweep.plan import Run

POLL_S = 0.1
EXIT_NO_SPACE = 28       # = errno ENOSPC: a worker that could not write its files exits with it


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (Linux); [] elsewhere.

    The kernel papermill starts is such a child, in its own session: killing the worker's
    group misses it. ipykernel's parent poller would end it within a second or so, but only
    if the notebook's code lets that thread run; killing it here frees its (GPU) memory now.
    """
    return [child for child, stat in lifeline.processes("stat")
            if len(fields := lifeline.stat_fields(stat)) > 1 and int(fields[1]) == pid]


@dataclass
class Dispatch:
    """A run handed to a worker: where its files go and when it started."""

    run: Run
    work: Path  # per-run scratch folder: job result and metrics files
    started: float  # time.monotonic()
    started_at: str  # ISO 8601, for the row

    # the files the worker writes for the run, in `work`
    result_path = property(lambda self: self.work / "result.json")
    metrics_path = property(lambda self: self.work / "metrics.json")
    notebook_path = property(lambda self: self.work / "executed.ipynb")
    log_path = property(lambda self: self.work / "run.log")


class Worker:
    """A worker process for one slot, started on first use and again after it was killed."""

    def __init__(self, slot: int, extra_env: dict[str, str], token: str):
        self.slot, self.extra_env, self.token = slot, extra_env, token
        self.proc: subprocess.Popen | None = None
        self.current: Dispatch | None = None

    def _spawn(self) -> None:
        # stderr stays the runner's until the first run redirects it to that run's log, so a
        # worker that cannot start (nwor_lab or papermill not importable) says why on the console
        runner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nwor_lab.sweep.worker"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            env={**os.environ, **self.extra_env, lifeline.MARKER_ENV: self.token}, start_new_session=True, text=True,
            preexec_fn=(lambda: lifeline.die_with_parent(runner)) if lifeline.parent_death_supported() else None)

    def submit(self, dispatch: Dispatch, job: dict) -> None:
        line = json.dumps(job) + "\n"
        for attempt in range(2):  # a worker that died between runs is replaced once
            if self.proc is None or self.proc.poll() is not None:
                self._spawn()
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                break
            except BrokenPipeError:
                self.proc.wait()
                if attempt:
                    raise
        self.current = dispatch

    def state(self) -> str:
        """`"running"`, `"done"` (its result file is there) or `"died"` (gone without one)."""
        if self.current.result_path.exists():
            return "done"
        return "running" if self.proc.poll() is None else "died"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the worker's process group and its kernel's (a kernel leads a session of its own)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for group in [self.proc.pid, *child_pids(self.proc.pid)]:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def reap(self, deadline: float) -> None:
        """Wait for the process until `deadline` (monotonic), then SIGKILL it; forget it."""
        if self.proc is None:
            return
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if self.proc.poll() is None:
            self.kill(signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc = None

    def close(self, grace_s: float) -> None:
        """End an idle worker: end of input makes it exit; killed if it does not in `grace_s`."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            self.reap(time.monotonic() + grace_s)
