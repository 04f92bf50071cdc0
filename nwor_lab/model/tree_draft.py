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
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.speculative.tree_window import BITS, words_for
from nwor_lab.window import Acceptance, Window


class HeadTreeStep:
    """`step(tokens [R, F], parent_rows [R, F], level) -> log-probs [R, F, V]` for dynamic_tree /
    static_tree, writing the head's layer through `policy` (one window, opened by `open`, committed
    rejecting every row by `close`). Every tensor is made on the device (no host read: the engine's
    captured steps call it too): request r's committed length `base [R]`, its block table row of
    `tables [R, max_blocks]`; rows of a request that does not run on (`live [R]` False) write nowhere."""

    def __init__(self, head, cache, policy, g_root: torch.Tensor, base: torch.Tensor, tables: torch.Tensor,
                 frontier: int, steps: int, *, live: torch.Tensor | None = None, attention: str = "auto"):
        self.head, self.cache, self.policy = head, cache, policy
        self.g_root, self.base, self.tables = g_root, base.long(), tables
        self.F, self.steps, self.attention = frontier, steps, attention
        R, dev = base.shape[0], base.device
        self.R = R
        rows = steps * frontier                                # request-local rows of the draft window
        self.words = words_for(max(1, rows))
        self.bits = torch.zeros(R, max(1, rows), self.words, dtype=torch.long, device=dev)
        self.g = torch.zeros(R, max(1, rows), g_root.shape[-1], dtype=g_root.dtype, device=dev)
        # every row a draft (nothing is kept), step-major; write-all slot of row j at base + j
        s = torch.arange(steps, device=dev)[:, None, None]
        r = torch.arange(R, device=dev)[None, :, None]
        f = torch.arange(frontier, device=dev)[None, None, :]
        j = (s * frontier + f).expand(steps, R, frontier).flatten()
        req = r.expand(steps, R, frontier).flatten()
        pos = self.base[req] + j
        if live is not None:
            pos = torch.where(live[req], pos, -1)
        slots = build_slot_mapping(tables, req, pos, cache.spec.block_size)
        order = torch.argsort(req * rows + j)                                # request-major draft rows
        self.window = Window(slots, req.to(torch.int32), (j + 1).to(torch.int32), order, [rows] * R, [rows] * R,
                             positions=self.base[req] + j)
        # every row rejected, made on the device (Acceptance.rejecting_all copies its lengths from the host)
        zero = torch.zeros(R, dtype=torch.int32, device=dev)
        self.reject = Acceptance(torch.zeros(R * rows, dtype=torch.bool, device=dev), zero,
                                 self.window.commit_mask_from(zero))
        self.in_buffer = policy.window_in_buffer
        self.qsl = torch.arange(0, R * frontier + 1, frontier, dtype=torch.int32, device=dev)
        self.done = 0

    def open(self) -> None:
        layer = self.head.layer_index
        self.policy.begin(self.window, layers=range(layer, layer + 1), kind="draft")

    def close(self):
        return self.policy.commit(self.reject)

    def __call__(self, tokens: torch.Tensor, parent_rows: torch.Tensor, level: int) -> torch.Tensor:
        R, F = tokens.shape
        if F != self.F or self.done >= self.steps:
            raise ValueError(f"step {self.done + 1}: {F} frontier nodes, built for {self.F} x {self.steps} steps")
        dev = tokens.device
        j = self.done * F + torch.arange(F, device=dev)                     # this step's rows
        features = grow_frontier(self.bits, self.g, self.g_root, parent_rows, j)
        offset = self.done * R * F
        so_far = (self.done + 1) * F
        positions = (self.base[:, None] + (level - 1)).expand(R, F).reshape(-1)
        if self.in_buffer:      # request r's draft rows so far in the buffer: s * R * F + r * F + f
            win_rows = (torch.arange(self.done + 1, device=dev)[None, :, None] * (R * F)
                        + torch.arange(R, device=dev)[:, None, None] * F
                        + torch.arange(F, device=dev)[None, None, :]).reshape(-1)
            win_start = torch.arange(0, R * so_far + 1, so_far, dtype=torch.int32, device=dev)
            lens = self.base.to(torch.int32)
        else:
            win_rows = win_start = None
            lens = (self.base + so_far).to(torch.int32)
        kernel = KernelArgs(self.tables, lens, self.qsl, win_rows, win_start, 0, 0, max_query_len=F,
                            tree_lo=self.base.to(torch.int32))
        md = AttentionMetadata(positions, self.window.slot_mapping[offset:offset + R * F], self.cache, self.policy,
                               kernel, offset, self.attention,
                               tree_mask=self.bits[:, j].reshape(R * F, self.words)[:, :words_for(so_far)].contiguous())
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
    from g_root `[R, h]` (its output at each request's t_last row), `context_lens [R]` (list or
    tensor) committed positions and `block_tables` (lists or an `[R, max_blocks]` tensor) each.
    -> (DraftTree, WindowRecord of the head's draft window)."""
    from nwor_lab.speculative.tree_draft import check_paths, dynamic_tree, static_tree
    root = torch.log_softmax(head.compute_logits(g_root).float(), -1)
    dev = cache.device
    base = torch.as_tensor(context_lens, dtype=torch.long, device=dev)
    tables = block_tables.to(dev, torch.int32) if torch.is_tensor(block_tables) else \
        block_table_tensor(block_tables, dev).to(torch.int32)
    if paths is not None:
        paths = check_paths(paths)
        levels = [[p for p in paths if len(p) == d and any(q[:-1] == p for q in paths)]
                  for d in range(1, max(map(len, paths)) + 1)]
        widths = [len(x) for x in levels if x]
        if len(set(widths)) > 1:
            raise ValueError(f"paths: the head's draft window needs the same number of expanded nodes at every "
                             f"level, got {widths}")
        step = HeadTreeStep(head, cache, policy, g_root, base, tables, widths[0] if widths else 1, len(widths),
                            attention=attention)
        run = lambda: static_tree(step, root, paths)       # noqa: E731
    else:
        step = HeadTreeStep(head, cache, policy, g_root, base, tables, topk, depth - 1, attention=attention)
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
