"""The engine's step, written once: one device-side body over fixed-shape step buffers.

    slots -> policy.begin -> target forward -> logits at the sampler's rows -> rejection sampling
    (greedy or T > 0, forced acceptance) -> the engine's SCV -> head pass over the window's rows
    -> policy.commit -> the EAGLE draft chain d_1..d_k for the next window (its own policy window
    on the head's layer, every row rejected)

With `LabConfig.tree` the same body verifies a tree window (t_last + N nodes a request, positions
n + depth, the tree mask in the attention metadata), accepts a root path, commits it through the
policy (`commit_slots`: n + 1 .. n + a) and drafts the next tree (EAGLE-2 / static) instead of the
chain; a prefill verifies its prompt with k = 0, then drafts a tree (`engine.tree_inputs`).

`run_step(engine, inputs)` is that body. The runner (nwor_lab.engine.runner) runs it eagerly on
buffers of exactly the step's size, or captures it once per bucket of padded sizes and replays it;
nothing else in the engine computes a step. The objects it calls are the engine's own (`scv`,
`drafter.propose`, `policy`, `drafter.policy`), so whatever wraps them (tensor parallel's agreed
SCV and drafter, observers, debug checks) applies to every step, eager or replayed.

The layout is data, not shape (vLLM's full graphs over mixed batches do the same):

    rows       ids, positions, request of each row, draft index of each row (0: always kept);
               padding rows: slot -1, in no request's row range
    requests   row range (query_start_loc), cached length, k draft slots each (a prefill's, a
               padding request's and drafts cut by the token budget or the ring guard are -1, at
               the last padding row, whose draft index k + 1 no accepted length reaches), the rows
               whose logits the sampler reads (t_last's and the drafts' rows, then the bonus row; a
               request without drafts reads its last row k + 1 times: its -1 drafts are rejected at
               column 0, where the target's own token is emitted), tokens left, prompt key

Attention's metadata has one form, eager and captured alike: device tensors over the buffers
(block tables, cached lengths, query starts, window rows), built once per buffers and refreshed by
`fill` and the body; the torch reference attention reads the same tensors as the Triton kernel.
"""
from __future__ import annotations

import torch

from nwor_lab.engine.buffers import Readback, StaticInputs, max_blocks
from nwor_lab.engine.preemption import drop_requests
from nwor_lab.engine.tree_inputs import TreeInputs
from nwor_lab.kv import build_slot_mapping
from nwor_lab.model.attention import AttentionMetadata, KernelArgs
from nwor_lab.speculative import SpecDecodeMetadata
from nwor_lab.window import Acceptance, Window


def chain_k(e) -> int:
    """Draft slots per request in the chain's sampler layout: the engine's k when it drafts chains,
    0 without drafting and with trees (a tree window has its own buffers, `TreeInputs`)."""
    return e.window_kind.k


class StepInputs:
    """Buffers of one step: `size` request slots, `tokens` rows, `k` draft slots per request
    (default the engine's k, 0 without drafting; a decode bucket's is the step's draft count d,
    `BucketKey`: its verify has d + 1 rows a request and its chain drafts at most d). `static`:
    padded to a bucket for capture (device metadata, `max_query_len` a bound fixed per bucket)
    rather than the step's exact size."""

    def __init__(self, engine, size: int, tokens: int, max_query_len: int, *, chain: bool, static: bool,
                 tree: bool = False, k: int | None = None):
        e, dev = engine, engine.device
        k = chain_k(e) if k is None else k
        if not 0 <= k <= chain_k(e):
            raise ValueError(f"StepInputs: k={k} draft slots a request; the engine drafts 0..{chain_k(e)}")
        if chain and not k:
            raise ValueError("StepInputs: a draft chain aboard needs k >= 1 draft slots (chain=False for k = 0)")
        self.size, self.tokens, self.k, self.static = size, tokens, k, static
        self.max_query_len = max_query_len
        # with trees: every step drafts a tree for the next window after its commit; `tree`: this
        # step verifies one (a decode step; prefills verify their prompt rows with k = 0)
        self.tree_draft = e.tree is not None and e.drafting
        self.tree = TreeInputs(e, size, static) if tree else None
        self.sampled_width = self.tree.plan.depth + 1 if tree else k + 1
        self.inputs = StaticInputs(
            dev, ids=((tokens,), torch.long), positions=((tokens,), torch.long), req_key=((size,), torch.long),
            rows_logits=((size * (k + 1),), torch.long), draft_rows=((size * k,), torch.long),
            last_rows=((size,), torch.long), num_drafts=((size,), torch.long), remaining=((size,), torch.long),
            start=((size,), torch.long), draft_limit=((size,), torch.long), token_req=((tokens,), torch.int32), draft_pos=((tokens,), torch.int32),
            drafts=((size * k,), torch.int32), qsl=((size + 1,), torch.int32), cache_lens=((size,), torch.int32),
            tables=((size, max_blocks(e)), torch.int32), state_slots=((size,), torch.long),
            chunk_next=((size,), torch.long))
        i = self.inputs.dev
        self.ids, self.positions, self.req_key, self.start = i["ids"], i["positions"], i["req_key"], i["start"]
        self.rows_logits, self.last_rows, self.num_drafts = i["rows_logits"], i["last_rows"], i["num_drafts"]
        self.remaining, self.qsl, self.tables, self.cache_lens = i["remaining"], i["qsl"], i["tables"], i["cache_lens"]
        self.draft_limit = i["draft_limit"]         # drafts each request may propose for the next window
        self.state_slots = i["state_slots"]         # a hybrid target's state slot per request (padding: scratch)
        # a chunk of a chunked prefill that is not the prompt's last: the prompt token after its rows
        # (what the head's last row reads; the step samples nothing for it); -1 for every other request
        self.chunk_next = i["chunk_next"]
        # every request slot has k drafts in the sampler's layout: target rows then the bonus row
        cu = [(k + 1) * (r + 1) for r in range(size)]
        self.spec = SpecDecodeMetadata.build([k] * size, cu, i["drafts"], device=dev)
        slots = torch.full((tokens,), -1, dtype=torch.long, device=dev)
        self.window = Window(slots, i["token_req"], i["draft_pos"], i["draft_rows"], [k + 1] * size, [k] * size,
                             draft_token_ids=i["drafts"], cu_draft=self.spec.cu_num_draft_tokens,
                             positions=self.positions)
        # the draft probabilities of the drafts (T > 0), each request's k rows (padding: zeros)
        self.draft_probs = None
        if k and e.temperature > 0:
            self.draft_probs = torch.zeros(size * k, e.vocab_size, dtype=torch.float32, device=dev)
        self.rows = torch.arange(tokens, device=dev)
        in_buffer = e.policy.window_in_buffer
        kernel = KernelArgs(self.tables, self.cache_lens, self.qsl, self.rows if in_buffer else None,
                            self.qsl if in_buffer else None, *_sliding_args(e), max_query_len=max_query_len)
        if reads_log(e):   # cow on a ring: each request's drafts' evicted positions, from the log (`window_chain.place_log`)
            kernel.log_lo = torch.zeros(size, dtype=torch.int32, device=dev)
            kernel.log_start = torch.zeros(size + 1, dtype=torch.int32, device=dev)
        self.md = AttentionMetadata(self.positions, slots, e.cache, e.policy, kernel, attention=e.config.attention,
                                    sliding=e.sliding, ledger=e.ledger)
        self.chain = ChainInputs(e, size, self.tables, static, k) if chain else None
        self.drafts_next = chain or self.tree_draft   # the body drafts the next window (a chain or a tree)
        # the readback: sampled ids, the accepted length, then the next window's drafts (the kind's width)
        self.readback = Readback(dev, (size, self.sampled_width + 1
                                       + (e.window_kind.draft_width(k) if self.drafts_next else 0)))
        # a decode bucket computes the next step's inputs itself (every request t_last + k drafts
        # again, at the positions this step's acceptance gives), so the runner can launch the next
        # step before it has read this one (`StepRunner._can_prelaunch`)
        self.feeds_itself = static and max_query_len == k + 1 and (chain or k == 0)
        self.host: dict = {}
        self.features = None          # head output at each request's last kept row [size, h], or None
        self.next_probs = None        # the chain's draft probabilities [size, k, V] (T > 0), or None
        self.graph = None             # the runner's: the captured body, and its outputs
        self.replays = 0              # steps replayed from `graph` (the runner counts them)
        self.lent: list = []          # requests holding views of `next_probs` (`StepRunner._keep_lent_probs`)
        self.outputs = None
        self.kept = None              # a prefill bucket's graph outputs outside the shared pool (the runner's)
        self.warmed = False

    @classmethod
    def of_key(cls, engine, key, static: bool) -> "StepInputs":
        """The buffers of `key` (a `BucketKey`)."""
        return cls(engine, key.size, key.tokens, key.max_query_len, chain=key.chain, static=static, tree=key.tree,
                   k=key.k)

    # -- host ----------------------------------------------------------------------------------
    def fill(self, engine, requests, limits: list[int] | None = None) -> None:
        """This step's requests into the buffers (padding stays padding), one copy per dtype;
        blocks allocated for every row the step writes (the chain's too; a tree window's buffers are
        `TreeInputs.fill`'s: the window kind picks). `limits`: the draft
        counts for the next window when the runner already asked `draft_counts` (else asked here)."""
        k, size = self.k, self.size
        rows = self.host_rows(engine, requests)
        h = self.inputs.host
        h["tables"].fill(0)
        for r, blocks in enumerate(self.host["tables"]):
            h["tables"][r, :len(blocks)] = blocks
        n_req, total = len(requests), len(self.host["ids"])
        pad_row = self.tokens - 1
        pad_rows, pad_reqs = self.tokens - total, size - n_req
        h["ids"][:] = self.host["ids"] + [0] * pad_rows
        h["positions"][:] = self.host["positions"] + [0] * pad_rows
        h["token_req"][:] = rows["token_req"] + [0] * pad_rows
        # the last row stands in for every padding draft: draft index k + 1, above any accepted
        # length, so it reads as a rejected draft to every check (its slot is -1: never written)
        h["draft_pos"][:] = rows["draft_pos"] + ([0] * (pad_rows - 1) + [k + 1 if k else 0] if pad_rows else [])
        h["qsl"][:] = rows["qsl"] + [total] * pad_reqs                   # padded requests: no rows
        h["last_rows"][:] = rows["last"] + [pad_row] * pad_reqs          # a padding row, never a real one
        h["num_drafts"][:] = self.host["ndrafts"] + [0] * pad_reqs
        h["cache_lens"][:] = rows["lens"] + [0] * pad_reqs
        h["start"][:] = self.host["ctx"] + [0] * pad_reqs
        h["rows_logits"][:] = rows["rows_logits"] + [pad_row] * (pad_reqs * (k + 1))
        h["draft_rows"][:] = rows["draft_rows"] + [pad_row] * (pad_reqs * k)
        h["drafts"][:] = rows["drafts"] + [-1] * (pad_reqs * k)
        if engine.states is not None:       # padding requests advance the store's scratch slot (no rows)
            h["state_slots"][:] = [r.state_slot for r in requests] + [engine.states.store.scratch_slot] * pad_reqs
        h["remaining"][:] = [r.remaining for r in requests] + [0] * pad_reqs
        h["req_key"][:] = [r.acceptance_key for r in requests] + [0] * pad_reqs
        limits = draft_limits(engine, requests) if limits is None else list(limits)
        chunk_next = self.host["chunk_next"]
        h["chunk_next"][:] = chunk_next + [-1] * pad_reqs
        # a chunk that is not the prompt's last drafts nothing: only the last chunk lets the head draft
        h["draft_limit"][:] = [0 if c >= 0 else n for c, n in zip(chunk_next, limits)] + [0] * pad_reqs
        self.inputs.upload()
        if not self.static:     # exact sizes: the kernel's query tile from the true bound, known here
            self.md.kernel.max_query_len = max(self.host["qlens"], default=0)
        if self.draft_probs is not None:
            self.draft_probs.zero_()
            for r, req in enumerate(requests):
                n = self.host["ndrafts"][r]
                if n and req.draft_probs is not None:
                    self.draft_probs[r * k:r * k + n].copy_(req.draft_probs[:n])

    def host_rows(self, engine, requests, *, ensure: bool = True) -> dict:
        """The step's rows from the requests' state, as host lists; what the host's bookkeeping
        reads is kept in `host`. `ensure`: allocate the blocks the step writes (with the chain
        aboard, its rows too: up to the most this window can keep, plus k - 1)."""
        k = self.k
        pad_row = self.tokens - 1
        in_buffer = engine.policy.window_in_buffer
        ids, pos, token_req, draft_pos, slots = [], [], [], [], []
        qsl, last, ndrafts, lens, ctx, qlens, kinds, chunk_next = [0], [], [], [], [], [], [], []
        rows_logits, draft_rows, drafts, real_draft_rows = [], [], [], []
        for r, req in enumerate(requests):
            sched = req.scheduled()
            toks, start, n = sched
            q = len(toks)
            if ensure:
                need = start + q
                if self.drafts_next:          # the head's draft window of the next window (the kind's)
                    need = max(need, engine.window_kind.draft_need(req, start, q, n))
                req.block_table.ensure(need)
            row0 = len(ids)
            ids += toks
            pos += range(start, start + q)
            token_req += [r] * q
            draft_pos += [0] * (q - n) + list(range(1, n + 1))
            slots += req.block_table.slots(range(start, start + q))
            qsl.append(row0 + q)
            last.append(row0 + q - 1)
            ndrafts.append(n)
            lens.append(start + (0 if in_buffer else q))
            ctx.append(start)
            qlens.append(q)
            kinds.append("prefill" if req.is_prefill else ("spec" if n else "decode"))
            chunk_next.append(req.chunk_next(sched))
            # t_last's row and the drafts' rows verify the drafts; drafts short of k (all k for a
            # prefill) are -1 at the padding row and read the request's last row, where the first
            # of them is rejected and the target's own token emitted
            rows_logits += list(range(row0 + q - n - 1, row0 + q)) + [row0 + q - 1] * (k - n)
            mine = range(row0 + q - n, row0 + q)
            real_draft_rows += mine
            draft_rows += list(mine) + [pad_row] * (k - n)
            drafts += list(req.drafts[:n]) + [-1] * (k - n)
        self.host = dict(requests=list(requests), ids=ids, slots=slots, qlens=qlens, ctx=ctx, ndrafts=ndrafts,
                         kinds=kinds, positions=pos, tables=[list(r.block_table.blocks) for r in requests],
                         chunk_next=chunk_next,
                         # the real rows' Window fields (`Window.from_counts`'s rule, laid out here
                         # once): the host window is built from them without a second walk
                         token_req=token_req, draft_pos=draft_pos, draft_rows=real_draft_rows)
        return dict(token_req=token_req, draft_pos=draft_pos, qsl=qsl, last=last, lens=lens,
                    rows_logits=rows_logits, draft_rows=draft_rows, drafts=drafts)


class ChainInputs:
    """Buffers of the EAGLE draft chain d_1..d_k for `size` request slots (k: the bucket's draft
    slots, at most the engine's): the first draft from the verify pass's head features, then k - 1
    head passes, one row per request each (step-major rows), in one draft-policy window on the
    head's layer, committed with every row rejected."""

    def __init__(self, engine, size: int, tables: torch.Tensor, static: bool, k: int):
        e, dev = engine, engine.device
        pol = e.drafter.policy
        self.size, self.k, self.tables = size, k, tables
        rows = size * max(0, k - 1)
        slots = torch.full((rows,), -1, dtype=torch.long, device=dev)
        token_req = torch.arange(size, dtype=torch.int32, device=dev).repeat(max(0, k - 1))
        draft_pos = torch.arange(1, max(1, k), dtype=torch.int32, device=dev).repeat_interleave(size)
        order = torch.arange(rows, device=dev).view(max(0, k - 1), size).t().reshape(-1)   # request-major
        self.positions = torch.zeros(max(0, k - 1), size, dtype=torch.long, device=dev)   # [step, request]
        self.window = Window(slots, token_req, draft_pos, order, [max(0, k - 1)] * size, [max(0, k - 1)] * size,
                             positions=self.positions.view(-1))           # step-major, as the rows
        self.reject = Acceptance.rejecting_all(self.window)
        self.in_buffer = pol.window_in_buffer
        self.step_offset = torch.arange(max(0, k - 1), device=dev)[:, None]
        self.lens = torch.zeros(max(0, k - 1), size, dtype=torch.int32, device=dev)
        self.lens_offset = torch.zeros(max(0, k - 1), 1, dtype=torch.long, device=dev) if self.in_buffer else \
            torch.arange(1, max(1, k), device=dev)[:, None]                 # chain step s reads s own rows
        self.static = static
        # each chain step's metadata (device tensors that `place` refreshes): one row a request, which
        # reads the committed prefix and its chain rows so far; a row that does not draft (padding,
        # finished, cut) writes nowhere (slot -1) and its output is never read
        self.steps = []
        qsl_t = torch.arange(size + 1, dtype=torch.int32, device=dev)
        for s in range(1, k):
            win_rows = win_start = None
            if self.in_buffer:   # request r's chain rows so far: r, size + r, ..., (s - 1) * size + r
                win_rows = (torch.arange(s, device=dev)[None, :] * size
                            + torch.arange(size, device=dev)[:, None]).reshape(-1)
                win_start = torch.arange(0, s * size + 1, s, dtype=torch.int32, device=dev)
            self.steps.append(AttentionMetadata(
                self.positions[s - 1], slots[(s - 1) * size:s * size], e.cache, pol,
                KernelArgs(self.tables, self.lens[s - 1], qsl_t, win_rows, win_start, *_sliding_args(e),
                           max_query_len=1), (s - 1) * size, e.config.attention, e.sliding, e.ledger))

    def place(self, engine, base: torch.Tensor, counts: torch.Tensor) -> None:
        """Positions, cached lengths and slots of every chain row: request j drafts `counts[j]`
        tokens (0: none, padding or finished) after its `base[j]` committed positions; chain step s
        (1-based) writes position base + s - 1 where counts > s, else nothing (slot -1)."""
        bs = engine.cache.spec.block_size
        pos = base[None, :] + self.step_offset                          # [k-1, B]
        self.positions.copy_(pos)
        self.lens.copy_(base[None, :] + self.lens_offset)
        live = counts[None, :] > self.step_offset + 1
        ring = engine.sliding.ring_slots if engine.sliding is not None else None
        rows = torch.where(live, pos, -1).reshape(-1)                     # step-major, as the window
        self.window.slot_mapping.copy_(build_slot_mapping(self.tables, self.window.token_req, rows, bs, ring))


def _sliding_args(e) -> tuple[int, int]:
    """(W, ring slots) of the kernel's metadata (0: off)."""
    s = e.sliding
    return (s.size, s.ring_slots or 0) if s is not None else (0, 0)


def reads_log(e) -> bool:
    """A ring under a policy that declares `evicted_in_log` (cow): the verify pass reads the positions
    its drafts' writes evict from the policy's log (the runner keeps these steps eager)."""
    return e.sliding is not None and e.sliding.ring_slots is not None and e.policy.evicted_in_log


def run_step(engine, inp: StepInputs):
    """The step on `inp`'s buffers -> (packed [B, k+2 (+k)] int64: sampled ids, accepted length,
    next drafts when the chain is aboard (-1 past each request's count); head features [B, h] or
    None; next draft probabilities [B, k, V] or None).

    What differs between a chain and a tree is the engine's window kind (`engine.window_kind`: the
    window and its metadata, the verdict, the head's ids, the next window's drafts; nwor_lab.engine.
    window_chain / window_tree); the body asks it, never which kind it is. With trees packed is
    [B, W + 1 + 2N] (W = D + 1 sampled ids on a tree window, 1 on a prefill; then the accepted
    length, the next tree's N node tokens (-1: none) and N parents)."""
    e, kind = engine, engine.window_kind
    w, md = kind.verify(e, inp)
    e.policy.begin(w, kind="verify")
    if e.states is not None:        # a hybrid target's recurrent state: opened on the same window
        # Capture forbids host counts: a decode bucket opens the state window in the device layout;
        # exact sizes (prefills too) open it with the true host counts (its chunked form reads them)
        if inp.static:
            e.states.begin(w, inp.state_slots, query_start_loc=inp.qsl, num_drafts=inp.num_drafts,
                           max_query_len=inp.max_query_len)
        else:
            h = inp.host
            qsl = [0]
            for q in h["qlens"]:
                qsl.append(qsl[-1] + q)
            e.states.begin(w, [r.state_slot for r in h["requests"]], query_start_loc=qsl, num_drafts=h["ndrafts"])
        md.states = e.states
    aux_layers = e.head.aux_layers if e.drafting else ()
    hidden, aux = e.target.forward_with_aux(inp.ids, md, aux_layers)
    sampled, acceptance, accepted, kept = kind.accept(e, inp, w, hidden)
    features = None
    if e.drafting:
        next_ids = kind.head_ids(inp, w, sampled, accepted, kept)
        feats = e.head.features_from_target(hidden, aux)
        g = e.head(next_ids, feats, md)
        features = g[kept]
    drop = e.window_drops(inp)
    if drop is not None:        # requests aborted or preempted while the window was open: nothing kept
        acceptance = drop_requests(w, acceptance, drop)
        accepted = acceptance.accepted_len.long()
    if e.drafting and e.prefix is not None:    # what the head's row at a committed block's end read, kept beside it
        e.prefix.keep_boundary(w, feats, next_ids, acceptance.commit_mask)
    e.policy.commit(acceptance)
    if e.states is not None:
        e.states.commit(acceptance)
    packed = [sampled.long(), accepted[:, None]]
    probs, drafts = None, []
    drop = e.window_drops(inp)  # (again: one dropped at the commit drafts nothing either)
    if inp.drafts_next:
        live = (accepted + 1 < inp.remaining) & (inp.chunk_next < 0)  # running on, past its prompt's chunks
        if drop is not None:
            live = live & ~drop
        base = torch.where(live, w.positions[kept] + 1, 0)           # num_computed after the step
        drafts, probs = kind.draft(e, inp, base, live, features)
        packed += drafts
    if inp.feeds_itself:        # (a chain's or no drafts: a tree step never feeds itself)
        next_inputs(e, inp, sampled, accepted, drafts[0] if drafts else None)
    return torch.cat(packed, 1), features, probs


def next_inputs(e, inp: StepInputs, sampled, accepted, drafts) -> None:
    """A decode bucket's next inputs from this step's outputs, on the device: what `fill` would
    write once the host advanced every request (t_last + k drafts each, the same rows), so the next
    step can run before the host read this one. Padding request slots stay padding. A request that
    emits its last token in this step (remaining - a - 1 <= 0, or an end token among the a + 1 it
    emits) keeps its inputs (positions inside
    its blocks and the tables) with remaining 0 and no drafts: in a pre-launched step it rides dead,
    its rows write nothing (`verify_rows`: slot -1), it drafts nothing (`run_step`'s `live`) and a
    hybrid target's state window runs it on the store's scratch slot (its own slot, which the host
    frees, keeps its bytes; block checkpoints key on the rows' slots: -1 goes to their scratch row)."""
    k = inp.k
    left = inp.remaining - accepted - 1                              # [B] tokens left after this step
    on = (inp.remaining > 0) & (left > 0)                            # runs on into the next step
    if e.eos_token_id is not None:  # an end token among what it emits now ends it too (the host's `_emit`)
        emitted = torch.arange(sampled.shape[1], device=sampled.device)[None, :] <= accepted[:, None]
        on = on & ~((sampled == e.eos_token_id) & emitted).any(1)
    token = sampled.gather(1, accepted[:, None]).long()              # [B, 1] the next t_last
    start = torch.where(on, inp.start + accepted + 1, inp.start)
    ids = torch.cat([token, drafts.clamp(min=0)], 1) if drafts is not None else token   # [B, k+1]
    pos = start[:, None] + torch.arange(k + 1, device=start.device)
    n = inp.size * (k + 1)
    keep = on[:, None].expand(inp.size, k + 1).reshape(-1)
    inp.ids[:n].copy_(torch.where(keep, ids.reshape(-1), inp.ids[:n]))
    inp.positions[:n].copy_(torch.where(keep, pos.reshape(-1), inp.positions[:n]))
    in_buffer = e.policy.window_in_buffer
    inp.cache_lens.copy_(torch.where(on, start + (0 if in_buffer else k + 1), inp.cache_lens.long()).int())
    inp.remaining.copy_(torch.where(on, left, 0))
    if drafts is not None:
        inp.spec.draft_token_ids.copy_(torch.where(on[:, None], drafts, -1).reshape(-1).int())
    if e.states is not None:    # a dead rider's state window runs on the store's scratch slot, as padding's
        inp.state_slots.copy_(torch.where(on, inp.state_slots, e.states.store.scratch_slot))
    inp.start.copy_(start)


def draft_limits(e, requests) -> list[int]:
    """Drafts each request may propose for its next window: `engine.draft_counts(engine, requests)`
    when set (checked: one count in 0..k per request), else k."""
    k = e.k if e.drafting else 0
    got = e.draft_counts(e, requests) if e.draft_counts is not None and k else None
    if got is None:
        return [k] * len(requests)
    got = list(got)
    if len(got) != len(requests) or any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= k
                                        for n in got):
        raise ValueError(f"draft_counts returned {got!r}: give one int in 0..{k} (the engine's k) per request, "
                         f"{len(requests)} here")
    return got
