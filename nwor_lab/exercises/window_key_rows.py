"""Exercise (v): where `stage`'s verify attention reads each key of a request, the paged cache or a
row of the staging buffer (chapter 16).

Write `window_key_rows(cache_lens, win_rows, win_start, request) -> [n] int64`; the spec is the
docstring of `nwor_lab.exercises.solutions.window_key_rows`. Check it with `exercises.check_window_key_rows(fn)`.

Cases: an empty cache (a first decode after a one-token prompt's prefill: every key from the window),
a window of t_last alone, the last request of a batch, staging rows in order and shuffled (the buffer
is shared by every request, so a request's rows need not be contiguous nor start at 0), then random
batches. An answer that skips the `win_rows` indirection, forgets the request's `win_start` offset,
counts t_last as a cache key or returns int32 is caught.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.read_path import SOURCE_COLOURS, CACHE, WINDOW

CATEGORIES = [("read from the paged cache", SOURCE_COLOURS[CACHE]),
              ("read from a staging-buffer row", SOURCE_COLOURS[WINDOW])]


def _case(cache_lens, win_lens, request, rows=None, d: Dice | None = None, note="random") -> Case:
    n = sum(win_lens)
    if rows is None:
        spare = 3
        rows = (d.perm(n + spare)[:n] if d is not None else torch.arange(n)).long()
    start = torch.tensor([0] + torch.tensor(win_lens).cumsum(0).tolist(), dtype=torch.int32)
    return Case(dict(cache_lens=torch.tensor(cache_lens, dtype=torch.int32), win_rows=torch.as_tensor(rows).long(),
                     win_start=start, request=request), note)


def cases(seed: int, n: int):
    fixed = [
        _case([6, 9], [5, 5], 1, rows=[7, 3, 9, 0, 12, 4, 10, 1, 8, 2], note="edge: shuffled staging rows, request 1"),
        _case([0], [3], 0, note="edge: an empty cache (every key from the window)"),
        _case([5, 4], [1, 5], 0, rows=[6, 0, 1, 2, 3, 4], note="edge: a window of t_last alone"),
        _case([3, 2, 7], [2, 4, 3], 2, rows=[8, 1, 4, 0, 6, 2, 3, 5, 7], note="edge: the last request of a batch"),
        _case([4], [4], 0, rows=[0, 1, 2, 3], note="edge: staging rows in order from 0"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    R = d.int(1, 4)
    return _case([d.int(0, 12) for _ in range(R)], [d.int(1, 6) for _ in range(R)], d.int(0, R - 1), d=d)


def compare(expected, got, case) -> str | None:
    problem = first_difference(expected, got, "key rows", "key position")
    if problem is None:
        return None
    i = case.inputs
    r = int(i["request"])
    n = int(i["cache_lens"][r])
    lo, hi = int(i["win_start"][r]), int(i["win_start"][r + 1])
    return (f"{problem}. Request {r}: positions 0..{n - 1} are in the cache ({n} keys), its window rows are "
            f"win_rows[{lo}:{hi}] = {i['win_rows'][lo:hi].tolist()} at positions {n}..{n + hi - lo - 1} "
            f"(t_last first, at position cache_lens[r] = {n}).")


def draw(case, expected, got):
    i = case.inputs
    r = int(i["request"])

    def panel(title, answer, other=None):
        try:
            vals = [int(x) for x in answer.tolist()]
        except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
            vals = []
        z = [[CACHE if v < 0 else WINDOW for v in vals]]
        text = [["C" if v < 0 else str(v) for v in vals]]
        hl = [] if other is None else [(0, c) for c in range(max(len(vals), len(other)))
                                       if c >= len(vals) or c >= len(other) or vals[c] != other[c]]
        hl = [(a, b) for a, b in hl if b < len(vals)]
        return dict(z=z or [[None]], text=text, rows=[f"request {r}"], cols=[str(p) for p in range(len(vals))],
                    title=title, highlight=hl)

    want = [int(x) for x in expected.tolist()]
    return labelled_grids([panel("expected", expected), panel("your window_key_rows", got, want)],
                          categories=CATEGORIES, stacked=True, title="window_key_rows: where each key is read",
                          subtitle=f"{case.note}; cache_lens = {i['cache_lens'].tolist()}, win_start = "
                                   f"{i['win_start'].tolist()}, win_rows = {i['win_rows'].tolist()}. Cell: C (cache) "
                                   f"or the staging-buffer row; outlined where yours differs",
                          x_title="key position", cell_px=34)


PREDICT = Prediction(
    question="A batch of two requests: cache_lens = [6, 9], win_start = [0, 5, 10], win_rows = [7, 3, 9, 0, 12, 4, "
             "10, 1, 8, 2]. Request 1's keys at positions 0..13: which staging-buffer row does its key at position 10 "
             "come from? (an int)",
    inputs=lambda: _case([6, 9], [5, 5], 1, rows=[7, 3, 9, 0, 12, 4, 10, 1, 8, 2]).inputs,
    answer=lambda out: int(out[10]),
    explain=lambda row: (f"row {row}: request 1 has 9 positions in the cache (0..8), so position 10 is its window row "
                         f"j = 10 − 9 = 1; its rows start at win_start[1] = 5, and win_rows[5 + 1] = {row}. Position 9 "
                         f"(t_last) reads win_rows[5] = 4: under stage even t_last's K/V is not in the cache yet."))

HINTS = (
    "A key at position p is in the cache when p < cache_lens[r]; from there on it is the request's window row "
    "j = p − cache_lens[r] (t_last is j = 0: its K/V was computed by this very pass, so it is not in the cache).",
    "Window row j of request r is not staging row j: look it up, win_rows[win_start[r] + j]. Return "
    "[-1] * cache_lens[r] followed by win_rows[win_start[r]:win_start[r + 1]], as int64.",
)

EXERCISE = Exercise("window_key_rows", cases, compare, draw, hints=HINTS, predict=PREDICT)
