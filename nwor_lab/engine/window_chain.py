"""The chain window kind: t_last + k drafts a request in plain rows (and every prefill's rows), the
EAGLE draft chain d_1..d_k drafted for the next window. One of the two kinds behind the engine's
window seam (nwor_lab.engine.window_kind); the other is the tree's (nwor_lab.engine.window_tree).

    rows functions   verify_rows / accept_rows / head_ids_rows: a window of plain rows (a chain's
                     verify window, or any prefill's rows), which the tree kind's prefills use too
    draft_chain      d_1 from the verify pass's head features, then k - 1 head passes in the
                     drafter policy's window (every row rejected)
    ChainKind        the seam's methods for an engine that drafts chains (or none: k = 0)
"""
from __future__ import annotations

import torch

from nwor_lab.engine.buffers import BucketKey, bucket_size, prefill_token_buckets, slot_sizes, token_bucket
from nwor_lab.kv import build_slot_mapping
from nwor_lab.speculative import check_against_sampler, rejection_sample
from nwor_lab.window import Acceptance, Window


# -- a window of plain rows ------------------------------------------------------------------------
def verify_rows(e, inp):
    """The verify window of plain rows and its metadata -> (Window, AttentionMetadata): write slots
    from the buffers' positions (padding rows: -1), the log ranges on a ring under cow.

    In a step that feeds itself, a request with nothing left to generate (`remaining` <= 0: it
    finished in the step before, which the device computed before the host read it; `next_inputs`)
    rides dead: its rows get slot -1 too, so no store receives them (the target's and the head's
    cache, cow's log, stage's commit, prefix caching's boundary rows: all skip slot -1). A
    host-filled step carries only requests with tokens left, so its slots do not change."""
    w = inp.window
    ring = e.sliding.ring_slots if e.sliding is not None else None
    row_ok = inp.rows < inp.qsl[-1]                                # rows past the requests': padding
    if inp.feeds_itself:
        row_ok = row_ok & (inp.remaining[w.token_req.long()] > 0)
    w.slot_mapping.copy_(build_slot_mapping(inp.tables, w.token_req, torch.where(row_ok, inp.positions, -1),
                                            e.cache.spec.block_size, ring))
    if inp.md.kernel.log_lo is not None:
        place_log(e, inp)
    return w, inp.md


def place_log(e, inp) -> None:
    """The log ranges of the verify pass, on the device: request r's drafts (its last rows) evict
    positions from first draft - ring on, logged in draft order (rows log_start[r] ..)."""
    a, nd = inp.md.kernel, inp.num_drafts
    first_row = (inp.qsl[1:].long() - nd).clamp(min=0, max=inp.tokens - 1)
    a.log_lo.copy_((torch.where(nd > 0, inp.positions[first_row], 0) - e.sliding.ring_slots).int())
    a.log_start[1:].copy_(nd.cumsum(0).int())


def accept_rows(e, inp, w, hidden):
    """Rejection sampling at the sampler's rows, then the engine's SCV -> (sampled [B, k + 1],
    Acceptance, accepted [B], kept [B]: each request's last kept row)."""
    # the logits stay in the model's dtype: greedy takes one argmax of them, T > 0 upcasts in the sampler
    logits = e.target.compute_logits(hidden[inp.rows_logits])
    sampled = rejection_sample(inp.spec, inp.draft_probs, logits, temperature=e.temperature, generator=e.generator,
                               generators=seeded_rows(e, inp), **_forced(e, inp))   # [B, k + 1]
    acceptance = e.scv.accept(w, sampled, max_spec_len=inp.k)
    if e.config.debug:
        check_against_sampler(w, acceptance, sampled, e.config.scv_mode)
    accepted = acceptance.accepted_len.long()
    return sampled, acceptance, accepted, inp.last_rows - inp.num_drafts + accepted


def head_ids_rows(inp, w, sampled, accepted, kept):
    """The head reads x[p+1]: the next row's token, and at the kept and last rows the token just
    sampled (a chunk's last row reads the prompt's next token instead: a chunk is a prefill whose
    rows end before the request's last token, and it samples nothing)."""
    token = sampled.gather(1, accepted[:, None]).squeeze(1).long()
    token = torch.where(inp.chunk_next >= 0, inp.chunk_next, token)
    next_ids = torch.cat([inp.ids[1:], inp.ids.new_zeros(1)])
    next_ids[inp.last_rows] = token
    next_ids[kept] = token
    return next_ids


def host_rows_window(h: dict, result):
    """(Window, Acceptance) on the CPU of a rows step's real requests (`StepInputs.host`). The
    window's rows are the lists `host_rows` laid out (the rule of `Window.from_counts`, which would
    walk the requests again and re-check counts the engine made); the acceptance is the readback's
    accepted lengths, checked (`Acceptance.from_accepted_len`)."""
    window = Window(torch.tensor(h["slots"], dtype=torch.long), torch.tensor(h["token_req"], dtype=torch.int32),
                    torch.tensor(h["draft_pos"], dtype=torch.int32), torch.tensor(h["draft_rows"], dtype=torch.int64),
                    list(h["qlens"]), list(h["ndrafts"]))
    return window, Acceptance.from_accepted_len(window, result.accepted)


def rows_key(e, requests, static: bool, k: int, chain: bool, limits: list[int]) -> BucketKey:
    """The `BucketKey` of a rows step: the bucket's when `static`, else the step's exact sizes (one
    padding row when a request has fewer drafts than k: it stands in for the missing ones; the
    sampler's layout keeps k slots a request; no chain when the step verifies no draft and drafts
    none). A decode bucket is keyed by the step's draft count d (`step_drafts`): d + 1 rows a request
    slot and a chain of d drafts (none at d = 0: a decode step, whose head pass only keeps the
    head's cache); a step with prefills keeps k."""
    n = len(requests)
    tokens = sum(len(r.scheduled()[0]) for r in requests)
    prefill = any(r.is_prefill for r in requests)
    if not static:
        short = k > 0 and any(r.is_prefill or len(r.drafts) < k for r in requests)
        # a decode step that verifies no draft and drafts none for the next window runs no chain, as
        # its bucket (d = 0) would: the head's pass still keeps its cache, but proposes nothing
        chain = chain and (prefill or step_drafts(requests, limits) > 0)
        return BucketKey(n, tokens + (1 if short else 0), 0 if prefill else k + 1, chain, False, k)
    if prefill:
        return BucketKey(bucket_size(n), token_bucket(tokens), 0, chain, False, k)
    return decode_key(bucket_size(n), step_drafts(requests, limits) if chain else 0)


def decode_key(size: int, d: int) -> BucketKey:
    """The decode bucket of `size` request slots and draft count d."""
    return BucketKey(size, size * (d + 1) + 1, d + 1, d > 0, False, d)


def step_drafts(requests, limits: list[int]) -> int:
    """A decode step's draft count d: the most drafts any request verifies now or may draft for its
    next window (`limits`, `step.draft_limits`): the step's verify rows and its chain both fit d."""
    return max([len(r.drafts) for r in requests] + list(limits), default=0)


def seeded_rows(e, inp) -> dict | None:
    """{row: generator} of the step's requests with their own generator (`add_request(generator=)`),
    None when none has one or T = 0."""
    if e.temperature == 0 or not e.seeded:
        return None
    rows = {r: req.generator for r, req in enumerate(inp.host["requests"]) if req.generator is not None}
    return rows or None


def chain_seeded_rows(e, inp, counts: torch.Tensor):
    """-> step s -> {row: generator} of the seeded rows that draft at chain step s (`counts`: the chain's
    drafts per row), so a request draws from its stream exactly what its own window needs, never what
    its batch neighbours' drafts need; None when no row is seeded. One host read of `counts` for the
    whole chain (such steps are eager: `check_request_generator`)."""
    rows = seeded_rows(e, inp) if inp is not None else None
    if rows is None:
        return lambda s: None
    n = counts.tolist()
    return lambda s: {r: g for r, g in rows.items() if n[r] > s} or None


# -- the draft chain -------------------------------------------------------------------------------
def _forced(e, inp) -> dict:
    """Forced acceptance: each draft's u from its request's key and position (padding drafts are
    rejected whatever their u)."""
    if e.acceptance is None or not inp.k:
        return {}
    keys = inp.req_key[:, None].expand(inp.size, inp.k).reshape(-1)
    pos = inp.positions[inp.window.draft_rows]
    return dict(synthetic_rates=e.forced, uniform_probs=e.acceptance.uniforms(keys, pos))


def drafts_allowed(e, base: torch.Tensor) -> torch.Tensor:
    """[B] drafts each request may propose for a window with t_last at `base` (the ring guard's
    rule, `SlidingWindow.drafts_allowed`, on the device; k otherwise)."""
    s = e.sliding
    if s is None or s.ring_slots is None or not s.guard:
        return torch.full_like(base, e.k)
    return torch.clamp(torch.clamp(s.ring_slots - 1 - base, min=s.ring_slots - s.size), max=e.k)


def draft_chain(engine, chain, base: torch.Tensor, counts: torch.Tensor, features: torch.Tensor, inp=None):
    """Drafts d_1..d_k of every request from the head's features at its last kept row: the first
    from the features, the rest from k - 1 head passes in the draft policy's window.
    -> (drafts [B, k] int64, -1 past `counts[j]`; probabilities [B, k, V] or None when greedy)."""
    e = engine
    head, pol, k = e.head, e.drafter.policy, chain.k
    chain.place(e, base, counts)
    g = torch.where((counts > 0)[:, None], features, torch.zeros_like(features))
    seeded = chain_seeded_rows(e, inp, counts)
    token, q = e.drafter.propose(g, seeded(0))
    drafts, probs = [token], [q]
    # Capture forbids branching on a device value: a captured chain runs its k - 1 passes with every
    # row padding when nobody drafts twice (the host traces none); an eager one reads the counts
    # once and opens no window for it.
    if k >= 2 and (chain.static or int(counts.max()) >= 2):
        layer = head.layer_index
        pol.begin(chain.window, layers=range(layer, layer + 1), kind="draft")
        for s in range(1, k):
            g = head(drafts[-1], g, chain.steps[s - 1])
            token, q = e.drafter.propose(g, seeded(s))
            drafts.append(token)
            probs.append(q)
        pol.commit(chain.reject)
    else:                               # every count below 2: the first draft only (the rest are -1)
        drafts += drafts[:1] * (k - 1)
        probs += probs[:1] * (k - 1)
    out = torch.stack(drafts, 1).long()
    out = torch.where(torch.arange(k, device=out.device)[None, :] < counts[:, None], out, -1)
    return out, (torch.stack(probs, 1) if probs[0] is not None else None)


class ChainKind:
    """The chain's side of the window seam (see nwor_lab.engine.window_kind for the interface)."""

    # a chain window's record reads only its host copy (`host_window`) and counts: it may be counted
    # after the next step is launched (`SpecEngine.flush_records`)
    records_later = True

    def __init__(self, engine):
        self.engine = engine        # (its drafter is made after the kind: the sizes below read it then)

    @property
    def k(self) -> int:
        """Draft slots a request in the sampler's layout (0 without drafting)."""
        e = self.engine
        return e.k if e.drafting else 0

    @property
    def lookahead(self) -> int:
        """Positions past t_last one step may write."""
        return self.engine.k

    @property
    def verify_rows(self) -> int:
        """Rows a request slot of a decode bucket."""
        return self.k + 1

    @property
    def draft_rows(self) -> int:
        """Rows a request slot of the drafter's window (0: no drafting)."""
        return max(1, self.k - 1) if self.engine.drafting else 0

    eager_reason = None     # nothing about chains keeps every step eager

    def start_keys(self, runner) -> list[BucketKey]:
        """Every bucket a step of this engine can reach, known before any request (captured at start,
        `engine.capture_sizes`): decode buckets by request slots and draft count d (d = k with a
        fixed k, every d in 0..k with a `draft_counts` hook), then the prefill buckets (none for
        a hybrid target, whose prefills stay eager)."""
        e = self.engine
        counts = range(self.k + 1) if e.draft_counts is not None and self.k else [self.k]
        keys = [decode_key(s, d) for s in slot_sizes(runner.max_size) for d in counts]
        if e.states is None:
            keys += [BucketKey(s, rows, 0, e.drafting, False, self.k) for s in slot_sizes(runner.max_size)
                     for rows in prefill_token_buckets(s, runner.max_tokens, runner.reserved)]
        return keys

    def capturable(self, runner) -> bool:
        return True         # every chain step may run from a bucket's graph (the runner's other rules apply)

    def schedule(self, requests):
        return requests                                   # prefills and decodes share a step

    def draft_width(self, k: int) -> int:
        """Readback columns of the next window's drafts in buffers of k draft slots: k."""
        return k

    def draft_need(self, req, start: int, q: int, n: int) -> int:
        """Positions the step may write for `req` with the chain aboard: up to the most this window
        can keep, plus k - 1 chain rows."""
        return start + q - n + min(n, req.remaining - 2) + self.k - 1

    def forced_tables(self, acceptance, device):
        """Forced acceptance's conditional rates per draft index `[k]` (the sampler's `synthetic_rates`)."""
        return acceptance.conditional(self.engine.k, device)

    def bucket_key(self, e, requests, static: bool, limits: list[int]) -> BucketKey:
        return rows_key(e, requests, static, self.k, e.drafting, limits)

    def fill(self, e, inp, requests, limits) -> None:
        inp.fill(e, requests, limits=limits)

    def verify(self, e, inp):
        return verify_rows(e, inp)

    def accept(self, e, inp, w, hidden):
        return accept_rows(e, inp, w, hidden)

    def head_ids(self, inp, w, sampled, accepted, kept):
        return head_ids_rows(inp, w, sampled, accepted, kept)

    def draft(self, e, inp, base, live, features):
        """-> ([drafts [B, k]], probabilities [B, k, V] or None)."""
        counts = torch.where(live, torch.minimum(drafts_allowed(e, base), inp.draft_limit), 0)
        drafts, probs = draft_chain(e, inp.chain, base, counts, features, inp)
        return [drafts], probs

    def unpack(self, inp, rows):
        """The next drafts in the readback rows (after k + 1 sampled ids and the accepted length),
        None when the step drafted nothing; no parents."""
        return ([row[inp.k + 2:] for row in rows] if inp.drafts_next else None), None

    def host_window(self, h: dict, result):
        return host_rows_window(h, result)

    def emitted(self, r, result, i: int, a: int) -> list[int]:
        return r.drafts[:a] + [result.next_tokens[i]]

    def note(self, entry, h, result) -> None:
        """Nothing a chain adds to its window's trace."""

    def hand_out(self, e, requests, result, live: list[bool]) -> list:
        """Give every request still running the drafts the body proposed for it -> the draft
        chain's rows [(request, slots)]: each request's drafts less the first, at num_computed on."""
        if result.drafts is None:
            return []
        k = self.k
        # each request's drafts: the bucket's d columns, -1 past its count (counted once a request)
        counts = [d.index(-1) if -1 in d else len(d) for d in result.drafts]

        def give(j: int, r) -> None:
            n = counts[j]
            r.drafts = result.drafts[j][:n]
            r.draft_probs = None if result.probs is None or not n else result.probs[j, :n]
            r.block_table.ensure(r.num_computed + 1, lookahead=k)   # the next window's slots

        return hand_out_each(requests, live, lambda j: counts[j] - 1 if counts[j] >= 2 else 0, give)


def hand_out_each(requests, live: list[bool], draft_rows, give) -> list:
    """The hand-out walk both kinds share: for each request still running, its rows of the head's
    draft window from num_computed on, `draft_rows(j)` of them (0: none), -> [(request, slots)];
    then `give(j, request)` its next window, unless it emitted its last token in this step."""
    drafted = []
    for j, r in enumerate(requests):
        if not live[j]:
            continue
        n = draft_rows(j)
        if n:
            drafted.append((r, r.block_table.slots(range(r.num_computed, r.num_computed + n))))
        if r.remaining > 0:
            give(j, r)
    return drafted
