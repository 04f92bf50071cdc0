"""A tree step's buffers and the head's tree drafting on device metadata (what `engine.step.run_step`
runs for `LabConfig.tree`; the body itself, its acceptance and its drafting calls, stay in step.py).

    TreeInputs          a tree verify window's buffers for `size` request slots of N nodes each, the
                        TreeWindow built from them on the device, its attention metadata (host lists
                        for eager steps, device tensors for a captured bucket)
    DeviceHeadTreeStep  `model.tree_draft.HeadTreeStep` with every tensor made on the device: the
                        step callback of EAGLE-2's `dynamic_tree` inside a captured step
"""
from __future__ import annotations

import torch

from nwor_lab.engine.buffers import StaticInputs
from nwor_lab.kv import build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.model.tree_draft import grow_frontier
from nwor_lab.tree import TreeWindow, words_for
from nwor_lab.window import Acceptance, Window


class TreeInputs:
    """Buffers of a tree verify window for `size` request slots, N = `engine.tree_plan.nodes` nodes
    each: per request `[t_last, node_1 .. node_N]` (rows request-major, N + 1 a request), the nodes'
    parents `[size, N]` (0 = t_last) and tokens `[size, N]` (-1: padding, a node cut by the token
    budget), each t_last's position `ctx [size]`. The TreeWindow itself is built from them on the
    device in the body (`TreeWindow.on_device`): depths, ancestor bits, slots. The ids, block
    tables, tokens left and prompt keys are StepInputs' own buffers."""

    def __init__(self, engine, size: int, static: bool = False):
        self.plan = engine.tree_plan
        n = self.plan.nodes
        self.size, self.nodes, self.static = size, n, static
        self.inputs = StaticInputs(engine.device, parents=((size, n), torch.long), node_tokens=((size, n), torch.long),
                                   ctx=((size,), torch.long))
        d = self.inputs.dev
        self.parents, self.node_tokens, self.ctx = d["parents"], d["node_tokens"], d["ctx"]

    def fill(self, engine, inp: "StepInputs", requests) -> None:
        """The requests' trees into the buffers (exact sizes: every request slot is a request);
        blocks allocated for the window's write-all rows and the next tree's draft window."""
        n, plan = self.nodes, self.plan
        h, t = inp.inputs.host, self.inputs.host
        ids, pos, slots, commit, ctx, qlens, ndrafts, parents, tokens = [], [], [], [], [], [], [], [], []
        for r, req in enumerate(requests):
            start = req.num_computed
            req.block_table.ensure(start + plan.lookahead)
            d = list(req.drafts)
            p = list(req.draft_parents[:len(d)])
            depth = [0]
            for q in p:
                depth.append(depth[q] + 1)
            parents.append(p)
            tokens.append(d)
            t["parents"][r] = p + [0] * (n - len(d))
            t["node_tokens"][r] = d + [-1] * (n - len(d))
            ids += [req.tokens[-1]] + d + [0] * (n - len(d))
            pos += [start + x for x in depth] + [start] * (n - len(d))
            slots += req.block_table.slots(range(start, start + 1 + len(d)))
            commit += req.block_table.slots([start + x for x in depth])
            ctx.append(start)
            qlens.append(1 + len(d))
            ndrafts.append(len(d))
        pad = self.size - len(requests)          # padding request slots (a bucket): no slot, never accepted
        for r in range(len(requests), self.size):
            t["parents"][r] = 0
            t["node_tokens"][r] = -1
        h["ids"][:] = ids + [0] * (pad * (n + 1))
        h["tables"].fill(0)
        for r, req in enumerate(requests):
            h["tables"][r, :len(req.block_table.blocks)] = req.block_table.blocks
        h["remaining"][:] = [r.remaining for r in requests] + [0] * pad
        h["req_key"][:] = [r.acceptance_key for r in requests] + [0] * pad
        h["chunk_next"][:] = -1                  # a tree window is no chunk of a prefill
        t["ctx"][:] = ctx + [0] * pad
        inp.inputs.upload()
        self.inputs.upload()
        inp.host = dict(requests=list(requests), ids=ids, slots=slots, commit_slots=commit, qlens=qlens, ctx=ctx,
                        ndrafts=ndrafts, kinds=["tree"] * len(requests), positions=pos, parents=parents,
                        node_tokens=tokens, tables=[list(r.block_table.blocks) for r in requests])

    def window(self, engine, inp: "StepInputs") -> TreeWindow:
        """The step's TreeWindow on the device (no host sync): write-all slots at n + row, commit
        slots at n + depth, padding nodes at slot -1 both ways."""
        bs = engine.cache.spec.block_size
        tok = self.node_tokens.reshape(-1)
        w = TreeWindow.on_device(self.parents, tok, inp.tables, self.ctx, bs, self.plan.depth, self.plan.children)
        pad = torch.zeros(w.num_tokens, dtype=torch.bool, device=tok.device).index_put((w.draft_rows,), tok < 0)
        pad |= (inp.remaining <= 0)[w.token_req.long()]           # a padding request slot's rows
        w.slot_mapping = torch.where(pad, -1, w.slot_mapping)
        w.commit_slots_ = torch.where(pad, -1, w.commit_slots_)
        w.positions = self.ctx[w.token_req.long()] + w.token_depth.long()
        return w

    def static_metadata(self, engine, inp: "StepInputs", w: TreeWindow) -> AttentionMetadata:
        """The same pass's metadata from device tensors only (a captured bucket): the kernel reads
        each request's N + 1 rows from key index n on (the cache under write-all, the staging buffer
        under stage), visible along the ancestor bits."""
        e = engine
        dev = self.ctx.device
        rows = self.nodes + 1
        in_buffer = e.policy.window_in_buffer
        qsl = torch.arange(0, self.size * rows + 1, rows, dtype=torch.int32, device=dev)
        lens = (self.ctx + (0 if in_buffer else rows)).to(torch.int32)
        kernel = KernelArgs(inp.tables, lens, qsl, inp.rows if in_buffer else None, qsl if in_buffer else None,
                            0, 0, max_query_len=rows, tree_lo=self.ctx.to(torch.int32))
        return AttentionMetadata(w.positions, w.slot_mapping, [0] * (self.size + 1), None, None, None, e.cache,
                                 e.policy, 0, kernel, tree_mask=w.ancestors)

    def host_metadata(self, engine, inp: "StepInputs", w: TreeWindow) -> AttentionMetadata:
        """The tree verify pass's metadata from the host lists (eager): each request's window rows from
        key index n on, visible along the ancestor bits; positions n + depth."""
        e, h = engine, inp.host
        return AttentionMetadata.build(e.cache, e.policy, w.positions, [self.nodes + 1] * self.size, h["tables"],
                                       h["ctx"], attention=e.config.attention, ledger=e.ledger,
                                       slot_mapping=w.slot_mapping, tree_mask=w.ancestors)


class DeviceHeadTreeStep:
    """`model.tree_draft.HeadTreeStep` (same rows, same attention, same writes) with every tensor
    made on the device: `step(tokens [R, F], parent_rows [R, F], level) -> log-probs [R, F, V]` over
    all R request slots, the draft window's rows step-major (step s's R * F rows together), row j of
    request r at position base[r] + j under write-all; rows of slots that do not run on are slot -1."""

    def __init__(self, e, tables: torch.Tensor, base: torch.Tensor, live: torch.Tensor, g_root: torch.Tensor):
        plan = e.tree_plan
        self.e, self.tables, self.base, self.g_root = e, tables, base, g_root
        self.F, self.steps = plan.frontier, plan.steps
        R, dev = base.shape[0], base.device
        self.R = R
        rows = self.steps * self.F
        self.words = words_for(rows)
        self.bits = torch.zeros(R, rows, self.words, dtype=torch.long, device=dev)
        self.g = torch.zeros(R, rows, g_root.shape[-1], dtype=g_root.dtype, device=dev)
        s = torch.arange(self.steps, device=dev)[:, None, None]
        r = torch.arange(R, device=dev)[None, :, None]
        f = torch.arange(self.F, device=dev)[None, None, :]
        j = (s * self.F + f).expand(self.steps, R, self.F).flatten()
        req = r.expand(self.steps, R, self.F).flatten()
        pos = base[req] + j
        slots = build_slot_mapping(tables, req, torch.where(live[req], pos, -1), e.cache.spec.block_size)
        order = torch.argsort(req * rows + j)
        self.window = Window(slots, req.to(torch.int32), (j + 1).to(torch.int32), order, [rows] * R, [rows] * R,
                             positions=pos)
        # every row rejected, made on the device (Acceptance.rejecting_all copies its lengths from the host)
        zero = torch.zeros(R, dtype=torch.int32, device=dev)
        self.reject = Acceptance(torch.zeros(R * rows, dtype=torch.bool, device=dev), zero,
                                 self.window.commit_mask_from(zero))
        self.in_buffer = e.drafter.policy.window_in_buffer
        self.qsl = torch.arange(0, R * self.F + 1, self.F, dtype=torch.int32, device=dev)
        self.done = 0

    def __call__(self, tokens: torch.Tensor, parent_rows: torch.Tensor, level: int) -> torch.Tensor:
        R, F = tokens.shape
        dev = tokens.device
        head, pol = self.e.head, self.e.drafter.policy
        j = self.done * F + torch.arange(F, device=dev)
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
        md = AttentionMetadata(positions, self.window.slot_mapping[offset:offset + R * F], [0] * (R + 1), None, None,
                               None, self.e.cache, pol, offset, kernel,
                               tree_mask=self.bits[:, j].reshape(R * F, self.words)[:, :words_for(so_far)].contiguous())
        out = head(tokens.reshape(-1), features.reshape(R * F, -1), md)
        self.g[:, j] = out.view(R, F, -1)
        self.done += 1
        return torch.log_softmax(head.compute_logits(out).float(), -1).view(R, F, -1)
