"""Exercise (i): the staged window's attention mask — which staging-buffer rows each query of the
window may read (chapter 05).

Write `window_attention_mask(query_lens) -> [T, T] bool`; the spec is the docstring of
`nwor_lab.exercises.solutions.window_attention_mask`. Check it with
`exercises.check_window_attention_mask(your_fn)`.

Cases: an empty window, one row, one speculative request, two requests (neither may see the
other's rows), a request with no rows between two others, a prefill beside speculative requests.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import STATE_COLOURS, SlotState

CATEGORIES = [("read from the staging buffer", STATE_COLOURS[SlotState.STAGED]), ("not read", "#f4f4f4")]


def _case(query_lens, note="random") -> Case:
    return Case(dict(query_lens=torch.tensor(query_lens, dtype=torch.int64)), note)


def cases(seed: int, n: int):
    fixed = [
        _case([], "edge: an empty window"),
        _case([1], "edge: one row (a plain decode)"),
        _case([4], "edge: one speculative request, t_last + 3 drafts"),
        _case([3, 2], "edge: two requests: neither reads the other's rows"),
        _case([2, 0, 2], "edge: a request with no rows in the window"),
        _case([5, 1, 3], "edge: a prefill chunk, a decode, a speculative request"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    return _case([d.int(0, 5) for _ in range(d.int(1, size + 1))])


def compare(expected, got, case) -> str | None:
    return first_difference(expected, got, "mask", "query row")


def _labels(query_lens) -> list[str]:
    return [f"{r}:{'t' if i == 0 else 'd' + str(i)}" for r, n in enumerate(query_lens) for i in range(n)]


def draw(case, expected, got):
    lens = case.inputs["query_lens"].tolist()
    names = _labels(lens) or ["-"]

    def panel(mask, title, high=()):
        z = [[0 if v else 1 for v in row] for row in mask.tolist()] or [[None]]
        text = [["✓" if v else "" for v in row] for row in mask.tolist()] or [[""]]
        return dict(z=z, text=text, rows=[f"query {x}" for x in names], cols=names, title=title, highlight=list(high))

    panels = [panel(expected, "expected")]
    try:
        g = torch.as_tensor(got).bool()
        if g.shape == expected.shape:
            wrong = [tuple(x) for x in (g != expected).nonzero().tolist()]
            panels = [panel(expected, "expected", wrong), panel(g, "your window_attention_mask", wrong)]
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    return labelled_grids(panels, categories=CATEGORIES, x_title="staging-buffer row (r:t = t_last, r:dj = draft j)",
                          title="window_attention_mask: which window rows each query reads",
                          subtitle=f"{case.note}; rows per request {lens}; the cached prefix is read from the "
                                   f"cache and is not part of this mask", cell_px=max(18, min(34, 520 // max(1, len(names)))))


PREDICT = Prediction(
    question="a window of two speculative requests, [t_last, d1, d2] and [t_last, d1]. How many (query, key) "
             "pairs does attention read from the staging buffer (the cached prefixes aside)?",
    inputs=lambda: dict(query_lens=torch.tensor([3, 2])),
    answer=lambda out: int(out.sum()),
    explain=lambda n: (f"{n}: 1 + 2 + 3 for the first request, 1 + 2 for the second — causal within a request, "
                       f"nothing across requests. The window's keys are the same numbers `off` would have "
                       f"written into the cache: that is why attention's output does not change."))

HINTS = (
    "Give every row its request: `req = torch.repeat_interleave(torch.arange(R), query_lens)`; rows i and j "
    "may attend iff req[i] == req[j].",
    "Causal within the request: j <= i (a query sees itself and the rows before it). Combine the two "
    "[T, T] comparisons with &; the result is bool.",
)

EXERCISE = Exercise("window_attention_mask", cases, compare, draw, hints=HINTS, predict=PREDICT)
