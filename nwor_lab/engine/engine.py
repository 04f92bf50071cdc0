"""The speculative decoding loop: one verify window per step, then the EAGLE head drafts.

    step():  schedule -> the step body (nwor_lab.engine.step: target forward -> sample + accept
             -> head pass over the same rows -> commit -> the draft chain for the next window),
             run eagerly or replayed from a CUDA graph (nwor_lab.engine.runner) -> advance the
             requests on the host

All of a window's cache writes (target layers 0..N-1 and the head's layer N) go through one write
policy, opened before the target forward and committed after the head pass: `t_last, d_1..d_a`
kept, the rest dropped the policy's way. `num_computed` advances by a + 1 (the rollback of rejected
drafts is just not advancing). The draft chain d_1..d_k runs in the same body, in its own window of
the drafter's policy on the head's layer.

Observers (`engine.observers`) see every phase of every window through the policies
(`on_phase(PhaseEvent)`, nwor_lab.policies.observer); one that also has
`on_window_end(engine, trace, window)` is called once the engine has advanced its requests.

Preemption and abort (nwor_lab.engine.preemption): admission reserves no worst case; when a step's
blocks do not fit, the scheduler preempts the newest running request by recompute or swap
(`SpecEngine(..., preemption=Preemption("swap"))`, counted in `preemption_stats`);
`engine.abort(req_id)` and `engine.preempt(req_id)` work between steps and while a window is open.

Chunked prefill (nwor_lab.engine.scheduler): a prefill gets what is left of the step's token budget,
so a prompt longer than `max_num_batched_tokens` runs in chunks beside the others' windows; a chunk
that is not the prompt's last commits its rows and emits nothing (`Request.chunk_next`).

Sliding windows (`LabConfig.sliding_window`, `kv_ring`; nwor_lab.engine.ring): every layer attends
the last W positions, each request's cache is a ring of `sliding.ring_slots` slots (or the whole
context), the guard cuts drafts that could evict a needed position, and debug mode checks every
cache read against a `RingLedger`. cow on a ring runs eagerly (`graphed_off` says why).
"""
from __future__ import annotations

import zlib
from array import array

import torch

from nwor_lab._checks import check_backend_device
from nwor_lab.config import LabConfig, check_int, check_temperature
from nwor_lab.engine.block_settings import preemption_for, prefix_cache_for, settled_config
from nwor_lab.engine.choices import Choices
from nwor_lab.engine.drafter import Drafter
from nwor_lab.engine.eager_rules import eager_rule
from nwor_lab.engine.prefix import PrefixCacheConfig, PrefixCaching
from nwor_lab.engine.preemption import Lifecycle, Preemption, PreemptionStats, check_preemption
from nwor_lab.engine.request import Request, check_prompt, check_request_generator, fit_context
from nwor_lab.engine.runner import StepRunner, can_capture
from nwor_lab.engine.scheduler import Scheduler
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.engine.window_chain import ChainKind
from nwor_lab.engine.tree_plan import tree_plan
from nwor_lab.engine.window_tree import TreeKind
from nwor_lab.kv import CACHE_DTYPES, KVCacheSpec, PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.engine.ring import sliding_window_for, strategy_name
from nwor_lab.policies import RingCorruption, RingLedger
from nwor_lab.speculative import ScvRunner
from nwor_lab.speculative.synthetic import ForcedAcceptance
from nwor_lab.window import Acceptance, Window


class SpecEngine:
    """Target + optional EAGLE-1 / EAGLE-3 head over one PagedKVCache (layers: target 0..N-1, head N).

    `policy` (records in `metrics`) handles verify windows, the drafter's policy (`draft_metrics`)
    the draft-chain windows: two policies of the same mode on the same cache, never open at once.
    `trace` lists every window (`WindowTrace`).
    """

    def __init__(self, target, head=None, config: LabConfig | Choices | None = None, *, k: int = 4,
                 num_blocks: int = 256, block_size: int = 16, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 1024, temperature: float = 0.0, seed: int = 0,
                 eos_token_id: int | None = None, cache_dtype: str = "auto",
                 max_cache_memory: int | None = None, acceptance: ForcedAcceptance | None = None,
                 prefix_cache: PrefixCacheConfig | None = None, preemption: Preemption | None = None):
        # Every limit is checked here, before the cache is allocated (its size is checked against
        # max_cache_memory and the device's free memory first): a bad value is one clear error.
        self.target, self.head = target, head
        # the config checked and its names looked up once (`prepare` hands its Choices down)
        choices = Choices.of(config)
        self.config, policy_cls = choices.config, choices.policy
        # prefix caching and preemption: LabConfig fields or keyword objects, decided once here (which
        # wins, and the contradiction refused: nwor_lab.engine.block_settings); self.config spells what runs
        prefix_cache = prefix_cache_for(self.config, prefix_cache)
        preemption = preemption_for(self.config, preemption)
        self.config = settled_config(self.config, prefix_cache, preemption)
        k = check_int("k", k, 0)
        self.k = k if head is not None else 0
        # draft trees (LabConfig.tree): only with a head and k > 0 (k = 0 decodes target-only, as with
        # chains); a tree window holds N nodes, so self.k is N (the drafts a window verifies)
        shape = self.config.tree_shape
        self.tree = shape if shape is not None and self.k > 0 else None
        self.tree_plan = tree_plan(self.tree) if self.tree is not None else None
        if self.tree is not None:
            if self.config.sliding_window:
                raise ValueError(f"LabConfig.tree={self.config.tree!r} with sliding_window="
                                 f"{self.config.sliding_window}: tree windows on sliding windows and rings are not "
                                 f"built in the engine; use sliding_window=0 or tree='' (chains)")
            if hasattr(target, "state_spec"):
                raise ValueError(f"LabConfig.tree={self.config.tree!r}: a hybrid target's recurrent state has no "
                                 f"tree window; use tree='' (chains) with a hybrid target")
            self.k = self.tree_plan.nodes
        # the window seam: everything that differs between a chain and a tree, picked once here
        self.window_kind = TreeKind(self) if self.tree is not None else ChainKind(self)
        self.temperature = check_temperature("temperature", temperature)
        seed = check_int("seed", seed)
        if max_cache_memory is not None:
            max_cache_memory = check_int("max_cache_memory", max_cache_memory, 1)
        if cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"cache_dtype={cache_dtype!r}: choose one of {', '.join(CACHE_DTYPES)}")
        if acceptance is not None and not isinstance(acceptance, ForcedAcceptance):
            raise TypeError(f"acceptance: expected a ForcedAcceptance (nwor_lab.speculative.synthetic) or None, "
                            f"got {type(acceptance).__name__}")
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        check_backend_device(self.config.backend, self.device)
        self.max_model_len = target.config.max_position_embeddings
        self.vocab_size = target.config.vocab_size
        num_blocks, block_size = check_int("num_blocks", num_blocks, 1), check_int("block_size", block_size, 1)
        self.cache = PagedKVCache(_cache_spec(target, head, num_blocks, block_size, self.dtype, cache_dtype),
                                  device=self.device, max_bytes=max_cache_memory)
        self.sliding = sliding_window_for(self.config, self.k, policy_cls)   # None: whole-context attention
        self.strategy = strategy_name(self.config, policy_cls)
        self.scheduler = Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens,
                                   self.window_kind.lookahead,
                                   ring_slots=self.sliding.ring_slots if self.sliding else None)
        self.lifecycle = Lifecycle(self, preemption)
        self.observers: list = []          # shared with both policies: see the module docstring
        # debug on a sliding window: which position each slot holds, every cache read checked
        self.ledger = RingLedger(self.cache, self.sliding) if self.sliding and self.config.debug else None
        if self.ledger is not None:
            self.observers.append(self.ledger)
        self.metrics, self.draft_metrics = LabMetrics(), LabMetrics()
        self._pending_records: list = []       # windows whose records wait for `flush_records`
        self.metrics.before_read = self.draft_metrics.before_read = self.flush_records
        self.policy = policy_cls(self.cache, self.config, self.metrics, observers=self.observers)
        # without drafts every row commits whatever the mode: the host loop of scv_mode='off' would only keep
        # the steps out of CUDA graphs, so such an engine takes the vectorised form (same acceptance)
        self.scv = ScvRunner(self.config.scv_mode if head is not None and self.k else "graph")
        # a hybrid target's recurrent and conv states: a store of their own, one slot per running
        # request (the last one a scratch slot), under the state strategy the config selects
        self.states, self.free_state_slots = None, []
        if hasattr(target, "state_spec"):
            from nwor_lab.state import make_state_policy, make_state_store
            state_config = choices.state_config()
            store = make_state_store(state_config, target.state_spec(), max_num_seqs + 1, self.k, self.device,
                                     scratch_slot=max_num_seqs)
            self.states = make_state_policy(state_config, store)
            self.free_state_slots = list(range(max_num_seqs - 1, -1, -1))
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.seeded = False        # whether any request brought its own generator (add_request)
        # forced acceptance (benchmarks on random weights): drafts accepted by a profile, not the target
        self.acceptance = acceptance if self.k else None
        # its tables made once, on the device, in the window kind's form (checked now)
        self.forced = self.window_kind.forced_tables(self.acceptance, self.device) \
            if self.acceptance is not None else None
        self.drafter = None
        if head is not None:
            draft_policy = policy_cls(self.cache, self.config, self.draft_metrics, observers=self.observers)
            self.drafter = Drafter(head, draft_policy, self.k, self.temperature, self.generator)
        self.eos_token_id = eos_token_id
        # prefix caching (off when None): committed blocks outlive their request (nwor_lab.engine.prefix)
        self.prefix = None
        if prefix_cache is not None:
            self.prefix = PrefixCaching(self, prefix_cache)
            self.scheduler.allocator = self.prefix.allocator
            self.scheduler.on_admit = self.prefix.admit
        # optional (engine, requests) -> drafts 0..k per request for the next window (None: k each),
        # asked before each step, whose draft chain drafts that window (nwor_lab.serve.AdaptiveK)
        self.draft_counts = None
        capture = can_capture(self)
        self.runner = StepRunner(self, max_num_seqs, max_num_batched_tokens, capture=capture)
        self.graphed_off = eager_reason(self) if capture else None   # why steps stay eager although graphs were asked for
        self.trace: list[WindowTrace] = []
        self.step_index = 0
        self.target_forwards = 0

    @property
    def drafting(self) -> bool:
        return self.drafter is not None and self.k > 0

    def add_request(self, prompt: list[int], max_new_tokens: int, *, truncate: bool = False,
                    name: str = "prompt", generator: torch.Generator | None = None) -> Request:
        """Queue `prompt` (token ids in the model's vocabulary) for `max_new_tokens` tokens. Prompt +
        new tokens must fit the model's `max_model_len` positions; `truncate` keeps the prompt's last
        tokens that fit instead of raising. Nothing is queued when this raises.

        `generator`: the request's own random stream at T > 0 (vLLM's per-request seed): its drafts and
        its acceptance draw from it alone, so its tokens do not depend on what else runs beside it, nor
        on a preemption (`check_request_generator`: refused with trees, forced acceptance and CUDA graphs)."""
        check_request_generator(self, generator)
        ids = check_prompt(name, prompt, self.vocab_size)
        ids = fit_context(name, ids, max_new_tokens, self.max_model_len, truncate)
        req = self.scheduler.add(ids, max_new_tokens)
        if generator is not None:
            req.generator = generator
            self.seeded = True
        if self.acceptance is not None:
            # forced acceptance keys on the prompt, not the request id: the same prompt is accepted
            # alike in every run and engine (a benchmark's repeats replay the same steps)
            req.acceptance_key = zlib.crc32(array("q", ids).tobytes()) & 0x7FFFFFFF
        return req

    def prefix_stats(self) -> dict | None:
        """Prefix caching's counters (`PrefixCaching.stats`: hit tokens, hit rate, recomputed rows...),
        None when prefix caching is off."""
        return None if self.prefix is None else self.prefix.stats()

    def run(self) -> None:
        """Step until every request finished."""
        while self.scheduler.has_work:
            self.step_with_progress()
        self.flush_records()

    def step_with_progress(self) -> None:
        """`step()`, raising instead of returning without a window while requests wait (a loop
        around it can never spin)."""
        if not self.step() and self.scheduler.has_work:
            raise RuntimeError(f"the scheduler scheduled nothing while {len(self.scheduler.waiting)} "
                               f"requests wait and {len(self.scheduler.running)} run (a scheduler bug)")

    # -- one step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> bool:
        """One verify window over every scheduled request, drafting for the next one in the same
        step. -> False when nothing was scheduled (no work)."""
        # a step the runner pre-launched is the next step, whatever changed since (a request added,
        # an observer attached): it runs on the GPU already; the scheduler waits one step. Its requests
        # that finished in the step before ride it dead and are not listed: nothing here sees them
        if self._pending_records and not self._records_later():
            self.flush_records()    # an observer attached since: it reads every record before this step's body
        pending = self.runner.pending_requests
        if pending == []:       # every request of it emitted an end token in the step before
            self.runner.drop_dead_step()
            pending = None
        requests = pending if pending is not None else self.scheduler.schedule()
        if not requests:
            return False
        requests = self.window_kind.schedule(requests)
        if self.states is not None:
            for r in requests:
                if r.state_slot is None:           # a new request: a cleared state slot
                    r.state_slot = self.free_state_slots.pop()
                    self.states.store.clear(r.state_slot)
                    if self.prefix is not None:    # after a prefix hit: the hit's state checkpoint
                        self.prefix.start_state(r)
        life = self.lifecycle
        life.in_step = requests
        try:
            result = self.runner.step(requests)
        except BaseException as err:
            for policy in (self.policy, self.drafter.policy if self.drafter else None, self.states):
                if policy is not None and policy.window is not None:
                    policy.cancel()        # the cache ends as `off` would leave it
            self._locate(err, requests)
            life.in_step = None
            life.apply_drops(requests)
            raise
        life.in_step = None
        self._advance(requests, result)
        life.apply_drops(requests)
        self.step_index += 1
        return True

    # -- preemption and abort (nwor_lab.engine.preemption.Lifecycle) ----------------------------
    def abort(self, req_id: int) -> bool:
        """Drop request `req_id` for good (`Lifecycle.abort`). -> False when it had already finished."""
        return self.lifecycle.abort(req_id)

    def preempt(self, req_id: int) -> None:
        """Preempt running request `req_id` now, as the scheduler does when blocks run out
        (`Lifecycle.preempt`)."""
        self.lifecycle.preempt(req_id)

    @property
    def preemption(self) -> Preemption:
        return self.lifecycle.preemption

    @preemption.setter
    def preemption(self, value: Preemption) -> None:
        self.lifecycle.preemption = check_preemption(value)
        self.config = self.config.replace(preemption=value.mode)      # the printed config stays what runs

    @property
    def preemption_stats(self) -> PreemptionStats:
        return self.lifecycle.stats

    @property
    def dropping(self) -> bool:
        """Whether a request of the step in flight was aborted or preempted (applied at its end)."""
        return bool(self.lifecycle.dropped)

    def window_drops(self, inp) -> torch.Tensor | None:
        """`[size]` bool on the device, the step's requests dropped while it runs, or None
        (`Lifecycle.window_drops`)."""
        return self.lifecycle.window_drops(inp)

    def _locate(self, err: BaseException, requests: list[Request]) -> None:
        """A RingCorruption names the step and the request id (the ledger knows window indices)."""
        if isinstance(err, RingCorruption) and err.step is None:
            err.step = self.step_index
            if 0 <= err.request < len(requests):
                err.req_id = requests[err.request].req_id
            err.args = (err.describe(),)

    def _advance(self, requests: list[Request], result) -> None:
        """Emit each request's accepted drafts + next token, advance `num_computed` by what was
        committed, finish what is done, hand out the next drafts; trace both windows."""
        h = result.inputs.host
        kind = self.window_kind
        # the body's rule: a request with a + 1 >= tokens left finishes now and got no drafts
        dropped = self.lifecycle.dropped   # aborted or preempted while the step ran: not advanced
        # a chunk of a chunked prefill that is not the prompt's last: its rows are committed, it emits
        # nothing and gets no drafts (the body drafted none: its draft limit was 0)
        chunked = [c >= 0 for c in h.get("chunk_next", [-1] * len(requests))]
        live = [a + 1 < r.remaining and r.req_id not in dropped and not c
                for r, a, c in zip(requests, result.accepted, chunked)]
        entry = WindowTrace(self.step_index, "verify", [r.req_id for r in requests], h["kinds"], h["ndrafts"],
                            result.accepted, [])
        policy = self.policy

        def count() -> Window:
            window, acceptance = kind.host_window(h, result)
            entry.record = self.runner.records(window, acceptance, policy)
            return window
        host_window = self._count_record(entry, count)      # (built once: the record and the observers)
        kind.note(entry, h, result)
        for i, r in enumerate(requests):
            r.chunk = None                 # the scheduler sets the next step's
            if r.req_id in dropped:
                entry.emitted.append([])
                continue
            if chunked[i]:
                r.num_computed = h["ctx"][i] + h["qlens"][i]
                entry.emitted.append([])
                continue
            a = result.accepted[i]
            r.num_computed = h["ctx"][i] + (h["qlens"][i] - h["ndrafts"][i]) + a
            entry.emitted.append(self._emit(r, kind.emitted(r, result, i, a)))
            # drafts accepted past max_new_tokens (or an end token) were cut from the output: the
            # request's state stops at what it emitted (num_computed == len(tokens) - 1)
            r.num_computed = min(r.num_computed, r.num_tokens - 1)
            r.drafts, r.draft_probs, r.draft_parents = [], None, None
        self._end_window(entry, host_window)
        self._record_draft_window(kind.hand_out(self, requests, result, live))
        if self.prefix is not None:             # the blocks this window completed, now committed
            self.prefix.commit(requests)
        for r in requests:
            if r.remaining <= 0 and r.req_id not in dropped:
                if self.prefix is not None:
                    self.prefix.forget(r)
                self.scheduler.finish(r)
                self.lifecycle.release_state(r)

    def _record_draft_window(self, drafted: list) -> None:
        """The head's draft window of this step, [(request, its slots)], traced with every row
        rejected (the drafter policy's record; nothing when the head drafted for nobody)."""
        if not drafted:
            return
        n = len(drafted)
        entry = WindowTrace(self.step_index, "draft", [r.req_id for r, _ in drafted], ["draft"] * n,
                            [len(s) for _, s in drafted], [0] * n, [[] for _ in drafted])
        layer = self.head.layer_index
        policy = self.drafter.policy
        slots = [s for _, s in drafted]

        def count() -> Window:
            window = chain_window(slots, self.cache.device)
            entry.record = policy.account(window, Acceptance.rejecting_all(window), range(layer, layer + 1))
            return window
        self._end_window(entry, self._count_record(entry, count))

    # -- records counted behind the next step ----------------------------------------------------
    def _records_later(self) -> bool:
        """Whether this step's window records may be counted after the next step is launched
        (`flush_records`): the window kind allows it (`records_later`), and nobody reads them as the
        window ends (no observers, no debug checks)."""
        return self.window_kind.records_later and not self.observers and not self.config.debug

    def _count_record(self, entry: WindowTrace, count) -> Window | None:
        """`count()` (it sets `entry.record` and returns its host window) now -> that window, or, when
        records may wait (`_records_later`), queued for `flush_records` -> None."""
        if not self._records_later():
            return count()
        entry._resolve = self.flush_records
        self._pending_records.append(count)
        return None

    def flush_records(self) -> None:
        """Count the windows whose records were deferred, in the order they ran. The runner calls it
        once the next step is launched, before it waits for that step's readback, so the host's
        bookkeeping (host windows, the policies' records and metrics) overlaps the GPU's work; any read
        of a record or of the metrics calls it first."""
        while self._pending_records:
            self._pending_records.pop(0)()

    def _emit(self, r: Request, tokens: list[int]) -> list[int]:
        """Append `tokens` to the output, cut at max_new_tokens and after an end-of-sequence token."""
        tokens = tokens[:r.remaining]
        if self.eos_token_id is not None and self.eos_token_id in tokens:
            tokens = tokens[:tokens.index(self.eos_token_id) + 1]
            r.max_new_tokens = len(r.output) + len(tokens)
        r.output += tokens
        return tokens

    def _end_window(self, entry: WindowTrace, window: Window) -> None:
        self.trace.append(entry)
        for o in self.observers:
            end = getattr(o, "on_window_end", None)
            if end is not None:
                end(self, entry, window)


def eager_reason(e) -> str | None:
    """The one line that says why an engine that asked for CUDA graphs runs its steps eagerly (the
    first rule of `engine.eager_rules.EAGER_RULES` that holds; None: its steps replay graphs).
    `StepRunner.capturable` decides per step; these are the settings that decide it for every step."""
    return eager_rule(e, e.runner, True)


def _cache_spec(target, head, num_blocks, block_size, dtype, cache_dtype) -> KVCacheSpec:
    """One stacked cache for the target's layers and (as layer N) the head's."""
    tc = target.config
    if head is not None:
        hc = head.config
        if (hc.num_key_value_heads, hc.head_dim) != (tc.num_key_value_heads, tc.head_dim):
            raise ValueError(f"draft head KV shape ({hc.num_key_value_heads} heads x {hc.head_dim}) differs "
                             f"from the target's ({tc.num_key_value_heads} x {tc.head_dim}); one stacked "
                             f"cache holds both")
    n_layers = target.num_layers + (1 if head is not None else 0)     # attention layers (a hybrid's too)
    return KVCacheSpec(n_layers, num_blocks, block_size, tc.num_key_value_heads, tc.head_dim, dtype=dtype,
                       cache_dtype=cache_dtype)


def chain_window(slots: list[list[int]], device) -> Window:
    """CPU Window of a draft chain over len(slots) requests, request j's rows at slots[j] (every
    row a draft, none kept): what the chain's record counts."""
    counts = [len(s) for s in slots]
    req = [j for j, c in enumerate(counts) for _ in range(c)]
    pos = [p for c in counts for p in range(1, c + 1)]
    total = len(req)
    return Window(torch.tensor([x for s in slots for x in s], dtype=torch.long), torch.tensor(req, dtype=torch.int32),
                  torch.tensor(pos, dtype=torch.int32), torch.arange(total), counts, counts)
