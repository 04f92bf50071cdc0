"""EAGLE drafting after a verify window: the first draft, then the chain d_2..d_n in one window.

The chain's K/V (head layer only) comes from *predicted* features, so none of it is ever kept:
its window marks every row as a draft and is committed with nothing accepted. A policy that
preserves rejected slots leaves the cache as it was (`cow` restores, `stage` never writes);
`off` leaves the rows in the cache, as vLLM does (the next verify window's head pass overwrites
them). Rows are step-major: step s (1-based) holds one row per request still drafting, at
position `num_computed + s - 1`, input `(d_s, g_{s-1})`; its output `g_s` proposes `d_{s+1}`.
"""
from __future__ import annotations

import torch

from nwor_lab.engine.request import Request
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import block_table_tensor, build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.speculative import sample_from_probs
from nwor_lab.window import Acceptance, Window


class Drafter:
    """Proposes each request's drafts with an EAGLE head writing cache layer `head.layer_index`
    through its own write policy (`policy`, never open at the same time as the verify policy)."""

    def __init__(self, head, cache, policy, k: int, temperature: float, generator: torch.Generator, *,
                 sliding=None, ledger=None):
        """sliding: the engine's SlidingWindow (None: whole context); ledger: debug read checks."""
        self.head, self.cache, self.policy = head, cache, policy
        self.k, self.temperature, self.generator = k, temperature, generator
        self.sliding, self.ledger = sliding, ledger

    def propose(self, g: torch.Tensor):
        """Head outputs `[n, h]` -> (draft ids `[n]`, draft probs `[n, V]` or None when greedy)."""
        logits = self.head.compute_logits(g).float()
        if self.temperature == 0:
            return logits.argmax(-1), None
        q = torch.softmax(logits / self.temperature, -1)
        return sample_from_probs(q, self.generator), q

    def draft(self, requests: list[Request], g: torch.Tensor, step: int, n_drafts: list[int] | None = None):
        """Give every request its drafts for the next window. g `[len(requests), h]`: the head's
        output at each request's last committed row. -> (WindowTrace, Window) of the chain, or None
        when no request drafts more than one token.

        Every request drafts k tokens, also in its last windows (as vLLM proposes
        num_speculative_tokens whatever max_tokens is left): a token verified past max_new_tokens
        is cut when emitted. Every decode step then has the same shape, so it replays from a CUDA
        graph to the end; the positions stay inside the request's reservation (prompt +
        max_new_tokens + k). `n_drafts[j]` (0..k) overrides k per request: the sliding-window
        guard cuts drafts (a request with none decodes its next token alone)."""
        if self.k == 0:
            return None
        n_drafts = [self.k] * len(requests) if n_drafts is None else list(n_drafts)
        ids, probs = self.propose(g)
        for j, r in enumerate(requests):
            r.drafts = [int(ids[j])] if n_drafts[j] else []
            r.draft_probs = None if probs is None or not n_drafts[j] else probs[j:j + 1]
            r.block_table.ensure(r.num_computed + 1, lookahead=self.k)   # the next window's slots
        chained = [j for j, n in enumerate(n_drafts) if n >= 2]
        if not chained:
            return None
        if len(chained) < len(requests):
            return self._chain([requests[j] for j in chained], [n_drafts[j] for j in chained], g[chained], step)
        return self._chain(requests, n_drafts, g, step)

    def _chain(self, requests: list[Request], n_drafts: list[int], g: torch.Tensor, step: int):
        """Drafts d_2..d_n of every request, one head pass per chain step, in one policy window."""
        ring = self.sliding.ring_slots if self.sliding is not None else None
        window, rows_of = chain_window(requests, n_drafts, self.cache, ring)
        layer = self.head.layer_index
        self.policy.begin(window, layers=range(layer, layer + 1), kind="draft")   # the head's layer only
        try:
            offset = 0
            for s in range(1, max(n_drafts)):
                live = [j for j in range(len(requests)) if n_drafts[j] > s]
                out = self._chain_step(requests, live, [rows_of[j][:s] for j in live], g[live], s, offset)
                g = g.clone()
                g[live] = out
                offset += len(live)
            record = self.policy.commit(Acceptance.rejecting_all(window))
        except BaseException:
            if self.policy.window is not None:
                self.policy.cancel()
            raise
        entry = WindowTrace(step, "draft", [r.req_id for r in requests], ["draft"] * len(requests),
                            [n - 1 for n in n_drafts], [0] * len(requests), [[] for _ in requests], record)
        return entry, window

    def _chain_step(self, requests, live, window_rows, g_live, s: int, offset: int) -> torch.Tensor:
        """Chain step s for requests `live`: one row each at position num_computed + s - 1, reading
        the committed prefix from the cache and the chain rows so far where the policy keeps them."""
        reqs = [requests[j] for j in live]
        md = AttentionMetadata.build(self.cache, self.policy, [r.num_computed + s - 1 for r in reqs],
                                     [1] * len(reqs), [r.block_table.blocks for r in reqs],
                                     [r.num_computed for r in reqs], window_rows=window_rows,
                                     write_offset=offset,
                                     slot_mapping=self.policy.window.slot_mapping[offset:offset + len(reqs)],
                                     attention=self.policy.config.attention, sliding=self.sliding,
                                     ledger=self.ledger)
        out = self.head(torch.tensor([r.drafts[-1] for r in reqs], dtype=torch.long, device=self.cache.device),
                        g_live, md)
        ids, probs = self.propose(out)
        for i, r in enumerate(reqs):
            r.drafts.append(int(ids[i]))
            if probs is not None:
                r.draft_probs = torch.cat([r.draft_probs, probs[i:i + 1]])
        return out


def chain_window(requests: list[Request], n_drafts: list[int], cache,
                 ring_slots: int | None = None) -> tuple[Window, list[list[int]]]:
    """The chain window of requests drafting `n_drafts[j] >= 2` tokens -> (window, rows per request).
    Every row is a draft (d_2..d_n of its request); slots from the one slot-mapping builder
    (through each request's ring of `ring_slots` on a sliding-window cache)."""
    dev = cache.device
    rows_of: list[list[int]] = [[] for _ in requests]
    token_req, draft_pos, positions = [], [], []
    for s in range(1, max(n_drafts)):
        for j, r in enumerate(requests):
            if n_drafts[j] > s:
                rows_of[j].append(len(token_req))
                token_req.append(j), draft_pos.append(s), positions.append(r.num_computed + s - 1)
    tables = block_table_tensor([r.block_table.blocks for r in requests], dev)
    token_req_t = torch.tensor(token_req, dtype=torch.int32, device=dev)
    pos = torch.tensor(positions, dtype=torch.long, device=dev)
    slots = build_slot_mapping(tables, token_req_t, pos, cache.spec.block_size, ring_slots)
    counts = [n - 1 for n in n_drafts]
    draft_rows = [row for rows in rows_of for row in rows]         # request-major, as Window wants
    window = Window(slots, token_req_t, torch.tensor(draft_pos, dtype=torch.int32, device=dev),
                    torch.tensor(draft_rows, dtype=torch.long, device=dev), counts, counts, positions=pos)
    return window, rows_of
