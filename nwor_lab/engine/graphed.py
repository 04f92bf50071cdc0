"""Steady verify steps replayed from one CUDA graph per batch bucket (`LabConfig.cuda_graph`).

A steady step is one where every scheduled request verifies `t_last + exactly k drafts` (or, without
a draft head, decodes one token), greedily, with no observers and no debug checks. Such a step has
the same shapes every time for a given number of requests, so it is captured once per bucket of
requests (1, 2, 4, 8, ...; missing requests are padding: slot -1, draft -1, never kept) and replayed:

    policy.begin -> target forward (every layer, Triton attention) -> logits -> greedy rejection
    sampling -> SCV mask -> head pass over the same rows (its next-token inputs and its kept rows
    built on the device from the acceptance) -> policy.commit

The host fills the static inputs (token ids, positions, slots, block tables, cached lengths, draft
ids) before each replay and reads the sampled ids and accepted lengths once after it (the sync the
eager engine has too). A bucket's first step runs the same code eagerly (it compiles the kernels
and is the warm-up); its second step captures, then replays, so no step ever runs twice (a CoW log
taken twice would restore the wrong bytes). Prefills, short draft lists, sampling at temperature
> 0, observers and debug mode take the eager path. After a replay the policy makes the window's
`WindowRecord` on the host (`WritePolicy.replayed`), as its commit would have.
Steady draft chains are replayed the same way (`GraphedDraft`, below).
"""
from __future__ import annotations

import torch

from nwor_lab.engine.batch import Verdict, VerifyBatch
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.ops.scv import scv_mask
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.window import Acceptance, Window


class _Bucket:
    """Static buffers, metadata and (after the warm-up) the graph of one padded batch size."""

    def __init__(self, engine, size: int):
        e, dev, k = engine, engine.device, engine.k
        self.size, t = size, size * (k + 1)
        bs = e.cache.spec.block_size
        max_blocks = -(-e.max_model_len // bs) + 1
        self.ids = torch.zeros(t, dtype=torch.long, device=dev)
        self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        slots = torch.full((t,), -1, dtype=torch.long, device=dev)
        self.tables = torch.zeros(size, max_blocks, dtype=torch.int32, device=dev)
        self.cache_lens = torch.zeros(size, dtype=torch.int32, device=dev)
        cu = [(k + 1) * (r + 1) for r in range(size)]
        drafts = torch.full((size * k,), -1, dtype=torch.int32, device=dev)
        self.spec = SpecDecodeMetadata.build([k] * size, cu, drafts, device=dev)
        self.window = Window.from_metadata(self.spec, cu, slots)
        in_buffer = e.policy.window_in_buffer
        qsl = [0] + cu
        kernel = KernelArgs(self.tables, self.cache_lens, torch.tensor(qsl, dtype=torch.int32, device=dev),
                            torch.arange(t, device=dev) if in_buffer else None,
                            torch.tensor(qsl, dtype=torch.int32, device=dev) if in_buffer else None)
        self.md = AttentionMetadata(self.positions, self.window.slot_mapping, qsl, None, None, None, e.cache,
                                    e.policy, 0, kernel)
        self.starts = torch.arange(0, t, k + 1, device=dev)             # each request's t_last row
        self.last_rows = self.starts + k
        self.no_drafts = Acceptance.from_accepted_len(self.window, [0] * size) if k == 0 else None
        self.graph = None
        self.outputs = None
        self.warmed = False

    def fill(self, engine, requests) -> None:
        """Copy this step's requests into the static inputs (padding rows stay padding)."""
        k, bs, n = engine.k, engine.cache.spec.block_size, len(requests)
        in_buffer = engine.policy.window_in_buffer
        ids, pos, slots, drafts, lens = [], [], [], [], []
        tables = torch.zeros(self.tables.shape, dtype=torch.int32)
        for r, req in enumerate(requests):
            toks, start, _ = req.scheduled()
            req.block_table.ensure(start + len(toks))
            blocks = req.block_table.blocks
            tables[r, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            ids += toks
            pos += range(start, start + k + 1)
            slots += [blocks[p // bs] * bs + p % bs for p in range(start, start + k + 1)]
            drafts += req.drafts
            lens.append(start + (0 if in_buffer else k + 1))
        pad = self.size - n
        ids += [0] * (pad * (k + 1))
        pos += list(range(k + 1)) * pad
        slots += [-1] * (pad * (k + 1))
        drafts += [-1] * (pad * k)
        lens += [0 if in_buffer else k + 1] * pad       # padding reads block 0 (its rows are never kept)
        self.ids.copy_(torch.tensor(ids), non_blocking=False)
        self.positions.copy_(torch.tensor(pos))
        self.window.slot_mapping.copy_(torch.tensor(slots))
        self.tables.copy_(tables)
        self.cache_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        if k:
            self.spec.draft_token_ids.copy_(torch.tensor(drafts, dtype=torch.int32))

    def body(self, engine):
        """The step on the static buffers -> (sampled [B, k+1], Acceptance, head features [B, h] or None)."""
        e, w, spec, md = engine, self.window, self.spec, self.md
        e.policy.begin(w, kind="verify")
        aux_layers = e.head.aux_layers if e.drafting else ()
        hidden, aux = e.target.forward_with_aux(self.ids, md, aux_layers)
        logits = e.target.compute_logits(hidden[spec.logits_indices.long()]).float()
        sampled = rejection_sample(spec, None, logits, temperature=0.0)
        if e.k:
            acceptance = Acceptance(*scv_mask(w.draft_token_ids, w.cu_num_draft_tokens, sampled, w.token_req,
                                              w.token_draft_pos))
        else:
            acceptance = self.no_drafts
        accepted = acceptance.accepted_len.long()
        features = None
        if e.drafting:
            # the head reads x[p+1]; at each request's kept row and last row, the token just sampled
            token = sampled.gather(1, accepted[:, None]).squeeze(1).long()
            kept = self.starts + accepted
            next_ids = torch.cat([self.ids[1:], self.ids.new_zeros(1)])
            next_ids[self.last_rows] = token
            next_ids[kept] = token
            g = e.head(next_ids, e.head.features_from_target(hidden, aux), md)
            features = g[kept]
        e.policy.commit(acceptance)
        return sampled, acceptance, features

    def run(self, engine, capture: bool):
        """-> the body's outputs; `self.ran_body` says whether its Python ran this time."""
        self.ran_body = self.graph is None
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        if not self.warmed or not capture:  # first step of this size: eager, compiles the kernels
            self.warmed = True
            return self.body(engine)
        holder = {}
        self.graph = capture_graph(lambda: holder.setdefault("out", self.body(engine)), warmup=0,
                                   device=engine.device)
        self.outputs = holder["out"]
        self.graph.replay()
        return self.outputs


class GraphedVerify:
    """The engine's graphed path for steady verify steps (see the module docstring)."""

    def __init__(self, engine, max_num_seqs: int, max_num_batched_tokens: int, *, capture: bool = True):
        """capture False: run the same padded static step eagerly every time (CPU tests of the
        padding and the on-device head inputs; no graph)."""
        self.engine = engine
        self.capture = capture
        self.buckets: dict[int, _Bucket] = {}
        self.max_size = 1 << max(0, max_num_seqs - 1).bit_length()
        self.steps = 0            # steps that took this path (eager warm-ups included)
        # A captured graph holds the staging buffer's address: it must never be reallocated, so
        # reserve the largest window any step (graphed bucket or eager prefill) can bring.
        engine.policy.reserve(max(max_num_batched_tokens, self.max_size * (engine.k + 1)))
        self.draft = GraphedDraft(engine, self.max_size) if engine.drafting else None

    def eligible(self, requests) -> bool:
        e = self.engine
        if e.temperature != 0 or e.observers or e.config.debug or len(requests) > self.max_size:
            return False
        k = e.k if e.drafting else 0
        return all(not r.is_prefill and len(r.drafts) == k for r in requests)

    def step(self, requests):
        """-> (VerifyBatch, Verdict, head features [n, h] or None, WindowRecord or None)"""
        e = self.engine
        size = 1 << max(0, len(requests) - 1).bit_length()
        if size not in self.buckets:
            self.buckets[size] = _Bucket(e, size)
        b = self.buckets[size]
        b.fill(e, requests)
        records = e.policy.records
        e.policy.records = False                 # a record reads counts on the host: not in a graph
        try:
            sampled, acceptance, features = b.run(e, self.capture)
        finally:
            e.policy.records = records
        written = range(e.target.num_layers + (1 if e.drafting else 0))    # the head's layer N when it ran
        record = e.policy.replayed(b.window, acceptance, written, opened=range(e.cache.num_layers),
                                   counted=b.ran_body)
        n = len(requests)
        acc = acceptance.accepted_len[:n].tolist()
        rows = sampled[:n].tolist()
        k = e.k
        batch = VerifyBatch(list(requests), b.ids[:n * (k + 1)].tolist(), [k + 1] * n,
                            [r.num_computed for r in requests], [k] * n, ["spec" if k else "decode"] * n,
                            [(k + 1) * (i + 1) for i in range(n)], b.md, b.spec, b.window)
        verdict = Verdict(sampled[:n], None, acc, [rows[i][a] for i, a in enumerate(acc)])
        self.steps += 1
        return batch, verdict, (features[:n] if features is not None else None), record


class _ChainBucket:
    """Static buffers and graph of the EAGLE draft chain d_1..d_k for one padded batch size: the
    first draft from the verify step's head features, then k - 1 head passes, one row per request
    each (step-major rows, as `engine.drafter.chain_window`), in one draft-policy window on the
    head's layer, committed with every row rejected."""

    def __init__(self, engine, size: int):
        e, dev, k = engine, engine.device, engine.k
        pol = e.drafter.policy
        self.size, rows = size, size * (k - 1)
        bs = e.cache.spec.block_size
        self.tables = torch.zeros(size, -(-e.max_model_len // bs) + 1, dtype=torch.int32, device=dev)
        self.base = torch.zeros(size, dtype=torch.long, device=dev)        # each request's num_computed
        self.features = torch.zeros(size, e.head.config.hidden_size, dtype=e.dtype, device=dev)
        slots = torch.full((rows,), -1, dtype=torch.long, device=dev)
        token_req = torch.arange(size, dtype=torch.int32, device=dev).repeat(k - 1)
        draft_pos = torch.arange(1, k, dtype=torch.int32, device=dev).repeat_interleave(size)
        order = torch.arange(rows, device=dev).view(k - 1, size).t().reshape(-1)   # request-major
        self.window = Window(slots, token_req, draft_pos, order, [k - 1] * size, [k - 1] * size)
        self.reject = Acceptance.rejecting_all(self.window)
        in_buffer = pol.window_in_buffer
        qsl = list(range(size + 1))
        qsl_t = torch.arange(size + 1, dtype=torch.int32, device=dev)
        self.steps = []
        for s in range(1, k):
            positions = torch.zeros(size, dtype=torch.long, device=dev)
            lens = torch.zeros(size, dtype=torch.int32, device=dev)
            win_rows = win_start = None
            if in_buffer:   # request r's chain rows so far: r, size + r, ..., (s - 1) * size + r
                win_rows = (torch.arange(s, device=dev)[None, :] * size + torch.arange(size, device=dev)[:, None]).reshape(-1)
                win_start = torch.arange(0, s * size + 1, s, dtype=torch.int32, device=dev)
            md = AttentionMetadata(positions, slots[(s - 1) * size:s * size], qsl, None, None, None, e.cache, pol,
                                   (s - 1) * size, KernelArgs(self.tables, lens, qsl_t, win_rows, win_start))
            self.steps.append((positions, lens, md))
        self.graph = None
        self.outputs = None
        self.warmed = False

    def fill(self, engine, requests, features) -> None:
        k, bs, n = engine.k, engine.cache.spec.block_size, len(requests)
        in_buffer = engine.drafter.policy.window_in_buffer
        tables = torch.zeros(self.tables.shape, dtype=torch.int32)
        base = [r.num_computed for r in requests] + [0] * (self.size - n)
        slots = [-1] * (self.size * (k - 1))
        for j, r in enumerate(requests):
            r.block_table.ensure(r.num_computed + 1, lookahead=k)     # the next window's slots too
            blocks = r.block_table.blocks
            tables[j, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            for s in range(1, k):
                p = r.num_computed + s - 1
                slots[(s - 1) * self.size + j] = blocks[p // bs] * bs + p % bs
        self.tables.copy_(tables)
        self.window.slot_mapping.copy_(torch.tensor(slots))
        base_t = torch.tensor(base)
        for s, (positions, lens, _) in enumerate(self.steps, 1):
            positions.copy_(base_t + s - 1)
            lens.copy_((base_t + (0 if in_buffer else s)).to(torch.int32))
        self.features.zero_()
        self.features[:n].copy_(features)

    def body(self, engine):
        e, head, pol = engine, engine.head, engine.drafter.policy
        g = self.features
        token = head.compute_logits(g).float().argmax(-1)
        drafts = [token]
        layer = head.layer_index
        pol.begin(self.window, layers=range(layer, layer + 1), kind="draft")
        for positions, lens, md in self.steps:
            g = head(drafts[-1], g, md)
            drafts.append(head.compute_logits(g).float().argmax(-1))
        pol.commit(self.reject)
        return torch.stack(drafts, 1)         # [B, k]

    run = _Bucket.run


class GraphedDraft:
    """The drafter's graphed path: steady chains (every request drafts exactly k >= 2, greedy)."""

    def __init__(self, engine, max_size: int):
        self.engine = engine
        self.buckets: dict[int, _ChainBucket] = {}
        self.max_size = max_size
        self.steps = 0
        engine.drafter.policy.reserve(max_size * max(1, engine.k - 1))   # never reallocated (see above)

    def eligible(self, requests) -> bool:
        e = self.engine
        return (e.k >= 2 and e.temperature == 0 and not e.observers and not e.config.debug
                and len(requests) <= self.max_size and all(r.remaining - 1 >= e.k for r in requests))

    def draft(self, requests, features, step_index: int, capture: bool):
        from nwor_lab.engine.trace import WindowTrace
        e = self.engine
        size = 1 << max(0, len(requests) - 1).bit_length()
        if size not in self.buckets:
            self.buckets[size] = _ChainBucket(e, size)
        b = self.buckets[size]
        b.fill(e, requests, features)
        pol = e.drafter.policy
        records = pol.records
        pol.records = False
        try:
            drafts = b.run(e, capture)
        finally:
            pol.records = records
        layer = e.head.layer_index
        record = pol.replayed(b.window, b.reject, range(layer, layer + 1), counted=b.ran_body)
        for r, row in zip(requests, drafts[:len(requests)].tolist()):
            r.drafts, r.draft_probs = row, None
        self.steps += 1
        n = len(requests)
        return WindowTrace(step_index, "draft", [r.req_id for r in requests], ["draft"] * n, [e.k - 1] * n,
                           [0] * n, [[] for _ in requests], record), b.window
