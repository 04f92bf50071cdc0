"""`results.jsonl`: one JSON line per finished run, appended durably; readers take the last row per run.

A row::

    {"run_id": "mode=b,x=2", "params": {"x": 2, "mode": "b"}, "metrics": {...},
     "status": "ok" | "failed", "error": null | "ValueError: ...", "duration_s": 3.1,
     "started_at": "2025-01-01T12:00:00+00:00", "notebook": "notebooks/mode=b,x=2.ipynb",
     "env": {"python": "3.11.9", "torch": "2.14.0", "device": "cpu", ...}}

`ROW_FIELDS` is the one description of its fields and their types; `metrics` is flat, as
`nwor_lab.sweep.record` promises (numbers, text, true/false or null per key), and no number is
NaN or infinite (JSON has none; the writer refuses them). A re-run appends a new row for a run it
retries, so the newest row of a `run_id` is its state.

What the file promises, as a database log would:
- a row is durable once `append` returns: written whole (newline included) by one `os.write`,
  then fsynced; the runner counts a run done only after that;
- the reader never drops a complete row: a last row that lost only its newline (a crash between
  the row and the `\\n`) is read, and the next writer restores the newline instead of cutting it;
- every other line that is not a well-formed row is named `file:line: what is wrong`: a torn
  last row (a crash mid-write), bytes that are not UTF-8, text that is not a JSON object, a
  missing or mistyped field. Readers leave it out (`read_results`: the report says so on its
  page); its run counts as not done, so a sweep redoes it;
- nothing is written over a damaged file without keeping it: before the next append, `repair`
  copies the file whole to `results.jsonl.damaged-<UTC time>` beside it, then replaces
  `results.jsonl` atomically with its well-formed rows, byte for byte.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nwor_lab import atomic
from nwor_lab.atomic import OutputError, fsync_dir

RESULTS_FILE = "results.jsonl"
DAMAGED_SUFFIX = ".damaged-"          # results.jsonl.damaged-20250101T120000Z: a damaged file, kept whole
STATUSES = ("ok", "failed")
NEWLINE = b"\n"
# what `nwor_lab.sweep.grid.run_id` makes: safe in a file name, never a path
_RUN_ID = re.compile(r"[A-Za-z0-9_+=,~-][A-Za-z0-9._+=,~-]{0,199}")

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
METRIC_TYPES = (bool, int, float, str, type(None))      # nwor_lab.sweep.record's flat contract


def row_problem(row: Any) -> str | None:
    """What makes `row` unusable (one phrase), or None for a well-formed row."""
    if not isinstance(row, dict):
        return f"a JSON {_json_kind(row)}, not an object"
    for name, (types, required) in ROW_FIELDS.items():
        if name not in row:
            if required:
                return f"no {name!r} field"
            continue
        value = row[name]
        if not _is_a(value, types):
            return f"{name!r} is {_shown(value)}, not {' or '.join(dict.fromkeys(_type_name(t) for t in types))}"
    if not _RUN_ID.fullmatch(row["run_id"]):
        return (f"'run_id' is {_shown(row['run_id'])}, not a run id (letters, digits and ._+=,~- only, "
                f"as the sweep makes them: x=2,mode=b)")
    if row["status"] not in STATUSES:
        return f"'status' is {row['status']!r}, not one of {', '.join(STATUSES)}"
    for key, value in (row.get("metrics") or {}).items():
        if not _is_a(value, METRIC_TYPES):
            return f"metric {key!r} is {_shown(value)}, not a number, text, true/false or null"
    if isinstance(row.get("duration_s"), (int, float)) and row["duration_s"] < 0:
        return f"'duration_s' is {row['duration_s']}, not a duration (>= 0)"
    return None


def _is_a(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and (not isinstance(value, bool) or bool in types)


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "true/false", type(None): "null"}.get(type(value), "number")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return f"a JSON {_json_kind(value)} ({text[:37]}...)" if len(text) > 40 else f"{text} (a JSON {_json_kind(value)})"


def _type_name(t: type) -> str:
    return {str: "a string", dict: "an object", int: "a number", float: "a number", bool: "true/false",
            type(None): "null"}.get(t, t.__name__)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _parse(line: bytes) -> tuple[dict | None, str | None]:
    """-> (row, None) for a well-formed row, else (None, what is wrong)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 (byte {line[err.start]:#04x} at column {err.start + 1})"
    try:
        row = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        return None, f"not a complete JSON row ({err.msg} at column {err.colno})"
    except ValueError as err:                       # NaN, Infinity: what no writer of this file writes
        return None, f"{err} (JSON has no NaN or infinity)"
    problem = row_problem(row)
    return (None, problem) if problem else (row, None)


@dataclass(frozen=True)
class BadLine:
    """A line of `results.jsonl` that is not a well-formed row (1-based `lineno`)."""

    path: Path
    lineno: int
    problem: str
    torn: bool = False          # the last line, not JSON: a crash mid-write

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.problem}"


@dataclass
class Reading:
    """`results.jsonl` read strictly: its well-formed rows and every other line, named."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    good_lines: list[bytes] = field(default_factory=list)   # the rows' own bytes, no newline
    lost_newline: bool = False       # the last line is a complete row that lost its newline
    data: bytes = b""                 # the file as read

    @property
    def latest(self) -> dict[str, dict[str, Any]]:
        """`run_id` -> its newest row (a retried run's last attempt), in order of first appearance."""
        return newest_per_run(self.rows)


def newest_per_run(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        latest[row["run_id"]] = row
    return latest


def read_results(run_dir: str | os.PathLike) -> Reading:
    """Read `<run_dir>/results.jsonl` strictly, writing nothing and warning nothing."""
    return read_log(Path(run_dir) / RESULTS_FILE)


def read_log(path: Path) -> Reading:
    """`read_results` of the log at `path`."""
    reading = Reading(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return reading
    reading.data = data
    lines = data.split(NEWLINE)
    for lineno, line in enumerate(lines, 1):
        if not line and lineno == len(lines):      # after the last newline: the end, not a line
            continue
        if not line.strip():                        # no writer of this file writes one
            reading.bad.append(BadLine(path, lineno, "an empty line" if not line else "a line of whitespace only"))
            continue
        row, problem = _parse(line)
        if row is not None:
            reading.rows.append(row)
            reading.good_lines.append(line)
            reading.lost_newline = lineno == len(lines)
            continue
        torn = lineno == len(lines) and problem.startswith("not a complete JSON row")
        if torn:
            problem = f"the last row was torn ({len(line)} bytes, a crash mid-write)"
        reading.bad.append(BadLine(path, lineno, problem, torn))
    return reading


def damaged_copy_name(path: Path, now: _dt.datetime | None = None) -> Path:
    """`results.jsonl.damaged-<UTC time>` beside `path`, not yet taken."""
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}"), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}-{n}")
    return candidate


@dataclass
class Repair:
    """What `repair` did to `results.jsonl` before a sweep appends to it."""

    bad: list[BadLine] = field(default_factory=list)
    kept_as: Path | None = None         # the damaged file, whole
    newline_restored: bool = False


def repair(path: Path, say=_warn) -> Repair:
    """Make `path` a clean log before appending to it; `say` each thing done, one line each.

    A last row that lost its newline gets it back (nothing is lost). A file with any other line
    that is not a well-formed row is first copied whole to `damaged_copy_name(path)`, then
    replaced atomically by its well-formed rows, byte for byte: the runs of the lines left out
    have no row any more, so the sweep redoes them. Raises OSError (the caller names the file)
    when the copy or the rewrite cannot be written; then `path` is unchanged.
    """
    reading = read_log(path)
    done = Repair(bad=reading.bad)
    if reading.bad:
        kept = damaged_copy_name(path)
        atomic.write_bytes(kept, reading.data)
        atomic.write_bytes(path, b"".join(line + NEWLINE for line in reading.good_lines))
        done.kept_as = kept
        for bad in reading.bad:
            say(f"{bad}; left out: its run counts as not done, and a sweep over it redoes it")
        say(f"{path}: kept the damaged file whole as {kept.name}; {path.name} now holds its "
            f"{len(reading.good_lines)} well-formed rows")
    elif reading.lost_newline:
        with open(path, "ab") as f:
            f.write(NEWLINE)
            f.flush()
            os.fsync(f.fileno())
        done.newline_restored = True
        say(f"{path}:{len(reading.good_lines)}: the last row had lost its newline; restored it")
    return done


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
            repair(self.path)
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
    other line is left out with one warning naming `file:line` and what is wrong."""
    reading = read_results(run_dir)
    for bad in reading.bad:
        _warn(f"{bad}; row left out, its run counts as not done")
    return reading.rows


def latest_rows(run_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """`run_id` -> its newest well-formed row (a retried run's last attempt), in order of first
    appearance; other lines warned about as `read_rows` does."""
    return newest_per_run(read_rows(run_dir))
