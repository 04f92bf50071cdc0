"""argparse value types that check a flag's value the way the API checks the parameter
(`nwor_lab.config.check_int` / `check_temperature`), so `--k -1` fails at parse time with the
flag's name. Torch-free: the command line is checked before torch is imported."""
from __future__ import annotations

import argparse
import re

from nwor_lab.config import check_int, check_temperature


def int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        try:
            return check_int("value", value, minimum)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}") from None
    parse.__name__ = f"integer >= {minimum}"
    return parse


def temperature(text: str) -> float:
    """An argparse type: a finite number >= 0 (NaN and inf refused)."""
    try:
        return check_temperature("value", text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 = greedy), got {text!r}") from None


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_size(text: str) -> int:
    """An argparse type: bytes, with an optional binary unit: `4096`, `512M`, `2GiB`, `1.5g`."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 512M or 2GiB, got {text!r}")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return n
