"""SpecDecodeMetadata: vLLM's example, a naive per-request builder, and argument errors."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nwor_lab.speculative.metadata import SpecDecodeMetadata


def naive_indices(num_draft, cu_sched):
    """One request at a time, straight from the definitions (the test's own reference)."""
    logits, target, bonus, cu_draft = [], [], [], []
    drafts_so_far = 0
    for n, end in zip(num_draft, cu_sched):
        row0 = len(logits)                       # this request's first logits row
        logits += list(range(end - n - 1, end))  # its last n + 1 scheduled tokens
        target += [row0 + j for j in range(n)]
        bonus.append(row0 + n)
        drafts_so_far += n
        cu_draft.append(drafts_so_far)
    return logits, target, bonus, cu_draft


def test_vllm_docstring_example():
    m = SpecDecodeMetadata.build([3, 0, 2, 0, 1], [4, 104, 107, 207, 209])
    assert m.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert m.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert m.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert m.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert m.num_draft_tokens == [3, 0, 2, 0, 1]
    assert m.max_spec_len == 3
    assert m.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    for t in (m.draft_token_ids, m.cu_num_draft_tokens, m.target_logits_indices,
              m.bonus_logits_indices, m.logits_indices):
        assert t.dtype == torch.int32


def test_drafts_read_from_input_ids_at_draft_positions():
    input_ids = torch.arange(1000, 1209)
    m = SpecDecodeMetadata.build([3, 0, 2, 0, 1], [4, 104, 107, 207, 209], input_ids=input_ids)
    # Drafts are each request's last n_r scheduled tokens.
    assert m.draft_token_ids.tolist() == [1001, 1002, 1003, 1105, 1106, 1208]


def test_make_dummy_is_a_pure_verify_window():
    m = SpecDecodeMetadata.make_dummy([[5, 6], [], [7]])
    assert m.draft_token_ids.tolist() == [5, 6, 7]
    assert m.logits_indices.tolist() == [0, 1, 2, 3, 4, 5]
    assert m.target_logits_indices.tolist() == [0, 1, 4]
    assert m.bonus_logits_indices.tolist() == [2, 3, 5]


def test_empty_batch():
    m = SpecDecodeMetadata.build([], [])
    assert m.max_spec_len == 0 and m.num_reqs == 0 and m.logits_indices.numel() == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5)), min_size=1, max_size=12))
def test_matches_naive_builder(reqs):
    num_draft = [n for n, _ in reqs]
    cu, total = [], 0
    for n, extra in reqs:                         # extra = prefill tokens before t_last
        total += n + 1 + extra
        cu.append(total)
    drafts = list(range(100, 100 + sum(num_draft)))
    m = SpecDecodeMetadata.build(num_draft, torch.tensor(cu, dtype=torch.int32), drafts)
    logits, target, bonus, cu_draft = naive_indices(num_draft, cu)
    assert m.logits_indices.tolist() == logits
    assert m.target_logits_indices.tolist() == target
    assert m.bonus_logits_indices.tolist() == bonus
    assert m.cu_num_draft_tokens.tolist() == cu_draft
    assert m.draft_token_ids.tolist() == drafts
    assert m.max_spec_len == max(num_draft)
    assert len(m.logits_indices) == sum(num_draft) + len(num_draft)


@pytest.mark.parametrize("num_draft, cu, needle", [
    ([1, 2], [2], "one entry per request"),
    ([1, -1], [2, 4], "negative draft count"),
    ([2, 0], [2, 3], r"must schedule at least num_draft_tokens\[r\] \+ 1 = 3"),
    ([0, 0], [3, 2], "non-decreasing"),
])
def test_bad_inputs_name_the_problem(num_draft, cu, needle):
    with pytest.raises(ValueError, match=needle):
        SpecDecodeMetadata.build(num_draft, cu)


def test_wrong_draft_count_names_argument():
    with pytest.raises(ValueError, match="draft_token_ids"):
        SpecDecodeMetadata.build([2, 1], [3, 5], torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="draft_token_ids"):
        SpecDecodeMetadata.build([1], [2], torch.tensor([1.0]))
