"""Exercise (t): which blocks of a request the prefix cache may register after a window's commit
(chapter 15).

Write `prefix_blocks(block_size, block_table, num_computed, num_drafts, accepted_len, write_policy)
-> [m] int64`; the spec is the docstring of `nwor_lab.exercises.solutions.prefix_blocks`. Check it
with `exercises.check_prefix_blocks(fn)`.

Cases: nothing accepted and no block filled; t_last alone fills a block; write-all (`off`) fills a
block with drafts that were rejected (written is not committed); every draft accepted across two
blocks; a window that starts on a block boundary; block size 1; earlier full blocks in the table
(registered before: not again); random windows under every policy. Block ids are shuffled, so an
answer in table indices instead of physical ids is caught.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random
from nwor_lab.exercises.check import Case, Exercise, Prediction, tensor_problem
from nwor_lab.exercises.pictures import labelled_grids
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import STATE_COLOURS

POLICIES = ("off", "cow", "stage")
CATEGORIES = [("full before the window (registered earlier)", STATE_COLOURS[SlotState.OLD]),
              ("full of committed rows after this commit", STATE_COLOURS[SlotState.COMMITTED]),
              ("partial, holds rejected drafts' K/V (off)", STATE_COLOURS[SlotState.REJECTED]),
              ("partial (committed rows, then unwritten)", STATE_COLOURS[SlotState.WRITTEN])]


def _case(bs: int, n: int, k: int, a: int, policy: str, d: Dice | None = None, note: str = "random") -> Case:
    blocks = -(-(n + 1 + k) // bs)                      # the blocks the window reaches
    ids = (d.perm(4 * blocks + 8)[:blocks] if d is not None
           else torch.tensor([7, 3, 9, 12, 5, 14, 2, 11, 6, 1][:blocks]) if blocks <= 10
           else torch.arange(blocks) * 3 + 1)
    return Case(dict(block_size=bs, block_table=ids.long(), num_computed=n, num_drafts=k, accepted_len=a,
                     write_policy=policy), note)


def cases(seed: int, n: int):
    fixed = [
        _case(8, 3, 3, 1, "stage", note="edge: nothing fills a block"),
        _case(8, 7, 4, 0, "stage", note="edge: t_last alone fills a block (nothing accepted)"),
        _case(8, 5, 4, 0, "off", note="edge: write-all filled the block with drafts that were rejected"),
        _case(4, 2, 6, 6, "cow", note="edge: every draft accepted, two blocks filled"),
        _case(4, 8, 3, 3, "off", note="edge: the window starts on a block boundary and fills its block"),
        _case(1, 5, 3, 2, "stage", note="edge: block size 1: every committed row is a block"),
        _case(4, 13, 4, 2, "off", note="edge: three full blocks before the window (registered already)"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    bs = d.choice((1, 2, 4, 8, 16))
    k = d.int(1, 6)
    return _case(bs, d.int(0, 40), k, d.int(0, k), d.choice(POLICIES), d)


def _blocks(case: Case) -> list[str]:
    i = case.inputs
    bs, n, k = i["block_size"], i["num_computed"], i["num_drafts"]
    committed = n + 1 + i["accepted_len"]
    out = []
    for b, bid in enumerate(i["block_table"].tolist()):
        lo, hi = b * bs, (b + 1) * bs
        kept = max(0, min(hi, committed) - lo)
        out.append(f"block {bid} (positions {lo}..{hi - 1}: {kept} of {bs} committed)")
    return out


def compare(expected, got, case) -> str | None:
    problem = tensor_problem(expected, got, "blocks")
    if problem and not (isinstance(got, torch.Tensor) and got.dtype == expected.dtype):
        return problem
    i = case.inputs
    exp, yours = expected.tolist(), got.tolist()
    if exp == yours:
        return None
    table = i["block_table"].tolist()
    n, a, bs = i["num_computed"], i["accepted_len"], i["block_size"]
    where = "; ".join(_blocks(case))
    extra = set(yours) - set(exp)
    why = ""
    if extra:
        b = next(x for x in yours if x not in exp)
        if b in table:
            idx = table.index(b)
            why = (f" Block {b} holds positions {idx * bs}..{(idx + 1) * bs - 1}: "
                   + ("it was full before the window, so an earlier commit registered it."
                      if (idx + 1) * bs <= n else
                      f"only positions below n + 1 + a = {n + 1 + a} are committed, so it is partial."))
        else:
            why = f" {b} is not a block id of this request (the table lists physical ids: return those)."
    return (f"expected blocks {exp}, got {yours} (n = {n}, k = {i['num_drafts']}, a = {a}, BS = {bs}, "
            f"{i['write_policy']}). The request's blocks: {where}.{why}")


def _show(out) -> str:
    return f"blocks {out.tolist()}"


def draw(case, expected, got):
    i = case.inputs
    bs, n, k = i["block_size"], i["num_computed"], i["num_drafts"]
    committed, written = n + 1 + i["accepted_len"], n + 1 + k
    table = i["block_table"].tolist()

    def category(b):
        hi = (b + 1) * bs
        if hi <= n:
            return 0
        if hi <= committed:
            return 1
        return 2 if i["write_policy"] == "off" and written > committed and b * bs < written else 3

    def marks(answer):
        try:
            return {int(x) for x in answer.tolist()}
        except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
            return set()

    def panel(title, answer, other=None):
        mine = marks(answer)
        text = [f"{bid}{' R' if bid in mine else ''}" for bid in table]
        hl = [(0, c) for c, bid in enumerate(table) if other is not None and (bid in mine) != (bid in other)]
        return dict(z=[[category(b) for b in range(len(table))]], text=[text], rows=["request"],
                    cols=[f"{b * bs}..{(b + 1) * bs - 1}" for b in range(len(table))], title=title, highlight=hl)

    want = marks(expected)
    return labelled_grids([panel("expected", expected), panel("your prefix_blocks", got, want)],
                          categories=CATEGORIES, stacked=True,
                          title="prefix_blocks: the blocks this commit registers",
                          subtitle=f"{case.note}; BS = {bs}, n = {n}, k = {k}, a = {i['accepted_len']}, "
                                   f"{i['write_policy']}. Cell: the block's id, R where the answer registers it; "
                                   f"outlined where yours differs",
                          x_title="the request's blocks (the positions each holds)", cell_px=70)


PREDICT = Prediction(
    question="Block size 16, n = 30 positions committed before the window, k = 4 drafts, 1 accepted, under `off` "
             "(write-all); the request's blocks are [7, 3, 9]. Which block ids does the commit register? (a list)",
    inputs=lambda: _case(16, 30, 4, 1, "off").inputs,
    answer=lambda out: out.tolist(),
    explain=lambda ids: (f"{ids}: t_last (position 30) and d1 (31) fill block 3 (positions 16..31) with committed "
                         f"rows, so it is hashed and registered. Block 7 was full before the window (registered "
                         f"then). Under `off` the verify pass also wrote d2..d4 at 32..34 in block 9, but they were "
                         f"rejected: block 9 is partial and holds rejected K/V, so it is never registered."))

HINTS = (
    "Only the accepted length matters: after the commit the rows at positions 0 .. n + a are committed (t_last at n "
    "and d_1 .. d_a), so n + 1 + a positions. The drafts that were written and rejected never count, whatever "
    "the policy.",
    "Block b is full of committed rows when (b + 1)·BS <= n + 1 + a, and was already full (registered at an "
    "earlier commit) when (b + 1)·BS <= n. Return block_table[n // BS : (n + 1 + a) // BS] as int64: physical "
    "ids, not indices.",
)

EXERCISE = Exercise("prefix_blocks", cases, compare, draw, _show, hints=HINTS, predict=PREDICT)
