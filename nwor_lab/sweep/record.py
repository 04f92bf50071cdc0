"""The metrics contract between a notebook and the sweep that runs it.

A chapter records what it measured in one call (or several) from a cell::

    from nwor_lab.sweep import record_metrics
    record_metrics({"step_ms": 4.31, "acceptance_length": 3.72, "nwor_mode": "stage"})

- `metrics` is a flat mapping: `str` keys, values `int`, `float`, `bool`, `str` or `None`.
  Numpy scalars and 0-d torch tensors are turned into Python numbers (`.item()`). Anything
  else (lists, dicts, multi-element tensors) raises `TypeError` naming the key: keep the
  record flat so the report can plot every number against the grid.
- Non-finite floats (NaN, inf) are recorded as `None`: JSON has no NaN.
- Units go in the key's suffix (`_s`, `_ms`, `_us`, `_bytes`, `_gb_s`, `_tok_s`, `_pct` ...);
  the report labels axes with them.
- Under a sweep, the runner sets `NWOR_LAB_METRICS_OUT` to a per-run path; each call merges
  its keys into the JSON object there (a later value for the same key wins) and replaces the
  file atomically (`nwor_lab.atomic`: a temporary file, fsync, rename), so a crash mid-write
  leaves the previous record, never half of one. The runner copies the object into the run's row of
  `results.jsonl`, failed runs included (what was recorded before the failure).
- Without `NWOR_LAB_METRICS_OUT` (interactive use) nothing is written.
- Either way the call returns the cleaned dict of this call, so a cell that ends with it
  shows what was recorded.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from nwor_lab import atomic

METRICS_ENV = "NWOR_LAB_METRICS_OUT"

_SCALARS = (bool, int, float, str, type(None))


def _clean_value(key: str, value: Any) -> Any:
    if not isinstance(value, _SCALARS) and callable(getattr(value, "item", None)):
        try:  # numpy scalars, 0-d tensors
            value = value.item()
        except (ValueError, RuntimeError) as err:
            raise TypeError(f"record_metrics: {key!r} is not a scalar ({err}); record one number per key") from None
    if not isinstance(value, _SCALARS):
        raise TypeError(f"record_metrics: {key!r} has a {type(value).__name__}; "
                        "values must be int, float, bool, str or None (flatten it into several keys)")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Validate and normalise a metrics mapping to the contract above (a new dict)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"record_metrics: expected a dict of metrics, got {type(metrics).__name__}")
    out = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"record_metrics: keys must be non-empty strings, got {key!r}")
        out[key] = _clean_value(key, value)
    return out


def read_metrics(path: str | os.PathLike) -> dict[str, Any]:
    """The metrics object recorded at `path`; `{}` when the notebook recorded nothing."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of metrics")
    return data


def record_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Record a notebook's metrics for the sweep running it; see the module docstring."""
    cleaned = clean_metrics(metrics)
    path = os.environ.get(METRICS_ENV)
    if path:
        atomic.write_json(path, {**read_metrics(path), **cleaned})
    return cleaned
