"""Tree acceptance: which root path of a tree window the target keeps, on the device, no host sync.

Row t of `target_logits [T, V]` is the target's distribution for the token AFTER row t (so a node's
own draft is judged at its parent's row, and the bonus at the path's last row).

Greedy (`accept_tree_greedy`): a node matches when its token is the target's argmax at its parent;
the accepted path is the deepest node whose every ancestor matches too (`match_closure`: one
gather per depth, a static loop of `window.max_depth` steps), then the bonus token is the target's
argmax at that node. Siblings carry distinct tokens (TreeWindow checks), so at most one child of a
node matches and the path is unique.

Stochastic (`accept_tree_sampled`): recursive rejection sampling over each node's children, as
SpecInfer / EAGLE verify trees (Jeon et al. 2024, "Recursive Speculative Decoding", without
replacement). At the current node, with target p and draft q over its children's tokens, child x_j
is accepted with probability min(1, p(x_j) / q(x_j)); on rejection p <- norm(max(p - q, 0)) and
q <- q with x_j removed, renormalised; the walk moves to the accepted child, or, when every child
is rejected, emits a token sampled from the residual p. After the path's last node, the bonus comes
from the target at that node. With candidates drawn from q without replacement (or q one-hot, the
point mass of a top-k drafter: `draft_probs=None`), every emitted token follows the target exactly.
Randomness: one uniform per node `[T]` float64 (a node is tested at most once) and one exponential
row per request `[R, V]` for the final token, both drawn up front from `generator`, so the same seed
gives the same path whatever the write strategy.

Output: `TreeVerdict(sampled [R, max_depth + 1] int32, path_mask [T] bool, accepted_len [R] int32)`:
the path's tokens by depth, then the bonus / recovered token, then -1 (vLLM's layout), and the
Acceptance (`verdict.acceptance(window)`) that the write policies commit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab._checks import FLOAT_DTYPES, INDEX_DTYPES, check_tensor
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID
from nwor_lab.speculative.tree_window import BITS, TreeWindow
from nwor_lab.window import Acceptance


@dataclass
class TreeVerdict:
    sampled: torch.Tensor        # [R, max_depth + 1] int32: path tokens, then the target's own, then -1
    path_mask: torch.Tensor      # [T] bool: rows on the accepted path (t_last included)
    accepted_len: torch.Tensor   # [R] int32: nodes on the path

    def path_rows(self, window: TreeWindow) -> torch.Tensor:
        """[R, max_depth + 1] int64 window rows of t_last and the path by depth, -1 past the path:
        the rows the head's pass after verify reads (fixed shape, no sync)."""
        R, width = window.num_reqs, window.max_depth + 1
        dev = self.path_mask.device
        out = torch.full((R * width + 1,), -1, dtype=torch.long, device=dev)
        at = window.token_req.long() * width + window.token_depth.long()
        out[torch.where(self.path_mask, at, R * width)] = torch.arange(window.num_tokens, device=dev)
        return out[:-1].view(R, width)

    def acceptance(self, window: TreeWindow) -> Acceptance:
        """The Acceptance the write policies commit (draft mask = the path's nodes)."""
        draft_mask = self.path_mask[window.draft_rows.to(self.path_mask.device)]
        return Acceptance(draft_mask, self.accepted_len, window.commit_mask_for(draft_mask, self.accepted_len))


def _check(window: TreeWindow, target_logits: torch.Tensor) -> None:
    if not isinstance(window, TreeWindow):
        raise TypeError(f"window: expected a nwor_lab.speculative.tree_window.TreeWindow, got {type(window).__name__}")
    if window.draft_token_ids is None:
        raise ValueError("window: draft_token_ids missing; build the TreeWindow with the nodes' tokens")
    check_tensor("target_logits", target_logits, ndim=2, dtypes=FLOAT_DTYPES, device=window.token_req.device,
                 what="[num_tokens, vocab]: row t = the target's logits for the token after row t")
    if target_logits.shape[0] != window.num_tokens:
        raise ValueError(f"target_logits: {target_logits.shape[0]} rows but the window has {window.num_tokens}")


def _row_tokens(window: TreeWindow, vocab: int) -> torch.Tensor:
    """[T] int64 each row's draft token (-1 for t_last and for padding / out-of-vocabulary drafts)."""
    tok = torch.full((window.num_tokens,), -1, dtype=torch.long, device=window.token_req.device)
    ids = window.draft_token_ids.long()
    ids = ids.masked_fill((ids < 0) | (ids >= vocab), -1)
    return tok.index_put((window.draft_rows,), ids)


def match_closure(window: TreeWindow, match: torch.Tensor) -> torch.Tensor:
    """[T] bool: rows whose own `match` and every ancestor's hold (t_last rows always). One gather
    per depth level, `window.max_depth` of them (a host constant: capturable)."""
    ok = match | (window.token_depth == 0)
    parent = window.token_parent
    root = parent < 0
    for _ in range(window.max_depth):
        ok = match & (root | ok[parent.clamp(min=0)]) | (window.token_depth == 0)
    return ok


def path_from_best(window: TreeWindow, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the rows whose whole root path holds: per request the deepest such row (lowest index on
    a tie), `(best_row [R], path_mask [T], accepted_len [R])`. Segment max by scatter_reduce, the path
    by one gather of the best row's ancestor bits: no sync."""
    T, dev = window.num_tokens, ok.device
    rows = torch.arange(T, device=dev)
    depth = window.token_depth.long()
    score = torch.where(ok, depth * (T + 1) + (T - rows), torch.full_like(rows, -1))
    best = torch.full((window.num_reqs,), -1, dtype=torch.long, device=dev)
    best = best.scatter_reduce(0, window.token_req.long(), score, "amax")
    best_row = T - best % (T + 1)
    req = window.token_req.long()
    start = torch.zeros(window.num_reqs, dtype=torch.long, device=dev).scatter_reduce(
        0, req, rows, "amin", include_self=False)
    local = rows - start[req]
    word = window.ancestors[best_row[req], local // BITS]
    path = ((word >> (local % BITS)) & 1).bool()
    return best_row, path, depth[best_row].to(torch.int32)


def _sampled_ids(window: TreeWindow, tokens: torch.Tensor, path: torch.Tensor, accepted_len: torch.Tensor,
                 last: torch.Tensor) -> torch.Tensor:
    """[R, max_depth + 1] int32: the path's tokens at their depths, `last` after them, -1 beyond."""
    R, width = window.num_reqs, window.max_depth + 1
    out = torch.full((R * width,), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=tokens.device)
    is_node = path & (window.token_depth > 0)
    at = window.token_req.long() * width + (window.token_depth.long() - 1)
    out = _scatter_where(out, at, tokens, is_node)
    reqs = torch.arange(R, device=tokens.device)
    out[reqs * width + accepted_len.long()] = last
    return out.view(R, width).to(torch.int32)


def _scatter_where(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """out[index[i]] = values[i] where keep[i]; fixed shapes: the others write into a scratch slot."""
    ext = torch.cat([out, out.new_full((1,), PLACEHOLDER_TOKEN_ID)])
    ext[torch.where(keep, index, torch.full_like(index, out.numel()))] = values
    return ext[:-1]


def accept_tree_greedy(window: TreeWindow, target_logits: torch.Tensor) -> TreeVerdict:
    """Greedy tree verification (module doc): the longest matching root path, then the bonus."""
    _check(window, target_logits)
    argmax = target_logits.argmax(-1)
    tokens = _row_tokens(window, target_logits.shape[1])
    parent = window.token_parent.clamp(min=0)
    match = (tokens >= 0) & (tokens == argmax[parent]) & (window.token_parent >= 0)
    best_row, path, acc = path_from_best(window, match_closure(window, match))
    return TreeVerdict(_sampled_ids(window, tokens, path, acc, argmax[best_row]), path, acc)


def accept_tree_from_sampled(window: TreeWindow, sampled: torch.Tensor) -> TreeVerdict:
    """SCV for trees: the path from sampled ids `[R, C]` (path tokens by depth, then one more, -1
    after), no host sync. Node t is on the path iff its token equals sampled[r, depth - 1], depth <=
    accepted length (non -1 ids minus one, as vLLM's runner counts), and its parent is on the path."""
    check_tensor("sampled", sampled, ndim=2, dtypes=INDEX_DTYPES, device=window.token_req.device,
                 what="[num_reqs, max_depth + 1]: path tokens, then the target's token, then -1")
    if sampled.shape[0] != window.num_reqs:
        raise ValueError(f"sampled: {sampled.shape[0]} rows but the window has {window.num_reqs} requests")
    acc = ((sampled != PLACEHOLDER_TOKEN_ID).sum(1) - 1).clamp(min=0)
    req = window.token_req.long()
    depth = window.token_depth.long()
    col = (depth - 1).clamp(min=0, max=sampled.shape[1] - 1)
    tokens = _row_tokens(window, 1 << 62)
    match = (depth > 0) & (depth <= acc[req]) & (tokens >= 0) & (tokens == sampled.long()[req, col])
    _, path, acc_len = path_from_best(window, match_closure(window, match))
    return TreeVerdict(sampled.to(torch.int32), path, acc_len)


def accept_tree_sampled(window: TreeWindow, target_logits: torch.Tensor, draft_probs: torch.Tensor | None,
                        temperature: float, generator: torch.Generator | None = None) -> TreeVerdict:
    """Recursive rejection sampling over the tree (module doc). draft_probs `[T, V]`: row t = the
    draft's distribution its children were drawn from (without replacement), or None for a top-k
    drafter (q one-hot on each candidate). temperature > 0 scales the target's logits."""
    _check(window, target_logits)
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: > 0 for sampling (0: use accept_tree_greedy)")
    T, V = target_logits.shape
    dev = target_logits.device
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, shape=(T, V), dtypes=FLOAT_DTYPES, device=dev,
                     what="[num_tokens, vocab]: row t = the draft distribution of row t's children")
    R = window.num_reqs
    tokens = _row_tokens(window, V)
    p_all = torch.softmax(target_logits.double() / temperature, -1)
    children = window.children                                  # [T, K] rows, -1 none
    u = torch.rand(T, dtype=torch.float64, device=dev, generator=generator)
    race = torch.empty((R, V), dtype=torch.float64, device=dev).exponential_(generator=generator)
    cur = torch.zeros(R, dtype=torch.long, device=dev).scatter_reduce(
        0, window.token_req.long(), torch.arange(T, device=dev), "amin", include_self=False)   # each t_last
    on_path = torch.zeros(T, dtype=torch.bool, device=dev)
    on_path.index_fill_(0, cur, True)     # not on_path[cur] = True: that copies a host scalar (no capture)
    active = torch.ones(R, dtype=torch.bool, device=dev)
    p = p_all[cur]
    for _ in range(window.max_depth):
        q = draft_probs[cur].double() if draft_probs is not None else None
        nxt = torch.full_like(cur, -1)
        for c in range(children.shape[1]):
            child = children[cur, c]
            x = tokens[child.clamp(min=0)]
            live = active & (nxt < 0) & (child >= 0)
            has_x = live & (x >= 0)
            xi = x.clamp(min=0)
            px = p.gather(1, xi[:, None])[:, 0]
            qx = q.gather(1, xi[:, None])[:, 0] if q is not None else torch.ones_like(px)
            ok = has_x & (qx > 0) & (u[child.clamp(min=0)] * qx <= px)   # u < p / q, without dividing
            nxt = torch.where(ok, child, nxt)
            rej = has_x & ~ok
            q_rej = q if q is not None else torch.zeros_like(p).scatter_(1, xi[:, None], 1.0)
            resid = (p - q_rej).clamp(min=0)
            total = resid.sum(1, keepdim=True)
            # residual all zero (only for an inconsistent q): keep p, the token stays in its support
            resid = torch.where(total > 0, resid / total.clamp(min=1e-300), p)
            p = torch.where(rej[:, None], resid, p)
            if q is not None:
                q_new = q.scatter(1, xi[:, None], 0.0)
                q_new = q_new / q_new.sum(1, keepdim=True).clamp(min=1e-300)
                q = torch.where(rej[:, None], q_new, q)
        moved = nxt >= 0
        hits = torch.zeros(T + 1, dtype=torch.int32, device=dev)
        on_path |= hits.index_add_(0, torch.where(moved, nxt, T), torch.ones_like(nxt, dtype=torch.int32))[:T] > 0
        cur = torch.where(moved, nxt, cur)
        p = torch.where(moved[:, None], p_all[cur], p)
        active &= moved
    last = torch.argmax(p / race, dim=-1)      # exponential race: one sample per request, no sync
    acc = window.token_depth.long()[cur].to(torch.int32)
    return TreeVerdict(_sampled_ids(window, tokens, on_path, acc, last), on_path, acc)
