"""A tree step's buffers and their device metadata (what `engine.step.run_step`
runs for `LabConfig.tree`; the body itself, its acceptance and its drafting calls, stay in step.py).

    TreeInputs          a tree verify window's buffers for `size` request slots of N nodes each, the
                        TreeWindow built from them on the device, its attention metadata (device
                        tensors, eager and captured alike)
The head's tree drafting is `model.tree_draft.HeadTreeStep` (device tensors throughout).
"""
from __future__ import annotations

import torch

from nwor_lab.engine.buffers import StaticInputs
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.speculative.tree_window import TreeWindow


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
            ids += [req.token_at(req.num_tokens - 1)] + d + [0] * (n - len(d))
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

    def metadata(self, engine, inp: "StepInputs", w: TreeWindow) -> AttentionMetadata:
        """The verify pass's metadata from device tensors: the kernel reads each request's N + 1 rows
        from key index n on (the cache under write-all, the staging buffer under stage), visible
        along the ancestor bits; positions n + depth. (No sliding window: a tree refuses a ring.)"""
        e = engine
        dev = self.ctx.device
        rows = self.nodes + 1
        in_buffer = e.policy.window_in_buffer
        qsl = torch.arange(0, self.size * rows + 1, rows, dtype=torch.int32, device=dev)
        lens = (self.ctx + (0 if in_buffer else rows)).to(torch.int32)
        kernel = KernelArgs(inp.tables, lens, qsl, inp.rows if in_buffer else None, qsl if in_buffer else None,
                            0, 0, max_query_len=rows, tree_lo=self.ctx.to(torch.int32))
        return AttentionMetadata(w.positions, w.slot_mapping, e.cache, e.policy, kernel, attention=e.config.attention,
                                 ledger=e.ledger, tree_mask=w.ancestors)
