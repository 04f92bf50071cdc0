"""Speculative decoding by hand for the hybrid target (no engine): one K/V write policy for the
attention layers and one state policy for the gated DeltaNet layers, opened on the same window and
committed with the same Acceptance. Drafts come from an oracle (the target-only tokens), with one
token spoiled where the test wants a request's acceptance to end."""
from __future__ import annotations

import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine.choices import Choices
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model import AttentionMetadata
from nwor_lab.policies import make_policy
from nwor_lab.state import make_state_policy, make_state_store
from nwor_lab.window import Acceptance, Window


class HandDecoder:
    """R requests, request r in state slot r and blocks r*B .. r*B+B-1."""

    def __init__(self, model, num_reqs: int, k: int, nwor_mode="stage", state_mode="auto",
                 block_size: int = 4, blocks_per_req: int = 16):
        cfg = model.config
        config = LabConfig(nwor_mode=nwor_mode, state_mode=state_mode, attention="torch", backend="torch")
        self.model, self.bs = model, block_size
        self.cache = PagedKVCache(KVCacheSpec(model.num_layers, num_reqs * blocks_per_req, block_size,
                                              cfg.num_key_value_heads, cfg.head_dim))
        self.kv = make_policy(config, self.cache)
        state_config = Choices.of(config).state_config()      # state_mode='auto': the policy's counterpart
        self.store = make_state_store(state_config, model.state_spec(), num_reqs, k)
        self.states = make_state_policy(state_config, self.store)
        self.tables = [list(range(r * blocks_per_req, (r + 1) * blocks_per_req)) for r in range(num_reqs)]
        self.lens = [0] * num_reqs           # committed positions per request

    @torch.no_grad()
    def forward(self, rows: list[list[int]], drafts: list[int]):
        """rows[r]: request r's tokens this window (its last drafts[r] are drafts). Opens both
        policies; -> (window, logits [T, V])."""
        ids = [t for r in rows for t in r]
        qlens = [len(r) for r in rows]
        pos = [self.lens[r] + j for r in range(len(rows)) for j in range(qlens[r])]
        slots = torch.tensor([self.tables[r][p // self.bs] * self.bs + p % self.bs
                              for r in range(len(rows)) for p in range(self.lens[r], self.lens[r] + qlens[r])])
        window = Window.from_counts(qlens, drafts, slots)
        self.kv.begin(window)
        self.states.begin(window, list(range(len(rows))))
        md = AttentionMetadata.build(self.cache, self.kv, pos, qlens, self.tables, self.lens, attention="torch")
        md.states = self.states          # beside the K/V writer: the model calls stay those of a Llama
        hidden = self.model(torch.tensor(ids), md)
        return window, self.model.compute_logits(hidden)

    def commit(self, window, accepted: list[int]) -> None:
        acc = Acceptance.from_accepted_len(window, accepted) if window.num_drafts else None
        self.kv.commit(acc)
        self.states.commit(acc)
        for r, (n, d, a) in enumerate(zip(window.num_scheduled_tokens, window.num_draft_tokens, accepted)):
            self.lens[r] += n - d + a


def target_only(model, prompts, new_tokens: int, on_step=None) -> list[list[int]]:
    """Greedy decoding, one token per request per forward; on_step(decoder, step) after each commit."""
    dec = HandDecoder(model, len(prompts), k=0)
    window, logits = dec.forward(prompts, [0] * len(prompts))
    dec.commit(window, [0] * len(prompts))
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    out = [[int(t)] for t in logits[ends].argmax(-1)]
    step = 0
    while len(out[0]) < new_tokens + 1:
        if on_step is not None:
            on_step(dec, step)
        step += 1
        if len(out[0]) == new_tokens:
            break
        window, logits = dec.forward([[o[-1]] for o in out], [0] * len(out))
        dec.commit(window, [0] * len(out))
        for o, t in zip(out, logits.argmax(-1).tolist()):
            o.append(t)
    return out


def speculative(model, prompts, new_tokens: int, k: int, spoil, nwor_mode="stage", state_mode="auto",
                reference=None, on_window=None):
    """Greedy speculative decoding with oracle drafts: request r's drafts are `reference[r]`'s next k
    tokens, the one at index spoil(window_index, r) (if < k) replaced by another id, so its
    acceptance ends there while everything is right. -> (tokens per request, accepted per window).
    on_window(decoder, window_index) runs after each commit."""
    V = model.config.vocab_size
    dec = HandDecoder(model, len(prompts), k, nwor_mode, state_mode)
    window, logits = dec.forward(prompts, [0] * len(prompts))
    dec.commit(window, [0] * len(prompts))
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    out = [[int(t)] for t in logits[ends].argmax(-1)]
    history, w = [], 0
    while min(len(o) for o in out) < new_tokens:
        rows = []
        for r, o in enumerate(out):
            ref = reference[r][len(o):len(o) + k]
            ref += [0] * (k - len(ref))
            j = spoil(w, r)
            if j < k:
                ref[j] = (ref[j] + 1) % V
            rows.append([o[-1]] + ref)
        window, logits = dec.forward(rows, [k] * len(rows))
        greedy = logits.argmax(-1).view(len(rows), k + 1).tolist()
        accepted = []
        for r, (row, g) in enumerate(zip(rows, greedy)):
            a = 0
            while a < k and row[1 + a] == g[a]:      # draft d_{a+1} matches the target's greedy token
                a += 1
            accepted.append(a)
            out[r] += g[:a + 1]                     # the accepted drafts, then the bonus / correction
        dec.commit(window, accepted)
        history.append(accepted)
        if on_window is not None:
            on_window(dec, w)
        w += 1
    return [o[:new_tokens] for o in out], history
