"""The tree window kind: t_last + N draft nodes a request (a TreeWindow: positions n + depth, the
ancestor mask, write-all slots, the accepted root path committed at n + 1 .. n + a), and the next
tree drafted by the head (EAGLE-2's dynamic tree, or a static one). One of the two kinds behind the
engine's window seam (nwor_lab.engine.window_kind); a tree engine's prefills verify plain rows
(nwor_lab.engine.window_chain's rows functions, k = 0) and draft a tree after them.

    accept_tree      the verdict on a tree window: forced, greedy, or recursive rejection sampling
    draft_tree       the next window's tree for every request still running
    TreeKind         the seam's methods for an engine that drafts trees
"""
from __future__ import annotations

import torch

from nwor_lab.engine.buffers import BucketKey, bucket_size, token_bucket
from nwor_lab.engine.tree_plan import host_path
from nwor_lab.engine.window_chain import accept_rows, hand_out_each, head_ids_rows, host_rows_window, verify_rows
from nwor_lab.speculative.tree_accept import accept_tree_from_sampled, accept_tree_greedy, accept_tree_sampled
from nwor_lab.speculative.tree_window import TreeWindow
from nwor_lab.window import Acceptance


def accept_tree(e, inp, w: TreeWindow, logits: torch.Tensor):
    """A tree window's verdict from the target's logits at every row `[T, V]` (row t: the token
    after row t): forced acceptance (a tree profile), greedy, or recursive rejection sampling at
    T > 0 (the drafter proposes its top-k: one-hot draft distributions, `draft_probs=None`). The
    engine's SCV for trees (`accept_tree_from_sampled`) then turns the sampled ids into the mask the
    policy commits, unless `scv_mode` is off (the sampler's own path mask).
    -> (sampled [B, D + 1] int64, Acceptance, accepted [B] int64, kept [B]: each path's last row)."""
    if e.acceptance is not None:
        from nwor_lab.speculative.tree_forced import accept_tree_forced
        verdict = accept_tree_forced(w, logits, e.forced, e.acceptance.seed, inp.req_key)
    elif e.temperature == 0:
        verdict = accept_tree_greedy(w, logits)
    else:
        verdict = accept_tree_sampled(w, logits, None, e.temperature, e.generator)
    if e.config.scv_mode != "off":
        scv = accept_tree_from_sampled(w, verdict.sampled)
        if e.config.debug and not torch.equal(scv.path_mask, verdict.path_mask):
            raise RuntimeError("tree SCV: the path from the sampled ids differs from the sampler's (engine bug)")
        verdict = scv
    acceptance = verdict.acceptance(w)
    if e.config.debug:
        err = w.acceptance_error(acceptance.draft_mask, acceptance.accepted_len)
        if err:
            raise RuntimeError(f"tree acceptance: {err}")
    accepted = verdict.accepted_len.long()
    kept = verdict.path_rows(w).gather(1, accepted[:, None]).squeeze(1)
    return verdict.sampled.long(), acceptance, accepted, kept


def draft_tree(e, inp, base: torch.Tensor, live: torch.Tensor, features: torch.Tensor) -> list:
    """The next window's tree for every request still running: EAGLE-2's dynamic tree (or a static
    one) drafted by the head from its features at the request's last kept row, in one window of the
    drafter's policy on the head's layer (committed rejecting every row: the head's K/V of frontier
    nodes is provisional; `stage` keeps it in its buffer, `cow` restores it, `off` leaves it past the
    committed positions, where the next windows overwrite it; `model.tree_draft`).
    -> [tokens [B, N], parents [B, N]] int64, tokens -1 and parents 0 for a request that does not run on.

    Capture forbids a shape read from the device: a captured step drafts for every request slot
    (`_draft_tree_on_device`); an eager one reads which requests run on (one sync) and drafts for
    those alone (a static tree's `static_tree` indexes with host lists: eager only)."""
    from nwor_lab.model.tree_draft import draft_tree_with_head
    plan = e.tree_plan
    B, N = inp.size, plan.nodes
    if inp.static:
        return _draft_tree_on_device(e, inp, base, live, features)
    tokens = torch.full((B, N), -1, dtype=torch.long, device=base.device)
    parents = torch.zeros((B, N), dtype=torch.long, device=base.device)
    on = [j for j, x in enumerate(live.tolist()) if x]
    if on:
        idx = torch.tensor(on, device=base.device)
        tree, _ = draft_tree_with_head(e.head, e.cache, e.drafter.policy, features[idx], base[idx], inp.tables[idx],
                                       attention=e.config.attention, **plan.draft_kwargs())
        tokens[idx] = tree.tokens.long()
        parents[idx] = tree.parents.long()
    return [tokens, parents]


def _draft_tree_on_device(e, inp, base: torch.Tensor, live: torch.Tensor, features: torch.Tensor):
    """`draft_tree` with no host sync (a captured bucket): EAGLE-2's dynamic tree for every request
    slot at once, the head's passes on metadata built from device tensors (`HeadTreeStep`);
    slots that do not run on draft nothing (slot -1) and hand out no tree."""
    from nwor_lab.model.tree_draft import HeadTreeStep
    from nwor_lab.speculative.tree_draft import dynamic_tree
    plan, head = e.tree_plan, e.head
    g_root = torch.where(live[:, None], features, torch.zeros_like(features))
    root = torch.log_softmax(head.compute_logits(g_root).float(), -1)
    shape = plan.shape
    if plan.steps == 0:
        tree = dynamic_tree(None, root, shape.topk, shape.depth, shape.nodes)
    else:
        step = HeadTreeStep(head, e.cache, e.drafter.policy, g_root, base, inp.tables, plan.frontier, plan.steps,
                            live=live, attention=e.config.attention)
        step.open()
        tree = dynamic_tree(step, root, shape.topk, shape.depth, shape.nodes)
        step.close()
    tokens = torch.where(live[:, None], tree.tokens.long(), -1)
    parents = torch.where(live[:, None], tree.parents.long(), 0)
    return [tokens, parents]


def host_tree_window(h: dict, result):
    """(TreeWindow, Acceptance) on the CPU of a tree step's real requests (`StepInputs.host`)."""
    window = TreeWindow.from_parents(h["parents"], torch.tensor(h["slots"], dtype=torch.long),
                                     torch.tensor(h["commit_slots"], dtype=torch.long),
                                     torch.tensor([t for ts in h["node_tokens"] for t in ts], dtype=torch.long))
    mask = []
    for p, t, s, a in zip(h["parents"], h["node_tokens"], result.sampled, result.accepted):
        path = set(host_path(p, t, s, a))
        mask += [i + 1 in path for i in range(len(p))]
    draft_mask = torch.tensor(mask, dtype=torch.bool)
    acc = torch.tensor(result.accepted, dtype=torch.int32)
    return window, Acceptance(draft_mask, acc, window.commit_mask_for(draft_mask, acc))


def path_ranks(h: dict, result) -> list[list[int]]:
    """Per request of a tree step, the sibling rank (0: the parent's first child) of each accepted node."""
    out = []
    for p, t, s, a in zip(h["parents"], h["node_tokens"], result.sampled, result.accepted):
        ranks = []
        for node in host_path(p, t, s, a):
            parent = p[node - 1]
            ranks.append(sum(1 for i in range(node - 1) if p[i] == parent))
        out.append(ranks)
    return out


class TreeKind:
    """The tree's side of the window seam (see nwor_lab.engine.window_kind for the interface). A
    step whose buffers hold a tree window (`inp.tree`) verifies it; a prefill step verifies its rows
    (k = 0). Either drafts the next tree."""

    k = 0           # draft slots a request in the sampler's layout: a tree engine's prefills verify with none
    # a tree window's record is counted as it ends: an eager tree step's compaction counts its moves in
    # the policy (`_moved`), which the next step's body would overwrite before a deferred record read it
    records_later = False

    def __init__(self, engine):
        self.plan = engine.tree_plan
        self.static_tree = engine.tree.is_static
        self._engine = engine                              # read for its temperature (set after the kind)
        self.verify_rows = self.plan.nodes + 1            # rows a request slot of a tree bucket
        self.draft_rows = max(1, self.plan.draft_rows)    # the head's draft window a slot
        self.lookahead = self.plan.lookahead

    @property
    def sampled(self) -> bool:
        """Whether the engine samples (T > 0): a sampled tree verdict runs eagerly."""
        return getattr(self._engine, "temperature", 0) != 0

    @property
    def eager_reason(self) -> str | None:
        """Why every step of this engine runs eagerly because of its tree (None: nothing)."""
        if self.static_tree:
            return "a static tree (paths) drafts every step eagerly (StepRunner.capturable says why)"
        if self.sampled:
            return ("temperature > 0 with a draft tree: the tree's sampled verdict is not captured (unverified on a "
                    "GPU): every step runs eagerly (chains at T > 0 replay graphs)")
        return None

    def capturable(self, runner) -> bool:
        # `runner.tree_graphs` False keeps tree steps eager (comparison, fallback). Declared: a static
        # tree (a list of paths) drafts eagerly. `speculative.tree_draft.static_tree` indexes with host lists built per level (copies from the host, which a capture cannot
        # hold); EAGLE-2's dynamic tree is device code throughout (`model.tree_draft.HeadTreeStep`).
        # At T > 0 a tree's sampled verdict (`speculative.tree_accept`) has not been run from a bucket
        # (no test of it padded or captured): its steps stay eager rather than unverified.
        return not self.static_tree and not self.sampled and runner.tree_graphs

    def start_keys(self, runner) -> list:
        """None: tree buckets are captured at their first use (not enumerated before serving)."""
        return []

    def draft_width(self, k: int) -> int:
        """Readback columns of the next tree: N node tokens, then N parents (whatever `k`)."""
        return 2 * self.plan.nodes

    def draft_need(self, req, start: int, q: int, n: int) -> int:
        """Positions the step may write for `req`: its rows, then the head's draft window of the next tree."""
        return start + q + self.plan.lookahead

    def forced_tables(self, acceptance, device):
        """A tree profile's tables (an entry per depth, checked here), made once on the device."""
        from nwor_lab.speculative.tree_forced import forced_tables
        plan = self.plan
        return forced_tables(acceptance, plan.depth, max(plan.children, plan.nodes), device)

    def schedule(self, requests):
        """A tree window holds t_last + N nodes a request, a prefill its prompt: a step with both runs
        the prefills, and the decodes (their trees kept) go next step, first in line."""
        if any(r.is_prefill for r in requests) and not all(r.is_prefill for r in requests):
            return [r for r in requests if r.is_prefill]
        return requests

    def bucket_key(self, e, requests, static: bool, limits: list[int]) -> BucketKey:
        """A tree window (N + 1 rows a request slot, short trees padded) or a prefill (plain rows,
        k = 0, the next tree drafted after it); padded to a bucket when static."""
        n = len(requests)
        if any(r.is_prefill for r in requests):
            tokens = sum(len(r.scheduled()[0]) for r in requests)
            return BucketKey(bucket_size(n), token_bucket(tokens), 0, False, False, self.k) if static \
                else BucketKey(n, tokens, 0, False, False, self.k)
        size = bucket_size(n) if static else n
        return BucketKey(size, size * self.verify_rows, self.verify_rows, False, True, self.k)

    def fill(self, e, inp, requests, limits) -> None:
        if inp.tree is not None:
            inp.tree.fill(e, inp, requests)
        else:
            inp.fill(e, requests, limits=limits)

    def verify(self, e, inp):
        if inp.tree is None:
            return verify_rows(e, inp)
        w = inp.tree.window(e, inp)       # built on the device from the parents and tokens
        return w, inp.tree.metadata(e, inp, w)

    def accept(self, e, inp, w, hidden):
        if inp.tree is None:
            return accept_rows(e, inp, w, hidden)
        # every row's logits in the model's dtype: greedy and forced take argmaxes, T > 0 upcasts itself
        return accept_tree(e, inp, w, e.target.compute_logits(hidden))

    def head_ids(self, inp, w, sampled, accepted, kept):
        if inp.tree is None:
            return head_ids_rows(inp, w, sampled, accepted, kept)
        # a tree row at depth d reads the token after it on the accepted path: sampled[r, d] (the
        # path's next node, the bonus after its last); rows off the path read whatever, and are
        # rejected with the window (their head K/V never commits)
        return sampled[w.token_req.long(), w.token_depth.long()].clamp(min=0)

    def draft(self, e, inp, base, live, features):
        """-> ([tokens [B, N], parents [B, N]], None)."""
        return draft_tree(e, inp, base, live, features), None

    def unpack(self, inp, rows):
        """The next tree in the readback rows (after the sampled ids and the accepted length):
        node tokens [N] and parents [N] per request."""
        w, n = inp.sampled_width, self.plan.nodes
        return [row[w + 1:w + 1 + n] for row in rows], [row[w + 1 + n:w + 1 + 2 * n] for row in rows]

    def host_window(self, h: dict, result):
        return host_rows_window(h, result) if result.inputs.tree is None else host_tree_window(h, result)

    def emitted(self, r, result, i: int, a: int) -> list[int]:
        # a tree's path tokens are the sampled ids (its nodes are no prefix of r.drafts)
        if result.inputs.tree is None:
            return r.drafts[:a] + [result.next_tokens[i]]
        return result.sampled[i][:a + 1]

    def note(self, entry, h, result) -> None:
        """The sibling rank of each accepted node, in the window's trace."""
        if result.inputs.tree is not None:
            entry.path_ranks = path_ranks(h, result)

    def hand_out(self, e, requests, result, live: list[bool]) -> list:
        """Give every request still running the tree the body drafted for it (tokens, parents) ->
        the head's draft window [(request, slots)] (steps * frontier rows a request, write-all order
        from num_computed on, every row rejected)."""
        if result.parents is None:
            return []
        plan = self.plan

        def give(j: int, r) -> None:
            tokens = result.drafts[j]
            n = tokens.index(-1) if -1 in tokens else plan.nodes
            r.drafts, r.draft_parents, r.draft_probs = tokens[:n], result.parents[j][:n], None
            r.block_table.ensure(r.num_computed + 1, lookahead=plan.lookahead)

        return hand_out_each(requests, live, lambda j: plan.draft_rows, give)
