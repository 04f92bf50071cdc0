"""Exercise (j): the CoW restore plan — which slots the commit restores, masked in data, and the
bytes `cow` logs and restores (chapter 06).

Write `cow_restore_plan(draft_slots, draft_mask, num_layers, bytes_per_token_layer)
-> (restore_slots, bytes_logged, bytes_restored)`; the spec is the docstring of
`nwor_lab.exercises.solutions.cow_restore_plan`. Check it with `exercises.check_cow_restore_plan(your_fn)`.

Cases: no drafts, every draft accepted, none accepted, padding drafts (slot -1: never logged, never
restored), a rejected padding draft, mixed windows of several requests.
"""
from __future__ import annotations

import numbers

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import STATE_COLOURS, TOKEN_COLOURS

CATEGORIES = [("accepted draft", TOKEN_COLOURS["kept"]), ("rejected draft", TOKEN_COLOURS["rejected"]),
              ("padding draft (slot -1)", "#ffffff"), ("restored into this slot", STATE_COLOURS[SlotState.RESTORED]),
              ("-1: nothing restored", "#f4f4f4")]


def _case(slots, mask, num_layers=4, bpt=512, note="random") -> Case:
    return Case(dict(draft_slots=torch.tensor(slots, dtype=torch.int64), draft_mask=torch.tensor(mask, dtype=torch.bool),
                     num_layers=num_layers, bytes_per_token_layer=bpt), note)


def cases(seed: int, n: int):
    fixed = [
        _case([], [], note="edge: no drafts"),
        _case([4, 5, 6], [True, True, True], note="edge: every draft accepted: nothing to restore"),
        _case([4, 5, 6], [False, False, False], note="edge: no draft accepted"),
        _case([9, -1, -1], [True, False, False], note="edge: padding drafts are neither logged nor restored"),
        _case([3, 7, -1, 12, 13], [True, False, False, False, True], 32, 4096, note="edge: a mixed window, 32 layers"),
        _case([20, 21, 22, 40, 41], [True, True, False, False, False], 1, 2, note="edge: two requests, one layer"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    slots, mask = [], []
    free = d.perm(64).tolist()
    for _ in range(d.int(0, size + 1)):
        k = d.int(1, 4)
        a = d.int(0, k)
        for j in range(k):
            slots.append(-1 if d.chance(0.15) else free.pop())
            mask.append(j < a and slots[-1] >= 0)
    return _case(slots, mask, d.choice((1, 2, 4, 32)), d.choice((2, 64, 512, 4096)))


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"expected a triple (restore_slots, bytes_logged, bytes_restored), got {type(got).__name__}"
    diff = first_difference(expected[0], got[0], "restore_slots", "draft")
    if diff:
        return diff
    for name, e, g in (("bytes_logged", expected[1], got[1]), ("bytes_restored", expected[2], got[2])):
        if not _is_int(g):
            return f"{name}: expected an int, got {type(g).__name__} {g!r} (return a Python int, e.g. int(x))"
        if g != e:
            return f"{name}: expected {e:,d}, got {g:,d}"
    return None


def draw(case, expected, got):
    slots, mask = case.inputs["draft_slots"].tolist(), case.inputs["draft_mask"].tolist()
    fate = [2 if s < 0 else (0 if m else 1) for s, m in zip(slots, mask)]
    exp = expected[0].tolist()
    try:
        mine = torch.as_tensor(got[0]).long().tolist()
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        mine = []
    z = [fate, [3 if s >= 0 else 4 for s in exp]]
    text = [[str(s) for s in slots], [str(s) for s in exp]]
    rows = ["draft slot (fate)", "expected restore_slots"]
    high = []
    if mine:
        z.append([3 if s >= 0 else 4 for s in mine])
        text.append([str(s) for s in mine])
        rows.append("your restore_slots")
        high = [(2, j) for j in range(min(len(mine), len(exp))) if mine[j] != exp[j]]
        high += [(2, j) for j in range(len(exp), len(mine))]
    if not slots:
        z, text, rows = [[None]], [["(no drafts)"]], ["-"]
    i = case.inputs
    try:
        yours = f"yours: logged {got[1]:,}, restored {got[2]:,}"
    except Exception:  # noqa: BLE001
        yours = "yours: (unreadable)"
    return labelled_grids([dict(z=z, text=text, rows=rows, cols=[f"d{j}" for j in range(max(1, len(slots)))],
                                highlight=high)], categories=CATEGORIES, x_title="draft (request-major)",
                          title="cow_restore_plan: what the commit restores, masked in data",
                          subtitle=f"{case.note}; {i['num_layers']} layers x {i['bytes_per_token_layer']} B per token "
                                   f"and layer; expected: logged {expected[1]:,} B, restored {expected[2]:,} B; {yours}",
                          cell_px=44)


PREDICT = Prediction(
    question="4 drafts at slots [12, 13, -1, 14], accepted [True, False, False, False], a cache of 32 layers "
             "with 4096 B of K + V per token and layer. How many bytes does `cow` restore at commit?",
    inputs=lambda: _case([12, 13, -1, 14], [True, False, False, False], 32, 4096).inputs,
    answer=lambda out: out[2],
    explain=lambda b: (f"{b:,}: two real rejected drafts (slots 13 and 14) x 32 layers x 4096 B. The padding "
                       f"draft was never written, so there is nothing to put back; the log held 3 rows per layer."))

HINTS = (
    "restore_slots has one entry per draft (shape [Dtot], int64): start from draft_slots and overwrite with "
    "-1 where the draft was accepted — `torch.where(draft_mask, -1, draft_slots)`; padding stays -1.",
    "Count rows, then multiply: logged = non-padding drafts, restored = entries of restore_slots that are "
    "not -1, each times num_layers * bytes_per_token_layer. Return Python ints (int(t.sum())).",
)

EXERCISE = Exercise("cow_restore_plan", cases, compare, draw, hints=HINTS, predict=PREDICT)
