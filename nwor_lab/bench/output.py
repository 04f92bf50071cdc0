"""How a bench hands its result over: the JSON text, and the same text in a file when asked."""
from __future__ import annotations

import json

from nwor_lab import atomic


def save_json(result, path=None, *, indent: int = 1) -> str:
    """`result` as the benches print it (JSON, `indent`); also written to `path` when given, atomically
    (a run cut short leaves the last complete file, never half of one). -> the text."""
    text = json.dumps(result, indent=indent)
    if path:
        atomic.write_text(path, text + "\n")
    return text
