"""Every checker passes the reference solutions, says "not attempted yet" for the untouched stub,
and catches planted wrong solutions (each exercise its own, dtype mistakes included), reporting the
first counterexample in words and in a picture. The references agree with the package where it
defines the same thing."""
import pytest
import torch

from exercise_tools import failed
from nwor_lab import exercises
from nwor_lab.exercises import solutions
from nwor_lab.kv import build_slot_mapping
from nwor_lab.ops.quant import raw
from nwor_lab.ops.scv import accepted_len_by_ids, scv_mask_reference

CHECKS = {name: getattr(exercises, f"check_{name}") for name in exercises.NAMES}


def stub(**_):
    raise NotImplementedError("write it")


@pytest.mark.parametrize("name", exercises.NAMES)
def test_solutions_pass(name, capsys):
    result = CHECKS[name](exercises.choose(name, None, use_solutions=True))
    assert result and result.figure is None and result.status == "pass"
    assert capsys.readouterr().out.strip() == f"PASS {name} (300 cases)"


@pytest.mark.parametrize("name", exercises.NAMES)
def test_untouched_stub_is_not_attempted_not_a_failure(name, capsys):
    result = exercises.check(name, stub)
    assert not result and result.status == "not attempted" and not result.attempted
    assert result.figure is None and result.case is None
    out = capsys.readouterr().out
    assert out.startswith(f"not attempted yet: {name}") and "FAIL" not in out


def test_not_implemented_after_the_first_case_is_a_failure():
    def half(block_tables, token_req, positions, block_size):
        if positions.numel() > 1:
            raise NotImplementedError("big windows")
        return solutions.slot_mapping(block_tables, token_req, positions, block_size)
    r = exercises.check_slot_mapping(half)
    assert r.status == "fail" and "raised NotImplementedError" in r.message


def test_eleven_exercises_each_with_a_home_chapter_hints_and_a_prediction():
    chapters = exercises.by_chapter()
    assert len(exercises.NAMES) >= 10
    for stem in ("02_paged_cache", "03_verify_window", "04_scv", "05_stage", "06_cow", "08_eagle"):
        assert chapters.get(stem), f"{stem} has no exercise"
    letters = [exercises.exercise(n).letter for n in exercises.NAMES]
    assert len(set(letters)) == len(letters)
    for name in exercises.NAMES:
        ex = exercises.exercise(name)
        assert ex.title and len(ex.hints) == 2 and ex.predict is not None
        hints = exercises.hints(name)
        assert len(hints) == 3 and f"def {name}(" in hints[2]       # hint 1, hint 2, the reference
        page = hints._repr_html_()
        assert page.count("<details") == 3 and "<summary>Hint 1" in page and "open" not in page.split(">")[0]
        p = exercises.predict(name)
        assert p.guess is None and "none yet" in repr(p)
        assert exercises.predict(name, p.answer).right and "right" in repr(exercises.predict(name, p.answer))


def test_choose_spec_and_hint(capsys):
    mine = lambda **kw: None  # noqa: E731
    assert exercises.choose("cow_restore", mine) is mine
    assert exercises.choose("cow_restore", mine, use_solutions=True) is solutions.cow_restore
    assert "accepted_len" in exercises.spec("acceptance_mask")
    with pytest.raises(ValueError, match="choose one of"):
        exercises.choose("slots", mine)
    exercises.hint("slot_mapping", 1)
    assert "block_tables[token_req" in capsys.readouterr().out
    with pytest.raises(ValueError, match="hints 1..3"):
        exercises.hint("slot_mapping", 4)


def test_predictions_are_answered_by_the_reference():
    answers = {n: exercises.predict(n).answer for n in exercises.NAMES}
    assert answers["acceptance_mask"] == 1                 # drafts [7, 8], row [7, 8, -1]: one, not two
    assert answers["storage_offsets"] == 1                 # one head of four lands right (chapter 02)
    assert answers["spec_decode_indices"] == [3, 4, 7, 8, 10]
    assert answers["greedy_sampled_ids"] == [5, 7, 6, -1]
    assert answers["cow_restore"] is False                 # NaN != NaN: a value comparison fails a perfect restore
    assert answers["acceptance_stats"] == 3.0


def as_dtype(fn, index, dtype):
    """Wrap a right answer so that its output `index` (None: the whole output) has the wrong dtype."""
    def wrong(**kw):
        out = fn(**kw)
        if index is None:
            return out.to(dtype)
        out = list(out)
        out[index] = out[index].to(dtype)
        return tuple(out)
    return wrong


# -- (a) slot_mapping ----------------------------------------------------------------------------
def slot_mapping_no_padding(block_tables, token_req, positions, block_size):
    p = positions.long()                                  # forgot: position -1 means "write nothing"
    return block_tables.long()[token_req.long(), p // block_size] * block_size + p % block_size


def slot_mapping_off_by_one(block_tables, token_req, positions, block_size):
    p = positions.long() + 1                              # counts tokens instead of indexing them
    slots = block_tables.long()[token_req.long(), (p // block_size).clamp(max=block_tables.shape[1] - 1)]
    return torch.where(positions >= 0, slots * block_size + p % block_size, -1)


def test_slot_mapping_catches_missing_padding(capsys):
    r = failed(exercises.check_slot_mapping(slot_mapping_no_padding), "slot_mapping", "padding")
    assert r.case_index == 5 and "first difference at token" in r.message
    assert r.figure.layout.shapes, "the wrong slots are outlined"
    assert capsys.readouterr().out.startswith("FAIL slot_mapping")


def test_slot_mapping_catches_off_by_one():
    r = failed(exercises.check_slot_mapping(slot_mapping_off_by_one), "slot_mapping", "edge")
    assert r.case_index == 1        # one token at position 0: the smallest window that shows it


def test_slot_mapping_catches_int32():
    failed(exercises.check_slot_mapping(as_dtype(solutions.slot_mapping, None, torch.int32)), "slot_mapping", "edge",
           "slots: dtype int32, the spec says int64")


# -- (b) acceptance_mask -------------------------------------------------------------------------
def acceptance_by_ids(draft_token_ids, cu_num_draft_tokens, sampled_token_ids):
    """The id comparison with bounds (the old exercise's reference): a draft with a column counts."""
    drafts, ends = draft_token_ids.tolist(), cu_num_draft_tokens.tolist()
    sampled, num_cols = sampled_token_ids.tolist(), sampled_token_ids.shape[1]
    mask, acc, start = torch.zeros(len(drafts), dtype=torch.bool), torch.zeros(len(ends), dtype=torch.int32), 0
    for r, end in enumerate(ends):
        for j in range(end - start):
            if j >= num_cols or drafts[start + j] == -1 or sampled[r][j] != drafts[start + j]:
                break
            mask[start + j] = True
            acc[r] += 1
        start = end
    return mask, acc


def acceptance_emitted(draft_token_ids, cu_num_draft_tokens, sampled_token_ids):
    """Forgets that every row emits one token of its own: accepted = emitted."""
    n = torch.diff(cu_num_draft_tokens.long(), prepend=torch.zeros(1, dtype=torch.long))
    acc = torch.minimum((sampled_token_ids != -1).sum(1), n).to(torch.int32)
    req = torch.repeat_interleave(torch.arange(len(n)), n)
    pos = torch.arange(len(draft_token_ids)) - torch.repeat_interleave(cu_num_draft_tokens.long() - n, n)
    return pos < acc[req], acc


def acceptance_without_padding_cut(draft_token_ids, cu_num_draft_tokens, sampled_token_ids):
    n = torch.diff(cu_num_draft_tokens.long(), prepend=torch.zeros(1, dtype=torch.long))
    acc = torch.minimum(((sampled_token_ids != -1).sum(1) - 1).clamp(min=0), n).to(torch.int32)
    req = torch.repeat_interleave(torch.arange(len(n)), n)
    pos = torch.arange(len(draft_token_ids)) - torch.repeat_interleave(cu_num_draft_tokens.long() - n, n)
    return pos < acc[req], acc


def test_acceptance_mask_catches_the_id_comparison_at_c_minus_one():
    r = failed(exercises.check_acceptance_mask(acceptance_by_ids), "acceptance_mask", "at most C - 1")
    assert r.case_index == 4 and "draft_mask: first difference at draft 1: expected False, got True" in r.message
    texts = [t for trace in r.figure.data if trace.type == "heatmap" for row in trace.text for t in row]
    assert "d1=5" in texts and "6" in texts, "the picture shows draft ids and sampled ids"
    assert r.figure.layout.shapes, "the wrong request is outlined"


def test_acceptance_mask_catches_forgetting_the_emitted_token():
    failed(exercises.check_acceptance_mask(acceptance_emitted), "acceptance_mask", "none accepted")


def test_acceptance_mask_catches_padding_drafts():
    failed(exercises.check_acceptance_mask(acceptance_without_padding_cut), "acceptance_mask", "padding cuts")


def test_acceptance_mask_catches_an_int64_length():
    r = failed(exercises.check_acceptance_mask(as_dtype(solutions.acceptance_mask, 1, torch.int64)),
               "acceptance_mask", "no requests")
    assert "accepted_len: dtype int64, the spec says int32" in r.message


def test_acceptance_mask_reports_an_exception():
    def no_bounds(draft_token_ids, cu_num_draft_tokens, sampled_token_ids):
        sampled_token_ids[0, 10]                          # reads past the sampled columns
    r = failed(exercises.check_acceptance_mask(no_bounds), "acceptance_mask", "no requests")
    assert r.case_index == 0 and r.error.startswith("IndexError") and "raised IndexError" in r.message


# -- (c) stage_commit_rows -----------------------------------------------------------------------
def commit_rows_off_by_one(token_req, token_draft_pos, accepted_len, slot_mapping):
    keep = (token_draft_pos < accepted_len[token_req.long()]) | (token_draft_pos == 0)   # drops d_a
    rows = torch.nonzero(keep & (slot_mapping >= 0)).flatten()
    return rows, slot_mapping[rows]


def commit_rows_with_padding(token_req, token_draft_pos, accepted_len, slot_mapping):
    rows = torch.nonzero(token_draft_pos <= accepted_len[token_req.long()]).flatten()   # keeps slot -1
    return rows, slot_mapping[rows]


def test_stage_commit_rows_catches_off_by_one():
    r = failed(exercises.check_stage_commit_rows(commit_rows_off_by_one), "stage_commit_rows",
               "every draft accepted")
    assert r.figure.layout.shapes                          # the missed slots are outlined


def test_stage_commit_rows_catches_padding():
    failed(exercises.check_stage_commit_rows(commit_rows_with_padding), "stage_commit_rows", "slot -1", "rows: shape")


def test_stage_commit_rows_catches_int32_rows():
    r = failed(exercises.check_stage_commit_rows(as_dtype(solutions.stage_commit_rows, 0, torch.int32)),
               "stage_commit_rows", "edge")
    assert "rows: dtype int32, the spec says int64" in r.message


# -- (d) cow_restore -----------------------------------------------------------------------------
def restore_accepted_too(key_cache, value_cache, log_key, log_value, draft_slots, draft_mask):
    bs = key_cache.shape[1]
    for i, s in enumerate(draft_slots.tolist()):          # ignores the mask: undoes accepted drafts
        if s >= 0:
            raw(key_cache)[s // bs, s % bs] = raw(log_key)[i]
            raw(value_cache)[s // bs, s % bs] = raw(log_value)[i]
    return key_cache, value_cache


def restore_slot_minus_one(key_cache, value_cache, log_key, log_value, draft_slots, draft_mask):
    bs = key_cache.shape[1]
    for i, (s, keep) in enumerate(zip(draft_slots.tolist(), draft_mask.tolist())):
        if not keep:                                      # slot -1 wraps to the cache's last slot
            raw(key_cache)[s // bs, s % bs] = raw(log_key)[i]
            raw(value_cache)[s // bs, s % bs] = raw(log_value)[i]
    return key_cache, value_cache


def restore_with_nhd_offsets(key_cache, value_cache, log_key, log_value, draft_slots, draft_mask):
    nb, bs, h, d = key_cache.shape
    for cache, log in ((key_cache, log_key), (value_cache, log_value)):
        # offsets computed as if the memory were NHD (slot * H * D), as a hand-written kernel might
        rows = torch.as_strided(raw(cache), (nb * bs, h, d), (h * d, d, 1), cache.storage_offset())
        rejected = ~draft_mask & (draft_slots >= 0)
        rows[draft_slots[rejected]] = raw(log)[rejected]
    return key_cache, value_cache


def restore_through_values(key_cache, value_cache, log_key, log_value, draft_slots, draft_mask):
    bs = key_cache.shape[1]
    for i, (s, keep) in enumerate(zip(draft_slots.tolist(), draft_mask.tolist())):
        if s >= 0 and not keep:                          # a float round trip: NaN payloads change
            key_cache[s // bs, s % bs] = (log_key[i].float() * 1.0).to(key_cache.dtype)
            value_cache[s // bs, s % bs] = (log_value[i].float() * 1.0).to(value_cache.dtype)
    return key_cache, value_cache


def test_cow_restore_catches_restoring_accepted_slots():
    r = failed(exercises.check_cow_restore(restore_accepted_too), "cow_restore", "all accepted")
    assert "accepted: keep what the window wrote" in r.message
    got_panel = r.figure.data[1]
    assert any("ACCEPTED" in str(c[2]) for row in got_panel.customdata for c in row)


def test_cow_restore_catches_slot_minus_one():
    r = failed(exercises.check_cow_restore(restore_slot_minus_one), "cow_restore", "padding draft")
    assert "not a draft slot" in r.message and "wraps to the last slot" in r.message


def test_cow_restore_catches_a_layout_mix_up():
    r = failed(exercises.check_cow_restore(restore_with_nhd_offsets), "cow_restore",
               "HND layout with block_size == num_kv_heads")
    assert "differs bit for bit" in r.message and "\n    got " in r.message


def test_cow_restore_shows_raw_bits_where_nan_looks_like_nan():
    r = failed(exercises.check_cow_restore(restore_through_values), "cow_restore", "random")
    assert "bits [" in r.message and "nan" in r.message
    assert "only the raw bits tell them apart" in r.message     # the values print alike
    subtitle = r.figure.layout.title.subtitle.text
    assert "expected bits" in subtitle and "yours" in subtitle


# -- (e) ring_evictions ----------------------------------------------------------------------------
def evictions_whole_ring(ring_slots, sliding_window, start, num_tokens):
    """Forgets the window: every committed position the writes overwrite counts as lost."""
    return [(p % ring_slots, p - ring_slots) for p in range(start, start + num_tokens) if p >= ring_slots]


def evictions_off_by_one(ring_slots, sliding_window, start, num_tokens):
    """Believes the query at `start` needs only start - W + 2 onward."""
    return [(p % ring_slots, p - ring_slots) for p in range(start, start + num_tokens)
            if p - ring_slots >= max(0, start - sliding_window + 2)]


def evictions_of_empty_slots(ring_slots, sliding_window, start, num_tokens):
    """Counts slots that never held a position (p - S < 0) as evictions."""
    return [(p % ring_slots, p - ring_slots) for p in range(start, start + num_tokens)
            if p - ring_slots >= start - sliding_window + 1]


def test_ring_evictions_reference_agrees_with_the_package():
    from nwor_lab.exercises import ring_evictions
    from nwor_lab.kv import evicted_needed
    for case in ring_evictions.cases(1, 200):
        assert solutions.ring_evictions(**case.inputs) == evicted_needed(**case.inputs)


def test_ring_evictions_catches_forgetting_the_window():
    failed(exercises.check_ring_evictions(evictions_whole_ring), "ring_evictions", "edge", "not evicted-and-needed")


def test_ring_evictions_catches_an_off_by_one_window():
    failed(exercises.check_ring_evictions(evictions_off_by_one), "ring_evictions", "edge", "missing [(")


def test_ring_evictions_catches_empty_slots_counted_as_evictions():
    failed(exercises.check_ring_evictions(evictions_of_empty_slots), "ring_evictions", "edge", "was never written")


# -- (f) storage_offsets ---------------------------------------------------------------------------
def offsets_assuming_nhd(slots, layout, block_size, num_kv_heads, head_size):
    """Chapter 02's trap: the NHD formula whatever the layout."""
    h = torch.arange(num_kv_heads)
    off = (slots[:, None] * num_kv_heads + h) * head_size
    return torch.where(slots[:, None] >= 0, off, -1)


def offsets_without_padding(slots, layout, block_size, num_kv_heads, head_size):
    b, o, h = slots[:, None] // block_size, slots[:, None] % block_size, torch.arange(num_kv_heads)
    return ((b * block_size + o) * num_kv_heads + h) * head_size if layout == "NHD" else \
        ((b * num_kv_heads + h) * block_size + o) * head_size


def test_storage_offsets_catches_assuming_nhd():
    r = failed(exercises.check_storage_offsets(offsets_assuming_nhd), "storage_offsets", "slot 0, HND")
    assert "offsets: first difference at slot 0" in r.message
    texts = [t for trace in r.figure.data if trace.type == "heatmap" for row in trace.text for t in row]
    assert "s0·h1" in texts and r.figure.layout.shapes


def test_storage_offsets_catches_missing_padding():
    failed(exercises.check_storage_offsets(offsets_without_padding), "storage_offsets", "padding slot")


def test_storage_offsets_catches_int32_and_a_transposed_answer():
    r = failed(exercises.check_storage_offsets(as_dtype(solutions.storage_offsets, None, torch.int32)),
               "storage_offsets", "no slots")
    assert "dtype int32, the spec says int64" in r.message
    r = failed(exercises.check_storage_offsets(lambda **kw: solutions.storage_offsets(**kw).T.contiguous()),
               "storage_offsets", "no slots")
    assert "offsets: shape [2, 0], expected [0, 2]" in r.message


def test_storage_offsets_reference_agrees_with_the_cache_memory():
    from nwor_lab.exercises import storage_offsets as module
    from nwor_lab.kv import KVCacheSpec, PagedKVCache
    for case in module.cases(2, 60):
        i = case.inputs
        spec = KVCacheSpec(num_layers=1, num_blocks=case.context["num_blocks"], block_size=i["block_size"],
                           num_kv_heads=i["num_kv_heads"], head_size=i["head_size"], layout=i["layout"])
        layer = PagedKVCache(spec).layer(0)[0]
        got = solutions.storage_offsets(**i)
        for t, s in enumerate(i["slots"].tolist()):
            for h in range(i["num_kv_heads"]):
                want = -1 if s < 0 else layer[s // i["block_size"], s % i["block_size"], h].storage_offset() \
                    - layer.storage_offset()
                assert int(got[t, h]) == want, (case.note, s, h)


# -- (g) spec_decode_indices ----------------------------------------------------------------------
def indices_bonus_as_positions(num_draft_tokens, cu_num_scheduled_tokens):
    """Gives the bonus row's WINDOW POSITION instead of its row of logits."""
    logits, target, _ = solutions.spec_decode_indices(num_draft_tokens, cu_num_scheduled_tokens)
    return logits, target, (cu_num_scheduled_tokens - 1).to(torch.int32)


def indices_from_the_first_token(num_draft_tokens, cu_num_scheduled_tokens):
    """Takes each request's FIRST n + 1 positions (right for a pure verify window only)."""
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), cu_num_scheduled_tokens[:-1].long()])
    logits = [p for s, n in zip(starts.tolist(), num_draft_tokens.tolist()) for p in range(s, s + n + 1)]
    _, target, bonus = solutions.spec_decode_indices(num_draft_tokens, cu_num_scheduled_tokens)
    return torch.tensor(logits, dtype=torch.int32), target, bonus


def test_spec_decode_indices_catches_positions_for_rows():
    failed(exercises.check_spec_decode_indices(indices_bonus_as_positions), "spec_decode_indices", "prefill chunk",
           "bonus_logits_indices: first difference")


def test_spec_decode_indices_catches_a_prefill_read_from_its_start():
    failed(exercises.check_spec_decode_indices(indices_from_the_first_token), "spec_decode_indices", "prefill",
           "logits_indices: first difference at entry 0: expected 99 int32, got 0 int32")


def test_spec_decode_indices_catches_int64():
    r = failed(exercises.check_spec_decode_indices(as_dtype(solutions.spec_decode_indices, 0, torch.int64)),
               "spec_decode_indices", "no requests")
    assert "logits_indices: dtype int64, the spec says int32" in r.message


def test_spec_decode_indices_reference_agrees_with_the_metadata():
    from nwor_lab.exercises import spec_decode_indices as module
    from nwor_lab.speculative import SpecDecodeMetadata
    for case in module.cases(3, 80):
        i = case.inputs
        if not len(i["num_draft_tokens"]):
            continue
        meta = SpecDecodeMetadata.build(i["num_draft_tokens"].tolist(), i["cu_num_scheduled_tokens"].tolist())
        for mine, theirs in zip(solutions.spec_decode_indices(**i), (meta.logits_indices, meta.target_logits_indices,
                                                                       meta.bonus_logits_indices)):
            assert torch.equal(mine, theirs), case.note


# -- (h) greedy_sampled_ids -----------------------------------------------------------------------
def sampled_without_bonus(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len):
    """Emits nothing after a fully accepted row (forgets the bonus token)."""
    out = solutions.greedy_sampled_ids(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len)
    n = torch.diff(cu_num_draft_tokens.long(), prepend=torch.zeros(1, dtype=torch.long))
    for r, k in enumerate(n.tolist()):
        if int((out[r] != -1).sum()) == k + 1 and k == (out[r, :k] != -1).sum():
            out[r, k] = -1
    return out


def sampled_keeping_matches(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len):
    """Keeps every draft that matches its row, even after a rejection (no prefix rule)."""
    drafts, ends, argmax = draft_token_ids.tolist(), cu_num_draft_tokens.tolist(), target_argmax.tolist()
    out = torch.full((len(ends), max_spec_len + 1), -1, dtype=torch.int32)
    start = 0
    for r, end in enumerate(ends):
        row = [argmax[start + r + j] for j in range(end - start) if drafts[start + j] == argmax[start + r + j]]
        row.append(argmax[end + r] if len(row) == end - start else
                   argmax[start + r + next(j for j in range(end - start) if drafts[start + j] != argmax[start + r + j])])
        out[r, :len(row)] = torch.tensor(row, dtype=torch.int32)
        start = end
    return out


def test_greedy_sampled_ids_catches_a_missing_bonus():
    failed(exercises.check_greedy_sampled_ids(sampled_without_bonus), "greedy_sampled_ids", "plain decode")


def test_greedy_sampled_ids_catches_matches_after_a_rejection():
    r = failed(exercises.check_greedy_sampled_ids(sampled_keeping_matches), "greedy_sampled_ids", "d2 was rejected")
    assert r.figure.layout.shapes, "the wrong cells of your row are outlined"


def test_greedy_sampled_ids_catches_int64():
    r = failed(exercises.check_greedy_sampled_ids(as_dtype(solutions.greedy_sampled_ids, None, torch.int64)),
               "greedy_sampled_ids", "no requests")
    assert "sampled_token_ids: dtype int64, the spec says int32" in r.message


def test_greedy_sampled_ids_reference_agrees_with_the_sampler():
    from nwor_lab.exercises import greedy_sampled_ids as module
    from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
    for case in module.cases(4, 80):
        i, ctx = case.inputs, case.context
        if not ctx["counts"]:
            continue
        meta = SpecDecodeMetadata.make_dummy(ctx["drafts"])
        argmax = i["target_argmax"]
        logits = torch.zeros(len(argmax), int(argmax.max()) + 2)
        logits[torch.arange(len(argmax)), argmax] = 1.0
        sampled = rejection_sample(meta, None, logits)
        mine = solutions.greedy_sampled_ids(**i)
        assert torch.equal(mine[:, :sampled.shape[1]], sampled), case.note
        assert bool((mine[:, sampled.shape[1]:] == -1).all())


# -- (i) window_attention_mask --------------------------------------------------------------------
def mask_across_requests(query_lens):
    """Causal over the whole window: the second request reads the first one's rows."""
    t = int(query_lens.sum())
    return torch.ones(t, t, dtype=torch.bool).tril()


def mask_without_itself(query_lens):
    return solutions.window_attention_mask(query_lens) & ~torch.eye(int(query_lens.sum()), dtype=torch.bool)


def test_window_attention_mask_catches_reading_another_request():
    r = failed(exercises.check_window_attention_mask(mask_across_requests), "window_attention_mask", "two requests")
    assert "mask: first difference at query row 3" in r.message and r.figure.layout.shapes


def test_window_attention_mask_catches_a_query_that_misses_itself():
    failed(exercises.check_window_attention_mask(mask_without_itself), "window_attention_mask", "one row")


def test_window_attention_mask_catches_an_int_mask():
    r = failed(exercises.check_window_attention_mask(as_dtype(solutions.window_attention_mask, None, torch.uint8)),
               "window_attention_mask", "empty window")
    assert "mask: dtype uint8, the spec says bool" in r.message


def test_window_attention_mask_agrees_with_the_attention_metadata():
    """The window columns of each request's attention mask, when the writer buffers the window."""
    from nwor_lab import LabConfig
    from nwor_lab.kv import BlockAllocator, BlockTable, KVCacheSpec, PagedKVCache
    from nwor_lab.model.attention import AttentionMetadata
    from nwor_lab.policies import make_policy
    spec = KVCacheSpec(num_layers=1, num_blocks=16, block_size=4, num_kv_heads=1, head_size=8)
    cache = PagedKVCache(spec)
    policy = make_policy(LabConfig(nwor_mode="stage"), cache)
    prefix, qlens = [3, 5, 2], [4, 1, 3]
    alloc = BlockAllocator(spec.num_blocks)
    tables = [BlockTable(alloc, spec.block_size) for _ in prefix]
    for t, p, q in zip(tables, prefix, qlens):
        t.ensure(p + q)
    positions = [p + i for p, q in zip(prefix, qlens) for i in range(q)]
    md = AttentionMetadata.build(cache, policy, positions, qlens, [t.blocks for t in tables], prefix, attention="torch")
    mask = solutions.window_attention_mask(torch.tensor(qlens))
    start = 0
    for r, (p, q) in enumerate(zip(prefix, qlens)):
        assert torch.equal(md.mask(r)[:, p:], mask[start:start + q, start:start + q])
        assert not mask[start:start + q, :start].any() and not mask[start:start + q, start + q:].any()
        start += q


# -- (j) cow_restore_plan -------------------------------------------------------------------------
def plan_compacted(draft_slots, draft_mask, num_layers, bytes_per_token_layer):
    """Compacts on the host: only the rejected slots (the launch then needs a host sync)."""
    restore, logged, restored = solutions.cow_restore_plan(draft_slots, draft_mask, num_layers, bytes_per_token_layer)
    return restore[restore >= 0], logged, restored


def plan_counting_padding(draft_slots, draft_mask, num_layers, bytes_per_token_layer):
    restore = torch.where(draft_mask, -1, draft_slots)
    per_row = num_layers * bytes_per_token_layer
    return restore, len(draft_slots) * per_row, int((~draft_mask).sum()) * per_row     # padding counted


def test_cow_restore_plan_catches_compaction():
    failed(exercises.check_cow_restore_plan(plan_compacted), "cow_restore_plan", "every draft accepted",
           "restore_slots: shape [0], expected [3]")


def test_cow_restore_plan_catches_counting_padding():
    failed(exercises.check_cow_restore_plan(plan_counting_padding), "cow_restore_plan", "padding drafts",
           "bytes_logged: expected 2,048, got 6,144")


def test_cow_restore_plan_catches_a_tensor_for_an_int_and_int32_slots():
    def tensor_bytes(**kw):
        restore, logged, restored = solutions.cow_restore_plan(**kw)
        return restore, torch.tensor(logged), restored
    r = failed(exercises.check_cow_restore_plan(tensor_bytes), "cow_restore_plan", "no drafts")
    assert "bytes_logged: expected an int, got Tensor" in r.message
    r = failed(exercises.check_cow_restore_plan(as_dtype(solutions.cow_restore_plan, 0, torch.int32)),
               "cow_restore_plan", "no drafts")
    assert "restore_slots: dtype int32, the spec says int64" in r.message


def test_cow_restore_plan_agrees_with_the_policy_record():
    from nwor_lab import LabConfig
    from nwor_lab.kv import KVCacheSpec, PagedKVCache
    from nwor_lab.policies import make_policy
    from nwor_lab.policies.invariants import random_window, run_window
    spec = KVCacheSpec(num_layers=3, num_blocks=16, block_size=8, num_kv_heads=2, head_size=4)
    gen = torch.Generator().manual_seed(5)
    for _ in range(10):
        cache = PagedKVCache(spec)
        rw = random_window(cache, gen, num_reqs=5, max_k=4)
        record = run_window(make_policy(LabConfig(nwor_mode="cow"), cache), rw)
        _, logged, restored = solutions.cow_restore_plan(rw.window.draft_slots, rw.draft_mask, spec.num_layers,
                                                         spec.bytes_per_token_layer)
        assert (logged, restored) == (record.bytes_logged, record.bytes_restored)


# -- (k) acceptance_stats -------------------------------------------------------------------------
def stats_accepted_plus_one(drafted, accepted, emitted, k):
    """Counts accepted + 1 per window: the tokens of a window cut short that nobody received."""
    return solutions.acceptance_stats(drafted, accepted, accepted + 1, k)


def stats_float32(drafted, accepted, emitted, k):
    mean, rates = solutions.acceptance_stats(drafted, accepted, emitted, k)
    return mean, rates.float()


def stats_with_prefills(drafted, accepted, emitted, k):
    """Averages over every window, the prefills and decodes too."""
    mean, rates = solutions.acceptance_stats(drafted, accepted, emitted, k)
    return (float(emitted.double().mean()) if len(emitted) else 1.0), rates


def test_acceptance_stats_reference_is_the_engines_rule():
    """The reference is written out for the learner (its source is the last hint), so it cannot call
    the engine's `acceptance_stats`: the two are pinned here instead, on the checker's own cases
    turned into traces (one verify window per pair, a draft window beside it that must not count)."""
    from nwor_lab.engine.generate import acceptance_stats
    from nwor_lab.engine.trace import WindowTrace
    for case in exercises.exercise("acceptance_stats").cases(3, 60):
        i = case.inputs
        trace = []
        for step, (n, a, e) in enumerate(zip(i["drafted"].tolist(), i["accepted"].tolist(), i["emitted"].tolist())):
            trace += [WindowTrace(step, "verify", [0], drafted=[n], accepted=[a], emitted=[list(range(e))]),
                      WindowTrace(step, "draft", [0], drafted=[n], accepted=[0], emitted=[])]
        mean, rates = solutions.acceptance_stats(**i)
        engine_mean, engine_rates = acceptance_stats(trace, i["k"])
        assert mean == pytest.approx(engine_mean) and rates.tolist() == pytest.approx(engine_rates), case.note


def test_acceptance_stats_catches_accepted_plus_one():
    r = failed(exercises.check_acceptance_stats(stats_accepted_plus_one), "acceptance_stats", "last window cut")
    assert "mean_acceptance_length: expected 3, got 4" in r.message
    assert [t.type for t in r.figure.data] == ["bar", "bar"]


def test_acceptance_stats_catches_float32_and_prefills():
    r = failed(exercises.check_acceptance_stats(stats_float32), "acceptance_stats", "no windows")
    assert "by_position: dtype float32, the spec says float64" in r.message
    failed(exercises.check_acceptance_stats(stats_with_prefills), "acceptance_stats", "a prefill between")


def test_acceptance_stats_reference_agrees_with_the_engine():
    from nwor_lab.engine.generate import acceptance_stats
    from nwor_lab.engine.trace import WindowTrace
    from nwor_lab.exercises import acceptance_stats as module
    for case in module.cases(6, 80):
        i = case.inputs
        trace = [WindowTrace(step=0, kind="verify", req_ids=list(range(len(i["drafted"]))),
                             drafted=i["drafted"].tolist(), accepted=i["accepted"].tolist(),
                             emitted=[[0] * e for e in i["emitted"].tolist()])]
        mean, rates = acceptance_stats(trace, i["k"])
        mine = solutions.acceptance_stats(**i)
        assert mine[0] == pytest.approx(mean) and mine[1].tolist() == pytest.approx(rates), case.note


# -- the package's own definitions ------------------------------------------------------------------
def test_references_agree_with_the_package():
    """slot_mapping is the package's builder; acceptance_mask is SCV (emitted − 1), which equals the id
    comparison on sampler-shaped rows except where a zero-probability draft was recovered as itself."""
    from nwor_lab.exercises import acceptance_mask, slot_mapping
    for case in slot_mapping.cases(1, 120):
        i = case.inputs
        if i["positions"].numel():
            assert torch.equal(solutions.slot_mapping(**i), build_slot_mapping(**i))
    differ = 0
    for case in acceptance_mask.cases(1, 200):
        i = case.inputs
        mask, acc = solutions.acceptance_mask(**i)
        ref_mask, ref_acc, _ = scv_mask_reference(**i)
        assert torch.equal(mask, ref_mask) and torch.equal(acc, ref_acc), case.note
        differ += int((acc != accepted_len_by_ids(**i)).any())
    assert differ, "the cases include rows where comparing ids would accept a rejected draft"


# -- the counterexample pictures say what is wrong, and only that ------------------------------------
def test_acceptance_mask_picture_outlines_only_the_drafts_that_differ():
    r = exercises.check_acceptance_mask(acceptance_by_ids)
    expected_mask = r.expected[0]
    got_mask = torch.as_tensor(r.got[0]).bool()
    differing = int((got_mask != expected_mask).sum())
    assert differing and len(r.figure.layout.shapes) == differing, "one outline per draft whose fate differs"


def restore_swapping_key_and_value(key_cache, value_cache, log_key, log_value, draft_slots, draft_mask):
    """Restores the rejected slots, from the wrong half of the log: K from the value log and V from the key log."""
    return solutions.cow_restore(key_cache, value_cache, log_value, log_key, draft_slots, draft_mask)


@pytest.mark.parametrize("wrong", [restore_with_nhd_offsets, restore_swapping_key_and_value])
def test_cow_restore_picture_never_calls_a_wrongly_restored_slot_rejected_k_v_left(wrong):
    from nwor_lab.viz.states import SlotState
    r = exercises.check_cow_restore(wrong)
    assert r.status == "fail"
    yours = r.figure.data[1]      # the second panel: your cache
    hover = " ".join(str(t) for row in yours.customdata for t in row if t)
    assert "restored with the wrong bits" in hover or "written over" in hover, hover[:300]
    assert "NOT restored" not in hover
    states = {int(v) for row in yours.z for v in row if v is not None}
    assert int(SlotState.REJECTED) not in states, "no slot of a restore that wrote the wrong bits is 'rejected K/V left'"
