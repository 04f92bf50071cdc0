"""Exercise (m): the share of `off`'s K/V rows that `stage` writes, from a trace (chapter 01).

Write `write_share(scheduled, drafted, accepted) -> float`; the spec is the docstring of
`nwor_lab.exercises.solutions.write_share`. Check it with `exercises.check_write_share(fn)`.

Cases: an empty trace, no drafts, every draft accepted, none accepted (1 / (1 + k)), prefill rows
riding in the windows, the fork's way of counting (drafts only) as a trap, random traces.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, float_difference
from nwor_lab.viz.theme import LEGEND_PX, STATE_COLOURS, SlotState, base_layout

TOLERANCE = 1e-12


def _case(pairs, note="random") -> Case:
    """pairs: (scheduled, drafted, accepted) per (request, verify window)."""
    cols = list(zip(*pairs)) if pairs else ([], [], [])
    t = [torch.tensor(c, dtype=torch.int64) for c in cols]
    return Case(dict(scheduled=t[0], drafted=t[1], accepted=t[2]), note)


def cases(seed: int, n: int):
    fixed = [
        _case([], "edge: an empty trace"),
        _case([(7, 0, 0), (1, 0, 0)], "edge: a prefill and a decode, no drafts"),
        _case([(5, 4, 4)] * 3, "edge: every draft accepted"),
        _case([(5, 4, 0)] * 3, "edge: no draft accepted: 1 / (1 + k)"),
        _case([(5, 4, 1), (12, 0, 0)], "edge: a prefill rides in the window (its rows are kept by both)"),
        _case([(5, 4, 1)] * 8, "edge: t_last counts: (1 + a) / (1 + k), not a / k"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count, 1, 16)
    pairs = []
    for _ in range(d.int(1, size)):
        kind = d.choice(("spec", "spec", "spec", "prefill", "decode"))
        if kind == "spec":
            k = d.int(1, 6)
            pairs.append((1 + k, k, d.int(0, k)))
        else:
            pairs.append((d.int(2, 20) if kind == "prefill" else 1, 0, 0))
    return _case(pairs)


def compare(expected, got, case) -> str | None:
    return float_difference(expected, got, "share", TOLERANCE)


def draw(case, expected, got):
    i = case.inputs
    off = int(i["scheduled"].sum())
    rejected = int((i["drafted"] - i["accepted"]).sum())
    fig = go.Figure()
    fig.add_bar(x=["off writes", "stage writes (expected)"], y=[off, off - rejected],
                marker_color=STATE_COLOURS[SlotState.COMMITTED], name="rows", text=[off, off - rejected],
                textposition="outside")
    try:
        fig.add_bar(x=["stage writes (yours)"], y=[float(got) * off], marker_color=STATE_COLOURS[SlotState.REJECTED],
                    name="yours: share × off's rows", text=[f"{float(got) * off:.4g}"], textposition="outside")
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    fig.update_layout(**base_layout("write_share: K/V rows written over the trace",
                                    f"{case.note}; {len(i['scheduled'])} (request, window) pairs, {rejected} "
                                    f"rejected drafts; expected share {expected:.4g}"),
                      height=380 + LEGEND_PX, width=720, showlegend=False)
    fig.update_yaxes(title_text="K/V rows (per layer)")
    return fig


PREDICT = Prediction(
    question="k = 4, one request, eight verify windows, exactly one draft accepted in each. What share of "
             "`off`'s K/V rows does `stage` write? (a number, 3 decimals)",
    inputs=lambda: _case([(5, 4, 1)] * 8).inputs,
    answer=lambda out: round(out, 3),
    explain=lambda s: (f"{s}: every window writes t_last and d1 under stage, t_last and four drafts under off: "
                       f"(1 + 1) / (1 + 4). Counting drafts only (the fork's way) would say 1 / 4 written, "
                       f"\"75 % saved\"."))

HINTS = (
    "`off` writes every scheduled row. `stage` writes every row except the rejected drafts: drafted − accepted "
    "per pair.",
    "Sum scheduled over the pairs (off), subtract the sum of drafted − accepted (stage), divide; return 1.0 for "
    "an empty trace, and a Python float.",
)

EXERCISE = Exercise("write_share", cases, compare, draw, hints=HINTS, predict=PREDICT)
