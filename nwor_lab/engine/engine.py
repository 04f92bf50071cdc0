"""The speculative decoding loop: one verify window per step, then the EAGLE head drafts.

Per step (every running request in one flattened window; prefills, plain decodes and
speculative requests mixed):
  1. `policy.begin(window)`; target forward: every layer writes K/V through the policy and
     attends (stage: prefix from the cache, window from the staging buffer).
  2. rejection sampler -> sampled ids `[R, k+1]`; SCV (`config.scv_mode`) -> Acceptance.
  3. EAGLE head first pass over the SAME window rows (cache layer N, same slots): row p reads
     (x[p+1], f[p]) with the freshly sampled token at the last accepted row (f: the final-norm
     hidden state for EAGLE-1, the fc-fused low/middle/high streams for EAGLE-3).
  4. `policy.commit(acceptance)`: target and head rows of t_last, d_1..d_a kept, the rest dropped.
     `num_computed` advances by a + 1 (the rollback of rejected drafts is just not advancing).
  5. Draft chain d_2..d_n in its own window (`draft_policy`, all rows speculative, committed
     with nothing accepted: `off` leaves them in the cache like vLLM, `cow` restores, `stage`
     never writes them).
"""
from __future__ import annotations

import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine.drafter import draft
from nwor_lab.engine.request import Request
from nwor_lab.engine.scheduler import Scheduler
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.policies import Window, make_policy
from nwor_lab.speculative import ScvRunner, SpecDecodeMetadata, rejection_sample


class SpecEngine:
    """Target + optional EAGLE-1 / EAGLE-3 head over one PagedKVCache (layers: target 0..N-1, head N).

    `policy` (records in `metrics`) handles verify windows, `draft_policy` (`draft_metrics`) the
    draft-chain windows: two policies of the same mode on the same cache, never open at once.
    `trace` lists every window (`WindowTrace`); `observers` see each window's begin and end.
    """

    def __init__(self, target, head=None, config: LabConfig | None = None, *, k: int = 4,
                 num_blocks: int = 256, block_size: int = 16, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 1024, temperature: float = 0.0, seed: int = 0,
                 eos_token_id: int | None = None, cache_dtype: str = "auto"):
        self.target, self.head = target, head
        self.config = config or LabConfig()
        self.k = k if head is not None else 0
        if self.k < 0:
            raise ValueError(f"k={k}: must be >= 0")
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        tc = target.config
        if head is not None:
            hc = head.config
            if (hc.num_key_value_heads, hc.head_dim) != (tc.num_key_value_heads, tc.head_dim):
                raise ValueError(f"draft head KV shape ({hc.num_key_value_heads} heads x {hc.head_dim}) differs "
                                 f"from the target's ({tc.num_key_value_heads} x {tc.head_dim}); one stacked "
                                 f"cache holds both")
        n_layers = tc.num_hidden_layers + (1 if head is not None else 0)
        self.cache = PagedKVCache(KVCacheSpec(n_layers, num_blocks, block_size, tc.num_key_value_heads,
                                              tc.head_dim, dtype=self.dtype, cache_dtype=cache_dtype),
                                  device=self.device)
        self.metrics = LabMetrics()
        self.draft_metrics = LabMetrics()
        self.policy = make_policy(self.config, self.cache, self.metrics)
        self.draft_policy = make_policy(self.config, self.cache, self.draft_metrics)
        self.scv = ScvRunner(self.config.scv_mode)
        self.scheduler = Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, self.k)
        self.temperature = float(temperature)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.eos_token_id = eos_token_id
        self.trace: list[WindowTrace] = []
        self.observers = []   # objects with begin(engine, kind, window) / end(engine, trace, window)
        self.step_index = 0
        self.target_forwards = 0

    @property
    def drafting(self) -> bool:
        return self.head is not None and self.k > 0

    @property
    def stage(self) -> bool:
        return self.config.nwor_mode == "stage"

    def add_request(self, prompt: list[int], max_new_tokens: int) -> Request:
        return self.scheduler.add(prompt, max_new_tokens)

    # -- one step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """One verify window over every scheduled request, then drafting for the next one."""
        batch = self.scheduler.schedule()
        if not batch:
            return
        ids, positions, qlens, ndrafts, ctx, drafts, kinds = [], [], [], [], [], [], []
        for r in batch:
            toks, start, n = r.scheduled()
            r.block_table.ensure(start + len(toks))
            ids += toks
            positions += range(start, start + len(toks))
            qlens.append(len(toks)), ndrafts.append(n), ctx.append(start)
            drafts += r.drafts[:n]
            kinds.append("prefill" if r.is_prefill else ("spec" if n else "decode"))
        cu = torch.tensor(qlens).cumsum(0).tolist()
        starts = [c - q for c, q in zip(cu, qlens)]
        md = self._metadata(positions, qlens, [r.block_table.blocks for r in batch], ctx,
                            [range(s, c) for s, c in zip(starts, cu)])
        spec_md = SpecDecodeMetadata.build(ndrafts, cu, torch.tensor(drafts, dtype=torch.int32), device=self.device)
        window = Window.from_metadata(spec_md, cu, md.slot_mapping)
        self._notify_begin("verify", window)
        self.policy.begin(window)
        try:
            acc, new_tok, record, g_last = self._verify(batch, ids, md, spec_md, window, cu)
        except BaseException:
            if self.policy.window is not None:
                self.policy.cancel()    # the cache ends as `off` would leave it
            raise
        entry = WindowTrace(self.step_index, "verify", [r.req_id for r in batch], kinds, ndrafts, acc, [], record)
        for i, r in enumerate(batch):
            # rollback = not advancing: only t_last (or the prompt) and the accepted drafts count
            r.num_computed = ctx[i] + (qlens[i] - ndrafts[i]) + acc[i]
            entry.emitted.append(self._emit(r, r.drafts[:acc[i]] + [new_tok[i]]))
            r.drafts, r.draft_probs = [], None
        self.trace.append(entry)
        self._notify_end(entry, window)
        for r in batch:
            if r.remaining <= 0:
                self.scheduler.finish(r)
        live = [i for i, r in enumerate(batch) if not r.finished]
        if self.drafting and live:
            draft(self, [batch[i] for i in live], g_last[live])
        self.step_index += 1

    def _verify(self, batch, ids, md, spec_md, window, cu):
        """Target forward, rejection sampling, SCV, the head's pass over the same rows, commit.
        -> (accepted lengths, the token sampled after each accepted prefix, WindowRecord,
        head output `[R, h]` at each request's last kept row, or None without a head)."""
        dev = self.device
        aux_layers = self.head.aux_layers if self.drafting else ()                      # EAGLE-3 only
        hidden, aux = self.target.forward_with_aux(torch.tensor(ids, dtype=torch.long, device=dev), md,
                                                   aux_layers)                        # [T, h]
        self.target_forwards += 1
        logits = self.target.compute_logits(hidden[spec_md.logits_indices.long()]).float()
        probs = [r.draft_probs for r in batch if r.draft_probs is not None and r.drafts]
        draft_probs = torch.cat(probs) if probs and self.temperature > 0 else None
        sampled = rejection_sample(spec_md, draft_probs, logits, temperature=self.temperature,
                                   generator=self.generator)                          # [R, k+1]
        acceptance = self.scv(spec_md.draft_token_ids, spec_md.cu_num_draft_tokens, sampled,
                              token_req=window.token_req, token_draft_pos=window.token_draft_pos,
                              max_spec_len=spec_md.max_spec_len)
        acc = acceptance.accepted_per_request()
        sampled_host = sampled.tolist()
        new_tok = [sampled_host[i][a] for i, a in enumerate(acc)]
        g_last = None
        if self.drafting:
            # Head row p reads x[p+1]: the next scheduled token of its request, except at the
            # request's last kept row (t_last + a_r for a speculative request), where x[p+1] is
            # the token just sampled. Rows after it are rejected drafts: their input is moot.
            last_rows = [c - 1 - n + a for c, n, a in zip(cu, spec_md.num_draft_tokens, acc)]
            nxt = ids[1:] + [0]
            for i, row in enumerate(last_rows):
                nxt[cu[i] - 1] = nxt[row] = new_tok[i]
            g = self.head(torch.tensor(nxt, dtype=torch.long, device=dev),
                          self.head.features_from_target(hidden, aux), md)
            g_last = g[torch.tensor(last_rows, device=dev)]
        record = self.policy.commit(acceptance, sampled_token_ids=sampled)  # sampled: debug cross-check
        return acc, new_tok, record, g_last

    def _emit(self, r: Request, tokens: list[int]) -> list[int]:
        """Append `tokens` to the output, cut at max_new_tokens and after an end-of-sequence token."""
        tokens = tokens[:r.remaining]
        if self.eos_token_id is not None and self.eos_token_id in tokens:
            tokens = tokens[:tokens.index(self.eos_token_id) + 1]
            r.max_new_tokens = len(r.output) + len(tokens)
        r.output += tokens
        return tokens

    # -- helpers -------------------------------------------------------------------------------
    def _metadata(self, positions, qlens, tables, ctx, rows) -> AttentionMetadata:
        """Verify window: stage reads the prefix (positions < ctx) from the cache and the request's
        window rows from the staging buffer; off / cow read every position from the cache."""
        if self.stage:
            return AttentionMetadata.build(self.cache, positions, qlens, tables, ctx, window_rows=rows,
                                           policy=self.policy)
        seq_lens = [c + q for c, q in zip(ctx, qlens)]
        return AttentionMetadata.build(self.cache, positions, qlens, tables, seq_lens, policy=self.policy)

    def _notify_begin(self, kind, window) -> None:
        for o in self.observers:
            o.begin(self, kind, window)

    def _notify_end(self, entry, window) -> None:
        for o in self.observers:
            o.end(self, entry, window)

    def run(self) -> None:
        while self.scheduler.has_work:
            self.step()
