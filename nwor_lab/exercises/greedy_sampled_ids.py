"""Exercise (h): the greedy rejection sampler's output — `sampled_token_ids`, row by row
(chapter 03).

Write `greedy_sampled_ids(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len)
-> [R, max_spec_len + 1] int32`; the spec is the docstring of
`nwor_lab.exercises.solutions.greedy_sampled_ids`. Check it with `exercises.check_greedy_sampled_ids(your_fn)`.

Cases: no requests, plain decodes (the bonus only), all drafts accepted (+ bonus), the first draft
rejected, padding drafts, a draft after a rejection that "matches" (it must not be emitted),
max_spec_len above every request's drafts.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import TOKEN_COLOURS

CATEGORIES = [("accepted draft", TOKEN_COLOURS["kept"]), ("rejected draft", TOKEN_COLOURS["rejected"]),
              ("the target's argmax", "#d9e6f5"), ("the target's own token", "#f2b134"),
              ("-1 placeholder", "#f4f4f4")]


def _case(drafts, argmax_rows, max_spec_len=None, note="random") -> Case:
    """drafts: per request its draft ids; argmax_rows: per request n_r + 1 argmax ids."""
    counts = [len(d) for d in drafts]
    k = max(counts + [0]) if max_spec_len is None else max_spec_len
    return Case(dict(draft_token_ids=torch.tensor([t for d in drafts for t in d], dtype=torch.int64),
                     cu_num_draft_tokens=torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
                     if counts else torch.zeros(0, dtype=torch.int32),
                     target_argmax=torch.tensor([t for r in argmax_rows for t in r], dtype=torch.int64),
                     max_spec_len=k), note, dict(counts=counts, drafts=drafts, argmax=argmax_rows))


def cases(seed: int, n: int):
    fixed = [
        _case([], [], note="edge: no requests"),
        _case([[]], [[6]], note="edge: a plain decode: the bonus row's token only"),
        _case([[3, 3]], [[3, 3, 7]], note="edge: every draft accepted, then the bonus token"),
        _case([[4]], [[2, 0]], note="edge: the first draft rejected: the target's token of its row"),
        _case([[5, 7, 2], [4], [], [3, 3]], [[5, 7, 6, 1], [2, 0], [6], [3, 3, 7]], note="edge: chapter 03's batch"),
        _case([[5, 9, 7]], [[5, 7, 7, 1]], note="edge: d3 equals its row's argmax, but d2 was rejected"),
        _case([[5, -1, -1]], [[5, 8, 2, 1]], note="edge: padding drafts (-1) are rejected"),
        _case([[1]], [[1, 4]], max_spec_len=3, note="edge: max_spec_len above the request's drafts"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    vocab = d.int(2, 8)
    drafts, rows = [], []
    for _ in range(d.int(1, size + 1)):
        k = d.int(0, 4)
        argmax = [d.int(0, vocab - 1) for _ in range(k + 1)]
        a = d.int(0, k)
        ids = [argmax[j] if j < a else (-1 if d.chance(0.1) else d.int(0, vocab - 1)) for j in range(k)]
        drafts.append(ids)
        rows.append(argmax)
    return _case(drafts, rows, max(len(x) for x in drafts) + (d.int(0, 2) if d.chance(0.2) else 0))


def compare(expected, got, case) -> str | None:
    return first_difference(expected, got, "sampled_token_ids", "request")


def draw(case, expected, got):
    counts, drafts, argmax = case.context["counts"], case.context["drafts"], case.context["argmax"]
    cols = expected.shape[1]
    try:
        mine = torch.as_tensor(got).long()
        mine = mine if mine.shape == expected.shape else None
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        mine = None
    z, text, rows, high = [], [], [], []
    for r, k in enumerate(counts):
        e = expected[r].tolist()
        a = next((j for j in range(cols) if j >= k or e[j] != drafts[r][j]), cols)   # accepted drafts
        z.append([0 if j < a else 1 for j in range(k)] + [None] * (cols - k))
        text.append([f"d{j + 1}={drafts[r][j]}" for j in range(k)] + [""] * (cols - k))
        z.append([2] * (k + 1) + [None] * (cols - k - 1))
        text.append([str(t) for t in argmax[r]] + [""] * (cols - k - 1))
        rows += [f"req {r} drafts", f"req {r} target argmax"]
        for label, row in (("expected", e), ("yours", None if mine is None else mine[r].tolist())):
            if row is None:
                continue
            z.append([4 if t == -1 else (0 if j < a and j < k else 3) for j, t in enumerate(row)])
            text.append([str(t) for t in row])
            rows.append(f"req {r} {label}")
            if label == "yours":
                high += [(len(rows) - 1, j) for j in range(cols) if row[j] != e[j]]
    if not counts:
        z, text, rows = [[None]], [["(no requests)"]], ["-"]
    return labelled_grids([dict(z=z, text=text, rows=rows, cols=[f"column {j}" for j in range(cols)],
                                highlight=high)],
                          categories=CATEGORIES, x_title="column of sampled_token_ids (= the request's logits row)",
                          title="greedy_sampled_ids: what the greedy rejection sampler returns",
                          subtitle=f"{case.note}; per request: its drafts, the target's argmax per row (the last is "
                                   f"the bonus row), the expected row and yours", cell_px=56)


PREDICT = Prediction(
    question="drafts [5, 7, 2]; the target's argmax per row is [5, 7, 6] and 1 for the bonus row; "
             "max_spec_len 3. What row of sampled_token_ids does the greedy sampler return?",
    inputs=lambda: _case([[5, 7, 2]], [[5, 7, 6, 1]]).inputs,
    answer=lambda out: out[0].tolist(),
    explain=lambda row: (f"{row}: d1 and d2 match, d3 does not, so the row is the two accepted drafts, then "
                         f"the target's own token at d3's row (6), then -1. The bonus row is used only when "
                         f"every draft is accepted."))

HINTS = (
    "Request r's logits rows start at cu_num_draft_tokens[r - 1] + r (each earlier request had n + 1 rows). "
    "Walk its drafts: while draft j equals the argmax of its row, write it to column j.",
    "At the first mismatch (or after the last draft, using the bonus row) write the argmax of that row "
    "and stop: exactly one token of the target's own per row. Everything else stays -1; the result is "
    "int32 (torch.full((R, max_spec_len + 1), -1, dtype=torch.int32)).",
)

EXERCISE = Exercise("greedy_sampled_ids", cases, compare, draw, hints=HINTS, predict=PREDICT)
