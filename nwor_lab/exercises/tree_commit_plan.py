"""Exercise (s): a tree window's commit — the accepted path, and the rows its commit copies where.

Write `tree_commit_plan(parents, draft_tokens, target_argmax, slots) -> (path, src, dst)`; the spec is the
docstring of `nwor_lab.exercises.solutions.tree_commit_plan`. Check it with `exercises.check_tree_commit_plan(your_fn)`.

Cases: no node matches (nothing accepted), a chain accepted whole, the path through a later sibling, a
grandchild that matches under a rejected parent (not accepted), a path already in place (node j at
depth j), a single node, then random trees.
"""
from __future__ import annotations

import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, first_difference

VOCAB = 12


def _case(parents, tokens, argmax, start=16, note="random") -> Case:
    n = len(parents)
    return Case(dict(parents=torch.tensor(parents, dtype=torch.int64), draft_tokens=torch.tensor(tokens, dtype=torch.int64),
                     target_argmax=torch.tensor(argmax, dtype=torch.int64),
                     slots=torch.arange(start, start + n + 1, dtype=torch.int64)), note)


def _random(d: Dice, size: int) -> Case:
    n = d.int(1, 2 + 3 * size)
    parents, tokens, used = [], [], {}
    for i in range(n):
        p = d.int(0, i) if d.chance(0.5) else (i if d.chance(0.6) else d.int(0, i))
        free = [t for t in range(VOCAB) if t not in used.setdefault(p, set())]
        t = d.choice(free)
        used[p].add(t)
        parents.append(p), tokens.append(t)
    argmax = [d.int(0, VOCAB - 1) for _ in range(n + 1)]
    for row in range(n + 1):                 # most rows agree with one of their children
        kids = [i for i, p in enumerate(parents) if p == row]
        if kids and d.chance(0.7):
            argmax[row] = tokens[d.choice(kids)]
    start = d.int(0, 40)
    return _case(parents, tokens, argmax, start)


def cases(seed: int, n: int):
    fixed = [
        _case([0, 0, 1], [3, 4, 5], [9, 9, 9, 9], note="edge: no node matches (nothing accepted)"),
        _case([0, 1, 2], [3, 4, 5], [3, 4, 5, 6], note="edge: a chain, every node accepted"),
        _case([0, 0, 1, 2], [3, 4, 5, 6], [4, 9, 6, 9, 9], note="edge: the path runs through the second child"),
        _case([0, 0, 2], [3, 4, 5], [3, 9, 5, 9], note="edge: a grandchild matches under a rejected parent"),
        _case([0, 1, 0, 2], [3, 4, 7, 5], [3, 4, 5, 9, 9], note="edge: the path's first nodes are already in place"),
        _case([0], [3], [3, 1], note="edge: a single node, accepted"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    return _random(d, growing(i, count))


def compare(expected, got, case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"expected a triple (path, src, dst), got {type(got).__name__}"
    return (first_difference(expected[0], got[0], "path", "entry")
            or first_difference(expected[1], got[1], "src", "entry")
            or first_difference(expected[2], got[2], "dst", "entry"))


def draw(case, expected, got):
    from nwor_lab.viz.tree import tree_figure
    import plotly.graph_objects as go
    from nwor_lab.viz.theme import HIGHLIGHT
    from nwor_lab.viz.tree import tree_layout
    inp = case.inputs
    parents, tokens, arg = inp["parents"].tolist(), inp["draft_tokens"].tolist(), inp["target_argmax"].tolist()
    want = set(expected[0].tolist())
    path = [i + 1 in want for i in range(len(parents))]
    hover = [f"t_last: the target's argmax after it is {arg[0]}"] + [
        f"node {i}: token {tokens[i - 1]}, parent {parents[i - 1]}; the target's argmax after it is {arg[i]}"
        for i in range(1, len(parents) + 1)]
    fig = tree_figure(parents, [str(t) for t in tokens], path, hover=hover,
                      title="tree_commit_plan: the accepted path (blue) and yours (red rings)",
                      subtitle=f"{case.note}; node label = index·token; the target's argmax per row: {arg}")
    try:
        mine = [int(i) for i in torch.as_tensor(got[0]).tolist()]
    except Exception:  # noqa: BLE001 - unreadable output: draw the expected side only
        mine = []
    x, y = tree_layout(parents)
    mine = [i for i in mine if 0 < i <= len(parents)]
    fig.add_trace(go.Scatter(x=[x[i] for i in mine], y=[y[i] for i in mine], mode="markers", name="your path",
                             marker=dict(size=26, symbol="circle-open", color=HIGHLIGHT, line=dict(width=3)),
                             hoverinfo="skip"))
    return fig


PREDICT = Prediction(
    question="t_last has children 1 (token 5) and 2 (token 7); node 1 has child 3 (token 9); node 2 has children 4 "
             "(token 3) and 5 (token 4); "
             "the target's argmax after t_last is 7, after node 2 it is 4, after node 5 it is 8. The write-all "
             "window put row j at slot 20 + j. Which (src, dst) copies does write-all + move make?",
    inputs=lambda: _case([0, 0, 1, 2, 2], [5, 7, 9, 3, 4], [7, 0, 4, 0, 0, 8], start=20).inputs,
    answer=lambda out: [(int(s), int(t)) for s, t in zip(out[1], out[2]) if s != t],
    explain=lambda s: (f"{s}: the path is node 2 (depth 1) then node 5 (depth 2); node 2 sits at slot 22 but belongs "
                       f"at n + 1 = 21, node 5 at 25 but belongs at 22. Under stage the same two rows go from the "
                       f"staging buffer straight to 21 and 22, and slots 23 .. 25 are never written."))

HINTS = (
    "Walk down from t_last (row 0): among the nodes whose parent is the current row, the one whose token equals "
    "target_argmax[current row] is accepted; stop when none does. Siblings carry distinct tokens, so at most one "
    "child matches.",
    "The i-th accepted node sits at depth i + 1, so it belongs at position n + i + 1: dst = slots[1 : a + 1]. "
    "Write-all wrote node j at position n + j: src = slots[path]. Return int64 tensors (empty ones when a = 0).",
)

EXERCISE = Exercise("tree_commit_plan", cases, compare, draw, hints=HINTS, predict=PREDICT)
