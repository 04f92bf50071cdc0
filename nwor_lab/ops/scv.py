"""SCV acceptance mask: which drafts survived the rejection sampler, computed on the device.

Draft `j` (1-based) of request `r` is accepted iff every draft `<= j` of `r` is in bounds
(`j - 1 < C`, the sampled ids' column count) and equals `sampled_token_ids[r, j - 1]`. The prefix
rule is a cumulative product along each request's row: a recovered token never equals the draft
it replaced, so the first mismatch ends the accepted prefix, and `-1` placeholders after it cannot
revive later drafts.

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


def scv_mask_reference(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                       sampled_token_ids: torch.Tensor, token_req: torch.Tensor | None = None,
                       token_draft_pos: torch.Tensor | None = None):
    """Vectorised torch acceptance mask. Returns `(draft_mask, accepted_len, commit_mask)`.

    draft_token_ids [Dtot], cu_num_draft_tokens [R] (inclusive), sampled_token_ids [R, C];
    token_req / token_draft_pos [T] optional.
    draft_mask [Dtot] bool (prefix-closed per request), accepted_len [R] int32,
    commit_mask [T] bool = token_draft_pos <= accepted_len[token_req], or None.
    """
    check_scv_args(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos)
    device = sampled_token_ids.device
    num_reqs, num_cols = sampled_token_ids.shape
    total = draft_token_ids.shape[0]

    # Request of each draft: how many inclusive ends are <= its flat index.
    flat = torch.arange(total, device=device, dtype=cu_num_draft_tokens.dtype)
    req = torch.searchsorted(cu_num_draft_tokens, flat, right=True)
    req = req.clamp_(max=max(num_reqs - 1, 0))           # only bad inputs land past the end
    start = cu_num_draft_tokens - torch.diff(cu_num_draft_tokens, prepend=cu_num_draft_tokens.new_zeros(1))
    pos = (flat - start[req]).long()                     # 0-based: draft d_{pos+1}, column pos

    in_bounds = pos < num_cols
    if num_cols > 0:                                     # a shape, not data: capture-safe
        col = pos.clamp(max=num_cols - 1)
        match = in_bounds & (sampled_token_ids[req, col] == draft_token_ids)
    else:
        match = torch.zeros(total, dtype=torch.bool, device=device)

    # Lay matches out per request in [R, C + 1]; column C is a dump for out-of-bounds drafts
    # (their match is False and they lie after every in-bounds draft, so nothing is lost).
    grid = torch.zeros(num_reqs, num_cols + 1, dtype=torch.int32, device=device)
    if total:
        grid[req, pos.clamp(max=num_cols)] = match.to(torch.int32)
    prefix = torch.cumprod(grid[:, :num_cols], dim=1)    # 1 while every draft so far matched
    accepted_len = prefix.sum(dim=1, dtype=torch.int32)
    if num_cols > 0:
        draft_mask = in_bounds & prefix[req, pos.clamp(max=num_cols - 1)].bool()
    else:
        draft_mask = match                               # all False

    commit_mask = None
    if token_req is not None:
        commit_mask = token_draft_pos <= accepted_len[token_req.long()]
    return draft_mask, accepted_len, commit_mask


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
