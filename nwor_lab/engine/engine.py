"""The speculative decoding loop: one verify window per step, then the EAGLE head drafts.

    step():  schedule -> prepare the verify batch -> target forward -> sample + accept
             -> head pass over the same rows -> commit -> advance the requests -> draft

All of a window's cache writes (target layers 0..N-1 and the head's layer N) go through one write
policy, opened before the target forward and committed after the head pass: `t_last, d_1..d_a`
kept, the rest dropped the policy's way. `num_computed` advances by a + 1 (the rollback of rejected
drafts is just not advancing). The draft chain d_2..d_n then runs in its own window (`Drafter`).

Observers (`engine.observers`) see every phase of every window through the policies
(`on_phase(PhaseEvent)`, nwor_lab.policies.observer); one that also has
`on_window_end(engine, trace, window)` is called once the engine has advanced its requests.

Sliding windows (`LabConfig.sliding_window`, `kv_ring`; nwor_lab.engine.ring): every layer attends
the last W positions, each request's cache is a ring of `sliding.ring_slots` slots (or the whole
context), the guard cuts drafts that could evict a needed position, and debug mode checks every
cache read against a `RingLedger`. Steps with a sliding window run eagerly (`graphed_off` says why).
"""
from __future__ import annotations

import zlib
from array import array

import torch

from nwor_lab._checks import check_backend_device
from nwor_lab.config import LabConfig, check_config, check_int, check_temperature
from nwor_lab.engine.batch import Verdict, VerifyBatch
from nwor_lab.engine.drafter import Drafter
from nwor_lab.engine.graphed import GraphedVerify
from nwor_lab.engine.request import Request, check_prompt, fit_context
from nwor_lab.engine.scheduler import Scheduler
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import CACHE_DTYPES, KVCacheSpec, PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.model.attention import AttentionMetadata, use_kernel
from nwor_lab.engine.ring import sliding_window_for, strategy_name
from nwor_lab.policies import POLICIES, RingCorruption, RingLedger, make_policy
from nwor_lab.speculative import ScvRunner, SpecDecodeMetadata, check_against_sampler, rejection_sample
from nwor_lab.speculative.synthetic import ForcedAcceptance
from nwor_lab.window import Window


class SpecEngine:
    """Target + optional EAGLE-1 / EAGLE-3 head over one PagedKVCache (layers: target 0..N-1, head N).

    `policy` (records in `metrics`) handles verify windows, the drafter's policy (`draft_metrics`)
    the draft-chain windows: two policies of the same mode on the same cache, never open at once.
    `trace` lists every window (`WindowTrace`).
    """

    def __init__(self, target, head=None, config: LabConfig | None = None, *, k: int = 4,
                 num_blocks: int = 256, block_size: int = 16, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 1024, temperature: float = 0.0, seed: int = 0,
                 eos_token_id: int | None = None, cache_dtype: str = "auto",
                 max_cache_memory: int | None = None, acceptance: ForcedAcceptance | None = None):
        # Every limit is checked here, before the cache is allocated (its size is checked against
        # max_cache_memory and the device's free memory first): a bad value is one clear error.
        self.target, self.head = target, head
        self.config = check_config("config", config)
        k = check_int("k", k, 0)
        self.k = k if head is not None else 0
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
        policy_cls = policy_class(self.config)
        self.sliding = sliding_window_for(self.config, self.k, policy_cls)   # None: whole-context attention
        self.strategy = strategy_name(self.config, policy_cls)
        self.scheduler = Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, self.k,
                                   ring_slots=self.sliding.ring_slots if self.sliding else None)
        self.observers: list = []          # shared with both policies: see the module docstring
        # debug on a sliding window: which position each slot holds, every cache read checked
        self.ledger = RingLedger(self.cache, self.sliding) if self.sliding and self.config.debug else None
        if self.ledger is not None:
            self.observers.append(self.ledger)
        self.metrics, self.draft_metrics = LabMetrics(), LabMetrics()
        self.policy = make_policy(self.config, self.cache, self.metrics, observers=self.observers)
        self.scv = ScvRunner(self.config.scv_mode)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        # forced acceptance (benchmarks on random weights): drafts accepted by a profile, not the target
        self.acceptance = acceptance if self.k else None
        self.forced_rates = acceptance.conditional(self.k, self.device) if self.acceptance is not None else None
        self.drafter = None
        if head is not None:
            draft_policy = make_policy(self.config, self.cache, self.draft_metrics, observers=self.observers)
            self.drafter = Drafter(head, self.cache, draft_policy, self.k, self.temperature, self.generator,
                                   sliding=self.sliding, ledger=self.ledger)
        self.eos_token_id = eos_token_id
        self.graphed = None          # steady verify steps replayed from CUDA graphs (engine/graphed.py)
        self.graphed_off = None      # why steps stay eager although CUDA graphs were asked for
        if self.config.cuda_graph and self.device.type == "cuda" and use_kernel(self.config.attention, self.device):
            if self.sliding is not None:
                self.graphed_off = ("sliding-window caches run every step eagerly: the graphed engine builds "
                                    "linear slots and full-context attention only")
            else:
                self.graphed = GraphedVerify(self, max_num_seqs, max_num_batched_tokens)
        # optional (engine, requests) -> list[int] | None: drafts (0..k) each request verifies in the
        # next window (an adaptive k, nwor_lab.serve.AdaptiveK); None, or all k: the k drafts as usual
        self.draft_counts = None
        self.trace: list[WindowTrace] = []
        self.step_index = 0
        self.target_forwards = 0

    @property
    def drafting(self) -> bool:
        return self.drafter is not None and self.k > 0

    def add_request(self, prompt: list[int], max_new_tokens: int, *, truncate: bool = False,
                    name: str = "prompt") -> Request:
        """Queue `prompt` (token ids in the model's vocabulary) for `max_new_tokens` tokens. Prompt +
        new tokens must fit the model's `max_model_len` positions; `truncate` keeps the prompt's last
        tokens that fit instead of raising. Nothing is queued when this raises."""
        ids = check_prompt(name, prompt, self.vocab_size)
        ids = fit_context(name, ids, max_new_tokens, self.max_model_len, truncate)
        req = self.scheduler.add(ids, max_new_tokens)
        if self.acceptance is not None:
            # forced acceptance keys on the prompt, not the request id: the same prompt is accepted
            # alike in every run and engine (a benchmark's repeats replay the same steps)
            req.acceptance_key = zlib.crc32(array("q", ids).tobytes()) & 0x7FFFFFFF
        return req

    def run(self) -> None:
        """Step until every request finished."""
        while self.scheduler.has_work:
            self.step_with_progress()

    def step_with_progress(self) -> None:
        """`step()`, raising instead of returning without a window while requests wait (a loop
        around it can never spin)."""
        if not self.step() and self.scheduler.has_work:
            raise RuntimeError(f"the scheduler scheduled nothing while {len(self.scheduler.waiting)} "
                               f"requests wait and {len(self.scheduler.running)} run (a scheduler bug)")

    # -- one step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> bool:
        """One verify window over every scheduled request, then drafting for the next one.
        -> False when nothing was scheduled (no work)."""
        # a step the graphed path pre-launched is the next step, whatever changed since (a request
        # added, an observer attached): it runs on the GPU already; the scheduler waits one step
        pending = self.graphed.pending_requests if self.graphed is not None else None
        requests = pending if pending is not None else self.scheduler.schedule()
        if not requests:
            return False
        if pending is not None or (self.graphed is not None and self.graphed.eligible(requests)):
            return self._graphed_step(requests)
        batch = self._prepare(requests)
        self.policy.begin(batch.window, kind="verify")
        try:
            hidden, aux = self._target_forward(batch)
            verdict = self._sample_and_accept(batch, hidden)
            features = self._head_pass(batch, verdict, hidden, aux)
            record = self.policy.commit(verdict.acceptance)
        except BaseException as err:
            if self.policy.window is not None:
                self.policy.cancel()        # the cache ends as `off` would leave it
            self._locate(err, batch.requests)
            raise
        live = self._advance(batch, verdict, record)
        if self.drafting and live:
            try:
                self._draft([batch.requests[i] for i in live], features[live])
            except RingCorruption as err:
                self._locate(err, [batch.requests[i] for i in live])
                raise
        self.step_index += 1
        return True

    def _locate(self, err: BaseException, requests: list[Request]) -> None:
        """A RingCorruption names the step and the request id (the ledger knows window indices)."""
        if isinstance(err, RingCorruption) and err.step is None:
            err.step = self.step_index
            if 0 <= err.request < len(requests):
                err.req_id = requests[err.request].req_id
            err.args = (err.describe(),)

    def _graphed_step(self, requests: list[Request]) -> bool:
        """A steady step from its bucket's CUDA graph (nwor_lab.engine.graphed), then as `step`;
        the draft chain for the next window rode in the same graph when `drafted` is not None."""
        try:
            batch, verdict, features, record, drafted = self.graphed.step(requests)
        except BaseException:
            for policy in (self.policy, self.drafter.policy if self.drafter else None):
                if policy is not None and policy.window is not None:
                    policy.cancel()
            raise
        self.target_forwards += 1
        live = self._advance(batch, verdict, record)
        if drafted is not None:
            chain = self.graphed.chain_done(self.step_index)
            if chain is not None:
                self._end_window(*chain)
            if self.draft_counts is not None and self.graphed.pending_requests is None:
                # the chain rode in the graph with k drafts: verify only the hook's prefix (a step
                # pre-launched already verifies all k: its drafts are on the device)
                reqs = [batch.requests[i] for i in live]
                for r, n in zip(reqs, self.draft_counts(self, reqs) or [self.k] * len(reqs)):
                    r.keep_drafts(n)
        elif self.drafting and live:
            self._draft([batch.requests[i] for i in live], features[live])
        self.step_index += 1
        return True

    def _prepare(self, requests: list[Request]) -> VerifyBatch:
        """Flatten every request's scheduled tokens into one window (slots, metadata, Window)."""
        ids, positions, qlens, ctx, ndrafts, drafts, kinds = [], [], [], [], [], [], []
        for r in requests:
            toks, start, n = r.scheduled()
            r.block_table.ensure(start + len(toks))
            ids += toks
            positions += range(start, start + len(toks))
            qlens.append(len(toks)), ctx.append(start), ndrafts.append(n)
            drafts += r.drafts[:n]
            kinds.append("prefill" if r.is_prefill else ("spec" if n else "decode"))
        cu = torch.tensor(qlens).cumsum(0).tolist()
        attention = AttentionMetadata.build(self.cache, self.policy, positions, qlens,
                                            [r.block_table.blocks for r in requests], ctx,
                                            attention=self.config.attention, sliding=self.sliding,
                                            num_drafts=ndrafts, ledger=self.ledger)
        spec = SpecDecodeMetadata.build(ndrafts, cu, torch.tensor(drafts, dtype=torch.int32), device=self.device)
        window = Window.from_metadata(spec, cu, attention.slot_mapping, attention.positions)
        return VerifyBatch(requests, ids, qlens, ctx, ndrafts, kinds, cu, attention, spec, window)

    def _target_forward(self, batch: VerifyBatch):
        """-> (final hidden states `[T, h]`, the aux streams EAGLE-3 reads or None)."""
        aux_layers = self.head.aux_layers if self.drafting else ()
        ids = torch.tensor(batch.token_ids, dtype=torch.long, device=self.device)
        self.target_forwards += 1
        return self.target.forward_with_aux(ids, batch.attention, aux_layers)

    def _sample_and_accept(self, batch: VerifyBatch, hidden: torch.Tensor) -> Verdict:
        """Rejection sampling against the drafts, then SCV turns the sampler's output into an
        Acceptance (debug mode cross-checks it with the host loop)."""
        logits = self.target.compute_logits(hidden[batch.spec.logits_indices.long()]).float()
        probs = [r.draft_probs for r in batch.requests if r.draft_probs is not None and r.drafts]
        draft_probs = torch.cat(probs) if probs and self.temperature > 0 else None
        sampled = rejection_sample(batch.spec, draft_probs, logits, temperature=self.temperature,
                                   generator=self.generator, **self._forced(batch))   # [R, k + 1]
        acceptance = self.scv.accept(batch.window, sampled, max_spec_len=batch.spec.max_spec_len)
        if self.config.debug:
            check_against_sampler(batch.window, acceptance, sampled, self.config.scv_mode)
        accepted = acceptance.accepted_per_request()
        sampled_host = sampled.tolist()
        return Verdict(sampled, acceptance, accepted, [sampled_host[i][a] for i, a in enumerate(accepted)])

    def _forced(self, batch: VerifyBatch) -> dict:
        """The sampler's forced-acceptance arguments for this window ({} when off): each draft's u
        hashed from its request's key (its prompt's hash) and its position (drafts are each
        request's last rows)."""
        if self.acceptance is None or not batch.spec.total_draft_tokens:
            return {}
        keys, pos = [], []
        for r, c, q, n in zip(batch.requests, batch.context_lens, batch.query_lens, batch.num_drafts):
            keys += [r.acceptance_key] * n
            pos += range(c + q - n, c + q)
        u = self.acceptance.uniforms(torch.tensor(keys), torch.tensor(pos)).to(self.device)
        return dict(synthetic_rates=self.forced_rates, uniform_probs=u)

    def _head_pass(self, batch: VerifyBatch, verdict: Verdict, hidden, aux) -> torch.Tensor | None:
        """The head over the window's rows (its layer N, same slots, same policy window) ->
        head output `[R, h]` at each request's last kept row, or None without drafting.

        Row p reads x[p+1]: the next scheduled token of its request, except at the request's last
        kept row, where x[p+1] is the token just sampled. Rows after it are rejected drafts."""
        if not self.drafting:
            return None
        kept = verdict.kept_rows(batch)
        next_ids = batch.token_ids[1:] + [0]
        for last, row, token in zip(batch.last_rows, kept, verdict.next_tokens):
            next_ids[last] = next_ids[row] = token
        g = self.head(torch.tensor(next_ids, dtype=torch.long, device=self.device),
                      self.head.features_from_target(hidden, aux), batch.attention)
        return g[torch.tensor(kept, device=self.device)]

    def _advance(self, batch: VerifyBatch, verdict: Verdict, record) -> list[int]:
        """Emit each request's accepted drafts + next token, advance `num_computed` by what was
        committed, finish what is done; trace the window. -> indices of requests still running."""
        entry = WindowTrace(self.step_index, "verify", [r.req_id for r in batch.requests], batch.kinds,
                            batch.num_drafts, verdict.accepted, [], record)
        for i, r in enumerate(batch.requests):
            a = verdict.accepted[i]
            r.num_computed = batch.context_lens[i] + (batch.query_lens[i] - batch.num_drafts[i]) + a
            entry.emitted.append(self._emit(r, r.drafts[:a] + [verdict.next_tokens[i]]))
            # drafts accepted past max_new_tokens (or an end token) were cut from the output: the
            # request's state stops at what it emitted (num_computed == len(tokens) - 1)
            r.num_computed = min(r.num_computed, len(r.tokens) - 1)
            r.drafts, r.draft_probs = [], None
        self._end_window(entry, batch.window)
        for r in batch.requests:
            if r.remaining <= 0:
                self.scheduler.finish(r)
        return [i for i, r in enumerate(batch.requests) if not r.finished]

    def _draft(self, requests: list[Request], features: torch.Tensor) -> None:
        """Drafts for the next window: the chain's CUDA graph when it can (GraphedDraft), else the
        eager drafter."""
        n_drafts = self.draft_counts(self, requests) if self.draft_counts is not None else None
        if n_drafts is not None and (len(n_drafts) != len(requests) or any(not 0 <= n <= self.k for n in n_drafts)):
            raise ValueError(f"draft_counts returned {list(n_drafts)} for {len(requests)} requests: one count "
                             f"in 0..k={self.k} per request")
        if n_drafts is not None and all(n == self.k for n in n_drafts):
            n_drafts = None
        graphed = self.graphed.draft if self.graphed is not None else None
        if graphed is not None and n_drafts is None and graphed.eligible(requests):
            self._end_window(*graphed.draft(requests, features, self.step_index, self.graphed.capture))
            return
        if self.sliding is not None and self.sliding.guard:   # t_last of the next window sits at num_computed
            guard = [self.sliding.drafts_allowed(r.num_computed, self.k) for r in requests]
            n_drafts = guard if n_drafts is None else [min(n, g) for n, g in zip(n_drafts, guard)]
        chain = self.drafter.draft(requests, features, self.step_index, n_drafts)
        if chain is not None:
            self._end_window(*chain)

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


def policy_class(config: LabConfig):
    """The write policy class `config.nwor_mode` names (what it declares decides `kv_ring='auto'`)."""
    if config.nwor_mode not in POLICIES:
        raise ValueError(f"nwor_mode={config.nwor_mode!r}: no such write policy; registered: {', '.join(POLICIES)}")
    return POLICIES[config.nwor_mode]


def _cache_spec(target, head, num_blocks, block_size, dtype, cache_dtype) -> KVCacheSpec:
    """One stacked cache for the target's layers and (as layer N) the head's."""
    tc = target.config
    if head is not None:
        hc = head.config
        if (hc.num_key_value_heads, hc.head_dim) != (tc.num_key_value_heads, tc.head_dim):
            raise ValueError(f"draft head KV shape ({hc.num_key_value_heads} heads x {hc.head_dim}) differs "
                             f"from the target's ({tc.num_key_value_heads} x {tc.head_dim}); one stacked "
                             f"cache holds both")
    n_layers = tc.num_hidden_layers + (1 if head is not None else 0)
    return KVCacheSpec(n_layers, num_blocks, block_size, tc.num_key_value_heads, tc.head_dim, dtype=dtype,
                       cache_dtype=cache_dtype)
