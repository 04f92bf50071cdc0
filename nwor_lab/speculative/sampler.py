"""Rejection sampler for one verify window, with vLLM v1's output format and randomness.

Output `sampled_token_ids [R, max_spec_len + 1] int32`: per request the accepted drafts, then one
token the target chose itself (the *recovered* token at the first rejection, or the *bonus* token
when every draft was accepted), then `PLACEHOLDER_TOKEN_ID` (-1) to the end of the row. The
accepted length of request r is therefore `(row != -1).sum() - 1`, which is how vLLM's runner
counts it (`nwor_lab.ops.scv` does the same).

Greedy (temperature 0): draft j is accepted while it equals the target's argmax at row j.
Stochastic (standard speculative sampling, Leviathan et al. / Chen et al.): with target
probabilities p and draft probabilities q, accept draft x iff q(x) > 0 and p(x) / q(x) >= u,
u ~ U[0, 1); on rejection sample from normalize(max(p - q, 0)); after all accepted sample the
bonus from p. This makes every emitted token distributed exactly as the target alone would sample
it. EAGLE proposes greedily, so `draft_probs=None` means q is a point mass on the draft (one-hot).

Two inputs the textbook rule does not cover, handled as vLLM 0.33 handles them:
  * a draft id of -1 (vLLM pads draft slots with it) is always rejected, never used as an index;
    ids outside [0, V) are treated the same way. The token emitted there is the target's
    (argmax for greedy, a sample from max(p - q, 0) otherwise).
  * a draft with q(x) = 0 is rejected: min(1, p/0) would accept it, but a drafter that gives its
    own draft probability 0 did not sample it, and vLLM's kernel tests `draft_prob > 0`. The
    recovered token then comes from max(p - q, 0), which keeps p(x): it can be the draft's own
    id. So "the recovered token differs from the draft" does NOT hold in general, and acceptance
    must be counted from the output's length, not by comparing ids (see `nwor_lab.ops.scv`).

Randomness is drawn in vLLM's order and layout, so the same seeds give the same tokens as vLLM's
`RejectionSampler` (tests/test_vllm_contract.py checks it against vLLM's own code):
  1. bonus: exponential noise `[R, V]` float32 (vLLM's `Sampler` / `random_sample`);
  2. acceptance: uniforms `[Dtot]` float64 (`generate_uniform_probs`);
  3. recovered: exponential noise `[R, V]` float32, ONE row per request shared by its drafts
     (`sample_recovered_tokens`; a request emits at most one recovered token, so sharing is exact).
Batch noise comes from `generator` (None = torch's default), then requests listed in
`generators` redraw their own rows from their own generator (vLLM's per-request seeds; steps 2
and 3 only for requests with drafts). The one deliberate difference: when max(p - q, 0) is all
zero and the draft is still rejected (only possible for inconsistent q), vLLM emits token 0 and
the lab samples from p, so the token stays in the target's support.

Forced acceptance (`synthetic_rates` with `uniform_probs`, `nwor_lab.speculative.synthetic`): vLLM's
synthetic mode. Draft j of a request is accepted iff it is not padding and u_j < c_j (conditional
rate of its position), while the drafts before it were; what is emitted at the first rejection and
after the last draft is what the target emits anyway (argmax / recovered sample, bonus).

Under CUDA-graph capture (the engine's buckets at T > 0) every draw comes from `generator`, which
the capture registers with the graph (`nwor_lab.ops.graphs.capture_graph(generators=)`): each
replay draws what the same step run eagerly on the same buffers would draw. Per-request
`generators` are refused under capture (`refuse_captured_generators`).

Everything is vectorised over requests and drafts with no host sync (request boundaries come
from the metadata's host list), so it runs unchanged on CPU and CUDA tensors.
"""
from __future__ import annotations

import math

import torch

from nwor_lab._checks import FLOAT_DTYPES, check_tensor
from nwor_lab.ops.softmax import temperature_softmax
from nwor_lab.speculative.metadata import SpecDecodeMetadata

PLACEHOLDER_TOKEN_ID = -1


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None, *,
                      generators: dict[int, torch.Generator] | None = None) -> torch.Tensor:
    """One token id per row of `probs [n, V]` -> `[n]` int64 (rows need not be normalised).

    Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with probability p_i / sum(p),
    like torch.multinomial but with no host sync; an all-zero row gives 0.
    generator:  where the noise comes from (None: torch's default generator).
    generators: `{row: generator}`: rows with their own generator (per-request seeds). The batch
                noise is drawn first (skipped when every row has its own), then each listed row
                is redrawn from its generator: vLLM's `random_sample`, same seeds, same ids.
    """
    race = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    generators = generators or {}
    refuse_captured_generators(generators, probs.device)
    if len(generators) != probs.shape[0]:
        race.exponential_(generator=generator)
    for row, g in generators.items():
        race[row].exponential_(generator=g)
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
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature={temperature}: must be a finite number >= 0 (0 = greedy)")
    if temperature == 0:
        return None
    return torch.full((num_reqs,), temperature, dtype=torch.float32, device=device)


def refuse_captured_generators(generators, device) -> None:
    """Per-request generators cannot be captured in a CUDA graph: which rows redraw is decided on
    the host each step (a graph would replay one step's choice forever), and a generator a graph
    draws from must be registered with it. A captured step draws from one registered generator
    (the batch's); a step with seeded requests runs eagerly."""
    if generators and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("generators: per-request generators cannot be captured in a CUDA graph; run a step "
                           "with seeded requests eagerly (or pass generator= only, registered with the graph)")


def _check_generators(generators, num_reqs: int) -> dict[int, torch.Generator]:
    if generators is None:
        return {}
    if not isinstance(generators, dict):
        raise TypeError(f"generators: expected a dict {{request index: torch.Generator}}, "
                        f"got {type(generators).__name__}")
    bad = [r for r in generators if not (isinstance(r, int) and 0 <= r < num_reqs)]
    if bad:
        raise ValueError(f"generators: keys {bad[:4]} are not request indices in [0, {num_reqs}); "
                         f"key each generator by its request's row in the batch")
    return generators


def _recovered_at_first_rejection(recovered, accepted_len, cu, n, safe, real, p, q, race, greedy_req):
    """`recovered [Dtot]` (the greedy argmax per draft) with, for each stochastic request that has
    drafts, the row of its first rejected draft (its last draft when all were accepted: unused)
    replaced by a sample of normalize(max(p - q, 0)) with the request's noise row. Only that row's
    recovered token can be emitted, so the residual is formed for R rows, not for every draft's
    [Dtot, V]: the same values, row for row, as forming it everywhere. If the residual is empty the
    draft could only be rejected through inconsistent q (or float noise): p is sampled instead, so
    the token stays in the target's support."""
    total = recovered.shape[0]
    if total == 0:
        return recovered
    start = cu - n                                                          # [R] first draft row
    row = start + torch.minimum(accepted_len, (n - 1).clamp(min=0))
    at = row.clamp(max=total - 1)       # (a request without drafts reads any row: its sample is dropped)
    p_r = p[at]                                                             # [R, V]
    if q is None:     # the point mass of a greedy drafter (padding drafts: zero)
        q_r = torch.zeros_like(p_r).scatter_(1, safe[at][:, None], real[at][:, None].float())
    else:
        q_r = q[at]
    residual = (p_r - q_r).clamp_min(0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    # residual * (1 / E) rather than residual / E: the same race, rounded as vLLM rounds it.
    sample = torch.argmax(torch.where(empty, p_r, residual) * race.reciprocal(), dim=-1)
    # a request without drafts (or a greedy one) writes to a trash slot past the drafts' rows
    keep = (n > 0) & ~greedy_req
    out = torch.cat([recovered, recovered.new_zeros(1)])
    out.scatter_(0, torch.where(keep, row, total), sample)
    return out[:total]


def rejection_sample(metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None,
                     target_logits: torch.Tensor, *, temperature=0.0,
                     generator: torch.Generator | None = None,
                     generators: dict[int, torch.Generator] | None = None,
                     synthetic_rates: torch.Tensor | None = None,
                     uniform_probs: torch.Tensor | None = None) -> torch.Tensor:
    """Verify the window's drafts against the target. Returns sampled ids [R, max_spec_len+1] int32.

    metadata:      the window's SpecDecodeMetadata (tensors on target_logits' device); draft ids
                   of -1 are padding and always rejected.
    draft_probs:   [Dtot, V] draft probabilities, or None for a greedy (point-mass) drafter.
    target_logits: [Dtot + R, V] rows in `metadata.logits_indices` order: per request its n_r
                   target rows, then its bonus row.
    temperature:   float for all requests or [R] float tensor; 0 means greedy for that request
                   (values must be >= 0; a tensor is not checked, that would cost a sync). A float
                   0 draws no random numbers; a tensor always draws them, as a mixed batch must.
    generator:     torch.Generator on target_logits' device for the batch's noise (None: torch's
                   default generator, as vLLM uses for requests without a seed).
    generators:    {request index: torch.Generator}: requests with their own seed (vLLM's
                   `SamplingMetadata.generators`); see the module doc for the order of draws.
    synthetic_rates: forced acceptance (vLLM's synthetic mode): [>= max_spec_len] float64 conditional
                   acceptance rate per draft position; needs `uniform_probs` [Dtot] float64, one
                   u in [0, 1) per draft (the caller's, so that eager and graphed steps agree).
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
    generators = _check_generators(generators, num_reqs)
    refuse_captured_generators(generators, device)

    # Where each draft lives: request and 0-based position. The counts come from the metadata's
    # device cumsum (no host-to-device copy: the sampler can be captured in a CUDA graph).
    cu = metadata.cu_num_draft_tokens.to(device=device, dtype=torch.long)
    n = torch.diff(cu, prepend=cu.new_zeros(1))
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), n, output_size=total)
    pos = torch.arange(total, device=device) - (torch.cumsum(n, 0) - n)[req]
    # Padding drafts (-1) and ids outside the vocabulary are rejected; `safe` only indexes.
    real = (drafts >= 0) & (drafts < vocab)
    safe = torch.where(real, drafts, torch.zeros_like(drafts))

    # Greedy decision for every request; stochastic requests overwrite it below. One argmax over
    # the rows as they come (bf16 at the 8B shape: argmax of a bf16 row equals argmax of its float
    # copy, ties included), then an index: no float copy and no gathered [Dtot + R, V] copy.
    row_argmax = target_logits.argmax(dim=-1)                                  # [Dtot + R]
    target_argmax = row_argmax[metadata.target_logits_indices.long()]
    accept = drafts == target_argmax                     # -1 never equals an argmax
    recovered = target_argmax
    bonus = row_argmax[metadata.bonus_logits_indices.long()]

    stochastic = None
    if temp is not None:
        target_rows = target_logits[metadata.target_logits_indices.long()]   # [Dtot, V]
        bonus_rows = target_logits[metadata.bonus_logits_indices.long()]     # [R, V]
        greedy_req = temp == 0
        safe_t = torch.where(greedy_req, torch.ones_like(temp), temp)   # no 0-division for greedy rows
        # 1. Bonus, first as in vLLM (its Sampler runs before the rejection kernels). softmax(x.float() / t)
        # (`ops.softmax`: on CUDA chunked kernels that read the logits in their own dtype)
        p_bonus = temperature_softmax(bonus_rows, safe_t)
        bonus = torch.where(greedy_req, bonus, sample_from_probs(p_bonus, generator, generators=generators))

        p = temperature_softmax(target_rows, safe_t[req])
        # q: a point mass on each real draft when the drafter is greedy (a padding draft's row is
        # zero: its residual is p), never laid out as [Dtot, V]: its value at the draft is `real`
        q = None if draft_probs is None else draft_probs.float()
        p_x = p.gather(1, safe[:, None]).squeeze(1)
        q_x = real.float() if q is None else q.gather(1, safe[:, None]).squeeze(1)

        # 2. Acceptance: u ~ U[0, 1) float64, draft accepted iff q(x) > 0 and p(x)/q(x) >= u (the
        # ratio in float32, compared in float64, as vLLM's kernel does).
        u = torch.rand(total, dtype=torch.float64, device=device, generator=generator)
        for r, g in generators.items():
            if metadata.num_draft_tokens[r]:
                lo = sum(metadata.num_draft_tokens[:r])
                u[lo:lo + metadata.num_draft_tokens[r]].uniform_(generator=g)
        s_accept = real & (q_x > 0) & ((p_x / q_x).double() >= u)

        # 3. The recovered token's noise, one row per request (drawn here, in vLLM's order; the
        # sample itself waits for the accepted lengths: `_recovered_at_first_rejection`)
        race = torch.empty((num_reqs, vocab), dtype=torch.float32, device=device).exponential_(generator=generator)
        for r, g in generators.items():
            if metadata.num_draft_tokens[r]:
                race[r].exponential_(generator=g)
        greedy_draft = greedy_req[req]
        accept = torch.where(greedy_draft, accept, s_accept)
        stochastic = (p, q, race, greedy_req)

    if synthetic_rates is not None:
        # forced acceptance: the verdict comes from the profile, never from the target's opinion
        if uniform_probs is None:
            raise ValueError("synthetic_rates: forced acceptance needs uniform_probs [total_draft_tokens] "
                             "float64 as well (one u per draft)")
        check_tensor("synthetic_rates", synthetic_rates, ndim=1, device=device,
                     what="[>= max_spec_len] conditional acceptance rates per draft position")
        if synthetic_rates.shape[0] < k:
            raise ValueError(f"synthetic_rates: {synthetic_rates.shape[0]} positions, the window has requests "
                             f"with {k} drafts")
        check_tensor("uniform_probs", uniform_probs, shape=(total,), device=device,
                     what="[total_draft_tokens] float64 uniforms, one per draft")
        accept = real & (uniform_probs.double() < synthetic_rates.double()[pos])

    # Per-request grids [R, k+1]: drafts, and the token emitted right after an accepted prefix of
    # length a (recovered[a] if a < n_r, bonus if a == n_r).
    width = k + 1
    flat = req * width + pos
    draft_grid = torch.full((num_reqs * width,), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    draft_grid[flat] = drafts
    accept_grid = torch.zeros(num_reqs * width, dtype=torch.int32, device=device)
    accept_grid[flat] = accept.to(torch.int32)
    draft_grid, accept_grid = draft_grid.view(num_reqs, width), accept_grid.view(num_reqs, width)
    # Accepted length: prefix of matches (padding columns are 0, so a <= n_r).
    accepted_len = torch.cumprod(accept_grid, dim=1).sum(dim=1)
    if stochastic is not None:
        recovered = _recovered_at_first_rejection(recovered, accepted_len, cu, n, safe, real, *stochastic)
    next_grid = torch.full((num_reqs, width), 0, dtype=torch.long, device=device)
    next_grid.scatter_(1, n[:, None], bonus[:, None])   # column n_r holds the bonus
    next_grid = next_grid.view(-1)
    next_grid[flat] = recovered
    next_grid = next_grid.view(num_reqs, width)

    cols = torch.arange(width, device=device)[None, :]
    a = accepted_len[:, None]
    emitted = next_grid.gather(1, a)
    out = torch.where(cols < a, draft_grid, torch.where(cols == a, emitted, PLACEHOLDER_TOKEN_ID))
    return out.to(torch.int32)
