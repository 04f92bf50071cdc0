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
no chain rows: their slots are -1, decided on the device by the same rule the host applies. The
chain's own graph (`GraphedDraft`) drafts after an eager step (the prefill's first drafts).

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
restore the wrong bytes). Prefills, short draft lists, sampling at temperature > 0, observers
and debug mode take the eager path. After a replay each policy makes the window's
`WindowRecord` on the host (`WritePolicy.replayed`) from a CPU window of the real requests: no
device work and no sync for bookkeeping.
"""
from __future__ import annotations

import numpy as np
import torch

from nwor_lab.engine.batch import Verdict, VerifyBatch
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.ops.scv import scv_mask
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.window import Acceptance, Window


class StaticInputs:
    """A graph's static input tensors, as views of one device buffer per dtype, filled from a
    pinned host mirror (numpy views: `host[name]`) with one copy per dtype (`upload`).

    Two mirrors, used in turn: when a step is pre-launched, the copy enqueued for the step before
    it may still be pending while the host writes the next mirror; the one before that has
    completed (the host read that step's outputs, which the stream ordered after the copy)."""

    def __init__(self, device: torch.device, **specs):
        """specs: name=(shape, dtype)."""
        pin = device.type == "cuda"
        self.dev: dict[str, torch.Tensor] = {}
        self._mirrors: list[dict[str, np.ndarray]] = [{}, {}]
        self._groups = []
        self._turn = 0
        for dtype in {d for _, d in specs.values()}:
            names = [n for n, (_, d) in specs.items() if d == dtype]
            sizes = [int(np.prod(specs[n][0])) for n in names]
            dev = torch.zeros(sum(sizes), dtype=dtype, device=device)
            hosts = [torch.zeros(sum(sizes), dtype=dtype, pin_memory=pin) for _ in range(2)]
            self._groups.append((dev, hosts))
            at = 0
            for name, size in zip(names, sizes):
                shape = specs[name][0]
                self.dev[name] = dev[at:at + size].view(shape)
                for mirror, host in zip(self._mirrors, hosts):
                    mirror[name] = host[at:at + size].view(shape).numpy()
                at += size

    @property
    def host(self) -> dict[str, np.ndarray]:
        """The mirror to write now (every field of it: the other mirror holds an older step)."""
        return self._mirrors[self._turn]

    def upload(self) -> None:
        for dev, hosts in self._groups:
            dev.copy_(hosts[self._turn], non_blocking=True)
        self._turn ^= 1


class Readback:
    """A step's packed outputs copied into pinned host memory right after its launch (two
    buffers, used in turn, so a pre-launched step's copy never overwrites one not yet read)."""

    def __init__(self, device: torch.device, shape):
        self.cuda = device.type == "cuda"
        self._bufs = [torch.zeros(shape, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
        self._turn = 0

    def start(self, packed: torch.Tensor):
        """Enqueue the copy of `packed` -> a handle for `rows`."""
        buf = self._bufs[self._turn]
        self._turn ^= 1
        buf.copy_(packed, non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        return buf, event

    @staticmethod
    def rows(handle, n: int) -> list[list[int]]:
        """Wait for the copy (the step's one sync) -> its first n rows."""
        buf, event = handle
        if event is not None:
            event.synchronize()
        return buf[:n].tolist()


def _bucket_size(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _max_blocks(engine) -> int:
    return -(-engine.max_model_len // engine.cache.spec.block_size) + 1


def _chain_record_window(slots: list[list[int]]) -> Window:
    """CPU Window of a draft chain over len(slots) requests, request j's k - 1 rows at slots[j]
    (step-major rows, as `engine.drafter.chain_window`): what the chain's record counts."""
    n, m = len(slots), len(slots[0])
    flat = [slots[j][s] for s in range(m) for j in range(n)]
    return Window(torch.tensor(flat), torch.arange(n, dtype=torch.int32).repeat(m),
                  torch.arange(1, m + 1, dtype=torch.int32).repeat_interleave(n),
                  torch.arange(n * m).view(m, n).t().reshape(-1), [m] * n, [m] * n)


class _Graphed:
    """The capture protocol every bucket shares: first call eager (warm-up, compiles), second
    captures then replays, later calls replay. `body(engine)` is the step on static buffers."""

    graph = None
    outputs = None
    warmed = False

    def body(self, engine):
        raise NotImplementedError

    def run(self, engine, capture: bool, policies=()):
        """-> the body's outputs. When the body's Python ran (warm-up, capture, or no capture),
        the windows its `policies` opened and committed are taken off their counts again: the
        host counts every window once, after the step (`WritePolicy.replayed`)."""
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        if not self.warmed or not capture:
            self.warmed = True
            out = self.body(engine)
        else:
            holder = {}
            self.graph = capture_graph(lambda: holder.setdefault("out", self.body(engine)), warmup=0,
                                       device=engine.device)
            self.outputs = out = holder["out"]
            self.graph.replay()
        for p in policies:
            p.windows_done -= 1
        return out


class _Bucket(_Graphed):
    """Static buffers, metadata and (after the warm-up) the graph of one padded batch size; with
    `chain`, the EAGLE draft chain for the next window runs in the same graph."""

    def __init__(self, engine, size: int, chain: bool):
        e, dev, k = engine, engine.device, engine.k
        self.size, t = size, size * (k + 1)
        self.inputs = StaticInputs(dev, ids=((t,), torch.long), positions=((t,), torch.long),
                                   start=((size,), torch.long),
                                   remaining=((size,), torch.long),
                                   drafts=((size * k,), torch.int32), cache_lens=((size,), torch.int32))
        # the block tables travel alone: a pre-launched step sends them, and nothing else
        self.table_inputs = StaticInputs(dev, tables=((size, _max_blocks(e)), torch.int32))
        i = self.inputs.dev
        self.ids, self.positions, self.cache_lens = i["ids"], i["positions"], i["cache_lens"]
        self.tables = self.table_inputs.dev["tables"]
        self.start = i["start"]                                         # each request's num_computed
        self.remaining = i["remaining"]                                 # tokens it has left (padding 0)
        cu = [(k + 1) * (r + 1) for r in range(size)]
        self.spec = SpecDecodeMetadata.build([k] * size, cu, i["drafts"], device=dev)
        # slots are computed in the step (body) from positions and block tables, so that a
        # pre-launched step sees the blocks the host allocated for it
        self.window = Window.from_metadata(self.spec, cu, torch.full((t,), -1, dtype=torch.long, device=dev))
        in_buffer = e.policy.window_in_buffer
        qsl = [0] + cu
        kernel = KernelArgs(self.tables, self.cache_lens, torch.tensor(qsl, dtype=torch.int32, device=dev),
                            torch.arange(t, device=dev) if in_buffer else None,
                            torch.tensor(qsl, dtype=torch.int32, device=dev) if in_buffer else None)
        self.md = AttentionMetadata(self.positions, self.window.slot_mapping, qsl, None, None, None, e.cache,
                                    e.policy, 0, kernel)
        self.starts = torch.arange(0, t, k + 1, device=dev)             # each request's t_last row
        self.last_rows = self.starts + k
        self.no_drafts = Acceptance.from_accepted_len(self.window, [0] * size) if k == 0 else None
        self.chain = _ChainBucket(e, size, tables=self.tables) if chain else None
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
        k, bs = engine.k, engine.cache.spec.block_size
        in_buffer = engine.policy.window_in_buffer
        ids, pos, slots, drafts, lens, start, left = [], [], [], [], [], [], []
        for req in requests:
            toks, s, _ = req.scheduled()
            if ensure:
                need = s + k + 1
                if self.chain is not None:
                    need = max(need, s + min(k, req.remaining - 2) + k)
                req.block_table.ensure(need)
            blocks = req.block_table.blocks
            ids += toks
            pos += range(s, s + k + 1)
            slots += [blocks[p // bs] * bs + p % bs for p in range(s, s + k + 1)]
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
        pos = self.positions.view(self.size, k + 1)
        slot = self.tables.long().gather(1, pos // bs) * bs + pos % bs
        w.slot_mapping.copy_(torch.where(real[:, None], slot, -1).reshape(-1))
        e.policy.begin(w, kind="verify")
        aux_layers = e.head.aux_layers if e.drafting else ()
        hidden, aux = e.target.forward_with_aux(self.ids, md, aux_layers)
        logits = e.target.compute_logits(hidden[spec.logits_indices.long()]).float()
        sampled = rejection_sample(spec, None, logits, temperature=0.0)
        if e.k:
            acceptance = Acceptance(*scv_mask(w.draft_token_ids, w.cu_num_draft_tokens, sampled, w.token_req,
                                              w.token_draft_pos))
        else:
            acceptance = self.no_drafts
        accepted = acceptance.accepted_len.long()
        features = None
        if e.drafting:
            # the head reads x[p+1]; at each request's kept row and last row, the token just sampled
            token = sampled.gather(1, accepted[:, None]).squeeze(1).long()
            kept = self.starts + accepted
            next_ids = torch.cat([self.ids[1:], self.ids.new_zeros(1)])
            next_ids[self.last_rows] = token
            next_ids[kept] = token
            g = e.head(next_ids, e.head.features_from_target(hidden, aux), md)
            features = g[kept]
        e.policy.commit(acceptance)
        packed = [sampled.long(), accepted[:, None]]
        if self.chain is not None:
            live = accepted + 1 < self.remaining                     # still running after this window
            base = torch.where(live, self.start + accepted + 1, 0)       # num_computed after the window
            self.chain.place(e, base, live, features)
            packed.append(self.chain.body(e))
        if self.feeds_itself:
            self._next_inputs(e, real, sampled, accepted, packed[-1] if self.chain is not None else None)
        return torch.cat(packed, 1), features

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
        self.max_size = _bucket_size(max_num_seqs)
        self.steps = 0            # steps that took this path (eager warm-ups included)
        self.chained_steps = 0    # of which the draft chain rode in the verify graph
        self.prelaunched = 0      # of which were launched before the host read the step before
        self.pending = None       # (bucket, requests, readback handle) of a pre-launched step
        self.broken = ""          # why the engine cannot go on (an interrupted pre-launch), or ""
        # A captured graph holds the staging buffer's address: it must never be reallocated, so
        # reserve the largest window any step (graphed bucket or eager prefill) can bring.
        self.reserved = max(max_num_batched_tokens, self.max_size * (engine.k + 1))
        engine.policy.reserve(self.reserved)
        self.prefill_buckets: dict = {}   # (requests, tokens) -> PrefillBucket (engine/graphed_prefill.py)
        self.prefill_steps = 0
        self.draft = GraphedDraft(engine, self.max_size) if engine.drafting else None

    def eligible(self, requests) -> bool:
        """A steady decode step, or a step of prefills alone (engine/graphed_prefill.py)."""
        e = self.engine
        if e.temperature != 0 or e.observers or e.config.debug or len(requests) > self.max_size:
            return False
        if all(r.is_prefill for r in requests):
            from nwor_lab.engine.graphed_prefill import token_bucket
            return token_bucket(sum(len(r.prompt) for r in requests)) <= self.reserved
        k = e.k if e.drafting else 0
        return all(not r.is_prefill and len(r.drafts) == k for r in requests)

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
        if self.pending is None and all(r.is_prefill for r in requests):
            return self._prefill_step(requests)
        chain = self.chain_aboard()
        key = (_bucket_size(len(requests)), chain)
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
            self.chain_ran = [(r, drafted[j], b.chain.row_slots(e, r, r.num_computed + a + 1))
                              for j, (r, a) in enumerate(zip(requests, acc)) if a + 1 < r.remaining]
            self.chained_steps += 1
        self.steps += 1
        features = b.features
        return batch, verdict, (features[:n] if features is not None else None), record, drafted

    def _prefill_step(self, requests):
        from nwor_lab.engine.graphed_prefill import PrefillBucket, prefill_bucket_key
        e, n = self.engine, len(requests)
        key = prefill_bucket_key(requests)
        if key not in self.prefill_buckets:
            self.prefill_buckets[key] = PrefillBucket(e, *key)
        b = self.prefill_buckets[key]
        b.fill(e, requests)
        packed = self._launch(b)
        rows = b.readback.rows(b.readback.start(packed), n)            # the step's one sync
        batch, verdict, record = b.finish(e, requests, rows)
        self.prefill_steps += 1
        return batch, verdict, (b.features[:n] if b.features is not None else None), record, None

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

    def chain_done(self, requests, step_index: int) -> tuple[WindowTrace, Window] | None:
        """After `step` carried the chain and the engine advanced `requests` (every one of the
        step's): hand out the drafts, record the chain window -> (trace, window), or None when
        every request finished in the step (no chain row was written)."""
        b = self.buckets[(_bucket_size(len(requests)), True)]
        return self.draft.finish(b.chain, self.chain_ran, step_index)


class _ChainBucket(_Graphed):
    """Static buffers and graph of the EAGLE draft chain d_1..d_k for one padded batch size: the
    first draft from the verify step's head features, then k - 1 head passes, one row per request
    each (step-major rows, as `engine.drafter.chain_window`), in one draft-policy window on the
    head's layer, committed with every row rejected. Its inputs come from the host (`fill`) or,
    inside the verify graph, from the device (`place`)."""

    def __init__(self, engine, size: int, tables: torch.Tensor | None = None):
        e, dev, k = engine, engine.device, engine.k
        pol = e.drafter.policy
        self.size, rows = size, size * (k - 1)
        self.tables = tables if tables is not None else \
            torch.zeros(size, _max_blocks(e), dtype=torch.int32, device=dev)
        self.features = torch.zeros(size, e.head.config.hidden_size, dtype=e.dtype, device=dev)
        slots = torch.full((rows,), -1, dtype=torch.long, device=dev)
        token_req = torch.arange(size, dtype=torch.int32, device=dev).repeat(k - 1)
        draft_pos = torch.arange(1, k, dtype=torch.int32, device=dev).repeat_interleave(size)
        order = torch.arange(rows, device=dev).view(k - 1, size).t().reshape(-1)   # request-major
        self.window = Window(slots, token_req, draft_pos, order, [k - 1] * size, [k - 1] * size)
        self.reject = Acceptance.rejecting_all(self.window)
        in_buffer = pol.window_in_buffer
        self.lens_offset = torch.zeros(k - 1, 1, dtype=torch.long, device=dev) if in_buffer else \
            torch.arange(1, k, device=dev)[:, None]                 # chain step s reads s own rows
        self.step_offset = torch.arange(k - 1, device=dev)[:, None]
        self.positions = torch.zeros(k - 1, size, dtype=torch.long, device=dev)   # [step, request]
        self.lens = torch.zeros(k - 1, size, dtype=torch.int32, device=dev)
        qsl = list(range(size + 1))
        qsl_t = torch.arange(size + 1, dtype=torch.int32, device=dev)
        self.steps = []
        for s in range(1, k):
            win_rows = win_start = None
            if in_buffer:   # request r's chain rows so far: r, size + r, ..., (s - 1) * size + r
                win_rows = (torch.arange(s, device=dev)[None, :] * size + torch.arange(size, device=dev)[:, None]).reshape(-1)
                win_start = torch.arange(0, s * size + 1, s, dtype=torch.int32, device=dev)
            md = AttentionMetadata(self.positions[s - 1], slots[(s - 1) * size:s * size], qsl, None, None, None,
                                   e.cache, pol, (s - 1) * size,
                                   KernelArgs(self.tables, self.lens[s - 1], qsl_t, win_rows, win_start))
            self.steps.append(md)

    @staticmethod
    def row_slots(engine, r, base: int) -> list[int]:
        """Slots of request r's chain rows, at positions base .. base + k - 2 (base: its
        num_computed after the verify window)."""
        bs, blocks = engine.cache.spec.block_size, r.block_table.blocks
        return [blocks[p // bs] * bs + p % bs for p in range(base, base + engine.k - 1)]

    def fill(self, engine, requests, features) -> None:
        n = len(requests)
        tables = torch.zeros(self.tables.shape, dtype=torch.int32)
        for j, r in enumerate(requests):
            r.block_table.ensure(r.num_computed + 1, lookahead=engine.k)     # the next window's slots too
            tables[j, :len(r.block_table.blocks)] = torch.tensor(r.block_table.blocks, dtype=torch.int32)
        self.tables.copy_(tables)
        bases = [r.num_computed for r in requests]
        self.rows = [self.row_slots(engine, r, b) for r, b in zip(requests, bases)]
        flat = [-1] * (self.size * (engine.k - 1))
        for j, rows in enumerate(self.rows):
            flat[j::self.size] = rows                                # step-major
        self.window.slot_mapping.copy_(torch.tensor(flat))
        base = torch.tensor(bases + [0] * (self.size - n), device=engine.device)
        real = torch.arange(self.size, device=engine.device) < n
        self._set_rows(engine, base, real)
        self.features.zero_()
        self.features[:n].copy_(features)

    def place(self, engine, base: torch.Tensor, drafting: torch.Tensor, features: torch.Tensor) -> None:
        """The chain's inputs from the device: base [B] num_computed of each request (0 where it
        does not draft), drafting [B] bool (False: padding, or finished in this window),
        features [B, h] the head's output at each kept row."""
        self._set_rows(engine, base, drafting)
        self.features.copy_(torch.where(drafting[:, None], features, torch.zeros_like(features)))

    def _set_rows(self, engine, base, real) -> None:
        """Positions, cached lengths and slots of every chain row from base [B] (device ops)."""
        bs = engine.cache.spec.block_size
        pos = base[None, :] + self.step_offset                          # [k-1, B]
        self.positions.copy_(pos)
        self.lens.copy_(base[None, :] + self.lens_offset)
        blk = self.tables.long().gather(1, (pos // bs).t()).t()          # [k-1, B] block of each row
        self.window.slot_mapping.copy_(torch.where(real[None, :], blk * bs + pos % bs, -1).reshape(-1))

    def body(self, engine):
        e, head, pol = engine, engine.head, engine.drafter.policy
        g = self.features
        token = head.compute_logits(g).float().argmax(-1)
        drafts = [token]
        layer = head.layer_index
        pol.begin(self.window, layers=range(layer, layer + 1), kind="draft")
        for md in self.steps:
            g = head(drafts[-1], g, md)
            drafts.append(head.compute_logits(g).float().argmax(-1))
        pol.commit(self.reject)
        return torch.stack(drafts, 1)         # [B, k]


class GraphedDraft:
    """The drafter's graphed path for chains not carried by a verify graph (after an eager step,
    e.g. the prefill's first drafts): every request drafts k >= 2, greedily."""

    def __init__(self, engine, max_size: int):
        self.engine = engine
        self.buckets: dict[int, _ChainBucket] = {}
        self.max_size = max_size
        self.steps = 0
        engine.drafter.policy.reserve(max_size * max(1, engine.k - 1))   # never reallocated (see above)

    def eligible(self, requests) -> bool:
        e = self.engine
        return (e.k >= 2 and e.temperature == 0 and not e.observers and not e.config.debug
                and len(requests) <= self.max_size)

    def draft(self, requests, features, step_index: int, capture: bool):
        e = self.engine
        size = _bucket_size(len(requests))
        if size not in self.buckets:
            self.buckets[size] = _ChainBucket(e, size)
        b = self.buckets[size]
        b.fill(e, requests, features)
        pol = e.drafter.policy
        records = pol.records
        pol.records = False
        try:
            drafts = b.run(e, capture, [pol])
        finally:
            pol.records = records
        self.steps += 1
        ran = list(zip(requests, drafts[:len(requests)].tolist(), b.rows))
        return self.finish(b, ran, step_index)

    def finish(self, b: _ChainBucket, ran, step_index: int):
        """`ran`: (request, its drafts d_1..d_k, its chain rows' slots) for every request the
        chain ran for. Hand the drafts to those still running; record the chain window, counted
        on a CPU window of those requests (not the bucket's padding) -> (WindowTrace, Window),
        or None when it ran for none."""
        pol = self.engine.drafter.policy
        if not ran:
            return None
        layer = self.engine.head.layer_index
        window = _chain_record_window([slots for _, _, slots in ran])
        record = pol.replayed(window, Acceptance.rejecting_all(window), range(layer, layer + 1))
        for r, drafts, _ in ran:
            if not r.finished:       # (one that emitted the end token in a chained step)
                r.drafts, r.draft_probs = list(drafts), None
        n, k = len(ran), self.engine.k
        return WindowTrace(step_index, "draft", [r.req_id for r, _, _ in ran], ["draft"] * n, [k - 1] * n,
                           [0] * n, [[] for _ in ran], record), b.window
