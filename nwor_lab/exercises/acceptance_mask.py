"""Exercise (b): the acceptance mask — which drafts survived the rejection sampler.

Write `acceptance_mask(draft_token_ids, cu_num_draft_tokens, sampled_token_ids)
-> (draft_mask, accepted_len)`; the spec is the docstring of
`nwor_lab.exercises.solutions.acceptance_mask`. Check it with `check_acceptance_mask(your_fn)`.

Cases: no requests, requests without drafts, all / none accepted, drafts beyond the sampled
columns, padding drafts (-1) facing -1 placeholders, and sampled rows that hold garbage after the
first mismatch (a later "match" there must not revive a draft: the prefix rule).
"""
from __future__ import annotations

import torch

from nwor_lab.exercises import solutions
from nwor_lab.exercises.cases import Dice, growing, host_window
from nwor_lab.exercises.check import Case, Exercise, first_difference, run_check
from nwor_lab.viz.window import window_timelines


def _case(drafts_per_req, sampled_rows, num_cols=None, note="random") -> Case:
    """drafts_per_req: per request its draft ids; sampled_rows: per request its sampled ids
    (padded with -1 to `num_cols` columns, default max drafts + 1)."""
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


def cases(seed: int, n: int):
    fixed = [
        _case([], [], note="edge: no requests"),
        _case([[5, 6, 7]], [[5, 6, 7, 9]], note="edge: one request, all drafts accepted (+ bonus)"),
        _case([[5, 6, 7]], [[4]], note="edge: one request, none accepted"),
        _case([[5, 6], [], [7]], [[5, 3], [8], [7, 2]], note="edge: a request without drafts"),
        _case([[5, 6, 7]], [[5, 6]], num_cols=2, note="edge: drafts beyond the sampled columns"),
        _case([[5, -1, -1]], [[5, -1]], note="edge: padding drafts (-1) facing -1 placeholders"),
        _case([[-1]], [[-1]], note="edge: a padding draft at d1 facing a -1 placeholder"),
        _case([[5, 6, 7]], [[5, 1, 7, 2]], note="edge: a match after the first mismatch (prefix rule)"),
        _case([[5, 6]], [], num_cols=0, note="edge: no sampled columns at all"),
    ]
    for c in fixed[:n]:
        yield c
    d = Dice(seed)
    for i in range(max(0, n - len(fixed))):
        size = growing(i, n - len(fixed))
        vocab = d.int(2, 6)                      # few ids: matches, and accidental matches, happen
        drafts, rows = [], []
        for _ in range(d.int(1, size + 1)):
            k = d.int(0, 4)
            ids = [-1 if d.chance(0.1) else d.int(0, vocab - 1) for _ in range(k)]
            a = d.int(0, k)
            row = ids[:a]
            if d.chance(0.5):                    # as the sampler writes it: a recovered id, then -1
                nxt = d.int(0, vocab - 1)
                row.append(nxt)
            else:                                # garbage after the prefix: never trust it
                row += [d.int(-1, vocab - 1) for _ in range(k - a + 1)]
            drafts.append(ids)
            rows.append(row)
        cols = None if d.chance(0.8) else d.int(0, max(len(x) for x in drafts))
        yield _case(drafts, rows, cols)


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (draft_mask, accepted_len), got {type(got).__name__}"
    return (first_difference(expected[0], got[0], "draft_mask", "draft")
            or first_difference(expected[1], got[1], "accepted_len", "request"))


def draw(case, expected, got):
    counts = case.context["counts"]
    window = host_window([k + 1 for k in counts], counts, torch.arange(sum(counts) + len(counts)))
    panels = [dict(window=window, acceptance=expected[0], accepted_len=expected[1], title="expected")]
    try:
        mask, acc = torch.as_tensor(got[0]).bool(), torch.as_tensor(got[1])
        if mask.shape == expected[0].shape and acc.shape == expected[1].shape:
            panels.append(dict(window=window, acceptance=mask, accepted_len=acc, title="your acceptance_mask"))
    except Exception:  # noqa: BLE001 - an unreadable output is reported in the text, drawn as missing
        pass
    ids = case.inputs["draft_token_ids"].tolist()
    sampled = case.inputs["sampled_token_ids"].tolist()
    return window_timelines(panels, title="acceptance_mask: which drafts are kept",
                            subtitle=f"{case.note}; draft ids {ids}, sampled ids {sampled}")


EXERCISE = Exercise("acceptance_mask", solutions.acceptance_mask, cases, compare, draw)


def check_acceptance_mask(user_fn, n_cases: int = 300, seed: int = 0, *, show: bool | None = None):
    """Check `user_fn(draft_token_ids, cu_num_draft_tokens, sampled_token_ids) -> (draft_mask,
    accepted_len)` against the reference; prints PASS or the first counterexample."""
    return run_check(EXERCISE, user_fn, n_cases, seed, show=show)
