"""Steady steps replayed from one CUDA graph per batch bucket (`LabConfig.cuda_graph`).

A steady step is one where every scheduled request verifies `t_last + exactly k drafts` (or, without
a draft head, decodes one token), greedily, with no observers and no debug checks. Such a step has
the same shapes every time for a given number of requests, so it is captured once per bucket of
requests (1, 2, 4, 8, ...; missing requests are padding: slot -1, draft -1, never kept) and replayed:

    policy.begin -> target forward (every layer, Triton attention) -> logits -> greedy rejection
    sampling -> SCV mask -> head pass over the same rows (its next-token inputs and its kept rows
    built on the device from the acceptance) -> policy.commit
    [-> the EAGLE draft chain d_1..d_k for the next window, its positions and slots built on the
        device from the acceptance: one graph, one replay, one readback per step]

Every request drafts k tokens to its last window (`Drafter.draft`), so decode steps keep one
shape to the end. A request that finishes in the step (accepted + 1 >= tokens it had left) gets
no chain rows: their slots are -1, decided on the device by the same rule the host applies.
Steps with prefills (alone, or mixed with steady decodes: a request joining mid-run) replay from
a bucket of their own with the chain aboard (`graphed_mixed.MixedBucket`), so the first drafts
after a prefill come from the prefill's graph; the chain's own graph (`GraphedDraft`) drafts
after an eager step.

Host work per step: the static inputs (token ids, positions, starts, cached lengths, tokens
left, draft ids; block tables apart) are written into pinned mirrors and sent with one copy per
dtype (`StaticInputs`); the window's slots are computed in the step from positions and block
tables. The outputs (sampled ids, accepted lengths, next drafts) come back in one packed tensor,
the one sync of the step (`Readback`). The step also computes the NEXT step's inputs on the
device, so when nothing can change that step (no request can finish now, nobody can be admitted,
no end token is watched) the host launches it before reading this one and does its bookkeeping
while the GPU runs (`GraphedVerify._can_prelaunch`).

A bucket's first step runs the same code eagerly (it compiles the kernels and is the warm-up);
its second step captures, then replays, so no step ever runs twice (a CoW log taken twice would
restore the wrong bytes). Short draft lists (cut by the token budget), sampling at temperature
> 0, observers and debug mode take the eager path. After a replay each policy makes the window's
`WindowRecord` on the host (`WritePolicy.replayed`) from a CPU window of the real requests: no
device work and no sync for bookkeeping.
"""
from __future__ import annotations

import torch

from nwor_lab.engine.batch import Verdict, VerifyBatch
from nwor_lab.engine.graphed_chain import ChainBucket, GraphedDraft
from nwor_lab.engine.graphed_mixed import MixedBucket, mixed_bucket_key, token_bucket
from nwor_lab.engine.graphed_static import (GraphedBucket, Readback, StaticInputs, accept_draft_commit, bucket_size,
                                            max_blocks)
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.window import Acceptance, Window


class _Bucket(GraphedBucket):
    """Static buffers, metadata and (after the warm-up) the graph of one padded batch size; with
    `chain`, the EAGLE draft chain for the next window runs in the same graph."""

    def __init__(self, engine, size: int, chain: bool):
        e, dev, k = engine, engine.device, engine.k
        self.size, t = size, size * (k + 1)
        self.inputs = StaticInputs(dev, ids=((t,), torch.long), positions=((t,), torch.long),
                                   start=((size,), torch.long),
                                   remaining=((size,), torch.long), req_key=((size,), torch.long),
                                   drafts=((size * k,), torch.int32), cache_lens=((size,), torch.int32))
        # the block tables travel alone: a pre-launched step sends them, and nothing else
        self.table_inputs = StaticInputs(dev, tables=((size, max_blocks(e)), torch.int32))
        i = self.inputs.dev
        self.ids, self.positions, self.cache_lens = i["ids"], i["positions"], i["cache_lens"]
        self.tables = self.table_inputs.dev["tables"]
        self.start = i["start"]                                         # each request's num_computed
        self.remaining = i["remaining"]                                 # tokens it has left (padding 0)
        self.req_key = i["req_key"]                                     # prompt hashes (forced acceptance)
        cu = [(k + 1) * (r + 1) for r in range(size)]
        self.spec = SpecDecodeMetadata.build([k] * size, cu, i["drafts"], device=dev)
        # slots are computed in the step (body) from positions and block tables, so that a
        # pre-launched step sees the blocks the host allocated for it
        self.window = Window.from_metadata(self.spec, cu, torch.full((t,), -1, dtype=torch.long, device=dev))
        in_buffer = e.policy.window_in_buffer
        qsl = [0] + cu
        kernel = KernelArgs(self.tables, self.cache_lens, torch.tensor(qsl, dtype=torch.int32, device=dev),
                            torch.arange(t, device=dev) if in_buffer else None,
                            torch.tensor(qsl, dtype=torch.int32, device=dev) if in_buffer else None,
                            max_query_len=k + 1)
        self.md = AttentionMetadata(self.positions, self.window.slot_mapping, qsl, None, None, None, e.cache,
                                    e.policy, 0, kernel)
        self.starts = torch.arange(0, t, k + 1, device=dev)             # each request's t_last row
        self.last_rows = self.starts + k
        self.no_drafts = Acceptance.from_accepted_len(self.window, [0] * size) if k == 0 else None
        self.chain = ChainBucket(e, size, tables=self.tables) if chain else None
        self.features = None                # head features [B, h] of the last run (None without a head)
        self.host_ids: list[int] = []      # this step's real rows, for the host's bookkeeping
        self.host_slots: list[int] = []
        self.readback = Readback(dev, (size, 2 * k + 2 if chain else k + 2))
        # the step computes the next one's inputs itself when it knows the next drafts: target-only
        # decoding, or the chain aboard (with k = 1 the drafter runs after the host read the step)
        self.feeds_itself = k == 0 or chain

    def host_rows(self, engine, requests, *, ensure: bool = True) -> tuple[list, ...]:
        """This step's rows from the requests' state: (ids, positions, slots, drafts, cache lens,
        starts, tokens left) of the real rows; kept in `host_ids` / `host_slots` for the host's
        bookkeeping. `ensure`: allocate the blocks the step writes (with the chain aboard, its
        rows too: a chain runs only if a + 1 < remaining, up to position s + a + k - 1)."""
        k = engine.k
        in_buffer = engine.policy.window_in_buffer
        ids, pos, slots, drafts, lens, start, left = [], [], [], [], [], [], []
        for req in requests:
            toks, s, _ = req.scheduled()
            if ensure:
                need = s + k + 1
                if self.chain is not None:
                    need = max(need, s + min(k, req.remaining - 2) + k)
                req.block_table.ensure(need)
            ids += toks
            pos += range(s, s + k + 1)
            slots += req.block_table.slots(range(s, s + k + 1))
            drafts += req.drafts
            lens.append(s + (0 if in_buffer else k + 1))
            start.append(s)
            left.append(req.remaining)
        self.host_ids, self.host_slots = ids, slots
        return ids, pos, slots, drafts, lens, start, left

    def fill(self, engine, requests) -> None:
        """Write this step's requests into the static inputs (padding rows stay padding), one
        copy per dtype."""
        k, pad = engine.k, self.size - len(requests)
        in_buffer = engine.policy.window_in_buffer
        ids, pos, slots, drafts, lens, start, left = self.host_rows(engine, requests)
        h = self.inputs.host
        h["ids"][:] = ids + [0] * (pad * (k + 1))
        h["positions"][:] = pos + list(range(k + 1)) * pad
        h["drafts"][:] = drafts + [-1] * (pad * k)
        h["cache_lens"][:] = lens + [0 if in_buffer else k + 1] * pad    # padding reads block 0, never kept
        h["start"][:] = start + [0] * pad
        h["remaining"][:] = left + [0] * pad
        h["req_key"][:] = [r.acceptance_key for r in requests] + [0] * pad
        self.inputs.upload()
        self.send_tables(requests)

    def send_tables(self, requests) -> None:
        tables = self.table_inputs.host["tables"]
        tables.fill(0)
        for r, req in enumerate(requests):
            blocks = req.block_table.blocks
            tables[r, :len(blocks)] = blocks
        self.table_inputs.upload()

    def body(self, engine):
        """The step on the static buffers -> (packed [B, k+2 (+k)] int64: sampled ids, accepted
        length, next drafts when the chain is aboard; head features [B, h] or None)."""
        e, w, spec, md = engine, self.window, self.spec, self.md
        k, bs = e.k, e.cache.spec.block_size
        real = self.remaining > 0                                        # [B] False: padding
        real_rows = real[:, None].expand(self.size, k + 1).reshape(-1)
        w.slot_mapping.copy_(build_slot_mapping(self.tables, w.token_req, torch.where(real_rows, self.positions, -1), bs))
        e.policy.begin(w, kind="verify")
        aux_layers = e.head.aux_layers if e.drafting else ()
        hidden, aux = e.target.forward_with_aux(self.ids, md, aux_layers)
        logits = e.target.compute_logits(hidden[spec.logits_indices.long()]).float()
        sampled = rejection_sample(spec, None, logits, temperature=0.0, **self._forced(e))
        accepted, _, features = accept_draft_commit(e, w, md, sampled, hidden, aux, self.ids, self.last_rows,
                                                    self.starts, self.no_drafts)
        packed = [sampled.long(), accepted[:, None]]
        if self.chain is not None:
            live = accepted + 1 < self.remaining                     # still running after this window
            base = torch.where(live, self.start + accepted + 1, 0)       # num_computed after the window
            self.chain.place(e, base, live, features)
            packed.append(self.chain.body(e))
        if self.feeds_itself:
            self._next_inputs(e, real, sampled, accepted, packed[-1] if self.chain is not None else None)
        return torch.cat(packed, 1), features

    def _forced(self, engine) -> dict:
        """Forced acceptance on the device: each draft's u from its request's key and position (rows
        1..k of each request's t_last + k), as the eager step hashes them."""
        if engine.acceptance is None:
            return {}
        k = engine.k
        keys = self.req_key[:, None].expand(self.size, k).reshape(-1)
        pos = self.positions.view(self.size, k + 1)[:, 1:].reshape(-1)
        return dict(synthetic_rates=engine.forced_rates, uniform_probs=engine.acceptance.uniforms(keys, pos))

    def _next_inputs(self, engine, real, sampled, accepted, drafts) -> None:
        """The next step's static inputs from this one's outputs, on the device: what `fill` would
        write after the host advanced every request, so the next step can be launched before the
        host has read this one (`GraphedVerify` pre-launches it only when no request can finish
        now; a request that finishes keeps its inputs, padding rows stay padding)."""
        k = engine.k
        token = sampled.gather(1, accepted[:, None]).long()              # [B, 1] the next t_last
        start = torch.where(real, self.start + accepted + 1, self.start)
        ids = torch.cat([token, drafts], 1) if drafts is not None else token    # [B, k+1]
        pos = start[:, None] + torch.arange(k + 1, device=start.device)
        in_buffer = engine.policy.window_in_buffer
        self.ids.copy_(torch.where(real[:, None], ids, 0).reshape(-1))
        self.positions.copy_(pos.reshape(-1))
        self.cache_lens.copy_(start + (0 if in_buffer else k + 1))
        self.remaining.copy_(torch.where(real, self.remaining - accepted - 1, 0))
        if drafts is not None:
            self.spec.draft_token_ids.copy_(torch.where(real[:, None], drafts, -1).reshape(-1))
        self.start.copy_(start)


class GraphedVerify:
    """The engine's graphed path for steady verify steps (see the module docstring)."""

    def __init__(self, engine, max_num_seqs: int, max_num_batched_tokens: int, *, capture: bool = True):
        """capture False: run the same padded static step eagerly every time (CPU tests of the
        padding and the on-device head and chain inputs; no graph)."""
        self.engine = engine
        self.capture = capture
        self.buckets: dict[tuple[int, bool], _Bucket] = {}
        self.max_size = bucket_size(max_num_seqs)
        self.steps = 0            # steps that took this path (eager warm-ups included)
        self.chained_steps = 0    # of which the draft chain rode in the verify graph
        self.prelaunched = 0      # of which were launched before the host read the step before
        self.pending = None       # (bucket, requests, readback handle) of a pre-launched step
        self.broken = ""          # why the engine cannot go on (an interrupted pre-launch), or ""
        # A captured graph holds the staging buffer's address: it must never be reallocated, so
        # reserve the largest window any step (graphed bucket or eager prefill) can bring.
        self.reserved = max(max_num_batched_tokens, self.max_size * (engine.k + 1))
        engine.policy.reserve(self.reserved)
        # steps with prefills (alone or mixed with decodes): (requests, tokens, chain) -> MixedBucket
        self.mixed_buckets: dict = {}
        self.mixed = True         # False: steps mixing prefills and decodes stay eager (bench comparison)
        self.prefill_steps = 0    # steps of prefills alone replayed from a MixedBucket
        self.mixed_steps = 0      # steps of prefills and decodes together replayed from a MixedBucket
        self.draft = GraphedDraft(engine, self.max_size) if engine.drafting else None
        self._chain = None        # (ChainBucket, what it drafted) of the last step that carried the chain

    def eligible(self, requests) -> bool:
        """A steady decode step, or a step of prefills, alone or with steady decodes
        (engine/graphed_mixed.py; with `mixed` False, prefills alone only)."""
        e = self.engine
        if e.temperature != 0 or e.observers or e.config.debug or len(requests) > self.max_size:
            return False
        k = e.k if e.drafting else 0
        steady = [not r.is_prefill and len(r.drafts) == k for r in requests]
        if all(steady):
            return True
        prefill = [r.is_prefill for r in requests]
        if not all(s or p for s, p in zip(steady, prefill)) or (any(steady) and not self.mixed):
            return False
        return token_bucket(sum(len(r.scheduled()[0]) for r in requests)) <= self.reserved

    def chain_aboard(self) -> bool:
        """Whether the draft chain rides in the step's graph (a drafting engine with k >= 2)."""
        return self.draft is not None and self.engine.k >= 2

    def step(self, requests):
        """-> (VerifyBatch, Verdict, head features [n, h] or None, WindowRecord or None, each
        request's next drafts [n][k] when the chain rode in the graph, else None).

        The step is launched (or was, by the step before: `pending`), the next one pre-launched
        when it can be (`_can_prelaunch`), and only then does the host wait for this step's
        outputs and do its bookkeeping, while the GPU runs the next step."""
        if self.broken:
            raise RuntimeError(f"graphed engine: {self.broken}; the requests' state no longer matches the "
                               f"cache: build a new engine")
        try:
            return self._step(requests)
        except BaseException:
            if self.pending is not None:   # the next step runs on the GPU, this one's bookkeeping is lost
                self.broken = "a step was interrupted after the next one had been launched"
            raise

    @property
    def pending_requests(self) -> list | None:
        """The requests of the pre-launched step (the engine's next step), or None."""
        return None if self.pending is None else list(self.pending[1])

    def _step(self, requests):
        e = self.engine
        if self.pending is None and any(r.is_prefill for r in requests):
            return self._mixed_step(requests)
        chain = self.chain_aboard()
        key = (bucket_size(len(requests)), chain)
        if key not in self.buckets:
            self.buckets[key] = _Bucket(e, key[0], chain)
        b = self.buckets[key]
        if self.pending is not None:
            pb, preqs, handle = self.pending
            self.pending = None
            if pb is not b or len(preqs) != len(requests) or any(x is not y for x, y in zip(preqs, requests)):
                raise RuntimeError("graphed engine: a step was pre-launched for other requests than the scheduler "
                                   "scheduled now (an engine bug; run with LabConfig(cuda_graph=False) meanwhile)")
            b.host_rows(e, requests, ensure=False)     # what the device fed itself, for the bookkeeping
        else:
            b.fill(e, requests)
            packed = self._launch(b)
            handle = b.readback.start(packed)
        if self._can_prelaunch(b, requests):
            self._prelaunch(b, requests)
        n, k = len(requests), e.k
        rows = b.readback.rows(handle, n)                               # the step's one sync
        acc = [row[k + 1] for row in rows]
        written = range(e.target.num_layers + (1 if e.drafting else 0))  # the head's layer N when it ran
        # the record counts the requests (a CPU window of them), not the bucket's padding
        host_window = Window.from_counts([k + 1] * n, [k] * n, torch.tensor(b.host_slots))
        record = e.policy.replayed(host_window, Acceptance.from_accepted_len(host_window, acc), written,
                                   opened=range(e.cache.num_layers))
        batch = VerifyBatch(list(requests), b.host_ids, [k + 1] * n, [r.num_computed for r in requests], [k] * n,
                            ["spec" if k else "decode"] * n, [(k + 1) * (i + 1) for i in range(n)], b.md, b.spec,
                            b.window)
        verdict = Verdict(torch.tensor(rows)[:, :k + 1], None, acc, [row[a] for row, a in zip(rows, acc)])
        drafted = None
        if chain:
            drafted = [row[k + 2:] for row in rows]
            # the device's rule: a request with a + 1 >= remaining finishes now and gets no chain rows
            self._chain = (b.chain, [(r, drafted[j], b.chain.row_slots(e, r, r.num_computed + a + 1))
                                     for j, (r, a) in enumerate(zip(requests, acc)) if a + 1 < r.remaining])
            self.chained_steps += 1
        self.steps += 1
        features = b.features
        return batch, verdict, (features[:n] if features is not None else None), record, drafted

    def _mixed_step(self, requests):
        """Prefills, alone or with steady decodes, from their (requests, tokens) bucket; the first
        drafts after a prefill ride in the same graph (engine/graphed_mixed.py)."""
        e, n = self.engine, len(requests)
        key = mixed_bucket_key(requests, self.chain_aboard())
        if key not in self.mixed_buckets:
            self.mixed_buckets[key] = MixedBucket(e, *key)
        b = self.mixed_buckets[key]
        b.fill(e, requests)
        packed = self._launch(b)
        rows = b.readback.rows(b.readback.start(packed), n)            # the step's one sync
        batch, verdict, record, ran = b.finish(e, requests, rows)
        if all(r.is_prefill for r in requests):
            self.prefill_steps += 1
        else:
            self.mixed_steps += 1
        self.steps += 1
        drafted = None
        if ran is not None:
            self._chain = (b.chain, ran)
            drafted = [d for _, d, _ in ran]
            self.chained_steps += 1
        features = b.features
        return batch, verdict, (features[:n] if features is not None else None), record, drafted

    def _launch(self, b) -> torch.Tensor:
        """Run (replay, or warm up / capture) bucket b's step -> its packed outputs (device)."""
        e = self.engine
        pols = [e.policy] + ([e.drafter.policy] if getattr(b, "chain", None) is not None else [])
        records = [p.records for p in pols]
        for p in pols:
            p.records = False                # a record reads counts on the host: not in a graph
        try:
            packed, b.features = b.run(e, self.capture, pols)
        finally:
            for p, r in zip(pols, records):
                p.records = r
        return packed

    def _can_prelaunch(self, b: "_Bucket", requests) -> bool:
        """The next step is this bucket again, with the inputs this step computes for it: every
        request runs on (none can emit its last token now: it has 2k + 2 or more left; no end
        token is watched, which only the host sees), the scheduler keeps them all and admits
        nobody (no request finishes, so neither slots nor blocks free up), and the graph exists
        (or, without capture, the eager body stands in for it: the CPU tests)."""
        e, k = self.engine, self.engine.k
        sched = e.scheduler
        running = sched.running
        return (b.feeds_itself and (b.graph is not None or not self.capture) and e.eos_token_id is None
                and len(running) == len(requests) and all(x is y for x, y in zip(running, requests))
                and (not sched.waiting or len(running) >= sched.max_num_seqs)   # nobody to admit
                and all(r.remaining >= 2 * k + 2 for r in requests))

    def _prelaunch(self, b: "_Bucket", requests) -> None:
        """Launch the next step now, on the inputs this step computed on the device. Its blocks
        are allocated for the most this step can accept (k): positions up to s + k + 1 + 2k - 1,
        inside every request's reservation (it has 2k + 2 tokens left or more)."""
        k = self.engine.k
        for r in requests:
            r.block_table.ensure(r.num_computed + k + 1 + (2 * k if b.chain is not None else k + 1))
        b.send_tables(requests)
        packed = self._launch(b)
        self.pending = (b, list(requests), b.readback.start(packed))
        self.prelaunched += 1

    def chain_done(self, step_index: int) -> tuple[WindowTrace, Window] | None:
        """After `step` carried the chain and the engine advanced the step's requests: hand out the
        drafts, record the chain window -> (trace, window), or None when every request finished
        in the step (no chain row was written)."""
        chain, ran = self._chain
        self._chain = None
        return self.draft.finish(chain, ran, step_index)
