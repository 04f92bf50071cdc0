"""Reference solutions of the exercises: plain loops, obviously right, slow on purpose.

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
    """Which drafts survived the rejection sampler, counted the way SCV (and vLLM's runner) count.

    draft_token_ids:     [Dtot] int64, request-major; -1 = a padding draft
    cu_num_draft_tokens: [R] int32, inclusive cumulative sum of drafts per request
    sampled_token_ids:   [R, C] int64, the sampler's output per request: its accepted drafts,
                         then ONE token the target chose itself, then -1 placeholders
    returns (draft_mask [Dtot] bool, accepted_len [R] int32)

    accepted_len[r] = (number of ids != -1 in row r) - 1   (the row emits one token of its own)
      - kept within 0 .. n_r (n_r = request r's number of drafts),
      - cut at request r's first padding draft: a draft with id -1 is never accepted, nor any
        draft after it.
    A row of C columns therefore accepts at most C - 1 drafts: its last id is the emitted token.
    draft_mask: draft d_j (1-based) of request r is accepted iff j <= accepted_len[r] (a prefix).

    Count, do not compare ids: vLLM rejects a draft whose draft probability was 0, and the token
    it emits instead can be that very id (drafts [7, 8], row [7, 8, -1]: ONE draft accepted).
    """
    drafts, ends = draft_token_ids.tolist(), cu_num_draft_tokens.tolist()
    rows = sampled_token_ids.tolist()
    mask = torch.zeros(len(drafts), dtype=torch.bool)
    accepted = torch.zeros(len(ends), dtype=torch.int32)
    start = 0
    for r, end in enumerate(ends):
        mine = drafts[start:end]
        emitted = sum(1 for t in rows[r] if t != -1)
        a = min(max(emitted - 1, 0), len(mine))
        if -1 in mine[:a]:                              # a padding draft ends the prefix
            a = mine.index(-1)
        accepted[r] = a
        mask[start:start + a] = True
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


def storage_offsets(slots: torch.Tensor, layout: str, block_size: int, num_kv_heads: int,
                    head_size: int) -> torch.Tensor:
    """Where, in a layer's flat storage, each KV head of each slot starts (chapter 02's layouts).

    A layer is one contiguous buffer of num_blocks * block_size * num_kv_heads * head_size
    elements. Its physical order depends on the layout:
      NHD: [num_blocks, block_size, num_kv_heads, head_size]  (vLLM's flash backend)
      HND: [num_blocks, num_kv_heads, block_size, head_size]
    slots:        [n] int64, slot = block * block_size + offset; -1 = padding
    layout:       "NHD" or "HND"
    block_size, num_kv_heads, head_size: ints >= 1
    returns       [n, num_kv_heads] int64: the element offset of head h of slots[i]
                  (its head_size elements follow it), -1 in every head of a padding slot
    """
    out = torch.full((slots.shape[0], num_kv_heads), -1, dtype=torch.int64)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        block, offset = divmod(s, block_size)
        for h in range(num_kv_heads):
            if layout == "NHD":
                out[i, h] = ((block * block_size + offset) * num_kv_heads + h) * head_size
            else:
                out[i, h] = ((block * num_kv_heads + h) * block_size + offset) * head_size
    return out


def spec_decode_indices(num_draft_tokens: torch.Tensor, cu_num_scheduled_tokens: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three index vectors of vLLM's SpecDecodeMetadata (chapter 03).

    num_draft_tokens:        [R] int32, n_r drafts of request r (0 for prefill / plain decode)
    cu_num_scheduled_tokens: [R] int32, inclusive cumulative sum of the tokens each request
                             schedules in the window (at least n_r + 1 each); request r's tokens
                             are window positions cu[r-1] .. cu[r] - 1, its drafts the last n_r
    returns (logits_indices [Dtot + R] int32, target_logits_indices [Dtot] int32,
             bonus_logits_indices [R] int32):
      logits_indices:        per request, its last n_r + 1 window positions (t_last or its last
                             token, then its drafts): the rows the target computes logits for;
      target_logits_indices: rows OF THOSE LOGITS that verify the drafts: request r's first n_r;
      bonus_logits_indices:  rows of those logits that sample the bonus token: request r's last.
    """
    logits, target, bonus = [], [], []
    for n, end in zip(num_draft_tokens.tolist(), cu_num_scheduled_tokens.tolist()):
        row = len(logits)                      # the first logits row of this request
        logits += list(range(end - n - 1, end))
        target += list(range(row, row + n))
        bonus.append(row + n)
    as32 = lambda v: torch.tensor(v, dtype=torch.int32)   # noqa: E731
    return as32(logits), as32(target), as32(bonus)


def greedy_sampled_ids(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                       target_argmax: torch.Tensor, max_spec_len: int) -> torch.Tensor:
    """What the greedy rejection sampler returns (chapter 03): `sampled_token_ids`.

    draft_token_ids:     [Dtot] int64, request-major; -1 = a padding draft (never equal to an id)
    cu_num_draft_tokens: [R] int32, inclusive cumulative sum of drafts per request
    target_argmax:       [Dtot + R] int64, the target's argmax per logits row, in logits order:
                         per request its n_r draft rows, then its bonus row
    max_spec_len:        int >= every n_r
    returns              [R, max_spec_len + 1] int32: per request the accepted drafts (draft d_j
                         is accepted while it equals the argmax of its row), then ONE token of the
                         target's own — the argmax of the first rejected draft's row, or of the
                         bonus row when every draft was accepted — then -1 placeholders
    """
    drafts, ends, argmax = draft_token_ids.tolist(), cu_num_draft_tokens.tolist(), target_argmax.tolist()
    out = torch.full((len(ends), max_spec_len + 1), -1, dtype=torch.int32)
    start = 0
    for r, end in enumerate(ends):
        first_row = start + r                   # request r's rows start after r bonus rows
        for j in range(end - start + 1):        # the drafts' rows, then the bonus row
            want = argmax[first_row + j]
            out[r, j] = want
            if j == end - start or drafts[start + j] != want:
                break                            # the target's own token ends the row
        start = end
    return out


def window_attention_mask(query_lens: torch.Tensor) -> torch.Tensor:
    """Which rows of the staging buffer each query of the window may read (chapter 05).

    Under `stage` a verify window's K/V sit in a staging buffer, request-major: request r's
    query_lens[r] rows (t_last, d_1 .. d_k, or a prefill's tokens) follow request r - 1's.
    Attention reads each request's earlier positions from the cache and the window from the
    buffer; a query sees its own request's window rows up to itself, never another request's.
    query_lens: [R] int64, window rows per request (>= 0)
    returns     [T, T] bool, T = sum(query_lens): mask[i, j] is True iff rows i and j belong to
                the same request and j <= i
    """
    total = int(query_lens.sum()) if query_lens.numel() else 0
    mask = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for n in query_lens.tolist():
        for i in range(start, start + n):
            for j in range(start, i + 1):
                mask[i, j] = True
        start += n
    return mask


def cow_restore_plan(draft_slots: torch.Tensor, draft_mask: torch.Tensor, num_layers: int,
                     bytes_per_token_layer: int) -> tuple[torch.Tensor, int, int]:
    """What `cow` logs at begin and restores at commit, masked in data (chapter 06).

    draft_slots:           [Dtot] int64, each draft's slot; -1 = padding draft (never written)
    draft_mask:            [Dtot] bool, True = accepted
    num_layers:            layers of the stacked cache (every layer is logged and restored)
    bytes_per_token_layer: K + V bytes of one token in one layer
    returns (restore_slots [Dtot] int64, bytes_logged int, bytes_restored int):
      restore_slots: per draft, the slot its logged row goes back to — its slot when rejected,
                     -1 when accepted or padding. One restore launch takes the whole vector: the
                     -1 entries write nothing, so nothing is compacted on the host;
      bytes_logged:  every non-padding draft slot, in every layer;
      bytes_restored: every rejected non-padding draft slot, in every layer.
    """
    restore = torch.full((draft_slots.shape[0],), -1, dtype=torch.int64)
    logged = restored = 0
    for i, (s, keep) in enumerate(zip(draft_slots.tolist(), draft_mask.tolist())):
        if s < 0:
            continue
        logged += 1
        if not keep:
            restore[i] = s
            restored += 1
    per_row = num_layers * bytes_per_token_layer
    return restore, logged * per_row, restored * per_row


def acceptance_stats(drafted: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
                     k: int) -> tuple[float, torch.Tensor]:
    """Mean acceptance length and acceptance by draft position, as the engine reports them (08).

    One entry per (request, verify window) pair of a run:
    drafted:  [P] int64, drafts the request verified in that window (0: prefill / plain decode)
    accepted: [P] int64, how many of them the sampler accepted (0 .. drafted)
    emitted:  [P] int64, tokens the window appended to the request's output: accepted + 1,
              unless the request ended inside the window (max_new_tokens or an end token), when
              it can be fewer
    k:        int >= 1, the most drafts a window verifies
    returns (mean_acceptance_length float, by_position [k] float64):
      mean: the mean of `emitted` over the pairs that had drafts (1.0 when there are none) —
            tokens a speculative request gains per target forward, counting only what it received;
      by_position[j - 1]: accepted d_j / windows in which d_j counted. A pair counts positions
            1 .. drafted, except a pair cut short (emitted <= accepted): its emitted tokens are
            d_1 .. d_e, all accepted, and it counts positions 1 .. e only. 0.0 where no pair counted.
    """
    produced = windows = 0
    drafted_at, accepted_at = [0] * k, [0] * k
    for n, a, e in zip(drafted.tolist(), accepted.tolist(), emitted.tolist()):
        if not n:
            continue
        produced += e
        windows += 1
        counted, kept = (e, e) if e <= a else (n, a)
        for j in range(min(counted, k)):
            drafted_at[j] += 1
            accepted_at[j] += int(j < kept)
    rates = [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)]
    return (produced / windows if windows else 1.0), torch.tensor(rates, dtype=torch.float64)


def rejected_slots(slots: torch.Tensor, token_req: torch.Tensor, token_draft_pos: torch.Tensor,
                   accepted_len: torch.Tensor) -> torch.Tensor:
    """The slots that hold rejected K/V after an `off` window (00).

    slots:           [T] int64, where each window token's K/V was written; -1 = padding (wrote nothing)
    token_req:       [T] int64, the request of each token
    token_draft_pos: [T] int64, 0 for t_last, prefill and plain-decode tokens; j for draft d_j
    accepted_len:    [R] int64, accepted drafts per request (drafts d_1 .. d_a are kept)
    returns          [N] int64: the slots of the rejected drafts (d_j with j > a of its request), in
                     window order; a padding slot (-1) wrote nothing and is never listed
    """
    out = []
    for s, r, j in zip(slots.tolist(), token_req.tolist(), token_draft_pos.tolist()):
        if s >= 0 and j > int(accepted_len[r]):
            out.append(s)
    return torch.tensor(out, dtype=torch.int64)


def write_share(scheduled: torch.Tensor, drafted: torch.Tensor, accepted: torch.Tensor) -> float:
    """The share of `off`'s K/V rows that `stage` writes, from a run's trace (01).

    One entry per (request, verify window) pair:
    scheduled: [P] int64, rows the request scheduled in the window (1 + drafted for a speculative
               request: t_last and its drafts; a prefill's prompt tokens; 1 for a plain decode)
    drafted:   [P] int64, its drafts (0 for a prefill or a plain decode)
    accepted:  [P] int64, how many of them were accepted (0 .. drafted)
    returns    float: rows stage writes / rows off writes. `off` writes every scheduled row; `stage`
               writes every row but the rejected drafts (t_last, accepted drafts, prefill and decode
               rows). For one request at accepted length a that is (1 + a) / (1 + k). 1.0 when
               nothing was scheduled.
    """
    off = stage = 0
    for n, d, a in zip(scheduled.tolist(), drafted.tolist(), accepted.tolist()):
        off += n
        stage += n - (d - a)
    return stage / off if off else 1.0


def napkin_speedup(decode_ms: float, verify_ms: float, head_pass_ms: float, k: int,
                   profile: torch.Tensor) -> tuple[float, float]:
    """EAGLE's napkin speedup over target-only decoding, from measured components (11).

    decode_ms:    one target-only decode step (emits one token per request)
    verify_ms:    one verify step of 1 + k tokens per request
    head_pass_ms: one pass of the EAGLE head (an EAGLE step makes k: one over the verify window,
                  k - 1 in the draft chain)
    k:            drafts per window, >= 1
    profile:      [k] float64, profile[j - 1] = P(d_1 .. d_j all accepted) (non-increasing)
    returns (L float, speedup float):
      L = 1 + sum(profile): the expected tokens a window emits (its accepted drafts plus the target's
          own token);
      speedup = L * decode_ms / (verify_ms + k * head_pass_ms).
    """
    length = 1.0 + float(sum(float(p) for p in profile.tolist()))
    return length, length * decode_ms / (verify_ms + k * head_pass_ms)


def vllm_key_offsets(slots: torch.Tensor, head: int, block_size: int, num_kv_heads: int,
                     head_size: int) -> torch.Tensor:
    """Where a token's key lives in one layer of vLLM's CPU KV cache (09).

    vLLM's CPU backend holds a layer as one contiguous tensor `[num_blocks, num_kv_heads, block_size,
    2 * head_size]`. Each (block, head) run of `block_size * 2 * head_size` elements stores the block's
    keys of that head TRANSPOSED, `[head_size, block_size]` (element d of the key at offset o sits at
    d * block_size + o), then its values `[block_size, head_size]`.
    slots:        [N] int64, slot = block * block_size + offset; -1 = padding
    head:         the KV head, 0 .. num_kv_heads - 1
    returns       [N, head_size] int64: the flat element index (into the layer tensor) of each element
                  of the token's key for `head`, d = 0 .. head_size - 1; a row of -1 for padding
    """
    run = block_size * 2 * head_size
    out = torch.full((slots.shape[0], head_size), -1, dtype=torch.int64)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        block, offset = divmod(s, block_size)
        base = (block * num_kv_heads + head) * run
        for d in range(head_size):
            out[i, d] = base + d * block_size + offset
    return out


def sweep_medians(rows: list, metric: str, policies: list, ks: list) -> torch.Tensor:
    """A sweep's rows read into the figure the report draws: one median per write policy and k (10).

    rows:     results.jsonl rows, dicts {"run_id", "params", "metrics", "status", ...}; a repeat of a
              configuration is a row of its own (same params, another run_id)
    metric:   the metric to read, e.g. "tok_s"
    policies: the policies in figure order (params["nwor_mode"])
    ks:       the k values in figure order (params["k"])
    returns   [len(policies), len(ks)] float64: the median of `metric` over the rows with status "ok"
              whose params match (the middle value; the mean of the two middle ones for an even count);
              a failed row, or one without that metric (or with None), does not count; NaN where
              no row counts
    """
    out = torch.full((len(policies), len(ks)), float("nan"), dtype=torch.float64)
    for i, p in enumerate(policies):
        for j, k in enumerate(ks):
            values = sorted(float(r["metrics"][metric]) for r in rows
                            if r.get("status") == "ok" and r["params"].get("nwor_mode") == p and r["params"].get("k") == k
                            and r.get("metrics", {}).get(metric) is not None)
            if values:
                m = len(values) // 2
                out[i, j] = values[m] if len(values) % 2 else (values[m - 1] + values[m]) / 2
    return out


def state_commit(window_states: torch.Tensor, conv_history: torch.Tensor, num_drafts: torch.Tensor,
                 accepted_len: torch.Tensor, conv_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent state a verify window commits, and the conv inputs it keeps (13).

    One gated DeltaNet layer; request r's window is t_last, d_1 .. d_n (n = num_drafts[r] <= k):
    window_states: [R, k+1, S] float32; window_states[r, j] is the state after t_last (j = 0) or after
                   draft d_j (j = 1 .. n), flattened to S numbers; rows past n are padding (NaN)
    conv_history:  [R, W-1 + k+1, C] float32: the conv state before the window (its W-1 inputs,
                   oldest first), then the conv inputs of t_last, d_1 .. d_k (padding: NaN)
    num_drafts:    [R] int64
    accepted_len:  [R] int64, a in 0 .. num_drafts[r]: t_last, d_1 .. d_a are kept
    conv_width:    W >= 2, the short conv's kernel width (its state holds W - 1 inputs)
    returns (state [R, S] float32, conv_state [R, W-1, C] float32): for each request the state after
            its last kept token (d_a; t_last when a = 0), and the W - 1 conv inputs that end with
            that token's, oldest first: what the store must hold for the next window. The state
            after d_n (what `off` keeps) holds every rejected draft's update.
    """
    rows = torch.arange(len(accepted_len))
    a = accepted_len.long()
    state = window_states[rows, a]                                      # the state after d_a
    # history index W-1 is t_last's input, W-1+a is d_a's: keep the W-1 entries ending there
    keep = a[:, None] + 1 + torch.arange(conv_width - 1)
    return state, conv_history[rows[:, None], keep]


def tree_commit_plan(parents: torch.Tensor, draft_tokens: torch.Tensor, target_argmax: torch.Tensor,
                     slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree window's accepted path under greedy acceptance, and what its commit copies where.

    parents:       [N] int64, node i+1's parent: 0 = t_last, j = node j (parents come first, j <= i)
    draft_tokens:  [N] int64, node i+1's draft token (siblings carry distinct tokens)
    target_argmax: [N + 1] int64, the target's greedy token after window row t (row 0 = t_last,
                   row j = node j): a node matches when its token equals target_argmax[its parent]
    slots:         [N + 1] int64, the slot of position n + j (j = 0 .. N): a write-all window put
                   row j there
    returns (path [a] int64: the accepted nodes by depth — from t_last, step to the child that matches,
             until no child does; src [a] int64 = slots[path]: where write-all wrote each path node;
             dst [a] int64 = slots[1 .. a]: position n + depth, where it belongs). Write-all + move
             copies src -> dst (a node already in place moves nothing); stage writes staging row
             path[i] to dst[i] directly.
    """
    par, tok, arg = parents.tolist(), draft_tokens.tolist(), target_argmax.tolist()
    path, at = [], 0
    while True:
        nxt = [i + 1 for i, p in enumerate(par) if p == at and tok[i] == arg[at]]
        if not nxt:
            break
        at = nxt[0]
        path.append(at)
    path = torch.tensor(path, dtype=torch.int64)
    return path, slots.long()[path], slots.long()[1:1 + len(path)]


def prefix_blocks(block_size: int, block_table: torch.Tensor, num_computed: int, num_drafts: int,
                  accepted_len: int, write_policy: str) -> torch.Tensor:
    """Which of a request's blocks its prefix cache registers (hashes and may share) after one verify
    window's commit.

    block_size:   int, positions per block (BS); block b of the table holds positions b·BS .. b·BS + BS − 1
    block_table:  [B] int64, the request's physical block ids in position order (enough for the window)
    num_computed: int n, positions whose K/V was committed before the window (0 .. n − 1); t_last sits at n
    num_drafts:   int k, drafts the window verified (positions n + 1 .. n + k)
    accepted_len: int a (0 <= a <= k), drafts the target accepted
    write_policy: "off" | "cow" | "stage", how the verify pass wrote (where rejected drafts' K/V went)
    returns       [m] int64: the physical ids, in position order, of the blocks that this commit makes
                  full of committed rows (every row the K/V of a kept token: t_last and d_1 .. d_a, so
                  positions below n + 1 + a). Blocks full before the window were registered at an
                  earlier commit and are not returned again; a partial block never is (under `off` its
                  rows past n + a can hold rejected drafts' K/V). The write policy does not change the
                  answer: what is registered follows from acceptance, never from what was written.
    """
    if write_policy not in ("off", "cow", "stage"):
        raise ValueError(f"write_policy={write_policy!r}: choose off, cow or stage")
    committed = num_computed + 1 + accepted_len         # t_last and the accepted drafts
    out = []
    for b in range(len(block_table)):
        full_now = (b + 1) * block_size <= committed
        full_before = (b + 1) * block_size <= num_computed
        if full_now and not full_before:
            out.append(int(block_table[b]))
    return torch.tensor(out, dtype=torch.int64)


def shipped_rows(block_size: int, num_computed: int, target_layers: int, head_layers: int,
                 strategy: str) -> torch.Tensor:
    """Which cache rows a prefill-to-decode hand-off ships of one request, per strategy.

    block_size:    int, positions per block (BS)
    num_computed:  int n, positions whose K/V is committed (0 .. n − 1; the next token's K/V is not
                   computed yet: the decode engine's first window writes it)
    target_layers: int, the target's cache layers (0 .. target_layers − 1)
    head_layers:   int, the EAGLE head's cache layers, after the target's (layer N, ...)
    strategy:      "nwor" | "write_all" | "no_head"
                   nwor       committed rows only, every layer (the target's and the head's)
                   write_all  whole blocks: every row of the request's blocks, every layer (the
                              rows past n travel too: junk, under write-all the rejected drafts' K/V)
                   no_head    committed rows of the target's layers only (the head's K/V left behind)
    returns        [target_layers + head_layers, P] bool, P = ceil(n / BS)·BS (the positions of the
                   request's blocks): True where the row (layer, position) travels
    """
    if strategy not in ("nwor", "write_all", "no_head"):
        raise ValueError(f"strategy={strategy!r}: choose nwor, write_all or no_head")
    layers = target_layers + head_layers
    blocks = -(-num_computed // block_size)
    positions = blocks * block_size
    out = torch.zeros(layers, positions, dtype=torch.bool)
    rows = positions if strategy == "write_all" else num_computed       # whole blocks, or committed rows
    kept = target_layers if strategy == "no_head" else layers           # the head's layers come last
    out[:kept, :rows] = True
    return out


def window_key_rows(cache_lens: torch.Tensor, win_rows: torch.Tensor, win_start: torch.Tensor,
                    request: int) -> torch.Tensor:
    """Where `stage`'s verify attention reads each key of one request: the paged cache or a row of
    the staging buffer.

    cache_lens: [R] int32, request r's committed positions 0 .. cache_lens[r] − 1 are in the paged cache
    win_rows:   [n] int64, rows of the staging buffer (win_key / win_value); request r's window rows
                are win_rows[win_start[r] .. win_start[r + 1] − 1], in position order (t_last first)
    win_start:  [R + 1] int32, each request's first entry in win_rows (win_start[R] = n)
    request:    int r, the request whose keys to list
    returns     [cache_lens[r] + W] int64, W = win_start[r + 1] − win_start[r]: for key position p, −1
                when the key is read from the cache (p < cache_lens[r]), else the staging-buffer row
                win_rows[win_start[r] + p − cache_lens[r]] (window row j sits at position cache_lens[r] + j)
    """
    r = int(request)
    n = int(cache_lens[r])
    lo, hi = int(win_start[r]), int(win_start[r + 1])
    out = [-1] * n
    for j in range(hi - lo):
        out.append(int(win_rows[lo + j]))
    return torch.tensor(out, dtype=torch.int64)


def sampled_verdict(draft_ids: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                    u: torch.Tensor) -> tuple[int, torch.Tensor]:
    """One request's verify window at temperature > 0 (speculative sampling, Leviathan et al.): how
    many drafts are accepted, and the distribution the target's own token is then drawn from.

    draft_ids:    [k] int64, the drafts d_1 .. d_k; an id outside [0, V) (−1 = padding) is always rejected
    target_probs: [k + 1, V] float64, row j: the target's distribution p_j for the token at draft
                  position j + 1 (after t_last and d_1 .. d_j); row k: the bonus token's
    draft_probs:  [k, V] float64, row j: the draft distribution q_j that d_(j+1) was sampled from
    u:            [k] float64, one uniform draw in [0, 1) per draft
    returns       (a, next_probs): a (int) = the number of drafts accepted, in order: draft j is
                  accepted iff every draft before it was, its id x is in [0, V), q_j(x) > 0 and
                  p_j(x) / q_j(x) >= u_j; next_probs [V] float64 = the distribution of the token emitted
                  after them: when a < k, the residual max(p_a − q_a, 0) normalised to sum 1 (p_a itself
                  if the residual is all zero); when a = k, the bonus row p_k
    """
    k, V = draft_probs.shape
    a = 0
    while a < k:
        x = int(draft_ids[a])
        if not 0 <= x < V:
            break
        p_x, q_x = float(target_probs[a, x]), float(draft_probs[a, x])
        if q_x <= 0 or p_x / q_x < float(u[a]):
            break
        a += 1
    if a == k:
        return a, target_probs[k].clone().double()
    residual = (target_probs[a] - draft_probs[a]).clamp_min(0).double()
    if float(residual.sum()) <= 0:
        return a, target_probs[a].clone().double()
    return a, residual / residual.sum()
