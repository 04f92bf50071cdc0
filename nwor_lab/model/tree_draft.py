"""An EAGLE head drafting a tree: the `step` of nwor_lab.speculative.tree_draft, run through a write
policy's window on the head's cache layer (EAGLE-1 and EAGLE-3 alike: `head(ids, features, md)`).

Step s (1-based) runs the head over F frontier nodes per request: node f's input is its token and
the head output g of its parent (g_root, the head's output at t_last's row, for depth-1 nodes), at
position n + s - 1 (a chain's step s is at the same position), attending the head layer's committed
prefix (positions < n) and its ancestors' rows among the earlier steps and itself (a tree mask over
the draft window's rows; siblings and cousins are invisible).

The head's K/V for frontier nodes is provisional state: it is computed from *predicted* features and
none of it is ever kept, exactly like a chain's. The draft window is committed with nothing accepted
(`Acceptance.rejecting_all`), so:
  stage  keeps it in its staging buffer, never in the cache (the head layer is untouched);
  cow    writes it at positions n .. n + (depth - 1) * F - 1 of the head layer, then restores them;
  off    leaves it there (the next verify's head pass overwrites positions n .. n + a; rows past that
         stay until later tokens overwrite them), so a tree needs (depth - 1) * F head slots past n
         under write-all, where a chain needs k - 1.
Rows are step-major (step s's R * F rows together), request-local row j = (s - 1) * F + f at position
n + j under write-all.
"""
from __future__ import annotations

import torch

from nwor_lab.kv import block_table_tensor, build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.tree import BITS, words_for
from nwor_lab.window import Acceptance, Window


class HeadTreeStep:
    """`step(tokens [R, F], parent_rows [R, F], level) -> log-probs [R, F, V]` for dynamic_tree /
    static_tree, writing the head's layer through `policy` (one window, opened by `open`, committed
    rejecting every row by `close`)."""

    def __init__(self, head, cache, policy, g_root: torch.Tensor, context_lens: list[int],
                 block_tables: list[list[int]], frontier: int, steps: int, *, attention: str = "torch"):
        self.head, self.cache, self.policy = head, cache, policy
        self.g_root, self.ctx, self.tables = g_root, [int(c) for c in context_lens], block_tables
        self.F, self.steps, self.attention = frontier, steps, attention
        R, dev = len(self.ctx), cache.device
        rows = steps * frontier                                # request-local rows of the draft window
        self.words = words_for(max(1, rows))
        self.bits = torch.zeros(R, max(1, rows), self.words, dtype=torch.long, device=dev)
        self.g = torch.zeros(R, max(1, rows), g_root.shape[-1], dtype=g_root.dtype, device=dev)
        self.window = self._window(R, rows)
        self.done = 0

    def _window(self, R: int, rows: int) -> Window:
        """Every row a draft (nothing is kept), step-major; write-all slot of row j at n + j."""
        dev = self.cache.device
        s = torch.arange(self.steps, device=dev)[:, None, None]
        r = torch.arange(R, device=dev)[None, :, None]
        f = torch.arange(self.F, device=dev)[None, None, :]
        j = (s * self.F + f).expand(self.steps, R, self.F).flatten()         # request-local row
        req = r.expand(self.steps, R, self.F).flatten()
        pos = torch.tensor(self.ctx, device=dev)[req] + j
        slots = build_slot_mapping(block_table_tensor(self.tables, dev), req, pos, self.cache.spec.block_size)
        order = torch.argsort(req * rows + j)                                # request-major draft rows
        return Window(slots, req.to(torch.int32), (j + 1).to(torch.int32), order, [rows] * R, [rows] * R,
                      positions=pos)

    def open(self) -> None:
        layer = self.head.layer_index
        self.policy.begin(self.window, layers=range(layer, layer + 1), kind="draft")

    def close(self):
        return self.policy.commit(Acceptance.rejecting_all(self.window))

    def __call__(self, tokens: torch.Tensor, parent_rows: torch.Tensor, level: int) -> torch.Tensor:
        R, F = tokens.shape
        if F != self.F or self.done >= self.steps:
            raise ValueError(f"step {self.done + 1}: {F} frontier nodes, built for {self.F} x {self.steps} steps")
        dev = self.cache.device
        j = self.done * F + torch.arange(F, device=dev)                     # this step's rows
        features = grow_frontier(self.bits, self.g, self.g_root, parent_rows, j)
        offset = self.done * R * F
        positions = [c + level - 1 for c in self.ctx for _ in range(F)]
        so_far = (self.done + 1) * F
        window_rows = [[s * R * F + r * F + f for s in range(self.done + 1) for f in range(F)] for r in range(R)]
        md = AttentionMetadata.build(self.cache, self.policy, positions, [F] * R, self.tables, self.ctx,
                                     window_rows=window_rows, write_offset=offset,
                                     slot_mapping=self.window.slot_mapping[offset:offset + R * F],
                                     attention=self.attention,
                                     tree_mask=self.bits[:, j].reshape(R * F, self.words)[:, :words_for(so_far)])
        out = self.head(tokens.reshape(-1), features.reshape(R * F, -1), md)
        self.g[:, j] = out.view(R, F, -1)
        self.done += 1
        return torch.log_softmax(self.head.compute_logits(out).float(), -1).view(R, F, -1)


def grow_frontier(bits: torch.Tensor, g: torch.Tensor, g_root: torch.Tensor, parent_rows: torch.Tensor,
                  rows: torch.Tensor) -> torch.Tensor:
    """One level of a draft tree in the head's window, in place and on the device: each frontier
    node's ancestor bits (its parent row's, plus its own bit) into `bits` [R, rows so far, words] at
    `rows` [F], and -> the features it drafts from [R, F, h]: its parent row's head output in `g`
    [R, rows so far, h], or `g_root` [R, h] for a child of t_last (`parent_rows` [R, F] -1)."""
    R, F = parent_rows.shape
    words = bits.shape[-1]
    dev = parent_rows.device
    par = parent_rows.clamp(min=0)
    inherited = bits.gather(1, par[..., None].expand(R, F, words))
    inherited = torch.where((parent_rows >= 0)[..., None], inherited, 0)
    own = torch.zeros(F, words, dtype=torch.long, device=dev)
    own[torch.arange(F, device=dev), rows // BITS] = torch.ones_like(rows) << (rows % BITS)
    bits[:, rows] = inherited | own[None]
    return torch.where((parent_rows >= 0)[..., None], g.gather(1, par[..., None].expand(R, F, g.shape[-1])),
                       g_root[:, None, :])


@torch.no_grad()
def draft_tree_with_head(head, cache, policy, g_root, context_lens, block_tables, *, topk: int = 0,
                         depth: int = 0, num_nodes: int = 0, paths=None, attention: str = "torch"):
    """EAGLE-2's dynamic tree (topk, depth, num_nodes) or a static tree (`paths`) drafted by `head`
    from g_root `[R, h]` (its output at each request's t_last row). -> (DraftTree, WindowRecord of the
    head's draft window)."""
    from nwor_lab.speculative.tree_draft import check_paths, dynamic_tree, static_tree
    root = torch.log_softmax(head.compute_logits(g_root).float(), -1)
    if paths is not None:
        paths = check_paths(paths)
        levels = [[p for p in paths if len(p) == d and any(q[:-1] == p for q in paths)]
                  for d in range(1, max(map(len, paths)) + 1)]
        widths = [len(x) for x in levels if x]
        if len(set(widths)) > 1:
            raise ValueError(f"paths: the head's draft window needs the same number of expanded nodes at every "
                             f"level, got {widths}")
        step = HeadTreeStep(head, cache, policy, g_root, context_lens, block_tables, widths[0] if widths else 1,
                            len(widths), attention=attention)
        run = lambda: static_tree(step, root, paths)       # noqa: E731
    else:
        step = HeadTreeStep(head, cache, policy, g_root, context_lens, block_tables, topk, depth - 1,
                            attention=attention)
        run = lambda: dynamic_tree(step, root, topk, depth, num_nodes)   # noqa: E731
    if step.steps == 0:
        return run(), None
    step.open()
    try:
        tree = run()
        record = step.close()
    except BaseException:
        if policy.window is not None:
            policy.cancel()
        raise
    return tree, record
