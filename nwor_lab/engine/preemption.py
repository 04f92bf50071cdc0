"""Preemption and abort: what the engine does with a request whose blocks it takes away.

Admission no longer reserves a request's worst case: a request is admitted while its prompt's
blocks plus one step's lookahead fit. When a step cannot get the blocks its requests need, the
scheduler preempts the newest running request (vLLM's order) in one of two modes:

    recompute  its blocks (and a hybrid target's state slot) are freed, its drafts dropped; it goes
               back to the front of the waiting queue and, when scheduled again, re-prefills its
               prompt + the output so far (in chunks when longer than `max_num_batched_tokens`:
               chunked prefill, nwor_lab.engine.scheduler; the head's K/V is recomputed with it)
    swap       its blocks' bytes (every layer: the target's and the head's layer N, which shares the
               block ids) and its state slot are copied to host memory (pinned on CUDA), then
               freed; when it is scheduled again they are copied into freshly allocated blocks and
               it continues with its drafts, as if it had never been preempted

A request whose re-prefill would overwrite its own sliding-window ring positions (prompt + output
longer than the ring) is swapped even under `recompute` (`PreemptionStats.swapped_for_budget`), and
so is a request with its own generator at T > 0 (`swapped_for_seed`): swapped, it verifies the drafts
it drew and draws on from its stream as if never preempted, so its tokens are its seed's (a re-prefill
would sample its next token from a prefill row, another order of draws). A hybrid target's request
preempted mid-window is recomputed whatever its generator: its seeded stream then differs.
The engine's side of all this is `Lifecycle` (`engine.lifecycle`); the scheduler's is its
`step_blocks` / `preempt` and the `on_preempt` / `on_resume` hooks.

`engine.preempt(req_id)` and `engine.abort(req_id)` may also be called from outside the scheduler,
between steps or while a step runs (an observer's `on_phase`). A request dropped while its verify
window is open keeps no draft of that window: before the policies commit, its drafts are all
rejected (`drop_requests`: `stage` never copies their staged rows, `cow` restores their slots from
its log, `off` leaves them past the committed positions, where nothing reads them). Its t_last row
is no draft (the token was sampled and emitted): it lands at the request's first uncommitted
position, in its own block, which the host does not count as committed (`num_computed` stays), and
the resumed request writes the same token there again. The dropped request drafts nothing for the
next window, the host does not advance it, and at the end of the step it is aborted (its blocks
and state slot freed) or preempted (a hybrid target's by recompute: its state slot went past
t_last with the window). The other requests of the step are unaffected. Dropped after the commit
(the `acceptance` or `commit` phase), the window's accepted rows reached the request's own blocks
past `num_computed`: they are freed, or swapped out and overwritten when the request re-verifies.
A captured step (CUDA graph) cannot read the host's drops: there the host alone drops the request
after the step, as after a commit (observers keep steps eager, so an observer's drop never meets a
captured step; not verified on a GPU here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.config import PREEMPTION_MODES   # the names LabConfig.preemption accepts (one home)


@dataclass(frozen=True)
class Preemption:
    """How the engine preempts (`SpecEngine(..., preemption=Preemption("swap"))`)."""

    mode: str = "recompute"

    def __post_init__(self) -> None:
        if self.mode not in PREEMPTION_MODES:
            raise ValueError(f"Preemption(mode={self.mode!r}): choose one of {', '.join(PREEMPTION_MODES)}")


@dataclass
class PreemptionStats:
    """What the engine's preemptions and aborts cost (a bench reads these)."""

    preemptions: int = 0            # requests preempted (either mode)
    recomputed_tokens: int = 0      # positions re-prefilled after a recompute preemption
    swapped_out_bytes: int = 0      # bytes copied to host memory (K/V of every layer, state slot)
    swapped_in_bytes: int = 0       # bytes copied back
    swapped_for_budget: int = 0     # recompute preemptions swapped instead (re-prefill longer than its ring)
    swapped_for_seed: int = 0       # recompute preemptions swapped instead (a request with its own generator)
    dropped_windows: int = 0        # open windows of preempted or aborted requests, committed as nothing
    aborted: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class SwappedOut:
    """A request's stores in host memory: per cache layer the key and value of its blocks
    `[n, BS, H, D]` (storage dtype, raw bytes), and a hybrid target's state slot (recurrent
    `[L, P, H, K, V]`, conv `[L, P, W-1, C]`, current row) or None."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    num_blocks: int
    state: tuple | None = None
    nbytes: int = field(default=0)
    ledger: torch.Tensor | None = None   # debug on a ring: which position each of its slots held


def block_slots(blocks: list[int], block_size: int) -> torch.Tensor:
    """Every slot of `blocks`, block by block `[len(blocks) * block_size]` int64."""
    b = torch.tensor(blocks, dtype=torch.long)
    return (b[:, None] * block_size + torch.arange(block_size)).reshape(-1)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of `t` (pinned when it lives on CUDA, so the copy back can be asynchronous)."""
    if t.device.type == "cuda":
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t)
        return out
    return t.clone()


def swap_out(cache, blocks: list[int], store=None, slot: int | None = None) -> SwappedOut:
    """Copy the bytes of `blocks` (every layer of `cache`) and, with a state `store`, its `slot`
    to host memory. The caller frees them."""
    idx = torch.tensor(blocks, dtype=torch.long, device=cache.device)
    keys, values, nbytes = [], [], 0
    for layer in range(cache.num_layers):
        k, v = cache.layer(layer)
        keys.append(_host(k[idx]))
        values.append(_host(v[idx]))
        nbytes += keys[-1].nbytes + values[-1].nbytes
    state = None
    if store is not None and slot is not None:
        state = (_host(store.recurrent[:, slot]), _host(store.conv[:, slot]), int(store.current[slot]))
        nbytes += state[0].nbytes + state[1].nbytes
    return SwappedOut(keys, values, len(blocks), state, nbytes)


def swap_in(cache, saved: SwappedOut, blocks: list[int], store=None, slot: int | None = None) -> None:
    """Copy `saved` into `blocks` (freshly allocated, `saved.num_blocks` of them) and its state
    into `slot` of `store`."""
    if len(blocks) != saved.num_blocks:
        raise ValueError(f"blocks: {len(blocks)} given for {saved.num_blocks} swapped-out blocks (engine bug)")
    idx = torch.tensor(blocks, dtype=torch.long, device=cache.device)
    for layer in range(cache.num_layers):
        k, v = cache.layer(layer)
        k[idx] = saved.keys[layer].to(cache.device, non_blocking=True)
        v[idx] = saved.values[layer].to(cache.device, non_blocking=True)
    if saved.state is not None:
        if store is None or slot is None:
            raise ValueError("swap_in: the request has a swapped state but no state slot was given (engine bug)")
        rec, conv, current = saved.state
        store.recurrent[:, slot] = rec.to(store.device, non_blocking=True)
        store.conv[:, slot] = conv.to(store.device, non_blocking=True)
        store.current[slot] = current


def drop_requests(window, acceptance, dropped: torch.Tensor):
    """`acceptance` with every draft of the requests in `dropped` (`[R]` bool, on the acceptance's
    device) rejected: what the policies then commit of those requests is t_last's row alone (not a
    draft: `cow` logs no old contents for it), at the request's first uncommitted position, which
    the host does not count as committed (`num_computed` stays)."""
    from nwor_lab.window import Acceptance
    acc = torch.where(dropped, torch.zeros_like(acceptance.accepted_len), acceptance.accepted_len)
    draft_mask = acceptance.draft_mask & ~dropped[window.draft_req.long()]
    return Acceptance(draft_mask, acc, window.commit_mask_for(draft_mask, acc))


def check_preemption(preemption) -> Preemption:
    """`preemption` as given (None: `Preemption()`, recompute); anything else is refused by name."""
    if preemption is None:
        return Preemption()
    if not isinstance(preemption, Preemption):
        raise TypeError(f"preemption: expected a nwor_lab.engine.preemption.Preemption (e.g. "
                        f"Preemption('swap')) or None, got {type(preemption).__name__}")
    return preemption


class Lifecycle:
    """The engine's preemption and abort (`engine.lifecycle`): the scheduler's `on_preempt` /
    `on_resume` hooks, `abort` / `preempt` from outside, and the drops of the step in flight
    (`in_step`: its requests; `dropped`: req_id -> "abort" / "preempt", applied at its end)."""

    def __init__(self, engine, preemption: Preemption):
        self.engine = engine
        self.preemption = preemption
        self.stats = PreemptionStats()
        self.in_step: list | None = None
        self.dropped: dict[int, str] = {}
        self._mid_window = False
        engine.scheduler.on_preempt = self.on_preempt
        engine.scheduler.on_resume = self.on_resume

    # -- from outside ----------------------------------------------------------------------------
    def find(self, req_id: int):
        sched = self.engine.scheduler
        for r in (*sched.running, *sched.waiting, *sched.finished):
            if r.req_id == req_id:
                return r
        raise ValueError(f"req_id={req_id!r}: no such request in this engine (ids 0..{sched._next_id - 1})")

    def stepping(self) -> list:
        """The requests of the step in flight: the one running, or the one pre-launched on the device."""
        if self.in_step is not None:
            return self.in_step
        return self.engine.runner.pending_requests or []

    def _in_flight(self, r) -> bool:
        return any(x is r for x in self.stepping())

    def abort(self, req_id: int) -> bool:
        """Drop request `req_id` for good: its blocks, its state slot and its swapped-out copies are
        freed; its tokens so far stay on the request, marked `aborted` (and finished). Called while
        a step runs (an observer), the request's open window keeps no draft and the request leaves
        at the end of the step. -> False when it had already finished."""
        r = self.find(req_id)
        if r.finished:
            return False
        if self._in_flight(r):
            self.dropped[r.req_id] = "abort"
            return True
        sched = self.engine.scheduler
        if any(x is r for x in sched.waiting):
            sched.waiting.remove(r)
        else:
            self._leave(r)
        self._mark_aborted(r)
        return True

    def preempt(self, req_id: int) -> None:
        """Preempt running request `req_id` now (mode `self.preemption`), as the scheduler does when
        blocks run out. Called while a step runs, its open window keeps no draft and it is preempted
        at the end of the step (a hybrid target's then by recompute: its state went past t_last)."""
        r = self.find(req_id)
        sched = self.engine.scheduler
        if not any(x is r for x in sched.running):
            raise ValueError(f"req_id={req_id}: not running (waiting, finished or aborted); only a running "
                             f"request can be preempted")
        if self._in_flight(r):
            if self.engine.states is not None and self.recompute_too_long(r):
                raise ValueError(f"req_id={req_id}: a hybrid target's request preempted mid-step is recomputed, "
                                 f"but its {len(r.tokens)} tokens outgrew its ring of {sched.ring_slots} slots "
                                 f"(a re-prefill would overwrite its own positions); preempt it between steps")
            self.dropped[r.req_id] = "preempt"
            return
        sched.preempt(r)

    def recompute_too_long(self, r) -> bool:
        """A re-prefill of prompt + output would overwrite its own ring positions (one longer than the
        step's token budget is prefilled in chunks)."""
        s = self.engine.scheduler
        return s.ring_slots is not None and len(r.tokens) > s.ring_slots

    # -- the step in flight ----------------------------------------------------------------------
    def window_drops(self, inp) -> torch.Tensor | None:
        """`[size]` bool on the device: the step's requests dropped while it runs, whose drafts the
        body rejects before the commit; None when none, and in a static step (a captured body
        cannot read the host's drops: the host drops them alone, after the step)."""
        if not self.dropped or inp.static:
            return None
        reqs = inp.host["requests"]
        flags = [r.req_id in self.dropped for r in reqs] + [False] * (inp.size - len(reqs))
        return torch.tensor(flags, dtype=torch.bool, device=self.engine.device)

    def apply_drops(self, requests: list) -> None:
        """At the end of a step (or its failure): abort or preempt what was dropped while it ran."""
        drops, self.dropped = self.dropped, {}
        for r in requests:
            what = drops.get(r.req_id)
            if what is None or r.finished:
                continue
            self.stats.dropped_windows += 1
            if what == "abort":
                self._leave(r)
                self._mark_aborted(r)
            else:
                self._mid_window = True
                try:
                    self.engine.scheduler.preempt(r)
                finally:
                    self._mid_window = False

    def _leave(self, r) -> None:
        """A running request leaves: its state slot and blocks freed, off the running list."""
        self.release_state(r)
        r.block_table.release()
        self.engine.scheduler.running.remove(r)

    def _mark_aborted(self, r) -> None:
        r.aborted = r.finished = True
        r.swapped = None
        r.drafts, r.draft_probs, r.draft_parents = [], None, None
        self.engine.scheduler.finished.append(r)
        self.stats.aborted += 1

    def release_state(self, r) -> None:
        """Give back a hybrid target's state slot (its next owner clears it)."""
        if r.state_slot is not None:
            self.engine.free_state_slots.append(r.state_slot)
            r.state_slot = None

    # -- the scheduler's hooks -------------------------------------------------------------------
    def on_preempt(self, r) -> None:
        """Before `r`'s blocks are freed: swap them out (and its state slot), or reset it to
        re-prefill prompt + output (recompute, in chunks where it is longer than the step's budget;
        swapped instead when that prefill would overwrite its own ring positions)."""
        e, stats = self.engine, self.stats
        stats.preemptions += 1
        r.preemptions += 1
        # a request with its own generator is swapped even under recompute: a re-prefill would sample
        # its next token from a prefill row, drawing from its stream in another order than the window
        # it was drafting for, so its tokens would no longer be its seed's
        seeded = r.generator is not None and e.temperature > 0
        swap = self.preemption.mode == "swap" or self.recompute_too_long(r) or seeded
        if e.states is not None and self._mid_window:
            swap = False        # its state slot went past t_last with the dropped window
        if swap and r.num_computed > 0:
            if self.preemption.mode != "swap":
                if self.recompute_too_long(r):
                    stats.swapped_for_budget += 1
                else:
                    stats.swapped_for_seed += 1
            store = e.states.store if e.states is not None else None
            r.swapped = swap_out(e.cache, r.block_table.blocks, store, r.state_slot)
            if e.ledger is not None:        # debug: the ring ledger's positions move with the bytes
                slots = block_slots(r.block_table.blocks, e.cache.spec.block_size)
                r.swapped.ledger = e.ledger.holder[:, slots].clone()
            stats.swapped_out_bytes += r.swapped.nbytes
        else:
            r.num_computed = 0
            r.drafts, r.draft_probs, r.draft_parents = [], None, None
            stats.recomputed_tokens += len(r.tokens)
        self.release_state(r)

    def on_resume(self, r) -> None:
        """Once swapped-out `r` has its new blocks: copy its bytes back (its state into a free slot)."""
        e = self.engine
        saved, r.swapped = r.swapped, None
        slot = None
        if saved.state is not None:
            slot = r.state_slot = e.free_state_slots.pop()
        swap_in(e.cache, saved, r.block_table.blocks, e.states.store if e.states is not None else None, slot)
        if saved.ledger is not None:
            e.ledger.holder[:, block_slots(r.block_table.blocks, e.cache.spec.block_size)] = saved.ledger
        self.stats.swapped_in_bytes += saved.nbytes
