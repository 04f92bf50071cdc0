"""Every checker passes the reference solutions and catches a planted wrong one, reporting the
first counterexample in words and in a picture."""
import plotly.graph_objects as go
import pytest
import torch

from nwor_lab.ops.scv import accepted_len_by_ids

from nwor_lab import exercises
from nwor_lab.exercises import solutions
from nwor_lab.kv import build_slot_mapping
from nwor_lab.ops.quant import raw
from nwor_lab.speculative.scv import compute_acceptance

CHECKS = {name: getattr(exercises, f"check_{name}") for name in exercises.NAMES}


@pytest.mark.parametrize("name", exercises.NAMES)
def test_solutions_pass(name, capsys):
    result = CHECKS[name](exercises.choose(name, None, use_solutions=True))
    assert result and result.figure is None
    assert capsys.readouterr().out.strip() == f"PASS {name} (300 cases)"


def test_choose_and_spec():
    mine = lambda **kw: None  # noqa: E731
    assert exercises.choose("cow_restore", mine) is mine
    assert exercises.choose("cow_restore", mine, use_solutions=True) is solutions.cow_restore
    assert "accepted_len" in exercises.spec("acceptance_mask")
    with pytest.raises(ValueError, match="choose one of"):
        exercises.choose("slots", mine)


def test_references_agree_with_the_package():
    """The exercise references agree with nwor_lab's own ops where those define the same thing."""
    from nwor_lab.exercises import acceptance_mask, slot_mapping
    for case in slot_mapping.cases(1, 120):
        i = case.inputs
        if i["positions"].numel():
            assert torch.equal(solutions.slot_mapping(**i), build_slot_mapping(**i))
    for case in acceptance_mask.cases(1, 120):
        # the exercise compares ids (the prefix rule); the package's SCV counts as vLLM does
        # (emitted - 1) and keeps the id comparison as accepted_len_by_ids: the same definition
        i = case.inputs
        mask, acc = solutions.acceptance_mask(**i)
        assert torch.equal(acc, accepted_len_by_ids(**i))
        if bool((acc == compute_acceptance(**i, mode="graph").accepted_len).all()):
            assert torch.equal(mask, compute_acceptance(**i, mode="graph").draft_mask)


def failed(result, name, note_part):
    assert not result and result.exercise == name
    assert result.message.startswith(f"FAIL {name}: case ") and note_part in result.message
    assert "expected:" in result.message and "got:" in result.message
    assert isinstance(result.figure, go.Figure)
    result.figure.to_json()
    return result


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
    highlighted = [s for s in r.figure.layout.shapes]
    assert highlighted, "the wrong slots are outlined"
    assert capsys.readouterr().out.startswith("FAIL slot_mapping")


def test_slot_mapping_catches_off_by_one():
    r = failed(exercises.check_slot_mapping(slot_mapping_off_by_one), "slot_mapping", "edge")
    assert r.case_index == 1        # one token at position 0: the smallest window that shows it


# -- (b) acceptance_mask -------------------------------------------------------------------------
def acceptance_without_prefix(draft_token_ids, cu_num_draft_tokens, sampled_token_ids):
    mask, acc = [], []
    start = 0
    for r, end in enumerate(cu_num_draft_tokens.tolist()):
        row = [j < sampled_token_ids.shape[1] and draft_token_ids[start + j] != -1 and
               int(sampled_token_ids[r, j]) == int(draft_token_ids[start + j]) for j in range(end - start)]
        mask += row                                       # every match counts, even after a mismatch
        acc.append(sum(row))
        start = end
    return torch.tensor(mask, dtype=torch.bool), torch.tensor(acc, dtype=torch.int32)


def acceptance_trusting_padding(draft_token_ids, cu_num_draft_tokens, sampled_token_ids):
    """The prefix rule with bounds, but a -1 draft "matches" a -1 placeholder."""
    drafts, ends = draft_token_ids.tolist(), cu_num_draft_tokens.tolist()
    sampled, num_cols = sampled_token_ids.tolist(), sampled_token_ids.shape[1]
    mask, acc, start = [False] * len(drafts), [], 0
    for r, end in enumerate(ends):
        a = 0
        while start + a < end and a < num_cols and sampled[r][a] == drafts[start + a]:
            mask[start + a] = True
            a += 1
        acc.append(a)
        start = end
    return torch.tensor(mask, dtype=torch.bool), torch.tensor(acc, dtype=torch.int32)


def test_acceptance_mask_catches_missing_prefix_rule():
    r = failed(exercises.check_acceptance_mask(acceptance_without_prefix), "acceptance_mask", "prefix rule")
    assert "draft_mask: first difference at draft 2" in r.message
    assert len([t for t in r.figure.data if t.type == "heatmap"]) == 2   # expected above got


def test_acceptance_mask_catches_padding_drafts():
    failed(exercises.check_acceptance_mask(acceptance_trusting_padding), "acceptance_mask", "padding drafts")


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
    r = failed(exercises.check_stage_commit_rows(commit_rows_with_padding), "stage_commit_rows", "slot -1")
    assert "rows: shape" in r.message


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
    r = failed(exercises.check_ring_evictions(evictions_whole_ring), "ring_evictions", "edge")
    assert "not evicted-and-needed" in r.message


def test_ring_evictions_catches_an_off_by_one_window():
    r = failed(exercises.check_ring_evictions(evictions_off_by_one), "ring_evictions", "edge")
    assert "missing [(" in r.message


def test_ring_evictions_catches_empty_slots_counted_as_evictions():
    r = failed(exercises.check_ring_evictions(evictions_of_empty_slots), "ring_evictions", "edge")
    assert "was never written" in r.message
