"""Exercise (c): the stage commit — which staged window rows reach the cache, and where.

Write `stage_commit_rows(token_req, token_draft_pos, accepted_len, slot_mapping) -> (rows, slots)`;
the spec is the docstring of `nwor_lab.exercises.solutions.stage_commit_rows`. Check it with
`exercises.check_stage_commit_rows(your_fn)`.

Cases: an empty window, only padding, all / none accepted, a single prefill request, an accepted
draft whose slot is -1 (kept, but nothing to write).
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing, host_window, random_accepted, unique_slots, window_counts
from nwor_lab.exercises.check import Case, Exercise, Prediction, as_tensor, first_difference
from nwor_lab.viz.cache import cache_grids
from nwor_lab.viz.states import SlotState, token_labels

NUM_BLOCKS, BLOCK_SIZE = 4, 8


def _case(sched, drafts, accepted, slots, note="random") -> Case:
    w = host_window(sched, drafts, slots)
    return Case(dict(token_req=w.token_req, token_draft_pos=w.token_draft_pos,
                     accepted_len=torch.tensor(accepted, dtype=torch.int32), slot_mapping=w.slot_mapping),
                note, dict(window=w))


def cases(seed: int, n: int):
    fixed = [
        _case([], [], [], [], "edge: empty window"),
        _case([4], [0], [0], [3, 4, 5, 6], "edge: a single prefill request (everything kept)"),
        _case([4, 3], [3, 2], [3, 2], [0, 1, 2, 3, 8, 9, 10], "edge: every draft accepted"),
        _case([4, 3], [3, 2], [0, 0], [0, 1, 2, 3, 8, 9, 10], "edge: no draft accepted"),
        _case([4], [3], [2], [0, 1, -1, 3], "edge: an accepted draft with slot -1 (padding)"),
        _case([2, 1], [1, 0], [1, 0], [-1, -1, -1], "edge: only padding"),
        _case([4, 1, 4], [3, 0, 3], [1, 0, 2], [16, 17, 18, 19, 5, 24, 25, 26, 27], "edge: mixed batch"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    sched, drafts = window_counts(d, d.int(1, size + 1), max_k=4)
    accepted = random_accepted(d, drafts, d.choice(("random", "random", "all", "none")))
    slots = unique_slots(d, sum(sched), NUM_BLOCKS * BLOCK_SIZE, pad_p=0.15)
    return _case(sched, drafts, accepted, slots)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (rows, slots), got {type(got).__name__}"
    return (first_difference(expected[0], got[0], "rows", "entry")
            or first_difference(expected[1], got[1], "slots", "entry"))


def draw(case, expected, got):
    w = case.context["window"]
    names = token_labels(w)
    slots = w.slot_mapping.tolist()
    rejected = ~w.commit_mask_from(case.inputs["accepted_len"])

    def panel(commit_slots, title, high):
        states = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.int8)
        labels, marks = {}, {}
        for t, s in enumerate(slots):
            if s >= 0:
                fate = "✗" if bool(rejected[t]) else ""
                labels[s] = names[t][1] + (" · rejected, never written" if fate else " · not written")
                marks[s] = names[t][0] + fate
        for s in commit_slots:
            if 0 <= s < states.numel():
                states[s] = SlotState.COMMITTED
                labels[s] = labels.get(s, f"slot {s}").replace(" · not written", " · committed")
        return dict(states=states, title=title, annotations=labels, cell_text=marks, highlight=high)

    exp = set(expected[1].tolist())
    try:
        mine = set(as_tensor(got[1]).long().tolist())
    except Exception:  # noqa: BLE001 - unreadable output: draw the expected side only
        mine = set()
    wrong = sorted(exp ^ mine)
    return cache_grids([panel(exp, "expected", wrong), panel(mine, "your stage_commit_rows", wrong)],
                       title="stage_commit_rows: what the stage commit writes into the cache",
                       subtitle=f"{case.note}; accepted lengths {case.inputs['accepted_len'].tolist()}; "
                                f"✗ = rejected draft", block_size=BLOCK_SIZE)


PREDICT = Prediction(
    question="one speculative request [t_last, d1, d2, d3] at slots [8, 9, 10, 11], accepted length 1, "
             "and a plain decode at slot 4. Which slots does the stage commit write?",
    inputs=lambda: _case([4, 1], [3, 0], [1, 0], [8, 9, 10, 11, 4]).inputs,
    answer=lambda out: out[1].tolist(),
    explain=lambda s: (f"{s}: t_last and the decode token always commit (token_draft_pos 0), d1 is within the "
                       f"accepted length 1; d2 and d3 never leave the staging buffer."))

HINTS = (
    "A row is kept when token_draft_pos[t] <= accepted_len[token_req[t]] (t_last, prefill and decode rows "
    "have draft position 0, so they always pass) — one gather and one compare.",
    "Drop padding rows (slot_mapping == -1) too, then `rows = torch.nonzero(keep).flatten()` (int64, "
    "ascending) and `slots = slot_mapping[rows]`.",
)

EXERCISE = Exercise("stage_commit_rows", cases, compare, draw, hints=HINTS, predict=PREDICT)
