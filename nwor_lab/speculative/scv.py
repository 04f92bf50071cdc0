"""SCV: which drafts of a window were accepted, as masks the write policies can commit with.

Three modes (LabConfig.scv_mode):
  off       the seed's plain per-request host loop: reads ids back to the host (one sync), walks each
            request's drafts until the first mismatch. Obviously right; the reference for the rest.
  graph     the vectorised op (`nwor_lab.ops.scv.scv_mask`); on CUDA, `ScvRunner` replays it as a
            CUDA graph per shape (`nwor_lab.speculative.scv_graph.GraphedScv`).
  adaptive  like graph, but when capture is impossible it falls back to the eager vectorised op
            (logged once) instead of raising.

Words: the accepted length a_r is counted as vLLM's runner counts it: the sampler emitted
`(sampled_token_ids[r] != -1).sum()` tokens, the accepted drafts then one recovered or bonus
token, so a_r = emitted - 1, capped at the request's drafts and cut at its first padding draft
(id -1, always rejected). Drafts d_1..d_{a_r} are accepted (the prefix rule); the commit mask keeps
window token t iff `token_draft_pos[t] <= a_{token_req[t]}`. Comparing draft ids with sampled ids
gives the same count for consistent inputs only: a draft whose draft probability is 0 is rejected
and its recovered token may be the very same id (`nwor_lab.ops.scv.check_against_ids`).
"""
from __future__ import annotations

import logging
import torch

from nwor_lab.config import SCV_MODES
from nwor_lab.ops.scv import check_against_ids, check_scv_args, scv_mask
from nwor_lab._checks import capturing, check_sampled_rows
from nwor_lab.window import Acceptance

logger = logging.getLogger("nwor_lab.scv")


def _check_mode(mode: str) -> str:
    if mode not in SCV_MODES:
        raise ValueError(f"mode={mode!r}: choose one of {', '.join(SCV_MODES)} (LabConfig.scv_mode)")
    return mode


def acceptance_loop(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req=None,
                    token_draft_pos=None, on_clamp=None) -> Acceptance:
    """Mode `off`: the per-request host loop. `on_clamp(r, n_r, num_cols)` is called when a
    request has more drafts than the sampled ids have columns (those drafts are rejected)."""
    check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos)
    device = sampled_token_ids.device
    drafts = draft_token_ids.tolist()
    ends = cu_num_draft_tokens.tolist()
    sampled = sampled_token_ids.tolist()
    num_cols = sampled_token_ids.shape[1]
    # The host lists make the cumsum check free here (check_scv_args only checks it on CPU).
    if any(b < a for a, b in zip([0] + ends, ends)) or (ends[-1] if ends else 0) != len(drafts):
        raise ValueError(f"cu_num_draft_tokens={ends[:8]}: must be a non-decreasing inclusive cumsum "
                         f"of drafts per request ending at len(draft_token_ids) = {len(drafts)}")

    draft_mask = [False] * len(drafts)
    accepted_len = []
    start = 0
    for r, end in enumerate(ends):
        n = end - start
        if n + 1 > num_cols and on_clamp is not None:
            on_clamp(r, n, num_cols)
        a = min(max(sum(t != -1 for t in sampled[r]) - 1, 0), n)   # emitted - 1, as vLLM counts
        for j in range(a):
            if drafts[start + j] < 0:         # a padding draft ends the accepted prefix
                a = j
                break
        for j in range(a):
            draft_mask[start + j] = True
        accepted_len.append(a)
        start = end

    commit_mask = None
    if token_req is not None:
        commit_mask = torch.tensor([p <= accepted_len[r] for r, p in
                                    zip(token_req.tolist(), token_draft_pos.tolist())],
                                   dtype=torch.bool, device=device)
    return Acceptance(torch.tensor(draft_mask, dtype=torch.bool, device=device),
                      torch.tensor(accepted_len, dtype=torch.int32, device=device), commit_mask)


def compute_acceptance(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                       sampled_token_ids: torch.Tensor, *, token_req: torch.Tensor | None = None,
                       token_draft_pos: torch.Tensor | None = None, mode: str = "off") -> Acceptance:
    """Stateless acceptance: `off` runs the host loop, `graph`/`adaptive` the vectorised op (eager;
    use `ScvRunner` to get CUDA graphs).

    draft_token_ids [Dtot], cu_num_draft_tokens [R] inclusive, sampled_token_ids [R, C] with -1
    placeholders, token_req / token_draft_pos [T] (both or neither) from the Window.
    """
    if _check_mode(mode) == "off":
        return acceptance_loop(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                               token_req, token_draft_pos)
    return Acceptance(*scv_mask(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                                token_req, token_draft_pos))


def check_against_sampler(window, acceptance: Acceptance, sampled_token_ids: torch.Tensor,
                          mode: str = "?") -> None:
    """Debug: `acceptance` must say what the plain host loop says about the sampler's output
    (committed == accepted by the sampler, every window). One sync; raises AssertionError."""
    drafts, cu, sampled = (window.draft_token_ids.cpu(), window.cu_num_draft_tokens.cpu(),
                           sampled_token_ids.cpu())
    ref = acceptance_loop(drafts, cu, sampled)
    got = acceptance.accepted_len.cpu().to(torch.int32)
    if not torch.equal(got, ref.accepted_len.to(torch.int32)):
        raise AssertionError(f"NWOR debug: the acceptance (SCV {mode}) says {got.tolist()} accepted but "
                             f"the sampler's output says {ref.accepted_len.tolist()}")
    check_against_ids(drafts, cu, sampled, got)   # ids agree wherever the two counts are equivalent


class ScvRunner:
    """Computes Acceptance in one mode and keeps that mode's state across windows.

    State: the CUDA-graph runner (graph/adaptive on CUDA), whether adaptive fell back to eager,
    and whether the bounds-clamping warning was already logged. `how` says what ran last.
    """

    def __init__(self, mode: str = "off"):
        self.mode = _check_mode(mode)
        self.how = "not run yet"
        self._graphed = None
        self._fallback_reason: str | None = None
        self._warned_clamp = False

    def _warn_clamp(self, detail: str) -> None:
        if not self._warned_clamp:
            self._warned_clamp = True
            logger.warning("SCV: %s; drafts without a sampled column are rejected (bounds clamp). "
                           "The rejection sampler should return max_spec_len + 1 columns.", detail)

    def _check_bounds(self, cu_num_draft_tokens, sampled_token_ids, total, max_spec_len) -> None:
        """Warn (once) when some request has more drafts than sampled columns, without a sync:
        from shapes, the caller's max_spec_len, or the CPU values (free on the host)."""
        if self._warned_clamp:
            return
        num_reqs, num_cols = sampled_token_ids.shape
        if max_spec_len is None and cu_num_draft_tokens.device.type == "cpu" and num_reqs:
            n = torch.diff(cu_num_draft_tokens, prepend=cu_num_draft_tokens.new_zeros(1))
            max_spec_len = int(n.max())
        if max_spec_len is not None and max_spec_len + 1 > num_cols:
            self._warn_clamp(f"a request has {max_spec_len} drafts but sampled_token_ids has "
                             f"{num_cols} columns")
        elif total + num_reqs > num_reqs * num_cols:
            self._warn_clamp(f"{total} drafts cannot fit {num_reqs} x {num_cols} sampled ids")

    def accept(self, window, sampled_token_ids: torch.Tensor, *, max_spec_len: int | None = None) -> Acceptance:
        """The `Acceptance` of `window` (a `nwor_lab.window.Window` with draft ids) from the
        rejection sampler's output `[R, max_spec_len + 1]`, commit mask included."""
        check_sampled_rows(sampled_token_ids, window.num_reqs)
        if window.draft_token_ids is None:
            raise ValueError("window: it has no draft_token_ids to compare with sampled_token_ids; build it "
                             "with Window.from_metadata or pass draft_token_ids to Window.from_counts")
        return self(window.draft_token_ids, window.cu_num_draft_tokens, sampled_token_ids,
                    token_req=window.token_req, token_draft_pos=window.token_draft_pos,
                    max_spec_len=max_spec_len)

    def __call__(self, draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                 sampled_token_ids: torch.Tensor, *, token_req: torch.Tensor | None = None,
                 token_draft_pos: torch.Tensor | None = None, max_spec_len: int | None = None) -> Acceptance:
        """Acceptance of one window (arguments as `compute_acceptance`; `max_spec_len` from the
        metadata lets the bounds warning work on CUDA without a sync)."""
        if self.mode == "off":
            self.how = "per-request host loop"
            return acceptance_loop(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req,
                                   token_draft_pos,
                                   on_clamp=lambda r, n, c: self._warn_clamp(
                                       f"request {r} has {n} drafts but sampled_token_ids has {c} columns"))
        check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos)
        self._check_bounds(cu_num_draft_tokens, sampled_token_ids, draft_token_ids.shape[0], max_spec_len)
        args = (draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos)
        if not sampled_token_ids.is_cuda:
            self.how = "vectorised (CPU: no CUDA graphs)"
            return Acceptance(*scv_mask(*args))
        if capturing():       # inside the engine step's own CUDA graph: the op is captured with it
            self.how = "vectorised, inside the step's CUDA graph"
            return Acceptance(*scv_mask(*args))
        if self._fallback_reason is None:
            try:
                if self._graphed is None:
                    # Lazy: only CUDA runs need the graph machinery.
                    from nwor_lab.speculative.scv_graph import GraphedScv
                    self._graphed = GraphedScv()
                out = self._graphed(*args)
                self.how = "CUDA graph (GraphedScv)"
                return out
            except Exception as err:  # noqa: BLE001 - adaptive means "any capture failure -> eager"
                if self.mode != "adaptive":
                    raise
                self._fallback_reason = f"{type(err).__name__}: {err}"
                logger.warning("SCV adaptive: CUDA graph unavailable (%s); using the eager vectorised "
                               "op from now on", self._fallback_reason)
        self.how = f"vectorised eager (adaptive fallback: {self._fallback_reason})"
        return Acceptance(*scv_mask(*args))
