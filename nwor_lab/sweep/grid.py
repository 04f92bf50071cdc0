"""The grid of a sweep: `--grid name=v1,v2` / `--set name=value` parsing, combinations, run ids.

Values are typed the way one would write them in the `parameters` cell:
`8` -> int, `0.5` / `1e-3` -> float, `true`/`false` -> bool, `none`/`null` -> None (any case),
`[5, 3]` / `{"a": 1}` -> a list / dict (JSON), anything else -> str; quote a value (`'8'` or
`"8"`) to keep it a string, `''` for the empty string. In `--grid`, commas inside brackets or
quotes do not split values: `--grid 'prompt_lens=[5,3],[8,8]'` sweeps two lists.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from typing import Any

from nwor_lab.config import state_modes

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")  # safe in file names on Linux, macOS and Windows
# parameters whose values the lab knows before any run: a bad one would fail every run alike
LAB_CHOICES = {"state_mode": state_modes}      # name -> its choices, read when checked (registered ones too)
MAX_RUN_ID = 120  # well under the 255-byte file name limit, with ".ipynb" / ".log" added


class SweepInputError(ValueError):
    """Bad sweep input; the message is one line naming the argument and the fix."""


def parse_value(text: str, flag: str = "value") -> Any:
    """Type one command-line value: int, float, bool, None, JSON list/dict, else str (quotes force
    str). `flag` names the argument in the error for a malformed list or dict."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text[:1] in ("[", "{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise SweepInputError(f"{flag} {text!r}: not a valid JSON {'list' if text[0] == '[' else 'dict'} "
                                  f"({err.msg} at column {err.colno}); e.g. [5, 3] or {{\"a\": 1}}") from None
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _split_assignment(flag: str, text: str, shape: str, example: str) -> tuple[str, str]:
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not _NAME.fullmatch(name):
        raise SweepInputError(f"{flag} {text!r}: expected {shape} with NAME a Python identifier, e.g. {flag} {example}")
    return name, rest


def split_values(text: str) -> list[str]:
    """Split `--grid` values at commas outside brackets and quotes: `[5,3],[8,8]` -> two values."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_grid(specs: list[str]) -> dict[str, list[Any]]:
    """`["batch=1,8", "mode=off,stage"]` -> `{"batch": [1, 8], "mode": ["off", "stage"]}`."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        name, rest = _split_assignment("--grid", spec, "NAME=V1,V2,...", "batch=1,8")
        texts = split_values(rest)
        if not rest.strip() or any(t == "" for t in texts):
            raise SweepInputError(f"--grid {spec!r}: empty value; give comma-separated values, e.g. --grid {name}=1,8")
        if name in grid:
            raise SweepInputError(f"--grid {name} given twice; put all its values in one flag: --grid {name}=v1,v2")
        values = [parse_value(t, f"--grid {name}") for t in texts]
        keys = [json.dumps(v) for v in values]
        if len(set(keys)) != len(keys):
            raise SweepInputError(f"--grid {spec!r}: a value is repeated; list each value once")
        grid[name] = values
    return grid


def parse_set(specs: list[str], grid: dict[str, list[Any]]) -> dict[str, Any]:
    """`["max_new_tokens=64"]` -> `{"max_new_tokens": 64}`: parameters fixed for every run."""
    fixed: dict[str, Any] = {}
    for spec in specs:
        name, rest = _split_assignment("--set", spec, "NAME=VALUE", "max_new_tokens=64")
        if name in grid:
            raise SweepInputError(f"--set {name} is also a --grid parameter; give it in one of the two")
        if name in fixed:
            raise SweepInputError(f"--set {name} given twice; give it once")
        if not rest.strip():
            raise SweepInputError(f"--set {spec!r}: empty value; give one, e.g. --set {name}=64 "
                                  f"(for the empty string: --set {name}=\"''\")")
        fixed[name] = parse_value(rest.strip(), f"--set {name}")
    return fixed


def check_parameters(grid: dict[str, list[Any]], fixed: dict[str, Any], declared: dict[str, Any], notebook: str,
                     assigned: set[str] = frozenset()) -> None:
    """Every swept or set name must be declared in the notebook's `parameters` cell, as papermill
    reads it (`declared`); `assigned`: the names the cell assigns as Python reads it, so a line
    papermill cannot parse is named as such instead of "not a parameter"."""
    if not declared and not assigned:
        raise SweepInputError(f"{notebook} has no cell tagged 'parameters'; tag the cell that assigns "
                              "the defaults (cell toolbar > Tags > parameters)")
    for flag, names in (("--grid", grid), ("--set", fixed)):
        for name in names:
            if name in declared:
                continue
            if name in assigned:
                raise SweepInputError(f"{flag} {name}: {notebook}'s parameters cell assigns it, but papermill "
                                      f"cannot read that line (its comment holds '=', or it spans lines); write "
                                      f"it as `{name} = value  # a comment without an equals sign`")
            raise SweepInputError(f"{flag} {name}: not a parameter of {notebook}; "
                                  f"its parameters cell declares: {', '.join(declared)}")
    check_lab_values(grid, fixed)


def check_lab_values(grid: dict[str, list[Any]], fixed: dict[str, Any]) -> None:
    """Values of the parameters in LAB_CHOICES (`state_mode`: a hybrid target's state strategy,
    nwor_lab.state) must be among the lab's choices: `--grid state_mode=snapshots,stage`."""
    for name, names in LAB_CHOICES.items():
        choices = names()
        for flag, values in (("--grid", grid.get(name, [])), ("--set", [fixed[name]] if name in fixed else [])):
            bad = [v for v in values if v not in choices]
            if bad:
                raise SweepInputError(f"{flag} {name}={bad[0]!r}: choose from {', '.join(choices)}")


def expand_grid(grid: dict[str, list[Any]], fixed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every combination, in `--grid` order (the last name varies fastest), `fixed` added to each."""
    names = list(grid)
    return [{**dict(zip(names, combo)), **(fixed or {})} for combo in itertools.product(*(grid[n] for n in names))]


def _token(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    safe = _UNSAFE.sub("-", text)
    if safe != text:  # keep ids of different values apart after the substitution
        safe += "~" + hashlib.sha1(text.encode()).hexdigest()[:6]
    return safe


def run_id(params: dict[str, Any], names: list[str] | None = None) -> str:
    """A readable, file-system-safe id from the swept values: `batch=8,mode=stage`.

    Names are sorted, so the id does not depend on the order of the `--grid` flags; only the
    swept names take part (`names`), so fixed `--set` values do not lengthen every id (the
    runner refuses to mix runs of the same id with different parameters in one folder).
    """
    names = sorted(params if names is None else names)
    rid = ",".join(f"{n}={_token(params[n])}" for n in names) or "defaults"
    if len(rid) > MAX_RUN_ID:
        rid = rid[: MAX_RUN_ID - 9] + "~" + hashlib.sha1(rid.encode()).hexdigest()[:8]
    return rid
