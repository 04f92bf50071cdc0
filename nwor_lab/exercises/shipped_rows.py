"""Exercise (u): which cache rows a prefill-to-decode hand-off ships of a request, per strategy
(chapter 15, section 4).

Write `shipped_rows(block_size, num_computed, target_layers, head_layers, strategy) -> [L, P] bool`;
the spec is the docstring of `nwor_lab.exercises.solutions.shipped_rows`. Check it with
`exercises.check_shipped_rows(fn)`.

Cases: a prompt that ends on a block boundary (write_all ships no junk); one row into a new block
(write_all ships a whole block for it); nothing computed; block size 1; several head layers; every
strategy at random sizes. The reference equals what the engine's own strategies export
(tests/test_exercise_shipped_rows.py).
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random
from nwor_lab.exercises.check import Case, Exercise, Prediction, tensor_problem
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import STATE_COLOURS

STRATEGIES = ("nwor", "write_all", "no_head")
CATEGORIES = [("committed, shipped", STATE_COLOURS[SlotState.COMMITTED]),
              ("past n, shipped (junk)", STATE_COLOURS[SlotState.REJECTED]),
              ("committed, left behind", STATE_COLOURS[SlotState.OLD]),
              ("past n, left behind", STATE_COLOURS[SlotState.WRITTEN])]


def _case(bs, n, tl, hl, strategy, note="random") -> Case:
    return Case(dict(block_size=bs, num_computed=n, target_layers=tl, head_layers=hl, strategy=strategy), note)


def cases(seed: int, n: int):
    fixed = [
        _case(4, 8, 2, 1, "write_all", "edge: the prompt ends on a block boundary (no junk row)"),
        _case(4, 9, 2, 1, "write_all", "edge: one row into a new block (write_all ships the whole block)"),
        _case(4, 9, 2, 1, "nwor", "edge: the partial block's committed row only"),
        _case(4, 9, 2, 1, "no_head", "edge: the head's layer (the last) left behind"),
        _case(8, 0, 2, 1, "nwor", "edge: nothing computed, nothing shipped"),
        _case(1, 5, 3, 1, "write_all", "edge: block size 1: whole blocks are committed rows"),
        _case(4, 6, 2, 2, "no_head", "edge: two head layers, both after the target's"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    return _case(d.choice((1, 2, 4, 8, 16)), d.int(0, 40), d.int(1, 4), d.int(1, 2), d.choice(STRATEGIES))


def _where(mask: torch.Tensor, case: Case) -> str:
    """Rows grouped by layer: 'layer 2: positions 0..8'."""
    parts = []
    for layer, row in enumerate(mask.tolist()):
        pos = [p for p, x in enumerate(row) if x]
        parts.append(f"layer {layer}: " + (f"positions {pos[0]}..{pos[-1]}" if pos else "nothing"))
    return "; ".join(parts)


def compare(expected, got, case) -> str | None:
    problem = tensor_problem(expected, got, "rows")
    if problem:
        return problem
    if torch.equal(expected, got):
        return None
    i = case.inputs
    n, bs, tl = i["num_computed"], i["block_size"], i["target_layers"]
    layer, p = (expected != got).nonzero()[0].tolist()
    what = "the head's" if layer >= tl else "the target's"
    if p >= n:
        why = (f"position {p} is past the committed length n = {n}: "
               + ("write_all ships it (its block travels whole)." if expected[layer, p] else
                  "only write_all ships rows past n (nwor and no_head ship committed rows only)."))
    elif layer >= tl:
        why = (f"layer {layer} is {what} (layers {tl}.. are the head's, after the target's {tl}): "
               + ("no_head leaves it behind." if not expected[layer, p] else "only no_head leaves it behind."))
    else:
        why = f"layer {layer} is {what}: every strategy ships the target's committed rows."
    return (f"rows differ first at layer {layer}, position {p} ({i['strategy']}, n = {n}, BS = {bs}, "
            f"{tl} target + {i['head_layers']} head layers): {why} Expected {_where(expected, case)}; "
            f"got {_where(got, case)}.")


def _show(out) -> str:
    return f"{int(out.sum())} rows of {out.numel()} ({list(out.shape)})"


def draw(case, expected, got):
    i = case.inputs
    n = i["num_computed"]
    L, P = expected.shape

    def panel(title, mask, other=None):
        try:
            m = mask.bool().reshape(L, P).tolist()
        except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
            m = [[False] * P for _ in range(L)]
        z = [[(0 if p < n else 1) if m[l][p] else (2 if p < n else 3) for p in range(P)] for l in range(L)]
        hl = [(l, p) for l in range(L) for p in range(P) if other is not None and m[l][p] != other[l][p]]
        rows = [f"layer {l}" + (" (head)" if l >= i["target_layers"] else "") for l in range(L)]
        return dict(z=z or [[None]], text=[["" for _ in range(P)] for _ in range(L)] or [[""]], rows=rows,
                    cols=[str(p) for p in range(P)], title=title, highlight=hl)

    want = expected.tolist()
    return labelled_grids([panel("expected", expected), panel("your shipped_rows", got, want)],
                          categories=CATEGORIES, stacked=True, title="shipped_rows: what the hand-off ships",
                          subtitle=f"{case.note}; {i['strategy']}, n = {n}, BS = {i['block_size']}; outlined "
                                   f"where yours differs", x_title="position in the request's blocks", cell_px=28)


PREDICT = Prediction(
    question="Block size 16, n = 20 committed positions, 32 target layers + 1 head layer. How many more rows "
             "(layer, position) does write_all ship than nwor? (an int)",
    inputs=lambda: _case(16, 20, 32, 1, "write_all").inputs,
    answer=lambda out: int(out.sum()) - 33 * 20,
    explain=lambda extra: (f"{extra}: the request's 2 blocks hold positions 0..31; nwor ships 0..19, write_all the "
                           f"whole second block too, 12 rows past n in each of the 33 layers (12 x 33 = {extra}). "
                           f"Under write-all those rows hold the prefill step's draft chain in the head's layer: "
                           f"rejected drafts' K/V travels."))

HINTS = (
    "Two independent choices: how many positions (n, or every position of the request's ceil(n / BS) blocks) "
    "and how many layers (all of them, or the target's only: the head's layers come after the target's).",
    "P = ceil(n / BS)·BS; out = zeros(L, P, bool); out[:layers, :positions] = True, with positions = P for "
    "write_all else n, and layers = target_layers for no_head else target_layers + head_layers.",
)

EXERCISE = Exercise("shipped_rows", cases, compare, draw, _show, hints=HINTS, predict=PREDICT)
