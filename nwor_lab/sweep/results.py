"""`results.jsonl`: one JSON line per finished run, appended durably; readers take the last row per run.

A row::

    {"run_id": "mode=b,x=2", "params": {"x": 2, "mode": "b"}, "metrics": {...},
     "status": "ok" | "failed", "error": null | "ValueError: ...", "duration_s": 3.1,
     "started_at": "2025-01-01T12:00:00+00:00", "notebook": "notebooks/mode=b,x=2.ipynb",
     "env": {"python": "3.11.9", "torch": "2.14.0", "device": "cpu", ...}}

A re-run appends a new row for a run it retries, so the newest row of a `run_id` is its state.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"


def _drop_torn_tail(path: Path) -> int:
    """Cut an incomplete last line (a process killed mid-write); returns the bytes dropped.

    Rows are written whole by one `os.write`, so this only follows a hard kill or a full
    disk; without the cut, the next row would be glued onto the fragment and lost too.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return 0
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
        return size - keep


class ResultsLog:
    """Appends rows to `results.jsonl`: one `os.write` per row, then fsync, under a lock.

    The lock makes concurrent `append` calls from threads safe; the sweep runner calls it only
    from its main loop anyway (one writer), and holds the folder lock against other sweeps.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / RESULTS_FILE
        dropped = _drop_torn_tail(self.path)
        if dropped:
            print(f"warning: {self.path} ended in an incomplete line ({dropped} bytes); dropped it", file=sys.stderr)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def append(self, row: dict[str, Any]) -> None:
        data = (json.dumps(row, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            view = memoryview(data)
            while view:  # a regular file takes it in one call; loop for the partial-write case
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_rows(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete row, in file order; a torn or unparsable line is skipped with a warning."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                print(f"warning: {path}:{lineno} is not a complete JSON row; skipped", file=sys.stderr)
                continue
            if isinstance(row, dict) and "run_id" in row:
                rows.append(row)
    return rows


def latest_rows(run_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """`run_id` -> its newest row (a retried run's last attempt), in order of first appearance."""
    latest: dict[str, dict[str, Any]] = {}
    for row in read_rows(run_dir):
        latest[row["run_id"]] = row
    return latest
