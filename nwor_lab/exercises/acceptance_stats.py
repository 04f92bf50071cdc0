"""Exercise (k): acceptance statistics — the mean acceptance length and the acceptance rate by
draft position, counting only what was emitted (chapter 08).

Write `acceptance_stats(drafted, accepted, emitted, k) -> (mean_acceptance_length, by_position)`;
the spec is the docstring of `nwor_lab.exercises.solutions.acceptance_stats`. Check it with
`exercises.check_acceptance_stats(your_fn)`.

Cases: no pairs, only prefills / decodes (no drafts), every draft accepted, none accepted, a last
window cut short by max_new_tokens (accepted + 1 would count tokens nobody received), k above the
drafts of every window, random runs.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, float_difference, tensor_problem
from nwor_lab.viz.theme import HIGHLIGHT, LEGEND_PX, STATE_COLOURS, SlotState, base_layout

TOLERANCE = 1e-9


def _case(pairs, k, note="random") -> Case:
    """pairs: (drafted, accepted, emitted) per (request, verify window)."""
    cols = list(zip(*pairs)) if pairs else ([], [], [])
    t = [torch.tensor(c, dtype=torch.int64) for c in cols]
    return Case(dict(drafted=t[0], accepted=t[1], emitted=t[2], k=k), note)


def cases(seed: int, n: int):
    fixed = [
        _case([], 4, "edge: no windows at all"),
        _case([(0, 0, 1), (0, 0, 1)], 4, "edge: only prefills and decodes (no drafts)"),
        _case([(4, 4, 5), (4, 4, 5)], 4, "edge: every draft accepted"),
        _case([(4, 0, 1), (4, 0, 1)], 4, "edge: no draft accepted"),
        _case([(4, 4, 5), (4, 1, 2), (4, 4, 2)], 4, "edge: the last window cut: 4 accepted, 2 emitted"),
        _case([(2, 1, 2), (0, 0, 3), (2, 2, 3)], 4, "edge: k above every window's drafts, a prefill between"),
        _case([(4, 3, 2)], 4, "edge: cut inside the accepted drafts: only d1, d2 count"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count, 1, 12)
    k = d.int(1, 5)
    pairs = []
    for _ in range(d.int(0, size)):
        if d.chance(0.15):
            pairs.append((0, 0, d.int(1, 4)))
            continue
        m = d.int(1, k)
        a = d.int(0, m)
        e = a + 1 if not d.chance(0.15) else d.int(1, a + 1)      # a window cut short at its end
        pairs.append((m, a, e))
    return _case(pairs, k)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (mean_acceptance_length, by_position), got {type(got).__name__}"
    mean, rates = got
    problem = (float_difference(expected[0], mean, "mean_acceptance_length", TOLERANCE)
               or tensor_problem(expected[1], rates, "by_position"))
    if problem:
        return problem
    close = torch.isclose(rates, expected[1], rtol=TOLERANCE, atol=TOLERANCE)
    if not bool(close.all()):
        j = int((~close).nonzero()[0])
        return (f"by_position: first difference at d{j + 1}: expected {float(expected[1][j]):.6g}, "
                f"got {float(rates[j]):.6g}")
    return None


def draw(case, expected, got):
    k = case.inputs["k"]
    names = [f"d{j + 1}" for j in range(k)]
    fig = go.Figure()
    fig.add_bar(x=names, y=expected[1].tolist(), name=f"expected (mean length {expected[0]:.3g})",
                marker_color=STATE_COLOURS[SlotState.COMMITTED])
    try:
        rates = torch.as_tensor(got[1]).double().reshape(-1).tolist()
        mean = float(got[0])
        fig.add_bar(x=names[:len(rates)], y=rates[:k], name=f"yours (mean length {mean:.3g})",
                    marker_color=STATE_COLOURS[SlotState.STAGED],
                    marker_line=dict(color=[HIGHLIGHT if j < len(expected[1]) and abs(r - float(expected[1][j])) > TOLERANCE
                                            else "#999999" for j, r in enumerate(rates[:k])], width=3))
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    i = case.inputs
    pairs = list(zip(i["drafted"].tolist(), i["accepted"].tolist(), i["emitted"].tolist()))
    shown = ", ".join(f"{n}/{a}/{e}" for n, a, e in pairs[:10]) + (" ..." if len(pairs) > 10 else "")
    fig.update_layout(**base_layout("acceptance_stats: acceptance rate by draft position",
                                    f"{case.note}; (drafted/accepted/emitted) per request and window: "
                                    f"{shown or 'none'}"),
                      barmode="group", height=380 + LEGEND_PX, width=760)
    fig.update_yaxes(title_text="accepted / counted", range=[0, 1.05])
    fig.update_xaxes(title_text="draft position")
    return fig


PREDICT = Prediction(
    question="k = 4, three verify windows of one request: 4 of 4 drafts accepted (5 tokens emitted), 1 of 4 "
             "(2 emitted), and a last window where 4 were accepted but only 2 emitted (max_new_tokens reached). "
             "What is the mean acceptance length?",
    inputs=lambda: _case([(4, 4, 5), (4, 1, 2), (4, 4, 2)], 4).inputs,
    answer=lambda out: round(out[0], 3),
    explain=lambda m: (f"{m}: (5 + 2 + 2) / 3 — what the request received per target forward. Counting "
                       f"accepted + 1 would say (5 + 2 + 5) / 3 = 4.0, tokens nobody received."))

HINTS = (
    "Keep only the pairs with drafted > 0. The mean is the mean of their `emitted` (1.0 when there is none) "
    "— a Python float.",
    "For the rates, each pair counts positions 1 .. drafted and accepts 1 .. accepted — unless it was cut "
    "(emitted <= accepted): then it counts and accepts 1 .. emitted only. Sum per position (up to k), divide "
    "where the count is > 0 (else 0.0), return a float64 tensor of shape [k].",
)

EXERCISE = Exercise("acceptance_stats", cases, compare, draw, hints=HINTS, predict=PREDICT)
