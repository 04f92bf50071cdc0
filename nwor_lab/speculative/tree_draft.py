"""Draft trees: EAGLE-2's dynamic tree and static trees, as fixed-shape device code around a step.

The drafter is a callback, so the same expansion serves the EAGLE-1 and EAGLE-3 heads (and a toy):

    step(tokens [R, F], parent_rows [R, F], level) -> log-probs [R, F, V]

runs the head over F frontier nodes per request (`tokens`: their draft tokens; `parent_rows`: the
frontier row of each node's parent in the previous `step` call, -1 for children of t_last; `level`:
their depth, 1-based) and returns the distribution of each node's children. Frontier rows are
numbered in call order: rows of call 1 are 0 .. F-1, of call 2 F .. 2F-1, ... (`DraftTree.row`
tells each node's row, -1 for a node never expanded).

EAGLE-2 (`dynamic_tree`, Li et al. 2024): the root's top-k children form the first frontier; at each
of the next `depth - 1` levels every frontier node proposes its top-k children, scored by cumulative
log-probability (the product of the draft's probabilities along the path), and the top-k of those
k * k candidates become the next frontier. Every candidate ever proposed is kept in a pool; the
tree is the `num_nodes` best of the pool (rerank). A child never outscores its parent (log-probs are
<= 0) and ties keep pool order, so the kept nodes are ancestor-closed. A chain is topk = 1.

Static trees (`static_tree`, Medusa / EAGLE-1): a list of paths of child ranks, e.g. [(0,), (1,),
(0, 0), (0, 1), (1, 0)]: node (0, 1) is the second-best child of the best child of t_last.

Shapes are fixed by (topk, depth, num_nodes) or the path list, so both run under CUDA-graph capture
(no host sync: selection by sort, maps by scatter).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """R trees of N nodes each, nodes numbered parents first (node i+1 -> parents[:, i] in 0 .. i).

    parents [R, N] int64 (0 = t_last); tokens [R, N] int64; scores [R, N] float32 cumulative draft
    log-probability; row [R, N] int64 the node's frontier row in the step calls (-1: a leaf never
    expanded); depth / max_children: host bounds for TreeWindow.from_tensors.
    """

    parents: torch.Tensor
    tokens: torch.Tensor
    scores: torch.Tensor
    row: torch.Tensor
    depth: int
    max_children: int

    @property
    def num_nodes(self) -> int:
        return self.parents.shape[1]


def check_tree_shape(topk: int, depth: int, num_nodes: int) -> None:
    for name, v in (("topk", topk), ("depth", depth), ("num_nodes", num_nodes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: expected an int >= 1")
    most = topk + (depth - 1) * topk * topk
    if num_nodes > most:
        raise ValueError(f"num_nodes={num_nodes}: a tree of topk={topk}, depth={depth} proposes at most {most} "
                         f"nodes (topk + (depth - 1) * topk^2); lower num_nodes or raise depth / topk")


def dynamic_tree(step, root_logprobs: torch.Tensor, topk: int, depth: int, num_nodes: int) -> DraftTree:
    """EAGLE-2's tree (module doc). root_logprobs [R, V]: the head's log-probs at t_last's row."""
    check_tree_shape(topk, depth, num_nodes)
    R, V = root_logprobs.shape
    dev = root_logprobs.device
    k = min(topk, V)
    lp, tok = root_logprobs.float().topk(k, dim=1)                     # [R, k]
    # the pool: every candidate, in proposal order (parents before children)
    score, token, parent, row = [lp], [tok], [torch.full_like(tok, -1)], [torch.full_like(tok, -1)]
    front_pool = torch.arange(k, device=dev).expand(R, k)               # pool index of each frontier node
    front_score, front_tok = lp, tok
    front_parent_row = torch.full_like(tok, -1)
    pool_size, rows_done = k, 0
    for level in range(1, depth):
        # this frontier is expanded: its nodes get step rows rows_done .. rows_done + k - 1
        frontier_rows = rows_done + torch.arange(k, device=dev).expand(R, k)
        _set_rows(row, front_pool, frontier_rows)
        logp = step(front_tok, front_parent_row, level).float()        # [R, k, V]
        clp, ctok = logp.topk(k, dim=2)                                # [R, k, k]
        cscore = (front_score[:, :, None] + clp).reshape(R, k * k)
        ctok = ctok.reshape(R, k * k)
        cparent = front_pool[:, :, None].expand(R, k, k).reshape(R, k * k)
        score.append(cscore), token.append(ctok), parent.append(cparent)
        row.append(torch.full_like(ctok, -1))
        cpool = pool_size + torch.arange(k * k, device=dev).expand(R, k * k)
        best = torch.sort(-cscore, dim=1, stable=True).indices[:, :k]   # the next frontier
        front_pool = cpool.gather(1, best)
        front_score = cscore.gather(1, best)
        front_tok = ctok.gather(1, best)
        front_parent_row = frontier_rows.gather(1, best // k)
        pool_size += k * k
        rows_done += k
    return _rerank(torch.cat(score, 1), torch.cat(token, 1), torch.cat(parent, 1), torch.cat(row, 1),
                   num_nodes, depth, k)


def _set_rows(row_chunks: list, pool_idx: torch.Tensor, rows: torch.Tensor) -> None:
    """row[pool_idx] = rows over the chunked pool (a scatter into the chunk each index falls in)."""
    flat = torch.cat(row_chunks, 1)
    flat.scatter_(1, pool_idx, rows)
    sizes = [c.shape[1] for c in row_chunks]
    row_chunks[:] = list(flat.split(sizes, 1))


def _rerank(score, token, parent, row, num_nodes: int, depth: int, max_children: int) -> DraftTree:
    """Keep the `num_nodes` best of the pool, renumbered in pool order (parents first)."""
    R, P = score.shape
    dev = score.device
    keep = torch.sort(-score, dim=1, stable=True).indices[:, :num_nodes]   # ties: pool order
    keep = torch.sort(keep, dim=1).values                                   # renumbered parents first
    number = torch.full((R, P + 1), 0, dtype=torch.long, device=dev)      # pool index -> node number
    number.scatter_(1, keep, torch.arange(1, num_nodes + 1, device=dev).expand(R, num_nodes))
    par_pool = parent.gather(1, keep)                                       # -1: t_last
    parents = number.gather(1, torch.where(par_pool < 0, P, par_pool))      # column P stays 0
    return DraftTree(parents=parents, tokens=token.gather(1, keep), scores=score.gather(1, keep),
                     row=row.gather(1, keep), depth=depth, max_children=max_children)


def check_paths(paths) -> list[tuple[int, ...]]:
    """Static tree paths: non-empty tuples of child ranks >= 0, each path's prefix listed too."""
    out = []
    for i, p in enumerate(paths):
        p = tuple(p)
        if not p or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in p):
            raise ValueError(f"paths[{i}]={p!r}: expected a non-empty tuple of child ranks >= 0")
        out.append(p)
    have = set(out)
    if len(have) != len(out):
        raise ValueError("paths: a path is listed twice")
    for p in out:
        if len(p) > 1 and p[:-1] not in have:
            raise ValueError(f"paths: {p} needs its parent {p[:-1]} in the list too")
    return sorted(out, key=lambda p: (len(p), p))


def static_tree(step, root_logprobs: torch.Tensor, paths) -> DraftTree:
    """A fixed tree shape (module doc): node `path` is the `path[-1]`-th best child of node `path[:-1]`."""
    paths = check_paths(paths)
    R, V = root_logprobs.shape
    dev = root_logprobs.device
    number = {p: i + 1 for i, p in enumerate(paths)}
    depth = max(len(p) for p in paths)
    width = max(p[-1] for p in paths) + 1
    if width > V:
        raise ValueError(f"paths: a child rank {width - 1} but the vocabulary has {V} tokens")
    N = len(paths)
    tokens = torch.zeros(R, N, dtype=torch.long, device=dev)
    scores = torch.zeros(R, N, dtype=torch.float32, device=dev)
    rows = torch.full((R, N), -1, dtype=torch.long, device=dev)
    logp = {(): root_logprobs.float()}                                 # node path -> [R, V] children's log-probs
    node_score = {(): torch.zeros(R, device=dev)}
    rows_done, row_of = 0, {}                                          # host: the shape is static
    for d in range(1, depth + 1):
        level = [p for p in paths if len(p) == d]
        for p in level:
            lp, tok = logp[p[:-1]].topk(p[-1] + 1, dim=1)
            i = number[p] - 1
            tokens[:, i], node_score[p] = tok[:, -1], node_score[p[:-1]] + lp[:, -1]
            scores[:, i] = node_score[p]
        expand = [p for p in level if any(q[:-1] == p for q in paths)]
        if not expand:
            continue
        parent_rows = torch.tensor([row_of.get(p[:-1], -1) for p in expand], device=dev).expand(R, len(expand))
        for j, p in enumerate(expand):
            rows[:, number[p] - 1] = row_of[p] = rows_done + j
        out = step(tokens[:, [number[p] - 1 for p in expand]], parent_rows, d).float()
        for j, p in enumerate(expand):
            logp[p] = out[:, j]
        rows_done += len(expand)
    parents = torch.tensor([number.get(p[:-1], 0) for p in paths], device=dev).expand(R, N).clone()
    return DraftTree(parents=parents, tokens=tokens, scores=scores, row=rows, depth=depth, max_children=width)
