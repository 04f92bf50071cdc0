"""Exercise (o): where a token's key lives in vLLM's CPU KV cache, keys transposed per block and head
(chapter 09).

Write `vllm_key_offsets(slots, head, block_size, num_kv_heads, head_size) -> [N, head_size] int64`; the
spec is the docstring of `nwor_lab.exercises.solutions.vllm_key_offsets`. Check it with
`exercises.check_vllm_key_offsets(fn)`.

vLLM's CPU backend needs a block size that is a multiple of 32; the cases use small blocks so that the
picture of one (block, head) run fits a slide. Cases: slot 0, the last offset of a block, a later head,
a padding slot, block_size equal to head_size (a square run: transposed or not cannot be told from the
shape), random slots.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, as_tensor, first_difference
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.theme import STATE_COLOURS, SlotState

CATEGORIES = [("keys (transposed: row d, column offset)", "#e4ecf6"), ("values", "#f3f3f3"),
              ("expected: this token's key", STATE_COLOURS[SlotState.COMMITTED]),
              ("yours only", STATE_COLOURS[SlotState.REJECTED]),
              ("yours and expected", STATE_COLOURS[SlotState.RESTORED])]


def _case(slots, head, block_size, num_kv_heads, head_size, note="random") -> Case:
    return Case(dict(slots=torch.as_tensor(slots, dtype=torch.int64), head=head, block_size=block_size,
                     num_kv_heads=num_kv_heads, head_size=head_size), note)


def cases(seed: int, n: int):
    fixed = [
        _case([0], 0, 4, 1, 2, "edge: slot 0, head 0"),
        _case([3, 7], 0, 4, 2, 2, "edge: the last offset of a block"),
        _case([5], 1, 4, 2, 3, "edge: head 1: a run per (block, head), heads inside a block"),
        _case([-1, 2], 0, 4, 1, 2, "edge: a padding slot (-1) gives a row of -1"),
        _case([6], 0, 4, 1, 4, "edge: block_size == head_size: the shape cannot tell transposed keys apart"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    bs, heads, hs = d.choice((4, 8, 16)), d.int(1, 4), d.choice((2, 4, 8))
    blocks = d.int(1, 6)
    count = growing(i, count, 1, 8)
    slots = [-1 if d.chance(0.1) else d.int(0, blocks * bs - 1) for _ in range(count)]
    return _case(slots, d.int(0, heads - 1), bs, heads, hs)


def compare(expected, got, case) -> str | None:
    return first_difference(expected, got, "key offsets", "slot index")


def draw(case, expected, got):
    i = case.inputs
    bs, hs = i["block_size"], i["head_size"]
    run = bs * 2 * hs
    rows = [r for r in range(expected.shape[0]) if int(i["slots"][r]) >= 0]
    try:
        mine = as_tensor(got).reshape(expected.shape)
        differing = [r for r in rows if not torch.equal(mine[r], expected[r])]
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        mine, differing = None, rows
    r = (differing or rows or [0])[0]
    slot = int(i["slots"][r])
    block, offset = divmod(max(slot, 0), bs)
    base = (block * i["num_kv_heads"] + i["head"]) * run
    z = [[0 if row < hs else 1 for _ in range(bs)] for row in range(2 * hs)]   # the run as [2 * head_size, block_size]
    text = [["" for _ in range(bs)] for _ in range(2 * hs)]
    want = {int(x) - base for x in expected[r].tolist()} if slot >= 0 else set()
    have = {int(x) - base for x in mine[r].tolist()} if mine is not None and slot >= 0 else set()
    highlight = []
    for e in range(run):
        row, col = divmod(e, bs)
        if e in want:
            z[row][col] = 4 if e in have else 2
            text[row][col] = f"d{sorted(want).index(e)}"
        elif e in have:
            z[row][col] = 3
            highlight.append((row, col))
    outside = sorted(x for x in have if not 0 <= x < run)
    return labelled_grids([dict(z=z, text=text, rows=[f"K d{d}" for d in range(hs)] + [f"V +{d}" for d in range(hs)],
                                cols=[str(c) for c in range(bs)], highlight=highlight)],
                          categories=CATEGORIES, x_title="offset in the block (keys) · element (values)",
                          title=f"vllm_key_offsets: slot {slot} (block {block}, offset {offset}), head {i['head']}",
                          subtitle=f"{case.note}; the (block, head) run starts at element {base}, "
                                   f"{run} elements" + (f"; yours also points outside it: {outside[:4]}" if outside else ""))


PREDICT = Prediction(
    question="block_size 4, 1 KV head, head_size 2: vLLM's CPU tensor is [num_blocks, 1, 4, 4]. Slot 6 is block 1, "
             "offset 2. At which flat element indices are its key's two elements? (a list)",
    inputs=lambda: _case([6], 0, 4, 1, 2).inputs,
    answer=lambda out: out[0].tolist(),
    explain=lambda s: (f"{s}: block 1's run starts at element 1 × 4 × 2 × 2 = 16; its keys are stored transposed, "
                       f"[head_size, block_size], so element d of offset 2 is at 16 + d × 4 + 2. Untransposed it "
                       f"would be 16 + 2 × 2 + d = [20, 21]."))

HINTS = (
    "One (block, head) run holds block_size × 2 × head_size elements; runs are ordered block-major, then head: "
    "run number block × num_kv_heads + head.",
    "Inside the run the keys come first, transposed: element d of the key at offset o is at d × block_size + o. "
    "Return a [N, head_size] int64 tensor, a row of -1 for a padding slot.",
)

EXERCISE = Exercise("vllm_key_offsets", cases, compare, draw, hints=HINTS, predict=PREDICT)
