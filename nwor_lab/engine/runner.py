"""How a step runs: eagerly, or replayed from a CUDA graph (`nwor_lab.engine.step` is what it does).

    eager      the body on buffers of exactly the step's size (every step on CPU, and on CUDA every
               step that cannot be captured: a draft tree at T > 0, SCV `off` (a host loop), observers,
               debug checks, a ring whose policy reads evicted rows from its log (cow), a hybrid
               target's steps with prefills (its chunked form reads host counts), a static draft
               tree's steps (paths; EAGLE-2 trees are captured), the first step of a shape)
    warm-up    a bucket's first step: the body run once on the bucket's padded buffers (compiles the
               kernels), a real step
    capture    its second step: the body captured on the same buffers, then replayed once (with
               `LabConfig.capture_at_start`, both ran on padding before the engine's first step:
               `nwor_lab.engine.capture_sizes`); a prefill bucket's graph into the one pool they
               all share, writing its outputs outside it (`_capture`)
    replay     every later step of that bucket: inputs copied in, the graph replayed, outputs read
    pre-launch a decode bucket's next step launched before the host read this one, on the inputs
               the step computed for it on the device (the scheduler keeps every request and admits
               nobody). A request that finishes in this step (its last token, or an end token) rides
               the next one dead: the device knows (`next_inputs`), so its rows write nothing and it
               drafts nothing; the host leaves it out of that step's bookkeeping (`_can_prelaunch`)

A hybrid target (recurrent state, nwor_lab.state): its decode buckets are captured like any other
(the state window opened in the device layout: `StepInputs.state_slots`, padding requests on the
store's scratch slot); its steps with prefills stay eager (the chunked form reads host counts), and
so does every step under a state strategy that declares `capture_off`.

Sampling at T > 0 is captured: every draw comes from `engine.generator`, registered with each graph
(`rng_generators`), so a replay draws what the body run eagerly on the same buffers draws.

Buckets (`BucketKey`): padded request slots (1, 2, 4, ...) and rows. A decode step (every request
t_last + its drafts) is keyed by its draft count d, the most drafts any request verifies now or may
draft for its next window (`window_chain.step_drafts`; d = k unless a `draft_counts` hook cuts the
counts): (d + 1) rows a request slot plus one padding row, a chain of d drafts (d - 1 head passes;
none at d = 0, a decode step whose head pass only keeps the head's cache). A step with prefills
pads its rows to `token_bucket` and keeps k. Either way the step's one sync is the packed readback
(sampled ids, accepted lengths, next drafts). After it the host does the bookkeeping, the same for
every kind of run: each policy's `WindowRecord` from a CPU window of the real requests
(`WritePolicy.account`).
"""
from __future__ import annotations

import torch

from nwor_lab.engine.buffers import BucketKey, bucket_size, token_bucket
from nwor_lab.engine.eager_rules import eager_rule
from nwor_lab.engine.step import StepInputs, draft_limits, run_step
from nwor_lab.model.attention import use_kernel
from nwor_lab.ops.graphs import capture_graph, graph_pool


class StepResult:
    """A step's outputs on the host: per request its sampled ids `[k + 1]`, accepted length, next
    token, next drafts (None without drafting) and their probabilities (T > 0); head features at the
    last kept rows `[n, h]` (device) or None. `aboard`: the request slots the host reads (None: the
    first len(rows)); a pre-launched step's dead riders' slots are left out."""

    def __init__(self, inp: StepInputs, rows: list[list[int]], features, probs, kind,
                 aboard: list[int] | None = None):
        w = inp.sampled_width          # k + 1 (a chain), D + 1 (a tree window)
        if aboard is not None:
            rows = [rows[i] for i in aboard]
            features, probs = (None if t is None else t[torch.tensor(aboard, device=t.device)]
                               for t in (features, probs))
        self.inputs = inp
        self.sampled = [row[:w] for row in rows]
        self.accepted = [row[w] for row in rows]
        self.next_tokens = [row[a] for row, a in zip(rows, self.accepted)]
        # the next window's drafts (None: none drafted) and, for a tree, its node parents (else None)
        self.drafts, self.parents = kind.unpack(inp, rows)
        self.features = features[:len(rows)] if features is not None else None
        self.probs = probs


class StepRunner:
    """Runs the engine's steps (see the module docstring). `capture`: CUDA graphs (the engine's
    `cuda_graph` on a CUDA device with the Triton attention); `pad` (default: `capture`): steps that
    could be captured run on their bucket's padded buffers — with `capture` False, eagerly every
    time (CPU tests of the padding, the device-side inputs and the pre-launch, without a graph)."""

    def __init__(self, engine, max_num_seqs: int, max_num_batched_tokens: int, *, capture: bool,
                 pad: bool | None = None):
        self.engine = engine
        self.capture = capture
        self.pad = capture if pad is None else pad
        self.max_size = bucket_size(max_num_seqs)
        self.max_tokens = max_num_batched_tokens     # the most rows a step with prefills brings
        self.startup_capture = None   # (graphs, seconds) captured before the first step (`engine.capture_sizes`)
        # every reachable bucket captured before the first step runs: then, not in the constructor,
        # so that what is installed after it (tensor-parallel agreement, a bench's policy) is captured
        self.capture_at_start = capture and engine.config.capture_at_start
        self.buckets: dict[tuple, StepInputs] = {}
        self.exact: dict[tuple, StepInputs] = {}     # eager buffers by exact size (reused)
        self.steps = 0            # steps run
        self.graphed_steps = 0    # of which from a bucket (warm-up, capture, replay)
        self.replays = 0          # of which replayed from a captured graph
        self.prelaunched = 0      # of which launched before the host read the step before
        self.prefill_steps = 0    # bucket steps of prefills alone
        self.mixed_steps = 0      # bucket steps of prefills and decodes together
        self.mixed = True         # False: steps mixing prefills and decodes stay eager (bench comparison)
        self.prelaunch = True     # False: never launch a step before the host read the one before
        self.limits = None        # ([id(request)], draft counts): a draft_counts decision made for the next fill
        self.pending = None       # (StepInputs, requests, readback handle) of a pre-launched step
        self.dead_riders = 0      # request slots pre-launched steps carried dead (finished the step before)
        self.last_rows = (0, 0)   # the last step's rows: (the requests', its buffers') — padding is the gap
        # False: a request that may finish keeps the next step for the host, as before dead riders (a
        # request that arrives when it finishes then joins a step sooner: TTFT against hidden host time)
        self.ride_dead = engine.config.ride_dead
        self.tree_graphs = True   # False: tree steps (a dynamic tree's) stay eager (comparison, fallback)
        self.prefill_pool = None  # the memory pool every prefill bucket's graph shares (`_capture`)
        self.share_prefill_pool = True   # False: a pool a prefill graph, as before (an A/B; set before capture)
        self.broken = ""          # why the engine cannot go on (an interrupted pre-launch), or ""
        kind = engine.window_kind
        # A captured graph holds the staging buffer's address: it must never be reallocated, so
        # reserve the largest window any step (bucket or eager) can bring.
        self.reserved = max(max_num_batched_tokens + 1, self.max_size * kind.verify_rows + 1)
        if capture:
            engine.policy.reserve(self.reserved)
            if kind.draft_rows:         # the head's draft window (a chain's k - 1 rows, a tree's levels)
                engine.drafter.policy.reserve(self.max_size * kind.draft_rows)

    # -- which buffers ---------------------------------------------------------------------------
    def capturable(self, requests) -> bool:
        """Whether this step may run from a bucket's graph (else it runs eagerly, the same body).
        Trees: EAGLE-2's dynamic trees are captured like chains (a bucket of request slots, N fixed,
        the TreeWindow built on the device); static trees and sampled trees stay eager (`TreeKind.capturable`)."""
        e = self.engine
        if self.never_static() or len(requests) > self.max_size:
            return False
        prefill = [r.is_prefill for r in requests]
        if e.states is not None and any(prefill):
            return False            # a hybrid target: decode buckets only (prefills run the chunked form)
        if any(prefill) and not all(prefill) and not self.mixed:
            return False
        return token_bucket(sum(len(r.scheduled()[0]) for r in requests)) <= self.reserved

    def never_static(self) -> bool:
        """True when no step of this engine may run from a bucket, whatever its requests: a runner
        that pads nothing, or a setting of `engine.eager_rules.EAGER_RULES` (which
        `engine.eager_reason` names in one line)."""
        return not self.pad or eager_rule(self.engine, self, self.capture) is not None

    def rng_generators(self) -> list:
        """The generators a captured step draws from (registered with each graph): the engine's."""
        return [self.engine.generator]

    def _key(self, requests, static: bool, limits: list[int] | None = None) -> BucketKey:
        """The step's `BucketKey` (the window kind's): the bucket's when `static` (a decode bucket's
        by the step's draft count, which `limits`, the next window's counts, bound too; None: asked
        now, `draft_limits`), else the step's exact sizes."""
        e = self.engine
        limits = draft_limits(e, requests) if limits is None else limits
        return e.window_kind.bucket_key(e, requests, static, limits)

    def _inputs(self, requests, static: bool, limits: list[int] | None = None) -> StepInputs:
        key = self._key(requests, static, limits)
        table = self.buckets if static else self.exact
        inp = table.get(key)
        if inp is None:
            if not static and len(self.exact) > 16:
                self.exact.clear()
            inp = table[key] = StepInputs.of_key(self.engine, key, static)
        return inp

    # -- one step --------------------------------------------------------------------------------
    def step(self, requests) -> StepResult:
        """Run the step of `requests` (or collect the pre-launched one) -> its host outputs."""
        if self.broken:
            raise RuntimeError(f"engine: {self.broken}; the requests' state no longer matches the cache: "
                               f"build a new engine")
        if self.capture_at_start and self.pending is None:
            self.capture_at_start = False       # once (a failure is raised, not retried every step)
            from nwor_lab.engine.capture_sizes import capture_buckets
            capture_buckets(self)
        try:
            return self._step(requests)
        except BaseException:
            if self.pending is not None:    # the next step runs on the GPU, this one's bookkeeping is lost
                self.broken = "a step was interrupted after the next one had been launched"
            raise

    @property
    def pending_requests(self) -> list | None:
        """The requests of the pre-launched step that run on (the engine's next step), or None. Those
        that finished in the step before ride it dead and are left out: the host does not step them.
        Empty only when end tokens ended every one of them (`drop_dead_step` collects that step)."""
        return None if self.pending is None else [r for r in self.pending[1] if not r.finished]

    def _step(self, requests) -> StepResult:
        e = self.engine
        riders, aboard = requests, None         # the step's request slots; those the host reads (None: all)
        if self.pending is not None:
            inp, riders, handle = self.pending
            self.pending = None
            aboard = [i for i, r in enumerate(riders) if not r.finished]
            if len(aboard) != len(requests) or any(riders[i] is not y for i, y in zip(aboard, requests)):
                raise RuntimeError("engine: a step was pre-launched for other requests than the scheduler "
                                   "scheduled now (an engine bug; run with LabConfig(cuda_graph=False) meanwhile)")
            self.dead_riders += len(riders) - len(aboard)
            if len(aboard) == len(riders):
                aboard = None
            inp.host_rows(e, requests, ensure=False)     # what the device fed itself, for the bookkeeping
            features, probs = inp.features, inp.next_probs
        else:
            # the next window's draft counts, asked once a step (a pre-launch decision made already
            # is kept in `limits`): a decode bucket is keyed by them too
            decided, self.limits = self.limits, None
            limits = decided[1] if decided and decided[0] == [id(r) for r in requests] else draft_limits(e, requests)
            inp = self._inputs(requests, self.capturable(requests), limits)
            e.window_kind.fill(e, inp, requests, limits)
            self._keep_lent_probs(inp, requests)      # (after `fill` read this step's requests' drafts)
            packed, features, probs = self._launch(inp)
            handle = inp.readback.start(packed)
        self.last_rows = (len(inp.host.get("ids", ())), inp.tokens)
        if probs is not None and inp.graph is not None:
            # T > 0: the drafts' probabilities [B, k, V] are the graph's output buffer, handed to the
            # requests as views (no per-step copy): the bucket's next replay overwrites them, which is
            # harmless for the requests aboard it (their next step read them already: `fill`, or the
            # pre-launch's device copy); `_keep_lent_probs` copies out the rows of any other
            inp.lent = list(requests)
        if self._can_prelaunch(inp, riders):     # (a step carrying dead riders never passes: see there)
            self._prelaunch(inp, riders)
        e.target_forwards += 1
        self.steps += 1
        if inp.static:
            self.graphed_steps += 1
            if any(r.is_prefill for r in requests):
                if all(r.is_prefill for r in requests):
                    self.prefill_steps += 1
                else:
                    self.mixed_steps += 1
        e.flush_records()     # the step before's bookkeeping, while this step (and the next) run on the GPU
        rows = inp.readback.rows(handle, len(riders))                # the step's one sync
        return StepResult(inp, rows, features, probs, e.window_kind, aboard)

    def _keep_lent_probs(self, inp: StepInputs, requests) -> None:
        """Before `inp`'s graph replays: a request handed views of its probabilities output by an
        earlier replay that is not aboard this one (the scheduler left it out of a step for the token
        budget, or it left for another engine) gets its own copy of its rows, which the replay would
        overwrite. The requests aboard read theirs before the replay or never (a pre-launch)."""
        lent, inp.lent = inp.lent, []
        if not lent or inp.graph is None or inp.next_probs is None:
            return
        aboard = {id(r) for r in requests}
        out = inp.next_probs.untyped_storage().data_ptr()
        for r in lent:
            p = r.draft_probs
            if id(r) not in aboard and p is not None and p.untyped_storage().data_ptr() == out:
                r.draft_probs = p.clone()

    def _launch(self, inp: StepInputs):
        """Run (eagerly, warm up, capture, or replay) the body on `inp` -> (packed outputs, head
        features, next draft probabilities); policies count every window once (see `account`)."""
        e = self.engine
        pols = [e.policy] + ([e.drafter.policy] if inp.drafts_next else [])
        saved = [(p.records, p.deferred) for p in pols]
        counted = [p.windows_done for p in pols]
        for p in pols:
            p.records, p.deferred = False, True     # records are the host's, after the readback
        try:
            if inp.graph is not None:
                inp.graph.replay()
                self.replays += 1
                inp.replays += 1
                packed, inp.features, inp.next_probs = inp.outputs
                return packed, inp.features, inp.next_probs
            if not inp.static or not inp.warmed or not self.capture:
                inp.warmed = True
                out = run_step(e, inp)
                if inp.static and self.capture and self._pooled(inp):
                    # the outputs its graph will write, allocated outside the shared pool (see `_capture`)
                    inp.kept = tuple(None if t is None else torch.empty_like(t) for t in out)
            else:
                out = self._capture(inp)
            for p, n in zip(pols, counted):
                p.windows_done = n      # the body's Python ran: `account` counts its windows, once
            inp.features, inp.next_probs = out[1], out[2]
            return out
        finally:
            for p, (records, deferred) in zip(pols, saved):
                p.records, p.deferred = records, deferred

    def _pooled(self, inp: StepInputs) -> bool:
        """Whether `inp`'s graph shares the prefill pool: a bucket of steps with prefills (rows padded
        to `token_bucket`: ~170 of them at 32 request slots, each otherwise a pool of its own,
        ~0.17 GiB on the 8B shape: serve_buckets_8b_h200.json). Decode buckets keep their own: they are few,
        and pre-launched."""
        return self.share_prefill_pool and inp.max_query_len == 0

    def _capture(self, inp: StepInputs):
        """Capture `inp`'s body, replay it once -> its outputs (the graph's output buffers). A prefill
        bucket's graph shares `prefill_pool` with every other: its body copies its outputs into
        `inp.kept` (allocated at its warm-up, outside the pool), so the only memory the graphs
        share is their intermediates, which no step reads after its graph ran. Captured largest
        first (`capture_sizes`), the smaller graphs' intermediates fit in what the largest freed."""
        e = self.engine
        holder = {}
        kept = inp.kept if self._pooled(inp) else None    # (allocated at its warm-up; else a pool of its own)
        if kept is not None and self.prefill_pool is None:
            self.prefill_pool = graph_pool(e.device)

        def body():
            out = run_step(e, inp)
            if kept is not None:
                for dst, t in zip(kept, out):
                    if t is not None:
                        dst.copy_(t)
                out = kept
            holder.setdefault("out", out)       # (the capture's call: its tensors are the graph's outputs)
        pool = self.prefill_pool if kept is not None else None
        inp.graph = capture_graph(body, warmup=0, device=e.device, generators=self.rng_generators(), pool=pool)
        inp.outputs = out = holder["out"]
        inp.graph.replay()
        return out

    # -- pre-launch ------------------------------------------------------------------------------
    def _can_prelaunch(self, inp: StepInputs, requests) -> bool:
        """The next step is this bucket again, on the inputs this step computed for it: every request
        has the bucket's k drafts (its draft count d) and either runs on with them or, emitting its
        last token or an end token now, rides the next step dead (`_finishing_may_ride`); the
        scheduler keeps them all and admits nobody, and the graph exists; no request of this step
        was aborted or preempted while it ran. `requests`: the
        step's request slots, so a step that carries dead riders itself never passes (they left the
        scheduler's running list): the host lays out the step after it."""
        e = self.engine
        k = inp.k
        sched = e.scheduler
        running = sched.running
        guard = e.sliding is not None and e.sliding.guard      # the next drafts may be fewer than k
        return (self.prelaunch and not guard and not e.dropping and inp.feeds_itself and (inp.graph is not None or not self.capture) and inp.warmed
                and len(running) == len(requests) and all(x is y for x, y in zip(running, requests))
                and all(not r.is_prefill and len(r.drafts) == k for r in requests)
                and (not sched.waiting or len(running) >= sched.max_num_seqs)   # nobody to admit
                and self._finishing_may_ride(inp, requests)
                and self._prelaunch_fits(inp, requests)
                and self._hook_keeps_k(inp, requests))

    def _finishing_may_ride(self, inp: StepInputs, requests) -> bool:
        """Whether every request that may finish in this step (k + 1 left or fewer: a step emits at
        most k + 1; any request while an end token is watched) may ride the next step dead:
        `dead_rider_refusal` is None and one request at least is short of its last token (a step of
        dead riders alone would be a wasted forward; end tokens can still end them all at once,
        `drop_dead_step`)."""
        near = [r.remaining <= inp.k + 1 for r in requests]
        if not any(near) and self.engine.eos_token_id is None:
            return True
        return self.dead_rider_refusal() is None and not all(near)

    def dead_rider_refusal(self) -> str | None:
        """Why a request that may finish in this step may not ride the pre-launched next step dead
        (then the step is not pre-launched), or None. On the device a dead rider writes and drafts
        nothing whatever the policy, prefix caching, a `draft_counts` hook or a hybrid target's state
        strategy (`step.next_inputs`); what remains:"""
        e = self.engine
        if not self.ride_dead:
            return "LabConfig.ride_dead (StepRunner.ride_dead) is False"
        if e.scheduler.waiting:
            # the finishing request's seat: the host's next step admits a waiting request into it,
            # a pre-launched one would keep that request waiting a step more
            return "a request waits for a seat that a finishing request frees"
        if e.temperature > 0:
            # the engine's generator draws by request slot and bucket: a dead rider keeps its slot
            # where the host compacts the requests (or picks a smaller bucket), so the next step's
            # draws would differ from a host-filled step's (the same distribution, another stream);
            # pre-launched and host-filled steps sample the same tokens (tests/test_sampling_buckets.py)
            return "sampling at T > 0 (the draws are laid out by request slot)"
        return None

    def _prelaunch_blocks(self, inp: StepInputs, r) -> int:
        """Positions the pre-launched step may write for `r` (up to s + k + 1 + 2k - 1), never past
        its worst case (a request that may finish now writes at most what it can still emit, + k)."""
        k = inp.k
        need = r.num_computed + k + 1 + (2 * k if inp.drafts_next else k + 1)
        return min(need, r.worst_case_blocks * self.engine.scheduler.block_size)

    def _prelaunch_fits(self, inp: StepInputs, requests) -> bool:
        """The pre-launched step's blocks fit without preempting (admission reserves no worst case:
        when they do not, the host schedules the next step and preempts there)."""
        sched = self.engine.scheduler
        need = sum(max(0, sched.blocks_for(self._prelaunch_blocks(inp, r)) - len(r.block_table.blocks))
                   for r in requests)
        return need <= sched.allocator.num_free

    def _hook_keeps_k(self, inp: StepInputs, requests) -> bool:
        """With a `draft_counts` hook, the pre-launched step's chain drafts with the limits already in
        its buffer (the bucket's k each, its draft count d: this step drafted d for everyone). Asked
        now, the hook decides the next window's counts; any other count keeps the step for the host,
        which fills that decision in and keys its bucket by it (kept in `limits`: one decision per step)."""
        e = self.engine
        if e.draft_counts is None:
            return True
        if any(int(n) != inp.k for n in inp.inputs.host["draft_limit"][:len(requests)]):
            return False            # this step's chain drafted fewer for someone: the host lays that out
        got = draft_limits(e, requests)
        if all(n == inp.k for n in got):
            return True
        self.limits = ([id(r) for r in requests], got)
        return False

    def _prelaunch(self, inp: StepInputs, requests) -> None:
        """Launch the next step now. Its blocks are allocated for the most this step can accept (k):
        positions up to s + k + 1 + 2k - 1, inside every request's worst case (`_prelaunch_fits`)."""
        for r in requests:
            r.block_table.ensure(self._prelaunch_blocks(inp, r))
        h = inp.inputs.host
        h["tables"].fill(0)
        for j, r in enumerate(requests):
            h["tables"][j, :len(r.block_table.blocks)] = r.block_table.blocks
        inp.inputs.upload_only("tables")
        if inp.draft_probs is not None and inp.next_probs is not None:
            # T > 0: the next verify reads the probabilities of the drafts this step's chain proposed,
            # copied on the device in place as `fill` copies them from the requests (padding slots: zeros)
            probs = inp.draft_probs.view(inp.next_probs.shape)
            probs.copy_(inp.next_probs).masked_fill_((inp.remaining <= 0)[:, None, None], 0.0)
        self._keep_lent_probs(inp, requests)
        packed, features, _ = self._launch(inp)
        self.pending = (inp, list(requests), inp.readback.start(packed))
        self.prelaunched += 1

    def drop_dead_step(self) -> None:
        """Collect the pre-launched step when every request of it finished in the step before (each
        emitted an end token: `pending_requests` is empty): it ran for nothing; its outputs are read
        and dropped, and the host schedules the next step."""
        inp, riders, handle = self.pending
        if any(not r.finished for r in riders):
            raise RuntimeError("drop_dead_step: the pre-launched step has requests that run on (an engine bug)")
        self.pending = None
        inp.readback.rows(handle, len(riders))
        self.dead_riders += len(riders)
        self.steps += 1
        self.graphed_steps += 1       # (a decode bucket's)
        self.engine.target_forwards += 1

    # -- the host's records ----------------------------------------------------------------------
    def records(self, window, acceptance, policy=None):
        """The verify window's record from its host copy (`window_kind.host_window`: the real
        requests' Window or TreeWindow, and what they accepted), by `policy` (default: the engine's
        write policy now; a deferred record passes the one that ran the window)."""
        e = self.engine
        written = range(e.target.num_layers + (1 if e.drafting else 0))
        return (policy or e.policy).account(window, acceptance, written, opened=range(e.cache.num_layers))


def can_capture(engine) -> bool:
    e = engine
    return bool(e.config.cuda_graph and e.device.type == "cuda" and use_kernel(e.config.attention, e.device))
