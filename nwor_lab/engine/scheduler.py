"""Continuous batching: requests join as others finish; blocks are allocated as positions grow.

Admission reserves each request's worst case (prompt + max_new_tokens + k positions), so a
running request never runs out of blocks (the lab has no preemption). Blocks are *allocated*
lazily: the prompt at admission, then `num_computed + 1 + num_drafts` before each draft chain
(the lookahead the next verify window needs).
"""
from __future__ import annotations

from collections import deque

from nwor_lab.engine.request import Request
from nwor_lab.kv import BlockAllocator, BlockTable


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 512, k: int = 0):
        self.allocator = BlockAllocator(num_blocks)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.k = k
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self._next_id = 0

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def add(self, prompt: list[int], max_new_tokens: int) -> Request:
        if not prompt:
            raise ValueError("prompt: empty; give at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
        worst = self.blocks_for(len(prompt) + max_new_tokens + self.k)
        if worst > self.allocator.num_blocks:
            raise ValueError(f"prompt of {len(prompt)} tokens + {max_new_tokens} new + {self.k} drafts needs "
                             f"{worst} blocks of {self.block_size}, the cache has {self.allocator.num_blocks}; "
                             f"shorten the prompt or build a bigger cache (num_blocks)")
        if len(prompt) > self.max_num_batched_tokens:
            raise ValueError(f"prompt of {len(prompt)} tokens exceeds max_num_batched_tokens="
                             f"{self.max_num_batched_tokens} (the lab does not chunk prefills)")
        req = Request(self._next_id, list(prompt), max_new_tokens, BlockTable(self.allocator, self.block_size),
                      worst_case_blocks=worst)
        self._next_id += 1
        self.waiting.append(req)
        return req

    def _reserved(self) -> int:
        return sum(r.worst_case_blocks - len(r.block_table.blocks) for r in self.running)

    def schedule(self) -> list[Request]:
        """Running requests first (1 + drafts tokens each), then waiting prefills while they fit."""
        batch = list(self.running)
        budget = self.max_num_batched_tokens - sum(1 + len(r.drafts) for r in batch)
        while self.waiting and len(batch) < self.max_num_seqs:
            req = self.waiting[0]
            free = self.allocator.num_free - self._reserved()
            if len(req.prompt) > budget or req.worst_case_blocks > free:
                break
            self.waiting.popleft()
            req.block_table.ensure(len(req.prompt))
            self.running.append(req)
            batch.append(req)
            budget -= len(req.prompt)
        return batch

    def finish(self, req: Request) -> None:
        req.finished = True
        req.block_table.release()
        self.running.remove(req)
        self.finished.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
