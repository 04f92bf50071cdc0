"""Exercise (e): ring evictions — which entries a write-all window overwrites while its queries
still need them, on a sliding-window ring cache (chapter 07).

Write `ring_evictions(ring_slots, sliding_window, start, num_tokens) -> [(ring index, position)]`;
the spec is the docstring of `nwor_lab.exercises.solutions.ring_evictions`. Check it with
`exercises.check_ring_evictions(your_fn)`.

Cases: a ring that has not wrapped yet, the window that wraps it, slack of exactly k (nothing
lost) and of k - 1 (one entry), t_last alone, W = 1, W smaller than the ring, windows near
position 0, long contexts.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction
from nwor_lab.viz.cache import cache_grids
from nwor_lab.viz.ring import ring_cells
from nwor_lab.viz.states import SlotState


def _case(ring_slots, sliding_window, start, num_tokens, note) -> Case:
    return Case(dict(ring_slots=ring_slots, sliding_window=sliding_window, start=start, num_tokens=num_tokens), note)


def cases(seed: int, n: int):
    fixed = [
        _case(8, 8, 0, 5, "edge: the first window (nothing committed yet)"),
        _case(8, 8, 3, 5, "edge: the window fills the ring exactly, nothing wraps"),
        _case(8, 8, 4, 5, "edge: the window's last draft wraps onto position 0, still needed"),
        _case(8, 8, 20, 1, "edge: t_last alone evicts only a position no query needs"),
        _case(12, 8, 30, 5, "edge: slack 4 = k: nothing needed is lost (llama.cpp's sizing)"),
        _case(11, 8, 30, 5, "edge: slack 3 = k - 1: exactly one entry lost"),
        _case(8, 8, 30, 5, "edge: no slack, ring wrapped: every draft evicts a needed position"),
        _case(8, 1, 30, 5, "edge: W = 1: a query needs only itself"),
        _case(16, 6, 9, 8, "edge: W below the ring near position 0"),
        _case(1, 1, 5, 1, "edge: a ring of one slot"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count, 2, 40)
    s = d.int(1, size)
    w = d.int(1, s)
    k = d.int(1, s)
    start = d.int(0, 3 * size)
    return _case(s, w, start, k, "random")


def compare(expected, got, case) -> str | None:
    try:
        got = [(int(a), int(b)) for a, b in got]
    except Exception as err:  # noqa: BLE001 - any unreadable answer is a counterexample
        return f"could not read a list of (ring index, position) pairs ({type(err).__name__}: {err})"
    if got == expected:
        return None
    missing = [e for e in expected if e not in got]
    extra = [g for g in got if g not in expected]
    if missing or extra:
        why = ""
        if any(pos < 0 for _, pos in extra):
            why = "; a negative position was never written (that slot was empty: the ring had not wrapped there)"
        return f"missing {missing[:4]}, not evicted-and-needed {extra[:4]}{why}"
    return "the right pairs in the wrong order (position order expected)"


def draw(case, expected, got):
    i = case.inputs
    s = i["ring_slots"]
    cells, _ = ring_cells(s, i["sliding_window"], i["start"], i["num_tokens"])
    colour = {"empty": SlotState.EMPTY, "outside": SlotState.EMPTY, "live": SlotState.COMMITTED,
              "window": SlotState.WRITTEN, "evicted": SlotState.REJECTED, "logged": SlotState.LOGGED}
    states = torch.tensor([int(colour[c.state]) for c in cells], dtype=torch.int8)
    text = {c.index: str(c.position) + (f"/{c.lost}" if c.lost >= 0 else "") for c in cells if c.position >= 0}
    labels = {c.index: (f"holds position {c.position}" if c.position >= 0 else "empty")
              + (f", evicted position {c.lost}" if c.lost >= 0 else "") for c in cells}
    try:
        answer = [int(a) for a, _ in got] if got is not None else []
    except Exception:  # noqa: BLE001
        answer = []

    def panel(title, marked):
        return dict(states=states, title=title, annotations=labels, cell_text=text,
                    highlight=[a for a in marked if 0 <= a < s])

    return cache_grids([panel("expected", [a for a, _ in expected]), panel("your ring_evictions", answer)],
                       title="ring_evictions: what a write-all window loses",
                       subtitle=f"{case.note}; ring of {s} slots, W = "
                                f"{i['sliding_window']}, window at {i['start']}..{i['start'] + i['num_tokens'] - 1}; "
                                f"cells show position now / position evicted; outlined: the answer's entries",
                       block_size=s)


def _show(pairs) -> str:
    return str(pairs) if pairs is not None else "None"


PREDICT = Prediction(
    question="a ring of W = 8 slots (no slack), long after it wrapped; a write-all window writes "
             "t_last and 4 drafts at positions 30..34. How many entries that its own queries still "
             "need does it evict?",
    inputs=lambda: dict(ring_slots=8, sliding_window=8, start=30, num_tokens=5),
    answer=lambda out: len(out),
    explain=lambda n: (f"{n}: writing position p evicts p − 8; the query at 30 needs 23 onward, so the "
                       f"evictions of positions 23..26 (by the drafts at 31..34) all hurt, and t_last's "
                       f"eviction of 22 does not."))

HINTS = (
    "Position p lives at ring index p % ring_slots, so writing p evicts p - ring_slots (if that is >= 0: "
    "before the ring wrapped, the slot was empty).",
    "The oldest key any query of the window needs is the first query's: start - sliding_window + 1. An "
    "eviction hurts when the evicted position is at least that. Return (p % ring_slots, p - ring_slots) "
    "pairs in position order.",
)

EXERCISE = Exercise("ring_evictions", cases, compare, draw, _show, hints=HINTS, predict=PREDICT)
