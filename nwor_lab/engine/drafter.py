"""The EAGLE drafter: turns the head's output into draft ids (and probabilities at T > 0).

The draft chain itself (the first draft from the verify pass's head features, then k - 1 head
passes in one window of the drafter's policy on the head's layer) runs inside the engine's step
body (`nwor_lab.engine.window_chain.draft_chain`). Its K/V comes from *predicted* features, so none of it
is ever kept: the window marks every row as a draft and is committed with nothing accepted. A
policy that preserves rejected slots leaves the cache as it was (`cow` restores, `stage` never
writes); `off` leaves the rows in the cache, as vLLM does (the next verify window's head pass
overwrites them). Rows are step-major: chain step s (1-based) holds one row per request, at
position `num_computed + s - 1`, input `(d_s, g_{s-1})`; its output `g_s` proposes `d_{s+1}`.

Every request drafts k tokens, also in its last windows (as vLLM proposes num_speculative_tokens
whatever max_tokens is left): a token verified past max_new_tokens is cut when emitted, and every
decode step keeps one shape to the end. The sliding-window guard cuts a request's count (its
missing drafts are -1, like a prefill's).
"""
from __future__ import annotations

import torch

from nwor_lab.ops.softmax import temperature_softmax
from nwor_lab.speculative import sample_from_probs


class Drafter:
    """Proposes drafts with an EAGLE head writing cache layer `head.layer_index` through its own
    write policy (`policy`, never open at the same time as the verify policy)."""

    def __init__(self, head, policy, k: int, temperature: float, generator: torch.Generator):
        self.head, self.policy = head, policy
        self.k, self.temperature, self.generator = k, temperature, generator

    def propose(self, g: torch.Tensor, generators: dict | None = None):
        """Head outputs `[n, h]` -> (draft ids `[n]`, draft probs `[n, V]` or None when greedy).
        `generators` {row: torch.Generator}: rows of requests with their own stream (eager steps only)."""
        logits = self.head.compute_logits(g)
        if self.temperature == 0:           # argmax of the model's dtype: no float copy of [n, V]
            return logits.argmax(-1), None
        q = temperature_softmax(logits, self.temperature)     # softmax(logits.float() / T), `ops.softmax`
        return sample_from_probs(q, self.generator, generators=generators), q
