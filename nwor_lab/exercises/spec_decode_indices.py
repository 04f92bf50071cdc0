"""Exercise (g): the indices of `SpecDecodeMetadata` — which window positions get logits, and which
of those rows verify drafts or sample the bonus token (chapter 03).

Write `spec_decode_indices(num_draft_tokens, cu_num_scheduled_tokens) -> (logits_indices,
target_logits_indices, bonus_logits_indices)`; the spec is the docstring of
`nwor_lab.exercises.solutions.spec_decode_indices`. Check it with `exercises.check_spec_decode_indices(your_fn)`.

Cases: no requests, plain decodes only, a long prefill without drafts, vLLM's own docstring
example, requests with more scheduled tokens than drafts + 1.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import TOKEN_COLOURS

CATEGORIES = [("verifies a draft (target_logits_indices)", TOKEN_COLOURS["pending"]),
              ("samples the bonus (bonus_logits_indices)", TOKEN_COLOURS["kept"]),
              ("in neither / both", TOKEN_COLOURS["rejected"])]
NAMES = ("logits_indices", "target_logits_indices", "bonus_logits_indices")


def _case(drafts, scheduled, note="random") -> Case:
    cu = torch.tensor(scheduled, dtype=torch.int64).cumsum(0).to(torch.int32) if scheduled else \
        torch.zeros(0, dtype=torch.int32)
    return Case(dict(num_draft_tokens=torch.tensor(drafts, dtype=torch.int32), cu_num_scheduled_tokens=cu), note,
                dict(scheduled=list(scheduled)))


def cases(seed: int, n: int):
    fixed = [
        _case([], [], "edge: no requests"),
        _case([0, 0], [1, 1], "edge: two plain decodes (no drafts)"),
        _case([3], [4], "edge: one speculative request, t_last + 3 drafts"),
        _case([0], [100], "edge: a prefill chunk of 100 tokens: only its last position gets logits"),
        _case([3, 0, 2, 0, 1], [4, 100, 3, 100, 2], "edge: vLLM's docstring example"),
        _case([2, 2], [6, 3], "edge: a request schedules more than drafts + 1 tokens"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    drafts, scheduled = [], []
    for _ in range(d.int(1, size + 1)):
        k = d.int(0, 4)
        drafts.append(k)
        scheduled.append(k + 1 + (d.int(0, 8) if d.chance(0.3) else 0))
    return _case(drafts, scheduled)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"expected a triple {NAMES}, got {type(got).__name__}"
    for name, e, g in zip(NAMES, expected, got):
        diff = first_difference(e, g, name, "entry")
        if diff:
            return diff
    return None


def _panel(case, answer, title, wrong=()):
    """One row per request; its cells are its logits rows, labelled with the window position."""
    n = case.inputs["num_draft_tokens"].tolist()
    logits, target, bonus = (a.tolist() for a in answer)
    total = sum(k + 1 for k in n)
    z, text, high = [], [], []
    row = 0
    for r, k in enumerate(n):
        zr, tr = [None] * total, [""] * total
        for i in range(row, row + k + 1):
            if i >= len(logits):
                break
            t, b = i in target, i in bonus
            zr[i] = 0 if t and not b else 1 if b and not t else 2
            tr[i] = f"pos {logits[i]}"
            if i in wrong:
                high.append((r, i))
        z.append(zr)
        text.append(tr)
        row += k + 1
    return dict(z=z or [[None]], text=text or [[""]], rows=[f"req {r} · n={k}" for r, k in enumerate(n)] or ["-"],
                cols=[f"row {i}" for i in range(max(total, 1))], title=title, highlight=high)


def draw(case, expected, got):
    panels = [_panel(case, expected, "expected")]
    try:
        g = [torch.as_tensor(x).long() for x in got]
        e = [x.long() for x in expected]
        if all(a.shape == b.shape for a, b in zip(g, e)):
            wrong = set((g[0] != e[0]).nonzero().flatten().tolist())
            wrong |= {int(i) for i in set(e[1].tolist()) ^ set(g[1].tolist())}
            wrong |= {int(i) for i in set(e[2].tolist()) ^ set(g[2].tolist())}
            panels = [_panel(case, expected, "expected", wrong), _panel(case, g, "your spec_decode_indices", wrong)]
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    cu = case.inputs["cu_num_scheduled_tokens"].tolist()
    return labelled_grids(panels, categories=CATEGORIES, stacked=True, x_title="row of logits = hidden[logits_indices]",
                          title="spec_decode_indices: which positions get logits, and what each row does",
                          subtitle=f"{case.note}; drafts per request {case.inputs['num_draft_tokens'].tolist()}, "
                                   f"cu_num_scheduled_tokens {cu}; a cell = one logits row, 'pos p' = the window "
                                   f"position it reads", cell_px=58)


PREDICT = Prediction(
    question="vLLM's docstring example: num_draft_tokens = [3, 0, 2, 0, 1], cu_num_scheduled_tokens = "
             "[4, 104, 107, 207, 209]. What is bonus_logits_indices?",
    inputs=lambda: _case([3, 0, 2, 0, 1], [4, 100, 3, 100, 2]).inputs,
    answer=lambda out: out[2].tolist(),
    explain=lambda b: (f"{b}: these are rows of the 11 logits rows, not window positions — each request's "
                       f"last row, after its n_r draft rows (3, then 3 + 0 + 1, ...)."))

HINTS = (
    "Go request by request. Request r's last n_r + 1 window positions are cu[r] - n_r - 1 .. cu[r] - 1 "
    "(its drafts are the last n_r tokens it schedules, t_last the one before): they are appended to "
    "logits_indices.",
    "target and bonus index the logits rows, not the window: keep a running row counter; request r's "
    "target rows are row .. row + n_r - 1, its bonus row is row + n_r, then row += n_r + 1. "
    "All three results are int32 tensors.",
)

EXERCISE = Exercise("spec_decode_indices", cases, compare, draw, hints=HINTS, predict=PREDICT)
