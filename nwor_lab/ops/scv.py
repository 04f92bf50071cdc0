"""SCV acceptance mask: which drafts survived the rejection sampler, computed on the device.

The accepted length is counted the way vLLM's runner counts it: the sampler emits the accepted
drafts, then exactly one token of its own, then `-1` placeholders, so

    a_r = (number of non-(-1) ids in sampled_token_ids[r]) - 1,  clamped to [0, n_r],

and lowered to the position of the first padding draft (draft id -1: always rejected). Draft `j`
(1-based) of request `r` is accepted iff `j <= a_r`; `commit_mask[t] = token_draft_pos[t] <=
a_{token_req[t]}`. Drafts without a column in the sampled ids are never accepted (a_r <= C - 1).

Why not compare ids? "Draft j accepted iff it equals sampled[r, j-1], for every draft up to j" is
the same rule only while a recovered token never equals the draft it replaced. That holds for
greedy requests and for stochastic ones whose draft probability q(x) is positive, but vLLM rejects
a draft with q(x) = 0 and its recovered token, sampled from max(p - q, 0), can then be that very
id: comparing ids would accept a draft vLLM rejected. `accepted_len_by_ids` keeps the id rule for
the cases where it is equivalent, and `check_against_ids` (debug) asserts both agree there.

`scv_mask_reference` is plain vectorised torch: no host sync, no data-dependent Python control
flow (only shapes decide branches), so it runs inside a CUDA graph capture. `scv_mask` dispatches
to the CUDA extension (`torch.ops.nwor_lab.scv_mask`) when the backend says so.
"""
from __future__ import annotations

import torch

from nwor_lab._checks import INDEX_DTYPES, capturing, check_tensor

# The CUDA kernel runs in one block and keeps per-request state in shared memory
# (kScvMaxRequests in csrc/nwor_kernels.h); bigger batches take the torch path.
CUDA_MAX_REQUESTS = 4096


def check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                   token_req=None, token_draft_pos=None) -> None:
    """Raise naming the argument unless the SCV inputs have the contract's ranks, dtypes, device.

    Shapes only (no sync), except on CPU where `cu_num_draft_tokens` is also checked to be a
    non-decreasing cumsum ending at Dtot (free there, and it catches swapped arguments early).
    """
    check_tensor("sampled_token_ids", sampled_token_ids, ndim=2, dtypes=INDEX_DTYPES,
                 what="[num_reqs, max_spec_len + 1] sampled ids from the rejection sampler "
                      "(-1 placeholders); a 1-D tensor is not accepted, reshape per request")
    device = sampled_token_ids.device
    num_reqs = sampled_token_ids.shape[0]
    check_tensor("draft_token_ids", draft_token_ids, ndim=1, dtypes=INDEX_DTYPES, device=device,
                 what="[total_draft_tokens] draft ids, request-major")
    check_tensor("cu_num_draft_tokens", cu_num_draft_tokens, shape=(num_reqs,), dtypes=INDEX_DTYPES,
                 device=device, what="[num_reqs] inclusive cumsum of drafts per request "
                                     "(one entry per row of sampled_token_ids)")
    if (token_req is None) != (token_draft_pos is None):
        given = "token_req" if token_draft_pos is None else "token_draft_pos"
        raise ValueError(f"{given} was given without its partner: pass both token_req and "
                         f"token_draft_pos (from the Window) for a commit mask, or neither")
    if token_req is not None:
        check_tensor("token_req", token_req, ndim=1, dtypes=INDEX_DTYPES, device=device,
                     what="[num_tokens] request of each window token")
        check_tensor("token_draft_pos", token_draft_pos, shape=(token_req.shape[0],), dtypes=INDEX_DTYPES,
                     device=device, what="[num_tokens] (same length as token_req): 0 for tokens that "
                                         "always commit, j for draft d_j")
    if device.type == "cpu" and num_reqs and not capturing():
        cu = cu_num_draft_tokens
        total = draft_token_ids.shape[0]
        if int(cu[0]) < 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) != total:
            raise ValueError(f"cu_num_draft_tokens={cu.tolist()[:8]}: must be a non-decreasing inclusive "
                             f"cumsum of drafts per request ending at len(draft_token_ids) = {total}")
    elif device.type == "cpu" and num_reqs == 0 and draft_token_ids.shape[0] != 0:
        raise ValueError(f"draft_token_ids: has {draft_token_ids.shape[0]} drafts but there are no "
                         f"requests (sampled_token_ids has 0 rows)")


def _draft_positions(cu_num_draft_tokens: torch.Tensor, total: int, num_reqs: int):
    """(request, 0-based position) of every draft, from the inclusive cumsum (no host sync)."""
    device = cu_num_draft_tokens.device
    flat = torch.arange(total, device=device, dtype=cu_num_draft_tokens.dtype)
    req = torch.searchsorted(cu_num_draft_tokens, flat, right=True)
    req = req.clamp_(max=max(num_reqs - 1, 0))           # only bad inputs land past the end
    start = cu_num_draft_tokens - torch.diff(cu_num_draft_tokens, prepend=cu_num_draft_tokens.new_zeros(1))
    return req, (flat - start[req]).long()


def scv_mask_reference(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                       sampled_token_ids: torch.Tensor, token_req: torch.Tensor | None = None,
                       token_draft_pos: torch.Tensor | None = None):
    """Vectorised torch acceptance mask. Returns `(draft_mask, accepted_len, commit_mask)`.

    draft_token_ids [Dtot] (-1 = padding), cu_num_draft_tokens [R] (inclusive), sampled_token_ids
    [R, C] (the sampler's output: accepted drafts, one token, -1 placeholders);
    token_req / token_draft_pos [T] optional.
    draft_mask [Dtot] bool (prefix-closed per request), accepted_len [R] int32,
    commit_mask [T] bool = token_draft_pos <= accepted_len[token_req], or None.
    """
    check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos)
    device = sampled_token_ids.device
    num_reqs = sampled_token_ids.shape[0]
    total = draft_token_ids.shape[0]
    req, pos = _draft_positions(cu_num_draft_tokens, total, num_reqs)
    n = torch.diff(cu_num_draft_tokens, prepend=cu_num_draft_tokens.new_zeros(1)).long()

    # vLLM's runner: accepted = emitted - 1 (every sampler row emits one token after its drafts).
    emitted = (sampled_token_ids != -1).sum(dim=1)
    accepted_len = torch.minimum((emitted - 1).clamp_(min=0), n.clamp(min=0))
    # A padding draft (-1) ends the accepted prefix, whatever the sampled ids say.
    first_pad = n.clamp(min=0).clone()
    if total:
        pad_pos = torch.where(draft_token_ids < 0, pos, torch.full_like(pos, torch.iinfo(torch.long).max))
        first_pad.scatter_reduce_(0, req.long(), pad_pos, reduce="amin")
    accepted_len = torch.minimum(accepted_len, first_pad).to(torch.int32)

    draft_mask = pos < accepted_len[req]
    commit_mask = None
    if token_req is not None:
        commit_mask = token_draft_pos <= accepted_len[token_req.long()]
    return draft_mask, accepted_len, commit_mask


def accepted_len_by_ids(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                        sampled_token_ids: torch.Tensor) -> torch.Tensor:
    """[R] int32: the longest prefix of real drafts equal to the sampled ids, column by column.

    Equals `scv_mask`'s accepted length for every row in which the token emitted at the first
    rejection differs from the rejected draft: always for greedy requests and for drafts with
    q(x) > 0. A zero-probability draft can be "recovered" as itself; then this count is higher.
    """
    check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids)
    num_reqs, num_cols = sampled_token_ids.shape
    total = draft_token_ids.shape[0]
    device = sampled_token_ids.device
    req, pos = _draft_positions(cu_num_draft_tokens, total, num_reqs)
    if num_cols == 0:
        return torch.zeros(num_reqs, dtype=torch.int32, device=device)
    col = pos.clamp(max=num_cols - 1)
    match = (pos < num_cols) & (draft_token_ids >= 0) & (sampled_token_ids[req, col] == draft_token_ids)
    # Lay matches out per request in [R, C + 1]; column C is a dump for out-of-bounds drafts.
    grid = torch.zeros(num_reqs, num_cols + 1, dtype=torch.int32, device=device)
    if total:
        grid[req, pos.clamp(max=num_cols)] = match.to(torch.int32)
    return torch.cumprod(grid[:, :num_cols], dim=1).sum(dim=1, dtype=torch.int32)


def check_against_ids(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                      sampled_token_ids: torch.Tensor, accepted_len: torch.Tensor) -> None:
    """Debug (one host sync): raise AssertionError unless `accepted_len` [R] agrees with the id
    comparison (`accepted_len_by_ids`) wherever the two are equivalent, and reads the sampler's
    output: accepted drafts echoed (none of them padding), one emitted token, then only -1.

    The one allowed disagreement: the id comparison counts more because the token emitted at the
    first rejection equals the rejected draft (a zero-probability draft, rejected by vLLM and
    recovered as itself)."""
    drafts = draft_token_ids.tolist()
    ends = cu_num_draft_tokens.tolist()
    rows = sampled_token_ids.tolist()
    acc = [int(a) for a in accepted_len.tolist()]
    by_ids = accepted_len_by_ids(draft_token_ids.cpu(), cu_num_draft_tokens.cpu(), sampled_token_ids.cpu()).tolist()
    start = 0
    for r, end in enumerate(ends):
        a, row, mine = acc[r], rows[r], drafts[start:end]
        if not (0 <= a <= len(mine) and a < len(row)):
            raise AssertionError(f"SCV: request {r} has accepted length {a} but {len(mine)} drafts and "
                                 f"{len(row)} sampled columns")
        recovered_itself = a < len(mine) and row[a] == mine[a] and by_ids[r] > a
        if by_ids[r] != a and not recovered_itself:
            raise AssertionError(f"SCV: request {r}: the emitted count says {a} accepted but comparing ids says "
                                 f"{by_ids[r]} (drafts {mine}, sampled {row})")
        if row[:a] != mine[:a] or -1 in mine[:a] or row[a] == -1 or any(t != -1 for t in row[a + 1:]):
            raise AssertionError(f"SCV: request {r}: sampled ids {row} do not read as {a} accepted drafts of "
                                 f"{mine}, one emitted token, then -1 placeholders")
        start = end


def scv_mask(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
             sampled_token_ids: torch.Tensor, token_req: torch.Tensor | None = None,
             token_draft_pos: torch.Tensor | None = None):
    """`scv_mask_reference`'s contract, on the CUDA extension when the backend picks it.

    Outputs are preallocated here so the op only writes (capturable, `Tensor(a!)` outputs).
    """
    # Lazy: nwor_lab.ops.backend may import the ops modules, and CPU callers never need it.
    from nwor_lab.ops.backend import use_cuda

    if sampled_token_ids.shape[0] > CUDA_MAX_REQUESTS or not use_cuda(sampled_token_ids):
        return scv_mask_reference(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                                  token_req, token_draft_pos)
    check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos)
    device = sampled_token_ids.device
    has_tokens = token_req is not None
    if not has_tokens:
        token_req = torch.empty(0, dtype=torch.int32, device=device)
        token_draft_pos = torch.empty(0, dtype=torch.int32, device=device)
    draft_mask = torch.empty(draft_token_ids.shape[0], dtype=torch.bool, device=device)
    accepted_len = torch.empty(sampled_token_ids.shape[0], dtype=torch.int32, device=device)
    commit_mask = torch.empty(token_req.shape[0], dtype=torch.bool, device=device)
    torch.ops.nwor_lab.scv_mask(draft_token_ids, cu_num_draft_tokens, sampled_token_ids,
                                token_req, token_draft_pos, draft_mask, accepted_len, commit_mask)
    return draft_mask, accepted_len, (commit_mask if has_tokens else None)
