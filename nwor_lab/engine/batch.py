"""One verify window's inputs and its verdict, prepared once per step."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.engine.request import Request
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.speculative import SpecDecodeMetadata
from nwor_lab.window import Acceptance, Window


@dataclass
class VerifyBatch:
    """Every scheduled request's tokens in one flattened window.

    Per request r: `query_lens[r]` tokens (its prompt, or `[t_last, d_1 .. d_n]`) at positions
    `context_lens[r] ..`, `num_drafts[r]` of them drafts; `kinds[r]` prefill / decode / spec.
    `cu_query` is the inclusive cumsum of `query_lens` (vLLM's cu_num_scheduled_tokens).
    """

    requests: list[Request]
    token_ids: list[int]              # [T] host
    query_lens: list[int]
    context_lens: list[int]
    num_drafts: list[int]
    kinds: list[str]
    cu_query: list[int]
    attention: AttentionMetadata
    spec: SpecDecodeMetadata
    window: Window

    @property
    def last_rows(self) -> list[int]:
        """Window row of each request's last token (t_last + its drafts, or the prompt's end)."""
        return [c - 1 for c in self.cu_query]


@dataclass
class Verdict:
    """What the rejection sampler and SCV decided for a VerifyBatch."""

    sampled: torch.Tensor          # [R, max_spec_len + 1] sampler output, -1 placeholders
    acceptance: Acceptance
    accepted: list[int]            # [R] host accepted lengths
    next_tokens: list[int]         # [R] host: the token sampled after each accepted prefix

    def kept_rows(self, batch: VerifyBatch) -> list[int]:
        """Window row of each request's last kept token (t_last + a_r, or the prompt's end)."""
        return [c - 1 - n + a for c, n, a in zip(batch.cu_query, batch.num_drafts, self.accepted)]
