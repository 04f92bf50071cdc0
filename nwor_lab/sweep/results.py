"""`results.jsonl`: one JSON line per finished run, appended durably; readers take the last row per run.

A row::

    {"run_id": "mode=b,x=2", "params": {"x": 2, "mode": "b"}, "metrics": {...},
     "status": "ok" | "failed", "error": null | "ValueError: ...", "duration_s": 3.1,
     "started_at": "2025-01-01T12:00:00+00:00", "notebook": "notebooks/mode=b,x=2.ipynb",
     "env": {"python": "3.11.9", "torch": "2.14.0", "device": "cpu", ...}}

A re-run appends a new row for a run it retries, so the newest row of a `run_id` is its state.

What the file promises, as a database log would:
- a row is durable once `append` returns: written whole (newline included) by one `os.write`,
  then fsynced; the runner counts a run done only after that;
- the reader never drops a complete row: a last row that lost only its newline (a crash between
  the row and the `\\n`) is read, and the next writer restores the newline instead of cutting it;
- a torn row (a crash mid-write: not valid JSON) is never counted done: the reader skips it, the
  next writer cuts it off, and the sweep reruns that run;
- a damaged row (not UTF-8, not a JSON object, a missing or mistyped field) is skipped with a
  warning naming the file, the line and what is wrong, so the run is redone rather than
  reported from a row that cannot be trusted.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from nwor_lab.atomic import OutputError, fsync_dir

RESULTS_FILE = "results.jsonl"
STATUSES = ("ok", "failed")
NEWLINE = b"\n"

# field -> (allowed types, required); the one description of a row's shape
ROW_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "run_id": ((str,), True),
    "params": ((dict,), True),
    "status": ((str,), True),
    "metrics": ((dict, type(None)), False),
    "error": ((str, type(None)), False),
    "duration_s": ((int, float, type(None)), False),
    "started_at": ((str, type(None)), False),
    "notebook": ((str,), False),
    "env": ((dict, type(None)), False),
}


def row_problem(row: Any) -> str | None:
    """What makes `row` unusable (one phrase), or None for a well-formed row."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    for name, (types, required) in ROW_FIELDS.items():
        if name not in row:
            if required:
                return f"no {name!r} field"
            continue
        value = row[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{name!r} is {json.dumps(value)[:40]}, not {' or '.join(_type_name(t) for t in types)}"
    if not row["run_id"]:
        return "'run_id' is empty"
    if row["status"] not in STATUSES:
        return f"'status' is {row['status']!r}, not one of {', '.join(STATUSES)}"
    return None


def _type_name(t: type) -> str:
    return {str: "a string", dict: "an object", int: "a number", float: "a number",
            type(None): "null"}.get(t, t.__name__)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def repair_tail(path: Path) -> None:
    """Before appending: give a complete last row its missing newline; cut a torn last row."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        tail = data[start:]
        if _parse(tail)[0] is not None:          # complete: only the newline was lost
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            _warn(f"{path}:{data.count(NEWLINE) + 1}: the last row had lost its newline; restored it")
        else:
            f.truncate(start)
            _warn(f"{path}: the last row was torn ({len(tail)} bytes, a crash mid-write); removed it, "
                  f"its run will be redone")
        f.flush()
        os.fsync(f.fileno())


def _parse(line: bytes) -> tuple[dict | None, str | None]:
    """-> (row, None) for a well-formed row, else (None, what is wrong)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 (byte {line[err.start]:#04x} at column {err.start + 1})"
    try:
        row = json.loads(text)
    except json.JSONDecodeError:
        return None, "not a complete JSON row"
    problem = row_problem(row)
    return (None, problem) if problem else (row, None)


class ResultsLog:
    """Appends rows to `results.jsonl`: one `os.write` per row, then fsync, under a lock.

    The lock makes concurrent `append` calls from threads safe; the sweep runner calls it only
    from its main loop anyway (one writer), and holds the folder lock against other sweeps.
    A write that fails (full disk) raises `OutputError` naming the file, after cutting what it
    wrote, so the file ends with a complete row.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / RESULTS_FILE
        try:
            repair_tail(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise OutputError(self.path, err) from None
        fsync_dir(self.path.parent)
        self._lock = threading.Lock()

    def append(self, row: dict[str, Any]) -> None:
        problem = row_problem(row)
        if problem:
            raise ValueError(f"results row: {problem}")
        data = (json.dumps(row, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            start = os.lseek(self._fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:  # a regular file takes it in one call; loop for the partial-write case
                    view = view[os.write(self._fd, view):]
                os.fsync(self._fd)
            except OSError as err:
                try:                      # leave no torn row behind us
                    os.ftruncate(self._fd, start)
                except OSError:
                    pass
                raise OutputError(self.path, err) from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_rows(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every well-formed row, in file order, a last row without its newline included; each
    torn or damaged line is skipped with one warning naming `file:line` and what is wrong."""
    path = Path(run_dir) / RESULTS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row, problem = _parse(line)
        if row is not None:
            rows.append(row)
            continue
        if lineno == len(lines) and problem == "not a complete JSON row":
            problem = "a torn row (a crash mid-write)"
        _warn(f"{path}:{lineno}: {problem}; row skipped, its run counts as not done")
    return rows


def latest_rows(run_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """`run_id` -> its newest row (a retried run's last attempt), in order of first appearance."""
    latest: dict[str, dict[str, Any]] = {}
    for row in read_rows(run_dir):
        latest[row["run_id"]] = row
    return latest
