"""Exercise (b): the acceptance mask — which drafts survived the rejection sampler, counted as SCV
counts them (chapter 04).

Write `acceptance_mask(draft_token_ids, cu_num_draft_tokens, sampled_token_ids)
-> (draft_mask, accepted_len)`; the spec is the docstring of
`nwor_lab.exercises.solutions.acceptance_mask`. Check it with `exercises.check_acceptance_mask(your_fn)`.

Cases are what a rejection sampler returns (accepted drafts, one token of its own, -1): no
requests, requests without drafts, all / none accepted, fewer sampled columns than drafts + 1
(at most C - 1 accepted), padding drafts, a zero-probability draft recovered as itself (the id
comparison would accept it), a row that reads past a padding draft, and a malformed row with more
ids than drafts + 1 (clamped to n_r).
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import TOKEN_COLOURS

_PLACEHOLDER = "#f4f4f4"
CATEGORIES = [("accepted draft", TOKEN_COLOURS["kept"]), ("rejected draft", TOKEN_COLOURS["rejected"]),
              ("sampled id (emitted)", "#d9e6f5"), ("-1 placeholder / no column", _PLACEHOLDER)]


def _case(drafts_per_req, sampled_rows, num_cols=None, note="random") -> Case:
    """drafts_per_req: per request its draft ids; sampled_rows: per request its sampled ids
    (padded with -1 to `num_cols` columns, default max drafts + 1; longer rows are cut)."""
    counts = [len(d) for d in drafts_per_req]
    c = max(counts + [0]) + 1 if num_cols is None else num_cols
    sampled = torch.full((len(counts), c), -1, dtype=torch.int64)
    for r, row in enumerate(sampled_rows):
        row = row[:c]
        sampled[r, :len(row)] = torch.tensor(row, dtype=torch.int64)
    ids = [x for d in drafts_per_req for x in d]
    return Case(dict(draft_token_ids=torch.tensor(ids, dtype=torch.int64),
                     cu_num_draft_tokens=torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32),
                     sampled_token_ids=sampled), note, dict(counts=counts))


def sampler_row(drafts: list[int], accepted: int, emitted: int) -> list[int]:
    """The row a rejection sampler writes: the accepted drafts, then its own token."""
    return drafts[:accepted] + [emitted]


def cases(seed: int, n: int):
    fixed = [
        _case([], [], note="edge: no requests"),
        _case([[5, 6, 7]], [[5, 6, 7, 9]], note="edge: one request, all drafts accepted (+ bonus)"),
        _case([[5, 6, 7]], [[4]], note="edge: one request, none accepted"),
        _case([[5, 6], [], [7]], [[5, 3], [8], [7, 2]], note="edge: a request without drafts"),
        _case([[5, 6, 7]], [[5, 6, 7, 9]], num_cols=2,
              note="edge: 2 sampled columns for 3 drafts: at most C - 1 = 1 accepted"),
        _case([[5, -1, -1]], [[5, 8]], note="edge: padding drafts (-1), rejected by the sampler"),
        _case([[7, 8]], [[7, 8]], note="edge: a zero-probability draft, rejected and recovered as itself"),
        _case([[5, -1, 6]], [[5, -1, 6, 2]], note="edge: a row that reads past a padding draft: the padding cuts"),
        _case([[5, 6]], [], num_cols=0, note="edge: no sampled columns at all"),
        _case([[5], [1, 2]], [[5, 3, 4]], note="edge: a malformed row, more ids than drafts + 1: clamp to n_r"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    vocab = d.int(2, 6)                      # few ids: accidental matches happen
    drafts, rows = [], []
    for _ in range(d.int(1, size + 1)):
        k = d.int(0, 4)
        ids = [-1 if d.chance(0.1) else d.int(0, vocab - 1) for _ in range(k)]
        limit = ids.index(-1) if -1 in ids else k        # the sampler never accepts a padding draft
        a = d.int(0, limit)
        if a < k and d.chance(0.15):                     # zero-probability draft: recovered as itself
            own = ids[a] if ids[a] != -1 else 0
        else:
            own = d.int(0, vocab - 1)
            if a < k and own == ids[a]:
                own = (own + 1) % vocab
        drafts.append(ids)
        rows.append(sampler_row(ids, a, own))
    cols = None if d.chance(0.8) else d.int(0, max(len(x) for x in drafts))
    return _case(drafts, rows, cols)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (draft_mask, accepted_len), got {type(got).__name__}"
    return (first_difference(expected[0], got[0], "draft_mask", "draft")
            or first_difference(expected[1], got[1], "accepted_len", "request"))


def _panel(case, mask, acc, title, wrong_drafts=(), wrong_reqs=(), expected_acc=None):
    """Two rows per request: its draft ids (coloured by this answer's fate) and its sampled ids. Outlined:
    the drafts whose fate differs from the expected mask, and, for a request whose accepted length differs,
    the drafts the two lengths disagree about (between them) — never the drafts both answers agree on."""
    counts = case.context["counts"]
    ids = case.inputs["draft_token_ids"].tolist()
    sampled = case.inputs["sampled_token_ids"].tolist()
    cols = max(counts + [case.inputs["sampled_token_ids"].shape[1], 1])
    z, text, rows, high = [], [], [], []
    start = 0
    for r, k in enumerate(counts):
        a = "?" if acc is None else acc[r]
        fates = [None if mask is None else (0 if mask[start + j] else 1) for j in range(k)]
        z.append([(f if f is not None else 3) for f in fates] + [None] * (cols - k))
        text.append([f"d{j + 1}={ids[start + j]}" for j in range(k)] + [""] * (cols - k))
        row = sampled[r] if r < len(sampled) else []
        z.append([2 if j < len(row) and row[j] != -1 else 3 for j in range(len(row))] + [None] * (cols - len(row)))
        text.append([str(t) for t in row] + [""] * (cols - len(row)))
        label = f"req {r} drafts · a={a}"
        high += [(2 * r, j) for j in range(k) if start + j in wrong_drafts]
        if r in wrong_reqs and expected_acc is not None:
            lo, hi = sorted((int(acc[r]), int(expected_acc[r])))
            high += [(2 * r, j) for j in range(max(lo, 0), min(hi, k))]
            label += f" (expected {expected_acc[r]})"
        rows += [label, f"req {r} sampled"]
        start += k
    if not counts:
        z, text, rows = [[None]], [["(no requests)"]], ["-"]
    return dict(z=z, text=text, rows=rows, cols=[f"column {j}" for j in range(cols)], title=title,
                highlight=sorted(set(high)))


def draw(case, expected, got):
    mask, acc = expected[0].tolist(), expected[1].tolist()
    panels = [_panel(case, mask, acc, "expected")]
    try:
        gm, ga = torch.as_tensor(got[0]).bool(), torch.as_tensor(got[1])
        if gm.shape == expected[0].shape and ga.shape == expected[1].shape:
            wrong_d = set((gm != expected[0]).nonzero().flatten().tolist())
            wrong_r = set((ga.long() != expected[1].long()).nonzero().flatten().tolist())
            panels.append(_panel(case, gm.tolist(), ga.tolist(), "your acceptance_mask", wrong_d, wrong_r,
                                 expected_acc=acc))
    except Exception:  # noqa: BLE001 - an unreadable output is reported in the text, drawn as missing
        pass
    c = case.inputs["sampled_token_ids"].shape[1]
    return labelled_grids(panels, categories=CATEGORIES, stacked=True, x_title="column of sampled_token_ids",
                          title="acceptance_mask: which drafts are kept",
                          subtitle=f"{case.note}; per request: its drafts d_j = id (coloured by fate) above the "
                                   f"sampler's row ({c} columns); a = accepted_len. Count emitted ids − 1; "
                                   f"an id that merely equals its draft proves nothing",
                          cell_px=52)


def _predict_inputs():
    return _case([[7, 8]], [[7, 8]], note="predict").inputs


PREDICT = Prediction(
    question="drafts [7, 8] and the sampler's row [7, 8, -1] (vLLM rejected d2 because its draft "
             "probability was 0, and recovered the same id 8). How many drafts does SCV accept?",
    inputs=_predict_inputs,
    answer=lambda out: int(out[1][0]),
    explain=lambda a: (f"{a}: the row emits 2 ids, and every row emits exactly one token of its own after its "
                       f"accepted drafts, so 2 − 1 = {a}. Comparing ids would say 2 and commit a rejected draft's K/V."))

HINTS = (
    "Per request, count the ids that are not -1 in its row of sampled_token_ids: that is accepted "
    "drafts + 1. Then clamp to 0 .. n_r, with n_r = cu_num_draft_tokens[r] - cu_num_draft_tokens[r - 1].",
    "A padding draft (-1) ends the prefix: cut accepted_len at the first -1 among the request's drafts. "
    "The mask is then `position_in_request < accepted_len[request]`, and accepted_len must be int32 "
    "(torch.int32), the mask bool.",
)

EXERCISE = Exercise("acceptance_mask", cases, compare, draw, hints=HINTS, predict=PREDICT)
