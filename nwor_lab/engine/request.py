"""A request's state between windows.

`tokens = prompt + output`; the LAST token (`t_last`) was sampled but not yet run, so its K/V is
not in the cache. `num_computed` positions (target and EAGLE-head layers alike) hold committed
K/V; after every window `num_computed == len(tokens) - 1`. Rejected drafts roll nothing back in
the cache's bookkeeping but `num_computed`: it only advances by the committed tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.kv import BlockTable


@dataclass
class Request:
    req_id: int
    prompt: list[int]
    max_new_tokens: int
    block_table: BlockTable
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    drafts: list[int] = field(default_factory=list)       # proposed for the next verify window
    draft_probs: torch.Tensor | None = None              # [len(drafts), V] when sampling, else None
    finished: bool = False
    worst_case_blocks: int = 0                            # reserved at admission (no preemption)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def is_prefill(self) -> bool:
        return self.num_computed == 0

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.max_new_tokens - len(self.output)

    def scheduled(self) -> tuple[list[int], int, int]:
        """(token ids, first position, number of drafts) of this request's next window:
        the prompt for a prefill, else `[t_last, d_1 .. d_n]` at positions num_computed.."""
        if self.is_prefill:
            return list(self.prompt), 0, 0
        return [self.tokens[-1]] + list(self.drafts), self.num_computed, len(self.drafts)
