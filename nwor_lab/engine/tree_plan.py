"""What a draft tree's shape fixes in the engine (host numbers, known before any step).

    nodes      N draft nodes per verify window (every window of a request has N, the last ones cut by the
               token budget pad to N with token -1, never written, never accepted)
    depth      D, the deepest node (the verify window's sampled ids are [D + 1] wide)
    children   the most children a node has (topk, or a static tree's widest rank + 1)
    frontier, steps   the head's draft window: `steps` head passes of `frontier` nodes each
               (EAGLE-2: depth - 1 passes of topk; a static tree: one pass per expanded level, and
               every expanded level must have the same width)
    lookahead  positions past a request's t_last that one step may write under write-all: the
               verify window's n .. n + N, then the head's draft window from the next t_last
               (n + a + 1 <= n + D + 1) on, steps * frontier rows
"""
from __future__ import annotations

from dataclasses import dataclass

from nwor_lab.config import TreeShape


@dataclass(frozen=True)
class TreePlan:
    shape: TreeShape
    nodes: int
    depth: int
    children: int
    frontier: int
    steps: int

    @property
    def draft_rows(self) -> int:
        """Rows per request of the head's draft window."""
        return self.steps * self.frontier

    @property
    def lookahead(self) -> int:
        return max(self.nodes, self.depth + 1 + self.draft_rows) + 1

    def draft_kwargs(self) -> dict:
        """Keyword arguments of `model.tree_draft.draft_tree_with_head` for this shape."""
        s = self.shape
        if s.is_static:
            return dict(paths=list(s.paths))
        return dict(topk=s.topk, depth=s.depth, num_nodes=s.nodes)


def tree_plan(shape: TreeShape) -> TreePlan:
    """The plan of a parsed `LabConfig.tree` (see the module doc)."""
    if shape.is_static:
        paths = list(shape.paths)
        depth = max(len(p) for p in paths)
        levels = [[p for p in paths if len(p) == d and any(q[:-1] == p for q in paths)] for d in range(1, depth + 1)]
        widths = [len(x) for x in levels if x]
        if len(set(widths)) > 1:
            raise ValueError(f"LabConfig.tree={shape.spelling!r}: the head's draft window needs the same number of "
                             f"expanded nodes at every level, got {widths}; list the same number of parents per "
                             f"level")
        return TreePlan(shape, len(paths), depth, max(p[-1] for p in paths) + 1, widths[0] if widths else 1,
                        len(widths))
    return TreePlan(shape, shape.nodes, shape.depth, shape.topk, shape.topk, shape.depth - 1)


def host_path(parents: list[int], tokens: list[int], sampled: list[int], accepted: int) -> list[int]:
    """The accepted root path as node numbers (1-based) from the host copies: at depth d the child of
    the node before whose token is sampled[d - 1] (siblings carry distinct tokens: one at most)."""
    path, cur = [], 0
    for d in range(accepted):
        nxt = next((i + 1 for i, (p, t) in enumerate(zip(parents, tokens)) if p == cur and t == sampled[d]), None)
        if nxt is None:
            raise RuntimeError(f"accepted token {sampled[d]} at depth {d + 1} is no child of node {cur} (engine bug)")
        path.append(nxt)
        cur = nxt
    return path
