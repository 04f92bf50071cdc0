"""What the exercise tests share: the report of a checker that caught a planted mistake."""
from __future__ import annotations

import plotly.graph_objects as go

from nwor_lab import exercises


def failed(result, name: str, note_part: str = "", *words: str):
    """`result` is exercise `name`'s FAIL on a case whose note holds `note_part`, with expected and got
    in the report, each of `words` in it too, and a picture that serialises; -> `result`."""
    assert not result and result.exercise == name and result.status == "fail"
    assert result.message.startswith(f"FAIL {name}: case ") and note_part in result.message, result.message
    assert "expected:" in result.message and "got:" in result.message
    assert all(w in result.message for w in words), result.message
    assert isinstance(result.figure, go.Figure)
    result.figure.to_json()
    return result


def caught(name: str, fn, note_part: str = "", *words: str):
    """Exercise `name`'s checker run on `fn` (no picture shown) must fail as `failed` says."""
    return failed(exercises.check(name, fn, show=False), name, note_part, *words)
