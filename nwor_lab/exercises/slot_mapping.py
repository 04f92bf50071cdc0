"""Exercise (a): the slot mapping — where each window token's K/V goes in the paged cache.

Write `slot_mapping(block_tables, token_req, positions, block_size) -> slots`; the spec is the
docstring of `nwor_lab.exercises.solutions.slot_mapping`. Check it with
`exercises.check_slot_mapping(your_fn)`.

Cases: padding tokens (-1), requests with no token in the window, tokens on block boundaries,
block_size 1, block tables whose physical blocks are not in order, wide tables ending in -1.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference
from nwor_lab.viz.cache import cache_grids
from nwor_lab.viz.states import SlotState


def _case(block_size, tables, window, note, pad=()) -> Case:
    """tables: per request its physical blocks; window: per request (context_len, tokens in window)
    (the window holds the LAST tokens of the context); pad: (request, count) padding tokens."""
    width = max([len(t) for t in tables] + [1])
    block_tables = torch.full((len(tables), width), -1, dtype=torch.int32)
    for r, t in enumerate(tables):
        block_tables[r, :len(t)] = torch.tensor(t, dtype=torch.int32)
    req, pos, committed = [], [], []
    for r, (ctx, n) in enumerate(window):
        req += [r] * n
        pos += list(range(ctx - n, ctx))
        committed += [tables[r][p // block_size] * block_size + p % block_size for p in range(ctx - n)]
    for r, count in pad:
        req += [r] * count
        pos += [-1] * count
    num_blocks = max([b for t in tables for b in t] + [0]) + 1
    return Case(dict(block_tables=block_tables, token_req=torch.tensor(req, dtype=torch.int32),
                     positions=torch.tensor(pos, dtype=torch.int64), block_size=block_size),
                note, dict(num_blocks=num_blocks, committed=committed))


def cases(seed: int, n: int):
    fixed = [
        _case(4, [[0]], [(0, 0)], "edge: empty window (no tokens)"),
        _case(4, [[2]], [(1, 1)], "edge: one request, one token at position 0"),
        _case(4, [[3, 1]], [(6, 3)], "edge: the window crosses a block boundary (positions 3, 4, 5)"),
        _case(2, [[5, 0, 3]], [(6, 6)], "edge: physical blocks out of order"),
        _case(1, [[4, 2, 0, 1]], [(4, 2)], "edge: block_size 1"),
        _case(4, [[0, 1], [2]], [(5, 2), (3, 1)], "edge: padding tokens (position -1)", pad=((0, 2),)),
        _case(4, [[1], [0], [2]], [(2, 1), (3, 0), (4, 2)], "edge: a request with no token in the window"),
        _case(4, [[3, 1, -1]], [(8, 4)], "edge: a table row ending in -1 entries"),
        _case(8, [[1], [0]], [(0, 0), (0, 0)], "edge: only padding tokens", pad=((0, 3),)),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    size = growing(i, count)
    bs = d.choice((1, 2, 4, 8, 16))
    num_reqs = d.int(1, size + 1)
    lengths = [d.int(0, 2 * bs * size) for _ in range(num_reqs)]
    need = [-(-ctx // bs) for ctx in lengths]
    free = d.perm(sum(need) + d.int(0, 3)).tolist()  # physical blocks handed out in random order
    tables, window = [], []
    for ctx, k in zip(lengths, need):
        tables.append([free.pop() for _ in range(k)] + [-1] * d.int(0, 1))
        window.append((ctx, d.int(0, min(ctx, 6))))
    pad = [(d.int(0, num_reqs - 1), d.int(1, 2))] if d.chance(0.3) else []
    return _case(bs, tables, window, "random", pad)


def compare(expected, got, case) -> str | None:
    return first_difference(expected, got, "slots", "token")


def draw(case, expected, got):
    bs, ctx = case.inputs["block_size"], case.context
    nb = ctx["num_blocks"]
    req, pos = case.inputs["token_req"].tolist(), case.inputs["positions"].tolist()
    got = torch.as_tensor(got).long() if got is not None else torch.full_like(expected, -1)
    wrong = [t for t in range(len(pos)) if got.shape != expected.shape or int(got[t]) != int(expected[t])]

    def panel(slots, title, bad):
        states = torch.zeros(nb * bs, dtype=torch.int8)
        states[ctx["committed"]] = SlotState.COMMITTED
        labels, marks, outside = {}, {}, []
        for t, s in enumerate(slots.tolist() if slots.shape == expected.shape else []):
            if s == -1:
                continue
            if not 0 <= s < nb * bs:
                outside.append(s)
                continue
            states[s] = SlotState.WRITTEN
            labels[s] = f"token {t}: req {req[t]} · position {pos[t]}"
            marks[s] = f"{req[t]}:{pos[t]}"
        same_shape = slots.shape == expected.shape
        high = [int(slots[t]) for t in bad if 0 <= int(slots[t]) < nb * bs] if same_shape else []
        title += f" (slots outside the cache: {outside})" if outside else ""
        return dict(states=states, title=title, annotations=labels, cell_text=marks, highlight=high)

    return cache_grids([panel(expected, "expected", wrong), panel(got, "your slot_mapping", wrong)],
                       title="slot_mapping: where the window's tokens are written",
                       subtitle=f"{case.note}; cells show request:position; "
                                f"blue = the requests' earlier tokens", block_size=bs)


PREDICT = Prediction(
    question="block_size 4; request 1's block table is [6, 2] (its positions 0-3 live in block 6, "
             "4-7 in block 2). Which slot holds its token at position 5?",
    inputs=lambda: dict(block_tables=torch.tensor([[0, 1], [6, 2]], dtype=torch.int32),
                        token_req=torch.tensor([1], dtype=torch.int32),
                        positions=torch.tensor([5], dtype=torch.int64), block_size=4),
    answer=lambda out: int(out[0]),
    explain=lambda s: (f"{s}: position 5 is entry 5 // 4 = 1 of the table (block 2) at offset 5 % 4 = 1, "
                       f"so slot 2 × 4 + 1 = {s}. The blocks of a request need not be in order."))

HINTS = (
    "Gather each token's block with advanced indexing: `block_tables[token_req, positions // block_size]` "
    "(cast the indices to int64 first), then slot = block * block_size + positions % block_size.",
    "Padding: positions == -1 would index entry -1 of the table. Compute with the positions clamped to >= 0, "
    "then put -1 back with `torch.where(positions >= 0, slots, -1)`. The result is int64, shape [T].",
)

EXERCISE = Exercise("slot_mapping", cases, compare, draw, hints=HINTS, predict=PREDICT)
