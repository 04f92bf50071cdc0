"""The command line's one validation layer: argparse value types that check a flag's type and range
before any work starts, the way the API checks the parameter (`nwor_lab.config.check_int` /
`check_temperature`).

Every `nwor-lab` flag takes one of these (or `choices=`), so a bad value fails at parse time with the
same shape everywhere: exit 2 and one line `nwor-lab: error: argument --FLAG: <what is allowed>,
got <value>` (`LabArgumentParser` turns argparse's errors into that line). Torch-free: the command
line is checked before torch is imported. Whether a device exists, a checkpoint loads or the
engine's limits fit is checked next, still before any work (`nwor_lab.commandline.environment`, the
commands).
"""
from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

from nwor_lab.config import INT64_MAX, check_int, check_temperature


def integer(minimum: int | None = None, maximum: int = INT64_MAX):
    """An argparse type: an integer in `minimum..maximum` (always bounded: past int64, torch fails)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        try:
            return check_int("value", value, minimum, maximum)
        except ValueError:
            lo = "" if minimum is None else f">= {minimum}"
            hi = f"<= {maximum}"
            raise argparse.ArgumentTypeError(f"must be {lo + ' and ' if lo else ''}{hi}, got {value}"
                                             if value > maximum else f"must be {lo}, got {value}") from None
    parse.__name__ = "integer"
    return parse


def int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum` (and within int64)."""
    return integer(minimum)


seed = integer(0)       # torch.manual_seed takes up to 2**64 - 1; int64 keeps it portable


def temperature(text: str) -> float:
    """An argparse type: a finite number >= 0 (NaN and inf refused)."""
    try:
        return check_temperature("value", text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 = greedy), got {text!r}") from None


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (0, negative, NaN and inf refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in 0..1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in 0..1, got {text!r}")
    return value


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_size(text: str) -> int:
    """An argparse type: bytes, with an optional binary unit: `4096`, `512M`, `2GiB`, `1.5g`."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 512M or 2GiB, got {text!r}")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 1 or n > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be 1 byte to 8 EiB, got {text!r}")
    return n


def listed(item, what: str):
    """An argparse type: comma-separated values, each parsed (and checked) by `item`; no empty
    entries, no repeats. `--batches 1,8,64` -> (1, 8, 64)."""
    def parse(text: str) -> tuple:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. 1,8; got {text!r}")
        values = []
        for p in parts:
            try:
                values.append(item(p))
            except argparse.ArgumentTypeError as err:
                raise argparse.ArgumentTypeError(f"{p!r} in {text!r}: {err}") from None
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"a value is repeated in {text!r}; list each once")
        return tuple(values)
    parse.__name__ = f"list of {what}"
    return parse


def one_of(choices):
    """An argparse type (for lists: `listed(one_of(...), ...)`): one of `choices`."""
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}; got {text!r}")
        return text
    parse.__name__ = "choice"
    return parse


def number_in(lo: float, hi: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo:g}..{hi:g}, got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def device(text: str) -> str:
    """An argparse type: `cpu`, `cuda` or `cuda:N` (whether it exists here is checked once torch is
    imported; `meta` and other torch device types hold no data the lab can compute with)."""
    if not _DEVICE.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"the lab runs on cpu, cuda or cuda:N; got {text!r}")
    return text.strip()


def tree(text: str) -> str:
    """An argparse type: a draft tree (`LabConfig.tree`): "topk=4,depth=5,nodes=32", "paths=0|1|0.0",
    or "chain" / "" for chains; returned in its canonical spelling ("" for chains)."""
    from nwor_lab.config import parse_tree
    try:
        shape = parse_tree("--tree", text)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return "" if shape is None else shape.spelling


def prompt(text: str) -> str:
    """An argparse type: prompt text, valid UTF-8 (a byte that is not arrives as a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raw = text.encode("utf-8", "surrogateescape")[err.start:err.start + 1]
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text (byte {raw.hex() or '?'} at character "
                                         f"{err.start}); pass the prompt as UTF-8") from None
    return text


def output_file(text: str) -> str:
    """An argparse type: a file to write: not a folder, in an existing folder we can write (the
    path is returned as given)."""
    p = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("expected a file path, got ''")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder; give a file path, e.g. {p / 'out.json'}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} does not exist; create it "
                                         f"(mkdir -p {folder}) or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text}: not writable (read-only file system or permissions); "
                                         f"choose a path you can write")
    return text


def output_file_or_stdout(text: str):
    """An argparse type: `-` (stdout, returned as the str '-') or an `output_file`."""
    return text if text == "-" else output_file(text)


def output_folder(text: str) -> str:
    """An argparse type: a folder to write into (created if missing): not a file, writable (the
    path is returned as given)."""
    p = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("expected a folder, got ''")
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a file; give a folder (created if missing)")
    existing = next((q for q in [p, *p.parents] if q.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {existing} is not a writable folder (read-only file system "
                                         f"or permissions); choose a folder you can write")
    return text


def existing_folder(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return text


def existing_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text
