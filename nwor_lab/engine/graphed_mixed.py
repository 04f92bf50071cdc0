"""Steps with prefills replayed from CUDA graphs: prefills alone, or prefills mixed with decodes.

A step whose every request is either a prefill (its whole prompt, no drafts) or a steady decode
(`t_last + k drafts`, or one token without a head), greedy, with no observers and no debug
checks, runs on static buffers padded to a bucket of requests (1, 2, 4, ...) and of tokens
(`token_bucket`: always at least one padding row). Where each request's rows sit changes from step
to step, so the layout is data, not shape (vLLM's full graphs over mixed batches do the same:
attention reads `query_start_loc`, the rest is per-token):

    rows       ids, positions, request of each row, draft index of each row (0: always kept);
               padding rows: slot -1, in no request's row range
    requests   row range (query_start_loc), cached length, drafts (k slots each: a prefill's and a
               padding request's are -1 at the last padding row, whose draft index k + 1 no
               accepted length reaches), the rows whose logits the sampler reads
               (k target rows + the bonus row; a prefill's are all its last row: its draft -1 is
               rejected at column 0, where the target's own token is emitted), tokens left, id

The step: policy.begin -> target forward -> logits at the sampler's rows -> greedy rejection
sampling -> SCV mask -> head pass (kept rows from the acceptance) -> policy.commit -> the EAGLE
draft chain for every request still running (its first drafts after a prefill: from this graph,
not a second one). Slots come from positions and block tables in the step. One readback: sampled
ids, accepted lengths, the next drafts.

Tokens are the same as the eager step's: the same kernels on the same rows (attention's launch
plan depends on the bucket's shape, which can change the reduction order of long contexts; see
tests/gpu/test_gpu_engine.py for what the GPU checks).
"""
from __future__ import annotations

import torch

from nwor_lab.engine.batch import Verdict, VerifyBatch
from nwor_lab.engine.graphed_chain import ChainBucket
from nwor_lab.engine.graphed_static import (GraphedBucket, Readback, StaticInputs, accept_draft_commit, bucket_size,
                                            max_blocks)
from nwor_lab.kv import build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.window import Acceptance, Window

LARGE_TOKENS = 1024      # from here on, buckets grow by 512 tokens instead of doubling


def token_bucket(n: int) -> int:
    """Rows of the bucket holding n tokens, always > n (one padding row at least): powers of two
    from 16 to 1024, then multiples of 512 (a prefill of 2048 tokens pads to 2560, not 4096)."""
    if n < LARGE_TOKENS:
        return max(16, 1 << n.bit_length())
    return (n // 512 + 1) * 512


def mixed_bucket_key(requests, chain: bool) -> tuple[int, int, bool]:
    return bucket_size(len(requests)), token_bucket(sum(len(r.scheduled()[0]) for r in requests)), chain


class MixedBucket(GraphedBucket):
    def __init__(self, engine, size: int, tokens: int, chain: bool):
        e, dev = engine, engine.device
        k = e.k if e.drafting else 0
        self.size, self.tokens, self.k = size, tokens, k
        self.inputs = StaticInputs(
            dev, ids=((tokens,), torch.long), positions=((tokens,), torch.long), req_key=((size,), torch.long),
            rows_logits=((size * (k + 1),), torch.long), draft_rows=((size * k,), torch.long),
            last_rows=((size,), torch.long), num_drafts=((size,), torch.long), remaining=((size,), torch.long),
            token_req=((tokens,), torch.int32), draft_pos=((tokens,), torch.int32), drafts=((size * k,), torch.int32),
            qsl=((size + 1,), torch.int32), cache_lens=((size,), torch.int32),
            tables=((size, max_blocks(e)), torch.int32))
        i = self.inputs.dev
        self.ids, self.positions, self.req_key = i["ids"], i["positions"], i["req_key"]
        self.rows_logits, self.last_rows, self.num_drafts = i["rows_logits"], i["last_rows"], i["num_drafts"]
        self.remaining, self.qsl, self.tables = i["remaining"], i["qsl"], i["tables"]
        # every request slot has k drafts in the sampler's layout: target rows then the bonus row
        cu = [(k + 1) * (r + 1) for r in range(size)]
        self.spec = SpecDecodeMetadata.build([k] * size, cu, i["drafts"], device=dev)
        slots = torch.full((tokens,), -1, dtype=torch.long, device=dev)
        # the layout varies per step: the window's host counts say only "k drafts per request slot"
        self.window = Window(slots, i["token_req"], i["draft_pos"], i["draft_rows"], [k + 1] * size, [k] * size,
                             draft_token_ids=i["drafts"], cu_draft=self.spec.cu_num_draft_tokens)
        self.no_drafts = Acceptance.from_accepted_len(self.window, [0] * size) if k == 0 else None
        in_buffer = e.policy.window_in_buffer
        kernel = KernelArgs(self.tables, i["cache_lens"], self.qsl,
                            torch.arange(tokens, device=dev) if in_buffer else None,
                            self.qsl if in_buffer else None)
        self.md = AttentionMetadata(self.positions, slots, [0] * (size + 1), None, None, None, e.cache, e.policy,
                                    0, kernel)
        self.rows = torch.arange(tokens, device=dev)
        self.chain = ChainBucket(e, size, tables=self.tables) if chain else None
        self.readback = Readback(dev, (size, 2 * k + 2 if chain else k + 2))
        self.features = None
        self.host: dict = {}

    def fill(self, engine, requests) -> None:
        """This step's requests into the static inputs (padding stays padding), one copy per dtype;
        blocks allocated for every row the step writes (the chain's too)."""
        e, k, size, pad_row = engine, self.k, self.size, self.tokens - 1
        in_buffer = e.policy.window_in_buffer
        h = self.inputs.host
        h["tables"].fill(0)
        ids, pos, token_req, draft_pos, slots = [], [], [], [], []
        qsl, last, ndrafts, lens, ctx, qlens, kinds = [0], [], [], [], [], [], []
        rows_logits, draft_rows, drafts, left = [], [], [], []
        for r, req in enumerate(requests):
            toks, start, n = req.scheduled()
            q = len(toks)
            need = start + q
            if self.chain is not None:   # the chain's rows, after the most this window can keep
                need = max(need, start + q - n + min(n, req.remaining - 2) + k - 1)
            req.block_table.ensure(need)
            blocks = req.block_table.blocks
            h["tables"][r, :len(blocks)] = blocks
            row0 = len(ids)
            ids += toks
            pos += range(start, start + q)
            token_req += [r] * q
            draft_pos += [0] * (q - n) + list(range(1, n + 1))
            slots += req.block_table.slots(range(start, start + q))
            qsl.append(row0 + q)
            last.append(row0 + q - 1)
            ndrafts.append(n)
            lens.append(start + (0 if in_buffer else q))
            ctx.append(start)
            qlens.append(q)
            kinds.append("prefill" if req.is_prefill else ("spec" if n else "decode"))
            if n:                        # t_last's row and the drafts' rows verify the drafts
                rows_logits += range(row0 + q - n - 1, row0 + q)
                draft_rows += range(row0 + q - n, row0 + q)
                drafts += req.drafts[:n]
            else:                        # the target's own token from the last row, drafts padding
                rows_logits += [row0 + q - 1] * (k + 1)
                draft_rows += [pad_row] * k
                drafts += [-1] * k
            left.append(req.remaining)
        n_req, total = len(requests), len(ids)
        pad_rows, pad_reqs = self.tokens - total, size - n_req
        h["ids"][:] = ids + [0] * pad_rows
        h["positions"][:] = pos + [0] * pad_rows
        h["token_req"][:] = token_req + [0] * pad_rows
        # the last row stands in for every padding draft: draft index k + 1, above any accepted
        # length, so it reads as a rejected draft to every check (its slot is -1: never written)
        h["draft_pos"][:] = draft_pos + [0] * (pad_rows - 1) + [k + 1 if k else 0]
        h["qsl"][:] = qsl + [total] * pad_reqs                   # padded requests: no rows
        h["last_rows"][:] = last + [pad_row] * pad_reqs          # a padding row, never a real one
        h["num_drafts"][:] = ndrafts + [0] * pad_reqs
        h["cache_lens"][:] = lens + [0] * pad_reqs
        h["rows_logits"][:] = rows_logits + [pad_row] * (pad_reqs * (k + 1))
        h["draft_rows"][:] = draft_rows + [pad_row] * (pad_reqs * k)
        h["drafts"][:] = drafts + [-1] * (pad_reqs * k)
        h["remaining"][:] = left + [0] * pad_reqs
        h["req_key"][:] = [r.acceptance_key for r in requests] + [0] * pad_reqs
        self.inputs.upload()
        self.host = dict(ids=ids, slots=slots, qlens=qlens, ctx=ctx, ndrafts=ndrafts, kinds=kinds)

    def body(self, engine):
        """-> (packed [B, k+2 (+k)] int64: sampled ids, accepted length, next drafts when the
        chain is aboard; head features [B, h] or None)."""
        e, w, md, spec, k = engine, self.window, self.md, self.spec, self.k
        bs = e.cache.spec.block_size
        row_ok = self.rows < self.qsl[-1]                                  # rows past the requests': padding
        w.slot_mapping.copy_(build_slot_mapping(self.tables, w.token_req, torch.where(row_ok, self.positions, -1), bs))
        e.policy.begin(w, kind="verify")
        aux_layers = e.head.aux_layers if e.drafting else ()
        hidden, aux = e.target.forward_with_aux(self.ids, md, aux_layers)
        logits = e.target.compute_logits(hidden[self.rows_logits]).float()
        sampled = rejection_sample(spec, None, logits, temperature=0.0, **self._forced(e))   # [B, k + 1]
        # a request's t_last row is its last row less its drafts
        accepted, kept, features = accept_draft_commit(e, w, md, sampled, hidden, aux, self.ids, self.last_rows,
                                                       self.last_rows - self.num_drafts, self.no_drafts)
        packed = [sampled.long(), accepted[:, None]]
        if self.chain is not None:
            live = accepted + 1 < self.remaining                            # still running after this step
            base = torch.where(live, self.positions[kept] + 1, 0)           # num_computed after the step
            self.chain.place(e, base, live, features)
            packed.append(self.chain.body(e))
        return torch.cat(packed, 1), features

    def _forced(self, engine) -> dict:
        """Forced acceptance: each draft's u from its request's key and position, as the eager step."""
        if engine.acceptance is None or not self.k:
            return {}
        keys = self.req_key[:, None].expand(self.size, self.k).reshape(-1)
        pos = self.positions[self.window.draft_rows]
        return dict(synthetic_rates=engine.forced_rates, uniform_probs=engine.acceptance.uniforms(keys, pos))

    def finish(self, engine, requests, rows):
        """Host bookkeeping after the step -> (VerifyBatch, Verdict, record, the chain's
        (request, drafts, slots) for the requests it drafted for, or None without the chain)."""
        e, k, n, h = engine, self.k, len(requests), self.host
        acc = [row[k + 1] for row in rows]
        host_window = Window.from_counts(h["qlens"], h["ndrafts"], torch.tensor(h["slots"]))
        written = range(e.target.num_layers + (1 if e.drafting else 0))
        record = e.policy.replayed(host_window, Acceptance.from_accepted_len(host_window, acc), written,
                                   opened=range(e.cache.num_layers))
        cu = torch.tensor(h["qlens"]).cumsum(0).tolist()
        batch = VerifyBatch(list(requests), h["ids"], h["qlens"], h["ctx"], h["ndrafts"], h["kinds"], cu, self.md,
                            self.spec, self.window)
        verdict = Verdict(torch.tensor(rows)[:, :k + 1], None, acc, [row[a] for row, a in zip(rows, acc)])
        ran = None
        if self.chain is not None:
            # the device's rule: a request with a + 1 >= remaining finishes now and gets no chain rows
            ran = []
            for j, (r, a) in enumerate(zip(requests, acc)):
                if a + 1 < r.remaining:
                    base = h["ctx"][j] + h["qlens"][j] - h["ndrafts"][j] + a
                    ran.append((r, rows[j][k + 2:], self.chain.row_slots(e, r, base)))
        return batch, verdict, record, ran
