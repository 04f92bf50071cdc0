"""Rejection sampler for one verify window, with vLLM v1's output format.

Output `sampled_token_ids [R, max_spec_len + 1] int32`: per request the accepted drafts, then one
token the target chose itself (the *recovered* token at the first rejection, or the *bonus* token
when every draft was accepted), then `PLACEHOLDER_TOKEN_ID` (-1) to the end of the row.

Greedy (temperature 0): draft j is accepted while it equals the target's argmax at row j.
Stochastic (standard speculative sampling, Leviathan et al. / Chen et al.): with target
probabilities p and draft probabilities q, accept draft x with probability min(1, p(x) / q(x));
on rejection sample from normalize(max(p - q, 0)); after all accepted sample the bonus from p.
This makes every emitted token distributed exactly as the target alone would sample it. EAGLE
proposes greedily, so `draft_probs=None` means q is a point mass on the draft (one-hot).

Everything is vectorised over requests and drafts with no host sync (request boundaries come
from the metadata's host list), so it runs unchanged on CPU and CUDA tensors.
"""
from __future__ import annotations

import torch

from nwor_lab._checks import FLOAT_DTYPES, check_tensor
from nwor_lab.speculative.metadata import SpecDecodeMetadata

PLACEHOLDER_TOKEN_ID = -1


def _sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs [N, V]` (rows need not be normalised; all-zero rows give 0).

    Exponential-race trick: argmax(p / E) with E ~ Exp(1) picks i with probability p_i / sum(p);
    unlike torch.multinomial it needs no sync and tolerates zero rows.
    """
    race = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return torch.argmax(probs.float() / race, dim=-1)


def _per_request_temperature(temperature, num_reqs: int, device) -> torch.Tensor | None:
    """[R] float32 temperatures, or None when every request is greedy (known on the host)."""
    if isinstance(temperature, torch.Tensor):
        check_tensor("temperature", temperature, shape=(num_reqs,), what="[num_reqs] per-request "
                     "temperature (0 = greedy)")
        if not temperature.is_floating_point():
            raise TypeError("temperature: expected a float tensor, e.g. temperature.float()")
        return temperature.to(device=device, dtype=torch.float32)
    temperature = float(temperature)
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: must be >= 0 (0 = greedy)")
    if temperature == 0:
        return None
    return torch.full((num_reqs,), temperature, dtype=torch.float32, device=device)


def rejection_sample(metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None,
                     target_logits: torch.Tensor, *, temperature=0.0,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Verify the window's drafts against the target. Returns sampled ids [R, max_spec_len+1] int32.

    metadata:      the window's SpecDecodeMetadata (tensors on target_logits' device).
    draft_probs:   [Dtot, V] draft probabilities, or None for a greedy (point-mass) drafter.
    target_logits: [Dtot + R, V] rows in `metadata.logits_indices` order: per request its n_r
                   target rows, then its bonus row.
    temperature:   float for all requests or [R] float tensor; 0 means greedy for that request
                   (values must be >= 0; a tensor is not checked, that would cost a sync).
    generator:     torch.Generator on target_logits' device, for reproducible stochastic sampling.
    """
    num_reqs, total, k = metadata.num_reqs, metadata.total_draft_tokens, metadata.max_spec_len
    check_tensor("target_logits", target_logits, shape=(total + num_reqs, None), dtypes=FLOAT_DTYPES,
                 what=f"[total_draft_tokens + num_reqs, vocab] = [{total + num_reqs}, V] logits rows "
                      f"in metadata.logits_indices order")
    device, vocab = target_logits.device, target_logits.shape[1]
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, shape=(total, vocab), dtypes=FLOAT_DTYPES, device=device,
                     what="[total_draft_tokens, vocab] draft probabilities (None for a greedy drafter)")
    drafts = check_tensor("metadata.draft_token_ids", metadata.draft_token_ids, shape=(total,),
                          device=device).long()
    temp = _per_request_temperature(temperature, num_reqs, device)

    # Where each draft lives: request and 0-based position, from the host draft counts (no sync).
    n = torch.tensor(metadata.num_draft_tokens, dtype=torch.long, device=device)
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), n, output_size=total)
    pos = torch.arange(total, device=device) - (torch.cumsum(n, 0) - n)[req]

    target_rows = target_logits[metadata.target_logits_indices.long()]   # [Dtot, V]
    bonus_rows = target_logits[metadata.bonus_logits_indices.long()]     # [R, V]

    # Greedy decision for every request; stochastic requests overwrite it below.
    accept = drafts == target_rows.argmax(dim=-1)
    recovered = target_rows.argmax(dim=-1)
    bonus = bonus_rows.argmax(dim=-1)

    if temp is not None:
        greedy_req = temp == 0
        safe_t = torch.where(greedy_req, torch.ones_like(temp), temp)   # no 0-division for greedy rows
        p = torch.softmax(target_rows.float() / safe_t[req, None], dim=-1)
        if draft_probs is None:
            q = torch.zeros_like(p)
            q.scatter_(1, drafts[:, None], 1.0)          # point mass on the greedy draft
        else:
            q = draft_probs.float()
        p_x = p.gather(1, drafts[:, None]).squeeze(1)
        q_x = q.gather(1, drafts[:, None]).squeeze(1)
        u = torch.rand(total, device=device, generator=generator)
        # u < p/q without dividing: also right for q_x = 0 (accept iff p_x > 0, i.e. min(1, inf)).
        s_accept = u * q_x < p_x
        residual = (p - q).clamp_min(0)
        # p == q makes the residual empty but then rejection has probability 0; fall back to p
        # so float noise never yields a token outside the target's support.
        empty = residual.sum(dim=-1, keepdim=True) <= 0
        s_recovered = _sample_from(torch.where(empty, p, residual), generator)
        p_bonus = torch.softmax(bonus_rows.float() / safe_t[:, None], dim=-1)
        s_bonus = _sample_from(p_bonus, generator)

        greedy_draft = greedy_req[req]
        accept = torch.where(greedy_draft, accept, s_accept)
        recovered = torch.where(greedy_draft, recovered, s_recovered)
        bonus = torch.where(greedy_req, bonus, s_bonus)

    # Per-request grids [R, k+1]: drafts, and the token emitted right after an accepted prefix of
    # length a (recovered[a] if a < n_r, bonus if a == n_r).
    width = k + 1
    flat = req * width + pos
    draft_grid = torch.full((num_reqs * width,), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    draft_grid[flat] = drafts
    accept_grid = torch.zeros(num_reqs * width, dtype=torch.int32, device=device)
    accept_grid[flat] = accept.to(torch.int32)
    next_grid = torch.full((num_reqs, width), 0, dtype=torch.long, device=device)
    next_grid.scatter_(1, n[:, None], bonus[:, None])   # column n_r holds the bonus
    next_grid = next_grid.view(-1)
    next_grid[flat] = recovered
    draft_grid, accept_grid, next_grid = (g.view(num_reqs, width) for g in (draft_grid, accept_grid, next_grid))

    # Accepted length: prefix of matches (padding columns are 0, so a <= n_r).
    accepted_len = torch.cumprod(accept_grid, dim=1).sum(dim=1)
    cols = torch.arange(width, device=device)[None, :]
    a = accepted_len[:, None]
    emitted = next_grid.gather(1, a)
    out = torch.where(cols < a, draft_grid, torch.where(cols == a, emitted, PLACEHOLDER_TOKEN_ID))
    return out.to(torch.int32)
