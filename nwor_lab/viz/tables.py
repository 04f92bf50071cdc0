"""Markdown tables for the chapters' rendered results (one writer for every chapter)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A Markdown table; cells are str()-ed (format numbers before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def spread_text(value, lo, hi, f: str, unit: str = "") -> str:
    """`2.40× [2.31–2.52]`: a median and its min–max over the repeats (`(1 run)` without them)."""
    if value is None:
        return "–"
    if lo is None or hi is None:
        return f"{format(value, f)}{unit} (1 run)"
    return f"{format(value, f)}{unit} [{format(lo, f)}–{format(hi, f)}]"


def records_table(rows: Sequence[Mapping], columns: Sequence[str] | None = None) -> str:
    """rows (dicts with the same keys) -> a Markdown table of `columns` (default: every key), the
    column names as its header."""
    cols = list(columns or rows[0])
    return markdown_table(cols, [[r[c] for c in cols] for r in rows])
