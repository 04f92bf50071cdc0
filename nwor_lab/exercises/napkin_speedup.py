"""Exercise (n): EAGLE's napkin speedup from measured components (chapter 11).

Write `napkin_speedup(decode_ms, verify_ms, head_pass_ms, k, profile) -> (L, speedup)`; the spec is the
docstring of `nwor_lab.exercises.solutions.napkin_speedup`. Check it with `exercises.check_napkin_speedup(fn)`.

Cases: nothing ever accepted (L = 1: EAGLE is slower), everything accepted (L = k + 1), k = 1, the H100
anchor of `nwor_lab.bench.engine8b` with the shipped pair's profile, random components and profiles.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from nwor_lab.bench.engine8b import H100_ANCHOR
from nwor_lab.exercises.cases import Dice, edge_then_random
from nwor_lab.exercises.check import Case, Exercise, Prediction, float_difference
from nwor_lab.speculative.synthetic import SHIPPED_PROFILE
from nwor_lab.viz.theme import LEGEND_PX, STATE_COLOURS, SlotState, base_layout

TOLERANCE = 1e-9
ANCHOR = {"decode_ms": H100_ANCHOR["decode_ms"], "verify_ms": H100_ANCHOR["verify_k4_ms"],
          "head_pass_ms": H100_ANCHOR["eagle1_pass_ms"]}           # EAGLE-1, k = 4
SHIPPED_K4 = SHIPPED_PROFILE[:4]                                   # P(d_1..d_j accepted), the shipped pair


def _case(decode, verify, head, profile, note="random") -> Case:
    return Case(dict(decode_ms=float(decode), verify_ms=float(verify), head_pass_ms=float(head), k=len(profile),
                     profile=torch.tensor(profile, dtype=torch.float64)), note)


def cases(seed: int, n: int):
    fixed = [
        _case(5.8, 5.85, 0.55, [0.0] * 4, "edge: nothing accepted: L = 1, EAGLE slower than target-only"),
        _case(5.8, 5.85, 0.55, [1.0] * 4, "edge: everything accepted: L = k + 1"),
        _case(10.0, 10.5, 1.0, [0.5], "edge: k = 1"),
        _case(ANCHOR["decode_ms"], ANCHOR["verify_ms"], ANCHOR["head_pass_ms"], SHIPPED_K4,
              "edge: the H100 anchor, EAGLE-1, the shipped pair's profile"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    k = d.int(1, 8)
    p, profile = 1.0, []
    for _ in range(k):
        p *= d.int(0, 100) / 100
        profile.append(round(p, 4))
    decode = d.int(50, 3000) / 100
    return _case(decode, decode * d.int(100, 180) / 100, decode * d.int(2, 25) / 100, profile)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (L, speedup), got {type(got).__name__}"
    return (float_difference(expected[0], got[0], "L", TOLERANCE)
            or float_difference(expected[1], got[1], "speedup", TOLERANCE))


def draw(case, expected, got):
    i = case.inputs
    k, length = i["k"], expected[0]
    step = i["verify_ms"] + k * i["head_pass_ms"]
    fig = go.Figure()
    fig.add_bar(y=["target-only, L tokens"], x=[length * i["decode_ms"]], orientation="h", name="L decode steps",
                marker_color=STATE_COLOURS[SlotState.COMMITTED])
    fig.add_bar(y=["one EAGLE step"], x=[i["verify_ms"]], orientation="h", name=f"verify of 1 + {k} tokens",
                marker_color=STATE_COLOURS[SlotState.WRITTEN])
    fig.add_bar(y=["one EAGLE step"], x=[k * i["head_pass_ms"]], orientation="h", name=f"{k} head passes",
                marker_color=STATE_COLOURS[SlotState.STAGED])
    try:
        yours = f"yours: L {float(got[0]):.4g}, speedup {float(got[1]):.4g}"
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        yours = "yours: unreadable"
    fig.update_layout(**base_layout("napkin_speedup: L tokens of target-only against one EAGLE step",
                                    f"{case.note}; expected L {length:.4g}, speedup {expected[1]:.4g} "
                                    f"({length * i['decode_ms']:.3g} ms / {step:.3g} ms); {yours}"),
                      barmode="stack", height=300 + LEGEND_PX, width=760)
    fig.update_xaxes(title_text="ms")
    return fig


PREDICT = Prediction(
    question=(f"The H100 anchor: decode {ANCHOR['decode_ms']} ms, a 5-token verify {ANCHOR['verify_ms']} ms, an "
              f"EAGLE-1 head pass {ANCHOR['head_pass_ms']} ms, k = 4, and the shipped pair's profile P(d1..dj "
              f"accepted) = {', '.join(map(str, SHIPPED_K4))}. What speedup does the napkin give? (2 decimals)"),
    inputs=lambda: _case(ANCHOR["decode_ms"], ANCHOR["verify_ms"], ANCHOR["head_pass_ms"], SHIPPED_K4).inputs,
    answer=lambda out: round(out[1], 2),
    explain=lambda s: (f"{s}×: L = 1 + {' + '.join(map(str, SHIPPED_K4))} = {1 + sum(SHIPPED_K4):.3f} tokens per "
                       f"EAGLE step, which costs {ANCHOR['verify_ms']} + 4 × {ANCHOR['head_pass_ms']} = "
                       f"{ANCHOR['verify_ms'] + 4 * ANCHOR['head_pass_ms']:.2f} ms against {ANCHOR['decode_ms']} ms "
                       f"a token for target-only."))

HINTS = (
    "The expected tokens of one window: the target's own token (always) plus, for each j, the probability that "
    "d_j is emitted — which is exactly profile[j - 1] (it already includes all the drafts before it).",
    "L = 1 + sum(profile); an EAGLE step costs verify_ms + k × head_pass_ms and emits L tokens; target-only needs "
    "L × decode_ms for them. Return two Python floats.",
)

EXERCISE = Exercise("napkin_speedup", cases, compare, draw, hints=HINTS, predict=PREDICT)
