"""Continuous batching: requests join as others finish; blocks are allocated as positions grow.

Admission does not reserve a request's worst case: a waiting request is admitted while the blocks
of its first step fit (its prompt's first chunk, or prompt + output's for one preempted by
recompute, or its swapped-out blocks, plus one step's lookahead). Before a running request's step,
the blocks that step can write are allocated (`step_blocks`: t_last + drafts or the prefill's
chunk, the draft chain's rows and the next window's lookahead, never more than the request's worst
case); when they do not fit, the newest running request is preempted (vLLM's order; `preempt`, the
engine's `on_preempt` decides recompute or swap: nwor_lab.engine.preemption), its blocks freed and
it is requeued at the front of the waiting queue. No request is admitted in a step that preempted.
A request that alone cannot fit the cache (prompt + max_new_tokens + k positions, or its ring) is
refused at `add`.

A verify window holds at most `max_num_batched_tokens` tokens: running requests come first, each
`1 + drafts` tokens, with its drafts cut to what is left of the budget (verifying a prefix of the
drafts is still exact); a running request for which not one token is left waits for the next
step and goes first then. Chunked prefill (vLLM's): a prefill gets what is left of the budget
(`Request.chunk`), so a prompt longer than the budget is prefilled over several steps beside the
others' verify windows (a running prefill in chunks is scheduled with the running requests; a
waiting one is admitted while one token of budget is left). A chunk that ends before the
request's last token samples nothing (the engine emits nothing and hands out no drafts). Every
step schedules at least one request while there is work (counts are >= 1, the oldest running
request always fits the cache once the newer ones are preempted, and a chunk of one token fits an
empty batch), so `run()` always ends.
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
        # the engine's: on_preempt(request) before a preempted request's blocks are freed (swap
        # them out, free its state slot, reset it for recompute); on_resume(request) once a swapped
        # request has its new blocks (copy them back)
        self.on_preempt = None
        self.on_resume = None
        self.preempted_this_step = 0

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def add(self, prompt: list[int], max_new_tokens: int) -> Request:
        if not prompt:
            raise ValueError("prompt: empty; give at least one token")
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
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

    def step_blocks(self, req: Request) -> int:
        """Blocks `req` must hold before its next step: the window's rows (prompt + output for a
        prefill, t_last + drafts else), one more position and the lookahead of the next window's
        drafts (what the draft chain and the hand-out write), at most its worst case; a swapped-out
        request at least its saved blocks."""
        need = min(self.blocks_for(self._positions(req)), req.worst_case_blocks)
        if req.swapped is not None:
            need = max(need, req.swapped.num_blocks)
        return need

    def _make_room(self, req: Request) -> bool:
        """Allocate `req`'s step blocks, preempting the newest running requests while they do not
        fit. -> False when `req` itself was preempted (it was the newest)."""
        while self.step_blocks(req) - len(req.block_table.blocks) > self.allocator.num_free:
            victim = self.running[-1]
            self.preempt(victim)
            if victim is req:
                return False
        req.block_table.ensure(min(self.step_blocks(req) * self.block_size, self._positions(req)))
        return True

    def _positions(self, req: Request) -> int:
        """Positions `req`'s next step may write up to: its window, one more, the next lookahead."""
        toks, start, _ = req.scheduled()
        return start + len(toks) + 1 + self.k

    def preempt(self, req: Request) -> None:
        """Take `req` off the running list: the engine's `on_preempt` (swap out or reset), its blocks
        freed, requeued at the front of the waiting queue."""
        if self.on_preempt is not None:
            self.on_preempt(req)
        req.block_table.release()
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.preempted_this_step += 1

    def schedule(self) -> list[Request]:
        """Running requests first (1 + drafts tokens each, drafts cut to the budget, their step's
        blocks allocated, preempting the newest when they do not fit), then waiting requests while
        they fit (none in a step that preempted). Never empty while there is work (see the module
        docstring)."""
        batch, waiting_turn = [], []
        budget = self.max_num_batched_tokens
        self.preempted_this_step = 0
        i = 0
        while i < len(self.running):
            r = self.running[i]
            i += 1
            if budget < 1:
                waiting_turn.append(r)
                continue
            r.chunk = budget if r.is_prefill else None     # a prefill in chunks: what is left of the budget
            if len(r.drafts) > budget - 1:
                r.keep_drafts(budget - 1)
            if not self._make_room(r):      # r was the newest: preempted, nothing after it
                break
            batch.append(r)
            budget -= len(r.scheduled()[0])
        if waiting_turn:                 # who waited goes first next step: nobody starves
            self.running = waiting_turn + batch
            return batch
        while self.waiting and len(self.running) < self.max_num_seqs and not self.preempted_this_step:
            req = self.waiting[0]
            if budget < 1:
                break
            req.chunk = budget if req.is_prefill else None
            if req.swapped is not None and budget < 1 + len(req.drafts):
                req.keep_drafts(budget - 1)
            if self.step_blocks(req) > self.allocator.num_free:
                break
            self.waiting.popleft()
            if req.swapped is not None:
                req.block_table.blocks = self.allocator.allocate(req.swapped.num_blocks)
                if self.on_resume is not None:
                    self.on_resume(req)
            elif self.on_admit is not None:        # prefix caching: shared hit blocks, a computed prefix
                self.on_admit(req)
            req.block_table.ensure(min(self.step_blocks(req) * self.block_size, self._positions(req)))
            self.running.append(req)
            batch.append(req)
            budget -= len(req.scheduled()[0])
        return batch

    def finish(self, req: Request) -> None:
        req.finished = True
        req.block_table.release()
        self.running.remove(req)
        self.finished.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
