"""Continuous batching: requests join as others finish; blocks are allocated as positions grow.

Admission reserves each request's worst case (prompt + max_new_tokens + k positions, or its ring:
`ring_slots` positions, for sliding-window rings), so a running request never runs out of blocks
(the lab has no preemption). Blocks are *allocated*
lazily: the prompt at admission, then `num_computed + 1 + num_drafts` before each draft chain
(the lookahead the next verify window needs).

A verify window holds at most `max_num_batched_tokens` tokens: running requests come first, each
`1 + drafts` tokens, with its drafts cut to what is left of the budget (verifying a prefix of the
drafts is still exact); a running request for which not one token is left waits for the next
step and goes first then. Every step schedules at least one request while there is work (counts
are >= 1 and an admitted prompt always fits an empty batch), so `run()` always ends.
"""
from __future__ import annotations

from collections import deque

from nwor_lab.config import check_int
from nwor_lab.engine.request import Request
from nwor_lab.kv import BlockAllocator, BlockTable


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 512, k: int = 0, ring_slots: int | None = None):
        self.allocator = BlockAllocator(check_int("num_blocks", num_blocks, 1))
        self.block_size = check_int("block_size", block_size, 1)
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.k = check_int("k", k, 0)
        self.ring_slots = ring_slots          # sliding-window rings: each request holds ceil(S / BS) blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self._next_id = 0
        # prefix caching (nwor_lab.engine.prefix): called with each request as it is admitted, before its
        # prompt's blocks are allocated; it may hand it shared blocks and a computed prefix
        self.on_admit = None

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def add(self, prompt: list[int], max_new_tokens: int) -> Request:
        if not prompt:
            raise ValueError("prompt: empty; give at least one token")
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        if len(prompt) > self.max_num_batched_tokens:
            raise ValueError(f"prompt of {len(prompt)} tokens exceeds max_num_batched_tokens="
                             f"{self.max_num_batched_tokens} (the lab does not chunk prefills); raise "
                             f"max_num_batched_tokens or shorten the prompt")
        if self.ring_slots is not None and len(prompt) > self.ring_slots:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the ring of {self.ring_slots} slots "
                             f"(sliding_window + slack): its prefill would overwrite its own positions; "
                             f"shorten the prompt or keep the whole context (kv_ring='full')")
        worst = self.blocks_for(len(prompt) + max_new_tokens + self.k)
        if self.ring_slots is not None:
            worst = min(worst, self.blocks_for(self.ring_slots))
        if worst > self.allocator.num_blocks:
            raise ValueError(f"prompt of {len(prompt)} tokens + {max_new_tokens} new + {self.k} drafts needs "
                             f"{worst} blocks of {self.block_size}, the cache has {self.allocator.num_blocks}; "
                             f"shorten the prompt or build a bigger cache (num_blocks)")
        req = Request(self._next_id, list(prompt), max_new_tokens, BlockTable(self.allocator, self.block_size, self.ring_slots),
                      worst_case_blocks=worst)
        self._next_id += 1
        self.waiting.append(req)
        return req

    def _reserved(self) -> int:
        return sum(r.worst_case_blocks - len(r.block_table.blocks) for r in self.running)

    def schedule(self) -> list[Request]:
        """Running requests first (1 + drafts tokens each, drafts cut to the budget), then waiting
        prefills while they fit. Never empty while there is work (see the module docstring)."""
        batch, waiting_turn = [], []
        budget = self.max_num_batched_tokens
        for r in self.running:
            if budget < 1:
                waiting_turn.append(r)
                continue
            if len(r.drafts) > budget - 1:
                r.keep_drafts(budget - 1)
            batch.append(r)
            budget -= 1 + len(r.drafts)
        if waiting_turn:                 # who waited goes first next step: nobody starves
            self.running = waiting_turn + batch
            return batch
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            free = self.allocator.num_free - self._reserved()
            if len(req.prompt) > budget or req.worst_case_blocks > free:
                break
            self.waiting.popleft()
            if self.on_admit is not None:
                self.on_admit(req)
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
