"""Reference solutions of the five exercises: plain loops, obviously right, slow on purpose.

A chapter with `use_solutions=True` checks these instead of the reader's functions (that is how
CI runs the exercises chapter); every checker passes them.
"""
from __future__ import annotations

import torch

from nwor_lab.ops.quant import raw


def slot_mapping(block_tables: torch.Tensor, token_req: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Where each window token's K/V goes in the paged cache.

    block_tables: [R, max_blocks] int32; row r lists request r's physical blocks in position
                  order (entries past the blocks it holds are -1)
    token_req:    [T] int32, the request of each window token
    positions:    [T] int64, the token's position in its request; -1 = padding token
    block_size:   int, slots per block
    returns       [T] int64: slot = block_tables[r, p // block_size] * block_size + p % block_size,
                  and -1 for padding tokens (positions == -1)
    """
    out = torch.full((positions.shape[0],), -1, dtype=torch.int64)
    for t, (r, p) in enumerate(zip(token_req.tolist(), positions.tolist())):
        if p >= 0:
            out[t] = int(block_tables[r, p // block_size]) * block_size + p % block_size
    return out


def acceptance_mask(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                    sampled_token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which drafts survived the rejection sampler (the prefix rule, with bounds checks).

    draft_token_ids:     [Dtot] int64, request-major; -1 = a padding draft (always rejected)
    cu_num_draft_tokens: [R] int32, inclusive cumulative sum of drafts per request
    sampled_token_ids:   [R, C] int64, the sampler's output per request, -1 placeholders
    returns (draft_mask [Dtot] bool, accepted_len [R] int32)

    Draft d_j (1-based) of request r is accepted iff EVERY draft d_i with i <= j is
      - in bounds: column i - 1 exists (i - 1 < C),
      - not padding: its id is not -1,
      - equal to sampled_token_ids[r, i - 1].
    The first failure ends the accepted prefix: do not trust any column after it.
    accepted_len[r] counts request r's accepted drafts.
    """
    drafts, ends = draft_token_ids.tolist(), cu_num_draft_tokens.tolist()
    sampled, num_cols = sampled_token_ids.tolist(), sampled_token_ids.shape[1]
    mask = torch.zeros(len(drafts), dtype=torch.bool)
    accepted = torch.zeros(len(ends), dtype=torch.int32)
    start = 0
    for r, end in enumerate(ends):
        for j in range(end - start):                 # column j holds the sampler's verdict on d_{j+1}
            d = drafts[start + j]
            if j >= num_cols or d == -1 or sampled[r][j] != d:
                break
            mask[start + j] = True
            accepted[r] += 1
        start = end
    return mask, accepted


def stage_commit_rows(token_req: torch.Tensor, token_draft_pos: torch.Tensor, accepted_len: torch.Tensor,
                      slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which staged window rows the stage commit copies into the cache, and to which slots.

    token_req:       [T] int32, the request of each window row
    token_draft_pos: [T] int32, 0 for rows that always commit (prefill, plain decode, t_last),
                     j for draft d_j
    accepted_len:    [R] int32, accepted drafts per request
    slot_mapping:    [T] int64, the row's slot; -1 = padding (nothing to write)
    returns (rows [n] int64 in ascending order, slots [n] int64 = slot_mapping[rows]):
    the rows that are kept (token_draft_pos <= accepted_len[token_req]) and not padding.
    """
    rows = [t for t, (r, j, s) in enumerate(zip(token_req.tolist(), token_draft_pos.tolist(),
                                                 slot_mapping.tolist()))
            if j <= int(accepted_len[r]) and s != -1]
    rows = torch.tensor(rows, dtype=torch.int64)
    return rows, slot_mapping.long()[rows]


def cow_restore(key_cache: torch.Tensor, value_cache: torch.Tensor, log_key: torch.Tensor,
                log_value: torch.Tensor, draft_slots: torch.Tensor, draft_mask: torch.Tensor):
    """Copy-on-write restore: put back the old contents of every REJECTED draft slot.

    key_cache, value_cache: [NB, BS, H, D] one layer, after the window wrote every draft (`off`);
                  any dtype (float32, bfloat16, float8_e4m3fn); NHD or HND layout: always index it
                  as [block, offset, head, dim] (for HND it is a permuted view)
    log_key, log_value: [Dtot, H, D] the old contents of each draft's slot, saved at begin
                  (zeros for padding drafts)
    draft_slots:  [Dtot] int64, the drafts' slots; -1 = padding draft (nothing was written there)
    draft_mask:   [Dtot] bool, True = accepted (its K/V stays)
    returns (key_cache, value_cache) where every rejected draft's slot is BIT-identical to its
    logged contents and every other slot is unchanged. Modifying the inputs in place and
    returning them is fine.
    """
    bs = key_cache.shape[1]
    for i, (s, keep) in enumerate(zip(draft_slots.tolist(), draft_mask.tolist())):
        if s >= 0 and not keep:
            # raw integer views: a bit-exact copy for every dtype (NaN payloads, -0.0, fp8 included)
            raw(key_cache)[s // bs, s % bs] = raw(log_key)[i]
            raw(value_cache)[s // bs, s % bs] = raw(log_value)[i]
    return key_cache, value_cache


def ring_evictions(ring_slots: int, sliding_window: int, start: int, num_tokens: int) -> list[tuple[int, int]]:
    """Which ring entries a write-all verify window evicts while its own queries still need them.

    A request has committed positions 0 .. start-1 into a ring of `ring_slots` slots: position p
    lives at ring index p % ring_slots, and a later position overwrites an earlier one at the
    same index. A verify window writes positions start .. start + num_tokens - 1 (t_last, then
    its drafts) into the ring BEFORE attention, as `off` does. A query at position q attends to
    positions q - sliding_window + 1 .. q.

    ring_slots:     int >= 1, slots in the ring (W + slack)
    sliding_window: int, 1 <= sliding_window <= ring_slots
    start:          int >= 0, the window's first position (t_last)
    num_tokens:     int, 1 <= num_tokens <= ring_slots (t_last + drafts)
    returns         list of (ring index, evicted position) pairs, in position order: every
                    committed position that a write of the window overwrites while some query
                    of the window still needs it
    """
    out = []
    for p in range(start, start + num_tokens):
        old = p - ring_slots                  # what p's ring index held: the latest earlier position there
        needed_from = max(0, start - sliding_window + 1)   # the query at `start` needs the oldest keys
        if old >= 0 and old >= needed_from:
            out.append((p % ring_slots, old))
    return out
