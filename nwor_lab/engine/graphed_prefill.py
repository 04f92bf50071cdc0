"""Prefill steps replayed from CUDA graphs: one graph per (requests, tokens) bucket.

A step where every scheduled request is a prefill (its whole prompt, no drafts), greedy, with no
observers and no debug checks, runs on static buffers padded to a bucket of requests (1, 2, 4,
...) and of tokens (the next power of two above the prompts' total, at least 16, so at least one
row is padding): prompt ids, positions, the request of each row, each request's row range and its
last row, and the block tables. Rows past the prompts are padding (slot -1, no query, no logits),
padded requests have no rows. The step: policy.begin -> target forward -> the LM head at each
request's last row -> greedy sample -> head pass (EAGLE features) -> policy.commit (every prompt
token kept). Slots come from positions and block tables in the step. The first drafts then come
from the chain's own graph (`GraphedDraft`), as after an eager step.

An eager prefill of the shipped pair is ~12 ms of host work on an H100 host, a third of a batch-1
EAGLE run once decode steps replay; the replay is ~1 ms.
"""
from __future__ import annotations

import torch

from nwor_lab.engine.batch import Verdict, VerifyBatch
from nwor_lab.engine.graphed_static import GraphedBucket, Readback, StaticInputs, bucket_size, max_blocks
from nwor_lab.kv import build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.window import Acceptance, Window


def token_bucket(n: int) -> int:
    """Rows of the bucket holding n prompt tokens: a power of two > n (one padding row at least)."""
    return max(16, 1 << n.bit_length())


class PrefillBucket(GraphedBucket):
    def __init__(self, engine, size: int, tokens: int):
        e, dev = engine, engine.device
        self.size, self.tokens = size, tokens
        self.inputs = StaticInputs(dev, ids=((tokens,), torch.long), positions=((tokens,), torch.long),
                                   token_req=((tokens,), torch.long), last_rows=((size,), torch.long),
                                   qsl=((size + 1,), torch.int32), cache_lens=((size,), torch.int32),
                                   real=((size,), torch.int32), tables=((size, max_blocks(e)), torch.int32))
        i = self.inputs.dev
        self.ids, self.positions, self.token_req, self.last_rows = i["ids"], i["positions"], i["token_req"], \
            i["last_rows"]
        self.qsl, self.tables, self.real = i["qsl"], i["tables"], i["real"]
        # one placeholder token per request: the sampler reads only the bonus rows 0..size-1
        self.spec = SpecDecodeMetadata.build([0] * size, list(range(1, size + 1)), device=dev)
        slots = torch.full((tokens,), -1, dtype=torch.long, device=dev)
        zeros = torch.zeros(tokens, dtype=torch.int32, device=dev)
        self.window = Window(slots, self.token_req, zeros, torch.zeros(0, dtype=torch.long, device=dev),
                             [0] * size, [0] * size)
        self.keep_all = Acceptance.from_accepted_len(self.window, [0] * size)
        in_buffer = e.policy.window_in_buffer
        kernel = KernelArgs(self.tables, i["cache_lens"], self.qsl,
                            torch.arange(tokens, device=dev) if in_buffer else None,
                            self.qsl if in_buffer else None)
        self.md = AttentionMetadata(self.positions, slots, [0] * (size + 1), None, None, None, e.cache, e.policy,
                                    0, kernel)
        self.rows = torch.arange(tokens, device=dev)
        self.readback = Readback(dev, (size, 1))
        self.features = None
        self.host_ids: list[int] = []
        self.host_slots: list[int] = []
        self.host_lens: list[int] = []

    def fill(self, engine, requests) -> None:
        in_buffer = engine.policy.window_in_buffer
        h = self.inputs.host
        ids, pos, req_of, slots, qsl, last, lens = [], [], [], [], [0], [], []
        h["tables"].fill(0)
        for r, req in enumerate(requests):
            toks, _, _ = req.scheduled()
            req.block_table.ensure(len(toks))
            blocks = req.block_table.blocks
            h["tables"][r, :len(blocks)] = blocks
            ids += toks
            pos += range(len(toks))
            req_of += [r] * len(toks)
            slots += req.block_table.slots(range(len(toks)))
            qsl.append(qsl[-1] + len(toks))
            last.append(qsl[-1] - 1)
            lens.append(0 if in_buffer else len(toks))
        n, pad_rows, pad_reqs = len(requests), self.tokens - len(ids), self.size - len(requests)
        self.host_ids, self.host_slots, self.host_lens = ids, slots, [b - a for a, b in zip(qsl, qsl[1:])]
        h["ids"][:] = ids + [0] * pad_rows
        h["positions"][:] = pos + [0] * pad_rows
        h["token_req"][:] = req_of + [0] * pad_rows
        h["qsl"][:] = qsl + [qsl[-1]] * pad_reqs                # padded requests: no rows
        h["last_rows"][:] = last + [self.tokens - 1] * pad_reqs  # a padding row: never a real one
        h["cache_lens"][:] = lens + [0] * pad_reqs
        h["real"][:] = [1] * n + [0] * pad_reqs
        self.inputs.upload()

    def body(self, engine):
        """-> (sampled [B, 1] int64, head features [B, h] or None)."""
        e, md, bs = engine, self.md, engine.cache.spec.block_size
        row_ok = self.rows < self.qsl[-1]                                  # rows past the prompts: padding
        self.window.slot_mapping.copy_(build_slot_mapping(self.tables, self.token_req,
                                                          torch.where(row_ok, self.positions, -1), bs))
        e.policy.begin(self.window, kind="verify")
        aux_layers = e.head.aux_layers if e.drafting else ()
        hidden, aux = e.target.forward_with_aux(self.ids, md, aux_layers)
        logits = e.target.compute_logits(hidden[self.last_rows]).float()
        sampled = rejection_sample(self.spec, None, logits, temperature=0.0)    # [B, 1]
        features = None
        if e.drafting:
            # the head reads x[p+1]: the prompt's next token, and at its last row the token just sampled
            next_ids = torch.cat([self.ids[1:], self.ids.new_zeros(1)])
            next_ids[self.last_rows] = sampled[:, 0].long()
            g = e.head(next_ids, e.head.features_from_target(hidden, aux), md)
            features = g[self.last_rows]
        e.policy.commit(self.keep_all)
        return sampled.long(), features

    def finish(self, engine, requests, packed_rows):
        """Host bookkeeping after the step -> (VerifyBatch, Verdict, record)."""
        e, n = engine, len(requests)
        lens = self.host_lens
        host_window = Window.from_counts(lens, [0] * n, torch.tensor(self.host_slots))
        written = range(e.target.num_layers + (1 if e.drafting else 0))
        record = e.policy.replayed(host_window, Acceptance.from_accepted_len(host_window, [0] * n), written,
                                   opened=range(e.cache.num_layers))
        cu = torch.tensor(lens).cumsum(0).tolist()
        batch = VerifyBatch(list(requests), self.host_ids, lens, [0] * n, [0] * n, ["prefill"] * n, cu, self.md,
                            self.spec, self.window)
        tokens = [row[0] for row in packed_rows]
        verdict = Verdict(torch.tensor(packed_rows), None, [0] * n, tokens)
        return batch, verdict, record


def prefill_bucket_key(requests) -> tuple[int, int]:
    return bucket_size(len(requests)), token_bucket(sum(len(r.prompt) for r in requests))
