"""Exercise (f): storage offsets — where each KV head of a slot lives in a layer's memory, in the
NHD and the HND layout (chapter 02).

Write `storage_offsets(slots, layout, block_size, num_kv_heads, head_size) -> [n, H] int64`; the
spec is the docstring of `nwor_lab.exercises.solutions.storage_offsets`. Check it with
`exercises.check_storage_offsets(your_fn)`.

Cases: both layouts, one KV head (the layouts coincide), block_size == num_kv_heads (the trap of
chapter 02: the shapes agree, the offsets do not), padding slots, no slots, head_size 1, the last
slot of the cache.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises import solutions
from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import STATE_COLOURS

HEAD_COLOURS = [STATE_COLOURS[s] for s in (SlotState.COMMITTED, SlotState.STAGED, SlotState.LOGGED,
                                           SlotState.RESTORED, SlotState.WRITTEN, SlotState.REJECTED)]


def _case(slots, layout, nb, bs, h, d, note="random") -> Case:
    return Case(dict(slots=torch.tensor(slots, dtype=torch.int64), layout=layout, block_size=bs,
                     num_kv_heads=h, head_size=d), note + f" · {layout}, NB={nb} BS={bs} H={h} D={d}",
                dict(num_blocks=nb))


def cases(seed: int, n: int):
    fixed = [
        _case([], "NHD", 2, 4, 2, 8, "edge: no slots"),
        _case([0], "NHD", 2, 4, 2, 8, "edge: slot 0, NHD"),
        _case([0], "HND", 2, 4, 2, 8, "edge: slot 0, HND"),
        _case([5], "NHD", 2, 4, 2, 8, "edge: slot 5 (block 1, offset 1), NHD"),
        _case([5], "HND", 2, 4, 2, 8, "edge: slot 5 (block 1, offset 1), HND"),
        _case([5, 2], "HND", 3, 4, 4, 8, "edge: block_size == num_kv_heads: the shapes cannot tell the layouts apart"),
        _case([3, 1], "HND", 2, 4, 1, 4, "edge: one KV head: NHD and HND are the same memory"),
        _case([2, -1, 7], "NHD", 2, 4, 2, 8, "edge: a padding slot (-1)"),
        _case([6, -1], "HND", 2, 4, 3, 1, "edge: head_size 1 and a padding slot"),
        _case([11], "HND", 3, 4, 2, 2, "edge: the last slot of the cache"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    bs = d.choice((1, 2, 4, 8))
    h = bs if d.chance(0.3) and bs <= 4 else d.int(1, 4)
    nb = d.int(1, size + 1)
    count = d.int(0, min(nb * bs, size + 2))
    slots = [-1 if d.chance(0.15) else int(s) for s in d.perm(nb * bs)[:count]]
    return _case(slots, d.choice(("NHD", "HND")), nb, bs, h, d.int(1, 8))


def compare(expected, got, case) -> str | None:
    return first_difference(expected, got, "offsets", "slot")


def _memory(case, offsets, title, wrong=()):
    """The layer's storage as rows of blocks; each cell one head row (head_size elements), in memory
    order; the cell says which (slot, head) this answer puts there."""
    i = case.inputs
    bs, h, d, nb = i["block_size"], i["num_kv_heads"], i["head_size"], case.context["num_blocks"]
    per_block = bs * h
    z = [[None] * per_block for _ in range(nb)]
    text = [[""] * per_block for _ in range(nb)]
    outside, high = [], []
    slots = i["slots"].tolist()
    for t, s in enumerate(slots):
        if s < 0:
            continue
        for head in range(h):
            off = int(offsets[t][head])
            cell = off // d
            if off < 0 or off % d or cell >= nb * per_block:
                outside.append(off)
                continue
            b, c = divmod(cell, per_block)
            text[b][c] = (text[b][c] + "+" if text[b][c] else "") + f"s{s}·h{head}"
            z[b][c] = head % len(HEAD_COLOURS)
            if (t, head) in wrong:
                high.append((b, c))
    if i["layout"] == "NHD":
        cols = [f"o{o}·h{x}" for o in range(bs) for x in range(h)]
    else:
        cols = [f"h{x}·o{o}" for x in range(h) for o in range(bs)]
    title += f" (offsets outside the layer or not on a head row: {outside[:4]})" if outside else ""
    return dict(z=z, text=text, rows=[f"block {b}" for b in range(nb)], cols=cols, title=title,
                highlight=sorted(set(high)))


def draw(case, expected, got):
    panels = [_memory(case, expected.tolist(), "expected")]
    try:
        g = torch.as_tensor(got).long()
        if g.shape == expected.shape:
            wrong = {(t, x) for t, x in (g != expected).nonzero().tolist()}
            panels[0] = _memory(case, expected.tolist(), "expected", wrong)
            panels.append(_memory(case, g.tolist(), "your storage_offsets", wrong))
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    i = case.inputs
    return labelled_grids(panels, categories=[(f"head {x}", c) for x, c in enumerate(HEAD_COLOURS[:i["num_kv_heads"]])],
                          stacked=True, x_title=f"head rows of a block, in memory order ({i['layout']})",
                          title="storage_offsets: where each head of each slot lives in memory",
                          subtitle=f"{case.note}; a cell is one head row of {i['head_size']} elements; "
                                   f"sS·hH = head H of slot S", cell_px=max(34, min(60, 900 // max(1, i['block_size'] * i['num_kv_heads']))))


def _assumed_nhd(out):
    nhd = solutions.storage_offsets(torch.tensor([5]), "NHD", 4, 4, 8)
    return int((nhd[0] == out[0]).sum())


PREDICT = Prediction(
    question="block_size = num_kv_heads = 4, head_size 8: a kernel that ASSUMES NHD writes the 4 heads of "
             "slot 5 into an HND cache. For how many of the 4 heads is its offset still right?",
    inputs=lambda: dict(slots=torch.tensor([5]), layout="HND", block_size=4, num_kv_heads=4, head_size=8),
    answer=_assumed_nhd,
    explain=lambda n: (f"{n}: NHD puts head h of slot 5 at ((1×4 + 1)×4 + h)×8, HND at ((1×4 + h)×4 + 1)×8; "
                       f"they agree only where 20 + h = 17 + 4h, h = 1. The other heads land in other slots "
                       f"of other heads — chapter 02's scrambled picture — and nothing raises."))

HINTS = (
    "Split the slot first: block = slot // block_size, offset = slot % block_size. Then walk the "
    "dimensions in memory order, outermost first: NHD is (block, offset, head), HND is (block, head, offset); "
    "each step multiplies by the size of the next dimension, and the last by head_size.",
    "Vectorise over heads with `torch.arange(num_kv_heads)` broadcast against slots[:, None]; put -1 in "
    "every head of a padding slot with torch.where(slots[:, None] >= 0, offsets, -1). Shape [n, H], int64.",
)

EXERCISE = Exercise("storage_offsets", cases, compare, draw, hints=HINTS, predict=PREDICT)
