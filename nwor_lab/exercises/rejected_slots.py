"""Exercise (l): which slots hold rejected K/V after an `off` window (chapter 00).

Write `rejected_slots(slots, token_req, token_draft_pos, accepted_len) -> [N] int64`; the spec is the
docstring of `nwor_lab.exercises.solutions.rejected_slots`. Check it with `exercises.check_rejected_slots(fn)`.

Cases: no drafts at all (prefills and decodes), every draft accepted, none accepted, a padding token
(slot -1), the accepted length's own draft (kept: `>` not `>=`), random mixed windows.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing, random_accepted, window_counts
from nwor_lab.exercises.check import Case, Exercise, Prediction, as_tensor, tensor_problem
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import TOKEN_COLOURS

CATEGORIES = [("kept (committed)", TOKEN_COLOURS["kept"]), ("rejected K/V left in the cache", TOKEN_COLOURS["rejected"]),
              ("padding (slot -1, writes nothing)", "#ffffff")]


def _case(sched, drafts, accepted, slots, note="random") -> Case:
    token_req = torch.tensor([r for r, n in enumerate(sched) for _ in range(n)], dtype=torch.int64)
    pos = []
    for n, d in zip(sched, drafts):
        pos += [0] * (n - d) + list(range(1, d + 1))
    return Case(dict(slots=torch.as_tensor(slots, dtype=torch.int64), token_req=token_req,
                     token_draft_pos=torch.tensor(pos, dtype=torch.int64),
                     accepted_len=torch.as_tensor(accepted, dtype=torch.int64)), note)


def cases(seed: int, n: int):
    fixed = [
        _case([3, 1], [0, 0], [0, 0], [10, 11, 12, 40], "edge: a prefill and a decode, no drafts"),
        _case([4], [3], [3], [0, 1, 2, 3], "edge: every draft accepted"),
        _case([4], [3], [0], [0, 1, 2, 3], "edge: no draft accepted"),
        _case([4], [3], [1], [8, 9, 10, 11], "edge: d1 accepted (kept: rejected means j > a, not j >= a)"),
        _case([3, 2], [2, 1], [0, 0], [5, 6, -1, 20, 21], "edge: a rejected draft on a padding slot wrote nothing"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    reqs = growing(i, count, 1, 5)
    sched, drafts = window_counts(d, reqs, 4)
    accepted = random_accepted(d, drafts, d.choice(("random", "random", "all", "none")))
    total = sum(sched)
    slots = d.perm(4 * total + 8)[:total].long().tolist()
    slots = [-1 if d.chance(0.1) else s for s in slots]
    return _case(sched, drafts, accepted, slots)


def compare(expected, got, case) -> str | None:
    problem = tensor_problem(expected, got, "rejected slots")
    if problem and not (isinstance(got, torch.Tensor) and got.dtype == expected.dtype and got.dim() == 1):
        return problem                       # a wrong dtype or rank; a wrong length is told by its slots below
    if not torch.equal(expected, got):
        missing = sorted(set(expected.tolist()) - set(got.tolist()))
        extra = sorted(set(got.tolist()) - set(expected.tolist()))
        if missing or extra:
            return f"rejected slots: missing {missing}, not rejected but listed {extra}"
        return f"rejected slots: same slots, other order: expected {expected.tolist()} (window order)"
    return None


def draw(case, expected, got):
    slots = case.inputs["slots"].tolist()
    want = set(expected.tolist())
    try:
        yours = set(as_tensor(got).reshape(-1).tolist())
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        yours = set()

    def row(chosen):
        return [2 if s < 0 else 1 if s in chosen else 0 for s in slots]
    exp_row, your_row = row(want), row(yours)
    labels = [[("—" if s < 0 else str(s)) for s in slots]]
    reqs, pos = case.inputs["token_req"].tolist(), case.inputs["token_draft_pos"].tolist()
    cols = [f"r{r} {'t' if j == 0 else f'd{j}'}" for r, j in zip(reqs, pos)]
    differ = [(0, c) for c, (a, b) in enumerate(zip(exp_row, your_row)) if a != b]
    return labelled_grids([dict(z=[exp_row], text=labels, rows=["expected"], cols=cols, title="expected"),
                           dict(z=[your_row], text=labels, rows=["yours"], cols=cols, title="yours",
                                highlight=differ)],
                          categories=CATEGORIES, stacked=True, title="rejected_slots: what `off` leaves in the cache",
                          subtitle=f"{case.note}; accepted lengths {case.inputs['accepted_len'].tolist()}; "
                                   f"cells: the token's slot, outlined where yours differs")


PREDICT = Prediction(
    question="One request, t_last at slot 8 and drafts d1 d2 d3 at slots 9, 10, 11; the sampler accepted 1 draft. "
             "Which slots hold rejected K/V after the window under `off`? (a list of slots)",
    inputs=lambda: _case([4], [3], [1], [8, 9, 10, 11]).inputs,
    answer=lambda out: out.tolist(),
    explain=lambda s: (f"{s}: d1 (slot 9) was accepted and is kept with t_last; d2 and d3 were rejected, and "
                       f"`off` wrote their K/V anyway. `cow` would restore those slots, `stage` never writes them."))

HINTS = (
    "A token's draft position j is 0 for t_last, prefill and decode tokens: those are always kept. Draft d_j "
    "is rejected when j is larger than its request's accepted length.",
    "Walk the window in order; keep slot s when s >= 0 and token_draft_pos[t] > accepted_len[token_req[t]]. "
    "Return torch.tensor(list, dtype=torch.int64) (an empty list gives shape [0]).",
)

EXERCISE = Exercise("rejected_slots", cases, compare, draw, hints=HINTS, predict=PREDICT)
