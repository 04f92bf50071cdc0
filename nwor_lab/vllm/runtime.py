"""NWOR inside one vLLM worker: the window state machine between vLLM's hooks and the lab's policy.

One step of vLLM's runner, and what the runtime does at each point:

    runner._prepare_inputs        plan(): the step's requests, scheduled tokens and drafts
                                  (vLLM's SpecDecodeMetadata, used as it is)
    target layer 0 writes K/V     begin the VERIFY window: Window.from_metadata(metadata,
                                  query_start_loc, the slot mapping vLLM hands the layer),
                                  layers 0..L-1 (target and EAGLE head alike)
    every layer writes K/V        policy.write(layer, key, value)  (stage: into its buffer)
    every layer attends           vLLM's kernel reads the cache; when the policy keeps the window
                                  in a buffer (stage), staged_metadata() copies the window's blocks
                                  into staging blocks past vLLM's pool, writes the staged rows
                                  there and hands vLLM's kernel a block table pointing at them
                                  (staging.py); when that cannot serve, attend(): the lab's verify
                                  attention over the cache prefix plus the staged rows
                                  (ops.verify_attention_batched, every request in one SDPA)
    runner._sample                accept(): SCV on the rejection sampler's output -> Acceptance
    head's first pass (layer N)   written into the verify window like any layer (same rows, slots)
    head's chain step 1           commit the verify window; begin the DRAFT window on layer N: all
                                  k-1 chain steps' slots, step-major, as vLLM will compute them
    chain step j                  policy.write(N, key, value, token_offset=(j-1)*R)
    end of runner.sample_tokens   commit what is still open (the draft window rejecting every row)

A window that cannot be matched to vLLM's step (an unknown drafting method, a slot mapping that
is not the one predicted) raises with what differed: nothing is written silently.

Under tensor parallelism every rank runs one runtime on its shard of KV heads (ranks.py): the
same windows and acceptance, its own bytes and checks; its record lines carry its rank.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import build_slot_mapping
from nwor_lab.ops.verify_attention_batched import attend_batched, plan_batched
from nwor_lab.ops.quant import raw
from nwor_lab.policies import make_policy
from nwor_lab.speculative import ScvRunner
from nwor_lab.vllm.names import LOGGER
from nwor_lab.vllm.settings import NworSettings
from nwor_lab.window import Acceptance, Window

log = logging.getLogger(LOGGER)


@dataclass
class _Plan:
    """What `_prepare_inputs` scheduled: one entry per request, in the runner's batch order."""
    num_scheduled: list[int]
    metadata: object | None          # vLLM's SpecDecodeMetadata, or None (no speculative config)
    req_ids: list[str]


@dataclass
class _Open:
    """An open window and what the runtime needs to check and count it."""
    kind: str                        # "verify" or "draft"
    window: Window
    req_ids: list[str]
    layers: range
    step: int
    acceptance: Acceptance | None = None
    sampled: torch.Tensor | None = None
    emit_caps: list | None = None                  # per request: tokens it may still emit (max_tokens)
    before: dict = field(default_factory=dict)     # layer -> raw (key, value) rows at the window's slots
    slots_seen: object = None                      # the last slot tensor found equal to the window's
    written: dict = field(default_factory=dict)    # layer -> (key, value) rows handed to write()


@dataclass
class Totals:
    """What the runtime saw, summed over windows (the numbers a note or a chapter reports)."""
    steps: int = 0
    verify_windows: int = 0          # verify windows that had drafts
    drafts: int = 0
    accepted: int = 0
    draft_windows: int = 0           # EAGLE chains
    chain_rows: int = 0              # chain rows (all rejected), per layer written
    rejected_writes: int = 0         # rejected rows x layers that landed in vLLM's cache
    rejected_left: int = 0           # ... and were still there after the window
    checks_passed: int = 0           # windows whose cache bytes were checked (settings.check)
    bytes_written: int = 0
    seconds_in_nwor: float = 0.0     # host time inside the runtime's hooks

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class NworRuntime:
    """Owned by the worker's model runner (`runner.nwor`). Inactive until `attach_cache`."""

    def __init__(self, settings: NworSettings, runner, rank: dict | None = None):
        self.settings = settings
        # where this worker is: {"rank", "tp_rank", "tp_size"} (vLLM's world rank and TP group)
        self.rank = dict(rank) if rank else {"rank": 0, "tp_rank": 0, "tp_size": 1}
        self.config = settings.lab
        self.check = settings.check          # compare vLLM's cache with the invariants after every window
        self.runner = runner
        self.vc = None                   # nwor_lab.vllm.cache.VllmCache
        self.policy = None
        self._parked = None                  # the policy while the runtime stands down (set_active)
        self.scv = ScvRunner(self.config.scv_mode)
        self.plan_: _Plan | None = None
        self.verify: _Open | None = None
        self.draft: _Open | None = None
        self.step = 0
        self.totals = Totals()
        self.trace: list[WindowTrace] = []      # every committed window, in order (generate's statistics)
        self.windows: list[dict] = []           # the same windows as the `record` JSONL rows
        self.last_req_ids: list[str] = []
        self._record = None                          # the record file's descriptor (O_APPEND), or None
        self._plan_key, self._plan = None, None      # stage attention: the current pass's gather plan
        self._stage_key, self._stage = None, None    # stage attention: the current pass's staging plan
        self.staging = None                          # StagingBlocks (attach_cache), or None
        self.max_model_len = runner.model_config.max_model_len
        self.block_size = None

    # -- set-up ---------------------------------------------------------------------------------
    def attach_cache(self, staging: tuple[int, int] | None = None) -> None:
        """`staging`: (the pool's block count, spare blocks past it in every KV tensor), in vLLM's
        blocks, when the worker allocated staging blocks (staging.py); None: stage's attention
        runs the lab's torch path."""
        from nwor_lab.vllm.cache import build
        from nwor_lab.vllm.staging import StagingBlocks

        self.vc = build(self.runner, self.runner.model_config.dtype)
        self.block_size = self.vc.cache.spec.block_size
        self.staging = None
        if staging is not None:
            pool, extra = staging
            tensor_blocks = self.vc.packed[0].shape[0]
            ratio = tensor_blocks // (pool + extra)         # kernel blocks per vLLM block
            if ratio * (pool + extra) != tensor_blocks:
                raise RuntimeError(f"nwor_lab.vllm: the KV tensors hold {tensor_blocks} blocks, not a multiple of "
                                   f"the {pool} + {extra} staging blocks allocated; the tensor placement changed")
            self.staging = StagingBlocks(pool * ratio, extra * ratio, self.block_size)
        self.policy = make_policy(self.config, self.vc.cache)
        if self.settings.record:
            # every rank appends to the one file: one os.write per line on an O_APPEND descriptor,
            # so lines of different ranks never interleave
            path = self.settings.record
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._record = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        r = self.rank
        log.info("nwor_lab.vllm: NWOR active, mode %s, rank %d (tp rank %d of %d): %s; %d layers (%d target + "
                 "%d head) x %d KV heads, block_size %d, %s", self.config.nwor_mode, r["rank"], r["tp_rank"],
                 r["tp_size"], self.settings.describe(), self.vc.cache.num_layers, self.vc.num_target_layers,
                 self.vc.cache.num_layers - self.vc.num_target_layers, self.vc.cache.spec.num_kv_heads,
                 self.block_size, f"{self.staging.count} staging blocks from block {self.staging.first}"
                 if self.staging else "no staging blocks")

    def set_mode(self, nwor_mode: str | None = None, scv_mode: str | None = None) -> None:
        """Switch the write policy / SCV mode between steps (no window may be open)."""
        if self.verify or self.draft:
            raise RuntimeError("set_mode: a window is open; switch between steps")
        changes = {k: v for k, v in (("nwor_mode", nwor_mode), ("scv_mode", scv_mode)) if v is not None}
        self.config = self.config.replace(**changes)
        self.policy = make_policy(self.config, self.vc.cache)
        self.scv = ScvRunner(self.config.scv_mode)

    def set_active(self, active: bool) -> None:
        """Stand the plugin down (False: every hook defers to vLLM's own code, as if the engine had no
        NWOR settings) or back up, between steps. The benchmark's "vLLM alone" on the same engine."""
        if self.verify or self.draft:
            raise RuntimeError("set_active: a window is open; switch between steps")
        if active and self.policy is None:
            self.policy = self._parked
        elif not active and self.policy is not None:
            self._parked, self.policy = self.policy, None

    def reset_totals(self) -> Totals:
        """Start counting afresh (steps numbered from 1 again); returns what was counted."""
        done, self.totals, self.step = self.totals, Totals(), 0
        return done

    def clear(self) -> None:
        """Totals, trace and window rows afresh (before a run whose windows are read back)."""
        self.reset_totals()
        self.trace.clear()
        self.windows.clear()

    def report(self) -> dict:
        """What this rank did since `clear` (picklable: collective_rpc sends it across processes)."""
        return {**self.rank, "active": self.active, "nwor_mode": self.config.nwor_mode,
                "num_kv_heads": self.vc.cache.spec.num_kv_heads if self.vc is not None else None,
                "totals": self.totals.to_dict(), "trace": list(self.trace), "windows": list(self.windows)}

    @property
    def active(self) -> bool:
        return self.policy is not None

    # -- runner hooks ---------------------------------------------------------------------------
    def plan(self, num_scheduled, metadata, req_ids) -> None:
        if not self.active:
            return
        if self.verify or self.draft:     # a step that never reached sampling: leave the cache as off would
            self._cancel_open("a new step began before the last one's windows were committed")
        self.plan_ = _Plan([int(n) for n in num_scheduled], metadata, list(req_ids))
        self.step += 1
        self.totals.steps += 1

    def accept(self, sampled_token_ids: torch.Tensor) -> None:
        """The rejection sampler's output `[R, max_spec_len + 1]` (-1 placeholders) for the open
        verify window: SCV turns it into the Acceptance the policy commits."""
        v = self.verify
        if v is None:
            return
        with self._timed():
            w = v.window
            v.sampled = sampled_token_ids[:w.num_reqs]
            v.emit_caps = self._emit_caps(v.req_ids)
            if w.num_drafts:
                v.acceptance = self.scv.accept(w, v.sampled)
                if self.config.debug:
                    self._check_count(v)

    def _emit_caps(self, req_ids) -> list:
        """Tokens each request may still emit this step (its max_tokens minus what it has): vLLM cuts
        the sampled ids there, and the lab's statistics count what was emitted. Stop tokens and
        strings are not applied (the lab's runs ignore EOS)."""
        caps = []
        for rid in req_ids:
            state = self.runner.requests.get(rid)
            sp = getattr(state, "sampling_params", None)
            caps.append(None if sp is None or sp.max_tokens is None else sp.max_tokens - len(state.output_token_ids))
        return caps

    def end_step(self) -> None:
        """End of `sample_tokens`: commit what is open (verify first: chain rows come after)."""
        with self._timed():
            try:
                if self.verify is not None:
                    self._commit_verify()
                if self.draft is not None:
                    self._commit(self.draft, Acceptance.rejecting_all(self.draft.window))
                    self.draft = None
            finally:
                self.plan_ = None

    # -- backend hooks --------------------------------------------------------------------------
    def write(self, layer_name: str, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor,
              attn_metadata) -> bool:
        """A layer's K/V for this forward; False: not ours (vLLM writes it as it would).
        `attn_metadata`: the layer's metadata, or a callable returning it (read only when needed)."""
        if not self.active:
            return False
        layer = self.vc.index.get(layer_name)
        if layer is None:
            return False
        with self._timed():
            return self._write(layer, key, value, slot_mapping, attn_metadata)

    def attend(self, layer_name: str, query: torch.Tensor, attn_metadata, scale: float,
               output: torch.Tensor) -> bool:
        """Attention for a layer whose window rows wait in the policy's buffer (stage): the cache
        prefix plus the staged rows, with the lab's batched torch attention (where staging blocks cannot
        serve: `staged_metadata` returned None). False: vLLM's kernel reads the cache."""
        found = self._buffered_layer(layer_name)
        if found is None:
            return False
        with self._timed():
            self._attend(*found, query, attn_metadata, scale, output)
        return True

    def staged_metadata(self, layer_name: str, attn_metadata):
        """For a layer whose window rows wait in the policy's buffer (stage): fill the staging
        blocks of this layer (the real blocks' copies plus the staged rows) and return vLLM's
        metadata with the block table pointing there, for vLLM's own kernel. None: not ours, or
        not expressible with staging blocks (`attend` then runs the lab's torch attention)."""
        found = self._buffered_layer(layer_name) if self.staging is not None else None
        if found is None:
            return None
        layer, opened = found
        with self._timed():
            ranges = self.policy.written_rows(layer)
            key = (id(opened), id(attn_metadata), tuple(ranges))    # every layer of one pass shares it
            if self._stage_key != key:
                w = opened.window
                p = None
                if bool((w.slot_mapping >= 0).all()):          # a row without a slot: the torch path
                    p = self.staging.plan(w.token_req, w.num_reqs, ranges, attn_metadata)
                self._stage_key, self._stage = key, p
            p = self._stage
            if p is None:
                return None
            win_key, win_value = self.policy.window_kv(layer)
            self.staging.fill(p, self.vc.packed[layer], self.vc.cache.native_writers[layer], win_key, win_value)
            return p.metadata

    def _buffered_layer(self, layer_name: str):
        """`(layer, open window)` when this layer's window rows wait in the policy's buffer (stage,
        rows written); else None."""
        if not self.active or not self.policy.window_in_buffer:
            return None
        layer = self.vc.index.get(layer_name)
        opened = self._window_of(layer)
        return None if opened is None else (layer, opened)

    @contextlib.contextmanager
    def _timed(self):
        """Host time spent in the runtime's hooks (`totals.seconds_in_nwor`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals.seconds_in_nwor += time.perf_counter() - t0

    # -- the state machine ----------------------------------------------------------------------
    def _write(self, layer, key, value, slot_mapping, md) -> bool:
        n_target = self.vc.num_target_layers
        v, d = self.verify, self.draft
        if v is None and d is None and self.plan_ is not None and layer < n_target:
            v = self._begin_verify(slot_mapping, md() if callable(md) else md)
        if v is not None and layer in v.layers and not self.policy.written_rows(layer):
            t = v.window.num_tokens
            # vLLM hands every layer of a pass the same slot tensor: compare its values once per tensor
            same = slot_mapping is v.slots_seen or (key.shape[0] >= t and torch.equal(slot_mapping[:t].long(),
                                                                                       v.window.slot_mapping))
            if not same:
                raise RuntimeError(f"nwor_lab.vllm: layer {layer} wrote {key.shape[0]} rows at slots that are not "
                                   f"the verify window's {t} (step {self.step}); this drafting method writes its "
                                   f"head's first pass differently, and the plugin does not support it")
            v.slots_seen = slot_mapping
            if key.shape[0] != t:
                key, value = key[:t], value[:t]
            self._keep(v, layer, key, value)
            self.policy.write(layer, key, value)
            return True
        if layer >= n_target and (v is not None or d is not None):
            return self._chain_write(layer, key, value, slot_mapping, md() if callable(md) else md)
        if self.plan_ is None and v is None and d is None:
            return False             # a forward vLLM runs outside a step (profiling, warm-up)
        raise RuntimeError(f"nwor_lab.vllm: unexpected K/V write to layer {layer} in step {self.step} "
                           f"(verify window {'open' if v else 'closed'}, draft window {'open' if d else 'closed'})")

    def _begin_verify(self, slot_mapping, md) -> _Open:
        plan, self.plan_ = self.plan_, None
        t = sum(plan.num_scheduled)
        slots = slot_mapping[:t].long()
        cu = torch.tensor(plan.num_scheduled, dtype=torch.int64).cumsum(0)
        if md is not None and torch.is_tensor(getattr(md, "query_start_loc", None)):
            qsl = md.query_start_loc[1:len(plan.num_scheduled) + 1].long()
            if not torch.equal(qsl, cu):
                raise RuntimeError(f"nwor_lab.vllm: query_start_loc {qsl.tolist()[:8]} disagrees with the scheduled "
                                   f"tokens {plan.num_scheduled[:8]} (step {self.step})")
        if plan.metadata is not None:
            window = Window.from_metadata(plan.metadata, cu, slots)
        else:
            window = Window.from_counts(plan.num_scheduled, [0] * len(plan.num_scheduled), slots)
        self.verify = self._open("verify", window, plan.req_ids, range(0, self.vc.cache.num_layers))
        return self.verify

    def _chain_write(self, layer, key, value, slot_mapping, md) -> bool:
        if self.verify is not None:          # chain step 1: the verify window is complete
            self._commit_verify()
        d = self.draft
        r = key.shape[0]
        if d is None:
            d = self._begin_draft(layer, slot_mapping[:r].long(), md)
        step = d.window.num_tokens // d.window.num_reqs
        written = sum(b - a for a, b in self.policy.written_rows(layer))
        j = written // d.window.num_reqs
        rr = d.window.num_reqs
        if r < rr or j >= step:
            raise RuntimeError(f"nwor_lab.vllm: chain write {j + 1} of {r} rows to layer {layer} does not fit the "
                               f"draft window ({step} steps x {rr} requests) in step {self.step}")
        want = d.window.slot_mapping[j * rr:(j + 1) * rr]
        if not torch.equal(slot_mapping[:rr].long(), want):
            raise RuntimeError(f"nwor_lab.vllm: chain step {j + 1} writes slots {slot_mapping[:rr].tolist()[:8]}, the "
                               f"draft window predicted {want.tolist()[:8]} (step {self.step}); vLLM's chain slot rule "
                               f"changed")
        self._keep(d, layer, key[:rr], value[:rr], offset=j * rr)
        self.policy.write(layer, key[:rr], value[:rr], token_offset=j * rr)
        return True

    def _begin_draft(self, layer, first_slots, md) -> _Open:
        """The EAGLE chain's window: k-1 steps x R requests, step-major (row j * R + r is step j+1
        of request r, as the lab's engine builds it: engine/drafter.py:chain_window), every row a
        draft. Slots as vLLM's `eagle_step_slot_mapping_metadata_kernel` computes them: step 1 at
        position seq_len - 1, then +1 per step; a position past max_model_len becomes position 0
        with slot -1, and the next step goes on from there."""
        steps = self.runner.speculative_config.num_speculative_tokens - 1
        num_reqs = first_slots.numel()
        pos = md.seq_lens[:num_reqs].long() - 1
        over = pos == 0                                     # step 1 was clamped already
        positions = []
        for j in range(steps):
            if j:
                pos = pos + 1
                over = pos >= self.max_model_len
                pos = torch.where(over, torch.zeros_like(pos), pos)
            positions.append(torch.where(over, torch.full_like(pos, -1), pos))
        positions = torch.cat(positions)                    # [steps * R], step-major; -1: no slot
        token_req = torch.arange(num_reqs, dtype=torch.int32).repeat(steps)
        slots = build_slot_mapping(md.block_table, token_req, positions, self.block_size)
        draft_pos = torch.arange(1, steps + 1, dtype=torch.int32).repeat_interleave(num_reqs)
        draft_rows = torch.arange(steps * num_reqs).view(steps, num_reqs).t().reshape(-1)   # request-major
        window = Window(slots, token_req, draft_pos, draft_rows, [steps] * num_reqs, [steps] * num_reqs)
        self.draft = self._open("draft", window, self.last_req_ids, range(layer, layer + 1))
        return self.draft

    def _open(self, kind: str, window: Window, req_ids, layers: range) -> _Open:
        """Begin `window` on the policy over `layers` (the cache's bytes there saved first when checking)."""
        opened = _Open(kind, window, req_ids, layers, self.step)
        if self.check:
            opened.before = self._raw_rows(window.slot_mapping, layers)
        self.policy.begin(window, layers, kind=kind)
        return opened

    def _commit_verify(self) -> None:
        v, self.verify = self.verify, None
        self.last_req_ids = v.req_ids
        if v.window.num_drafts and v.acceptance is None:
            self.policy.cancel()
            raise RuntimeError(f"nwor_lab.vllm: the verify window of step {v.step} has {v.window.num_drafts} "
                               f"drafts but no sampler output reached the plugin (runner._sample)")
        self._commit(v, v.acceptance)

    def _commit(self, opened: _Open, acceptance: Acceptance | None) -> None:
        rec = self.policy.commit(acceptance)
        w = opened.window
        layers_written = len(opened.written)
        real = w.slot_mapping >= 0
        kept = real if acceptance is None else (real & acceptance.commit_mask)
        rejected_rows = int((real & ~kept).sum())
        reached = 0 if self.policy.window_in_buffer else rejected_rows * layers_written
        left = 0 if self.policy.preserves_rejected_slots else reached
        t = self.totals
        if opened.kind == "verify" and w.num_drafts:
            t.verify_windows += 1
            t.drafts += w.num_drafts
            t.accepted += rec.num_accepted if rec is not None else int(acceptance.accepted_len.sum())
        if opened.kind == "draft":
            t.draft_windows += 1
            t.chain_rows += int(real.sum()) * layers_written
        t.rejected_writes += reached
        t.rejected_left += left
        if rec is not None:
            t.bytes_written += rec.bytes_written
        if self.check:
            self._check_cache(opened, kept)
            t.checks_passed += 1
        emitted = []
        if opened.sampled is not None:      # what vLLM emits: the sampled ids, cut at each request's max_tokens
            caps = opened.emit_caps or [None] * w.num_reqs
            emitted = [[int(t) for t in row if t != -1][:cap] for row, cap in zip(opened.sampled.tolist(), caps)]
        accepted = acceptance.accepted_per_request() if acceptance is not None else [0] * w.num_reqs
        self.trace.append(WindowTrace(opened.step, opened.kind, list(opened.req_ids), drafted=list(w.num_draft_tokens),
                                      accepted=accepted, emitted=emitted, record=rec))
        row = {"vllm_step": opened.step, "kind": opened.kind, **self.rank,
               "layers": [opened.layers.start, opened.layers.stop],
               "rejected_writes": reached, "rejected_left": left, **(rec.to_dict() if rec is not None else {})}
        self.windows.append(row)
        if self._record is not None:
            os.write(self._record, (json.dumps(row) + "\n").encode())

    def _cancel_open(self, why: str) -> None:
        log.warning("nwor_lab.vllm: %s; cancelling the open window (the cache keeps every row written, as off)", why)
        self.policy.cancel()
        self.verify = self.draft = None

    # -- attention over the staged window ---------------------------------------------------------
    def _window_of(self, layer) -> _Open | None:
        for opened in (self.draft, self.verify):
            if opened is not None and layer in opened.layers and self.policy.written_rows(layer):
                return opened
        return None

    def _attend(self, layer, opened: _Open, query, md, scale, output) -> None:
        ranges = self.policy.written_rows(layer)
        key = (id(opened), id(md), tuple(ranges))     # every layer of one pass shares this: plan once
        if self._plan_key != key:
            self._plan_key, self._plan = key, self._plan_pass(opened.window, ranges, md)
        plan, t = self._plan
        key_cache, value_cache = self.vc.cache.layer(layer)
        win_key, win_value = self.policy.window_kv(layer)
        attend_batched(plan, query[:t], key_cache, value_cache, win_key=win_key, win_value=win_value, scale=scale,
                       out=output[:t])

    def _plan_pass(self, w: Window, ranges, md):
        """Where each request's keys come from in this pass: positions before its staged rows from
        vLLM's cache (its block table), then its staged rows in position order; its queries are
        the last q_len of those positions (vLLM's seq_lens count them all). Host arithmetic in numpy."""
        num_reqs = w.num_reqs
        rows = np.concatenate([np.arange(a, b) for a, b in ranges])
        req = w.token_req.numpy()[rows]
        win_rows = rows[np.argsort(req, kind="stable")]          # per request, in row (= position) order
        counts = np.bincount(req, minlength=num_reqs)
        win_start = np.concatenate([[0], np.cumsum(counts)])
        qsl = md.query_start_loc.numpy()[:num_reqs + 1].astype(np.int64)
        seq_lens = md.seq_lens.numpy()[:num_reqs].astype(np.int64)
        q_lens = np.diff(qsl)
        t = int(qsl[-1])
        token_req = np.repeat(np.arange(num_reqs), q_lens)
        positions = seq_lens[token_req] - q_lens[token_req] + (np.arange(t) - qsl[token_req])
        t_ = torch.from_numpy
        plan = plan_batched(md.block_table, t_(seq_lens - counts), t_(qsl), t_(positions), self.block_size,
                            win_rows=t_(win_rows), win_start=t_(win_start))
        return plan, t

    # -- checks -----------------------------------------------------------------------------------
    def _keep(self, opened: _Open, layer, key, value, offset: int = 0) -> None:
        if self.check:
            opened.written.setdefault(layer, []).append((offset, key.clone(), value.clone()))
        else:
            opened.written.setdefault(layer, [])

    def _raw_rows(self, slots: torch.Tensor, layers: range) -> dict:
        bs = self.block_size
        s = slots.clamp(min=0)
        out = {}
        for layer in layers:
            k, v = self.vc.cache.layer(layer)
            out[layer] = (raw(k[s // bs, s % bs]).clone(), raw(v[s // bs, s % bs]).clone())
        return out

    def _check_cache(self, opened: _Open, kept: torch.Tensor) -> None:
        """After a window: rejected slots as the policy declares (bit-identical to before when it
        preserves them), kept slots holding exactly the rows that were written."""
        w = opened.window
        real = w.slot_mapping >= 0
        after = self._raw_rows(w.slot_mapping, opened.layers)
        rejected = real & ~kept
        for layer, parts in opened.written.items():
            k_now, v_now = after[layer]
            k_old, v_old = opened.before[layer]
            if self.policy.preserves_rejected_slots:
                for what, now, old in (("key", k_now, k_old), ("value", v_now, v_old)):
                    if not torch.equal(now[rejected], old[rejected]):
                        raise AssertionError(f"nwor_lab.vllm check (rank {self.rank['rank']}): {self.policy.name} {opened.kind} window of step "
                                             f"{opened.step}: a rejected {what} slot of layer {layer} is not "
                                             f"bit-identical to before the window")
            wk = torch.zeros_like(k_now)
            wv = torch.zeros_like(v_now)
            for offset, key, value in parts:
                wk[offset:offset + key.shape[0]] = raw(key.to(self.vc.cache.spec.storage_dtype))
                wv[offset:offset + value.shape[0]] = raw(value.to(self.vc.cache.spec.storage_dtype))
            if not (torch.equal(k_now[kept], wk[kept]) and torch.equal(v_now[kept], wv[kept])):
                raise AssertionError(f"nwor_lab.vllm check (rank {self.rank['rank']}): {self.policy.name} {opened.kind} window of step "
                                     f"{opened.step}: a kept slot of layer {layer} does not hold the K/V written")

    def _check_count(self, v: _Open) -> None:
        """Debug: the committed count is vLLM's own (the runner's (ids != -1).sum(1) - 1)."""
        w = v.window
        emitted = (v.sampled != -1).sum(1)
        has = torch.tensor([n > 0 for n in w.num_draft_tokens])
        vllm_count = int(torch.where(has, (emitted - 1).clamp(min=0), torch.zeros_like(emitted)).sum())
        ours = int(v.acceptance.accepted_len.sum())
        if ours != vllm_count:
            raise AssertionError(f"nwor_lab.vllm debug (rank {self.rank['rank']}): step {v.step}: SCV accepted {ours} drafts, vLLM's sampler "
                                 f"output says {vllm_count}")

