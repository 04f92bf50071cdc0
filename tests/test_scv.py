"""SCV acceptance: counted as vLLM's runner counts it (emitted - 1), padding drafts, the host
loop (`off`) and the vectorised op agree, bounds clamp, errors."""
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nwor_lab.ops.scv import accepted_len_by_ids, check_against_ids, scv_mask, scv_mask_reference
from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import rejection_sample
from nwor_lab.speculative.scv import Acceptance, ScvRunner, compute_acceptance

I32 = torch.int32


def example():
    drafts = torch.tensor([5, 6, 7, 8, 9], dtype=I32)
    cu = torch.tensor([3, 3, 5], dtype=I32)                 # 3 drafts, 0 drafts, 2 drafts
    sampled = torch.tensor([[5, 6, 1, -1],                  # d3 rejected (recovered 1)
                            [4, -1, -1, -1],                # no drafts
                            [8, 9, 3, -1]], dtype=I32)      # all accepted, bonus 3
    # Window tokens: [t_last, d1..d3], [t], [t_last, d1, d2]
    token_req = torch.tensor([0, 0, 0, 0, 1, 2, 2, 2], dtype=I32)
    token_draft_pos = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2], dtype=I32)
    return drafts, cu, sampled, token_req, token_draft_pos


@pytest.mark.parametrize("mode", ["off", "graph", "adaptive"])
def test_hand_example(mode):
    drafts, cu, sampled, tr, tp = example()
    acc = compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode=mode)
    assert acc.draft_mask.tolist() == [True, True, False, True, True]
    assert acc.accepted_len.dtype == I32 and acc.accepted_len.tolist() == [2, 0, 2]
    assert acc.commit_mask.tolist() == [True, True, True, False, True, True, True, True]
    assert int(acc.num_accepted) == 4 and acc.accepted_per_request() == [2, 0, 2]


@pytest.mark.parametrize("mode", ["off", "graph"])
def test_fewer_columns_than_drafts_count_what_is_there(mode):
    # Each row's last non-placeholder column is read as the emitted token (vLLM's count), so a
    # draft needs its own column AND one after it: with one column nothing is accepted.
    drafts, cu, sampled, _, _ = example()
    acc = compute_acceptance(drafts, cu, sampled[:, :2], mode=mode)
    assert acc.draft_mask.tolist() == [True, False, False, True, False]
    assert acc.accepted_len.tolist() == [1, 0, 1]
    acc = compute_acceptance(drafts, cu, sampled[:, :0], mode=mode)   # zero columns: all rejected
    assert acc.draft_mask.tolist() == [False] * 5 and acc.accepted_len.tolist() == [0, 0, 0]


def test_id_rule_needs_every_earlier_draft():
    # Prefix rule of the id comparison: d2 and d3 equal their columns but d1 does not. (Such a
    # row is no sampler's output: the count says 2, and check_against_ids rejects it.)
    drafts, cu = torch.tensor([1, 2, 3], dtype=I32), torch.tensor([3], dtype=I32)
    sampled = torch.tensor([[9, 2, 3, -1]], dtype=I32)
    assert accepted_len_by_ids(drafts, cu, sampled).tolist() == [0]
    with pytest.raises(AssertionError, match="count says 2 accepted but comparing ids says 0"):
        check_against_ids(drafts, cu, sampled, scv_mask_reference(drafts, cu, sampled)[1])
    with pytest.raises(AssertionError, match="do not read as"):      # two tokens after no accepted draft
        check_against_ids(drafts, cu, torch.tensor([[3, 4, -1, -1]], dtype=I32), torch.tensor([0], dtype=I32))


def zero_probability_case():
    """Case 2 of the vLLM fidelity issue, from the lab's own sampler: draft 2 has draft
    probability 0, so it is rejected, and the recovered token (from max(p - q, 0), which keeps
    p(2)) is 2 itself. Returns drafts, cu, sampled ids, token_req, token_draft_pos."""
    m = SpecDecodeMetadata.make_dummy([[2, 5]])
    q = torch.tensor([[0.5, 0.5, 0.0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0, 0, 0]])
    logits = torch.zeros(3, 8)
    for seed in range(100):
        out = rejection_sample(m, q, logits, temperature=1.0, generator=torch.Generator().manual_seed(seed))
        if out[0, 0] == 2:
            break
    assert out.tolist() == [[2, -1, -1]]
    tr, tp = torch.tensor([0, 0, 0], dtype=I32), torch.tensor([0, 1, 2], dtype=I32)
    return m.draft_token_ids, m.cu_num_draft_tokens, out, tr, tp


@pytest.mark.parametrize("mode", ["off", "graph", "adaptive"])
def test_zero_probability_draft_recovered_as_itself_is_not_accepted(mode):
    drafts, cu, sampled, tr, tp = zero_probability_case()
    acc = compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode=mode)
    assert acc.accepted_len.tolist() == [0] and acc.draft_mask.tolist() == [False, False]
    assert acc.commit_mask.tolist() == [True, False, False]      # t_last only


def test_id_comparison_disagrees_exactly_where_expected():
    drafts, cu, sampled, _, _ = zero_probability_case()
    assert accepted_len_by_ids(drafts, cu, sampled).tolist() == [1]   # ids would accept d1
    counted = scv_mask_reference(drafts, cu, sampled)[1]
    assert counted.tolist() == [0]
    check_against_ids(drafts, cu, sampled, counted)                   # the documented exception
    # Anywhere else a disagreement is an error: 2 accepted but d2 = 5 is not echoed.
    with pytest.raises(AssertionError, match="emitted count says 2 .* comparing ids says 1"):
        check_against_ids(drafts, cu, torch.tensor([[2, 9, 4]], dtype=I32), torch.tensor([2], dtype=I32))
    with pytest.raises(AssertionError, match="comparing ids says 0"):             # a padding draft accepted
        check_against_ids(torch.tensor([-1, 5], dtype=I32), cu, torch.tensor([[-1, 5, -1]], dtype=I32),
                          torch.tensor([1], dtype=I32))


@pytest.mark.parametrize("mode", ["off", "graph", "adaptive"])
def test_padding_draft_is_rejected_from_sampler_output(mode):
    # vLLM pads draft slots with -1; its sampler (and the lab's) always rejects them.
    m = SpecDecodeMetadata.make_dummy([[-1, 3], [4, -1, 6], [1]])
    logits = torch.zeros(9, 8)
    logits[torch.arange(9), torch.tensor([3, 0, 0, 4, 6, 1, 0, 1, 2])] = 5.0
    tr = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2], dtype=I32)
    tp = torch.tensor([0, 1, 2, 0, 1, 2, 3, 0, 1], dtype=I32)
    for temp in (0.0, 1.0):
        sampled = rejection_sample(m, None, logits, temperature=temp, generator=torch.Generator().manual_seed(1))
        acc = compute_acceptance(m.draft_token_ids, m.cu_num_draft_tokens, sampled, token_req=tr,
                                 token_draft_pos=tp, mode=mode)
        assert acc.accepted_len.tolist()[:2] == [0, 1]               # stops at the padding draft
        assert acc.draft_mask.tolist()[:5] == [False, False, True, False, False]
        assert acc.commit_mask.tolist()[:7] == [True, False, False, True, True, False, False]


@pytest.mark.parametrize("mode", ["off", "graph"])
def test_padding_draft_is_rejected_even_if_sampled_ids_echo_it(mode):
    # Not a sampler's output, but a -1 draft must never match a -1 placeholder or an echoed -1.
    drafts = torch.tensor([-1, 3, 5], dtype=I32)
    cu = torch.tensor([3], dtype=I32)
    sampled = torch.tensor([[-1, 3, 5, 7]], dtype=I32)
    acc = compute_acceptance(drafts, cu, sampled, mode=mode)
    assert acc.accepted_len.tolist() == [0] and acc.draft_mask.tolist() == [False, False, False]


def test_commit_mask_drops_padding_drafts_and_what_follows():
    """Window -> commit mask: a -1 draft and every later draft of its request are never committed."""
    from nwor_lab.window import Window
    w = Window.from_counts([3, 2], [2, 1], torch.arange(5), draft_token_ids=torch.tensor([7, -1, 9]))
    sampled = torch.tensor([[7, 2, -1], [9, 4, -1]], dtype=I32)       # d2 = -1 rejected, 2 emitted
    dm, al, cm = scv_mask(w.draft_token_ids, w.cu_num_draft_tokens, sampled, w.token_req, w.token_draft_pos)
    assert al.tolist() == [1, 1] and dm.tolist() == [True, False, True]
    assert cm.tolist() == [True, True, False, True, True]
    assert torch.equal(w.commit_mask_from(al), cm)


def naive_accepted_len(drafts, cu, sampled):
    """vLLM's runner: emitted - 1, no more than the request's drafts, stopping at a -1 draft."""
    out, start = [], 0
    for r, end in enumerate(cu):
        a = min(max(sum(t != -1 for t in sampled[r]) - 1, 0), end - start)
        a = next((j for j in range(a) if drafts[start + j] < 0), a)
        out.append(a)
        start = end
    return out


@st.composite
def windows(draw, max_reqs=10, max_k=6):
    """Random windows: realistic sampler rows (prefix, then one token, then -1) or noise rows
    over a tiny vocab, and a column count that may be short or zero."""
    num_draft = draw(st.lists(st.integers(0, max_k), min_size=1, max_size=max_reqs))
    k = max(num_draft)
    cols = draw(st.sampled_from([k + 1, k + 1, k, 1, 0]))
    drafts, rows = [], []
    for n in num_draft:
        d = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
        if draw(st.booleans()):
            real = next((j for j in range(n) if d[j] < 0), n)          # a sampler rejects -1 drafts
            a = draw(st.integers(0, real))
            nxt = draw(st.integers(0, 3))                              # may equal d[a]: q(x) = 0
            row = d[:a] + [nxt] + [-1] * (k - a)
        else:
            row = draw(st.lists(st.integers(-1, 3), min_size=k + 1, max_size=k + 1))
        drafts += d
        rows.append(row[:cols])
    cu = torch.cumsum(torch.tensor(num_draft), 0)
    sampled = torch.tensor(rows, dtype=I32).reshape(len(num_draft), cols)
    token_req, token_pos = [], []
    for r, n in enumerate(num_draft):
        extra = draw(st.integers(0, 2))                  # prefill tokens always commit
        token_req += [r] * (extra + 1 + n)
        token_pos += [0] * (extra + 1) + list(range(1, n + 1))
    return (torch.tensor(drafts, dtype=I32), cu.to(I32), sampled,
            torch.tensor(token_req, dtype=I32), torch.tensor(token_pos, dtype=I32))


def assert_same(a: Acceptance, b: Acceptance):
    assert torch.equal(a.draft_mask, b.draft_mask)
    assert torch.equal(a.accepted_len, b.accepted_len)
    assert (a.commit_mask is None) == (b.commit_mask is None)
    if a.commit_mask is not None:
        assert torch.equal(a.commit_mask, b.commit_mask)


@settings(max_examples=150, deadline=None)
@given(windows())
def test_vectorised_counts_like_vllm(w):
    drafts, cu, sampled, tr, tp = w
    ref = compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode="graph")
    assert ref.accepted_len.tolist() == naive_accepted_len(drafts.tolist(), cu.tolist(), sampled.tolist())
    n = torch.diff(cu, prepend=cu.new_zeros(1)).long()
    pos = torch.arange(drafts.shape[0]) - (cu.long() - n).repeat_interleave(n)
    assert torch.equal(ref.draft_mask, pos < ref.accepted_len.long().repeat_interleave(n))
    assert torch.equal(ref.commit_mask, tp <= ref.accepted_len[tr.long()])
    assert_same(ref, compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode="adaptive"))
    assert_same(ref, ScvRunner("graph")(drafts, cu, sampled, token_req=tr, token_draft_pos=tp))
    # Without the token map there is no commit mask, the rest is unchanged.
    no_tok = compute_acceptance(drafts, cu, sampled, mode="graph")
    assert no_tok.commit_mask is None and torch.equal(no_tok.draft_mask, ref.draft_mask)


@settings(max_examples=150, deadline=None)
@given(windows())
def test_off_equals_vectorised(w):
    drafts, cu, sampled, tr, tp = w
    ref = compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode="graph")
    assert_same(ref, compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode="off"))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_more_than_512_drafts(dtype):
    g = torch.Generator().manual_seed(0)
    num_reqs, k = 160, 7                                  # 1120 drafts: past one 512-thread block
    n = torch.randint(0, k + 1, (num_reqs,), generator=g)
    n[:100] = k
    drafts = torch.randint(0, 3, (int(n.sum()),), generator=g, dtype=dtype)
    sampled = torch.randint(-1, 3, (num_reqs, k + 1), generator=g, dtype=dtype)
    start = 0                                             # make long prefixes common
    for r in range(num_reqs):
        a = int(torch.randint(0, int(n[r]) + 1, (1,), generator=g))
        sampled[r, :a] = drafts[start:start + a]
        sampled[r, a] = 2                                 # the emitted token, then placeholders
        sampled[r, a + 1:] = -1
        start += int(n[r])
    cu = torch.cumsum(n, 0).to(dtype)
    ref = compute_acceptance(drafts, cu, sampled, mode="graph")
    assert int(ref.num_accepted) > 200                    # the case really exercises acceptance
    assert ref.accepted_len.tolist() == naive_accepted_len(drafts.tolist(), cu.tolist(), sampled.tolist())


def test_dispatching_op_uses_reference_on_cpu():
    drafts, cu, sampled, tr, tp = example()
    for x, y in zip(scv_mask(drafts, cu, sampled, tr, tp), scv_mask_reference(drafts, cu, sampled, tr, tp)):
        assert torch.equal(x, y)


def test_shape_and_dtype_errors_name_the_argument():
    drafts, cu, sampled, tr, tp = example()
    for mode in ("off", "graph"):
        with pytest.raises(ValueError, match=r"sampled_token_ids.*2-D.*max_spec_len \+ 1"):
            compute_acceptance(drafts, cu, sampled[0], mode=mode)   # 1-D is an error, no fallback
        with pytest.raises(TypeError, match="sampled_token_ids"):
            compute_acceptance(drafts, cu, sampled.float(), mode=mode)
        with pytest.raises(ValueError, match="draft_token_ids"):
            compute_acceptance(drafts[None], cu, sampled, mode=mode)
        with pytest.raises(TypeError, match="draft_token_ids"):
            compute_acceptance(drafts.float(), cu, sampled, mode=mode)
        with pytest.raises(ValueError, match="cu_num_draft_tokens"):
            compute_acceptance(drafts, cu[:2], sampled, mode=mode)
        with pytest.raises(ValueError, match="cu_num_draft_tokens"):
            compute_acceptance(drafts, torch.tensor([3, 3, 4], dtype=I32), sampled, mode=mode)
        with pytest.raises(ValueError, match="token_draft_pos"):
            compute_acceptance(drafts, cu, sampled, token_req=tr, mode=mode)
        with pytest.raises(ValueError, match="token_draft_pos"):
            compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp[:3], mode=mode)
    with pytest.raises(ValueError, match="mode"):
        compute_acceptance(drafts, cu, sampled, mode="fast")
    with pytest.raises(ValueError, match="mode"):
        ScvRunner("graphs")


@pytest.mark.parametrize("mode", ["off", "graph", "adaptive"])
def test_runner_warns_once_on_clamp_and_says_how(mode, caplog):
    drafts, cu, sampled, _, _ = example()
    runner = ScvRunner(mode)
    with caplog.at_level(logging.WARNING, logger="nwor_lab.scv"):
        full = runner(drafts, cu, sampled)
        assert not caplog.records                          # enough columns: no warning
        for _ in range(3):
            short = runner(drafts, cu, sampled[:, :2])
    assert len([r for r in caplog.records if "bounds clamp" in r.getMessage()]) == 1
    assert full.accepted_len.tolist() == [2, 0, 2] and short.accepted_len.tolist() == [1, 0, 1]
    assert short.draft_mask.tolist() == [True, False, False, True, False]
    expected = "per-request host loop" if mode == "off" else "vectorised (CPU: no CUDA graphs)"
    assert runner.how == expected


@pytest.mark.gpu
def test_reference_captures_in_a_cuda_graph():
    drafts, cu, sampled, tr, tp = (t.cuda() for t in example())
    want = scv_mask_reference(drafts, cu, sampled, tr, tp)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                            # warm up outside the capture
        scv_mask_reference(drafts, cu, sampled, tr, tp)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = scv_mask_reference(drafts, cu, sampled, tr, tp)
    sampled.copy_(torch.tensor([[5, 6, 7, 2], [4, -1, -1, -1], [0, -1, -1, -1]], dtype=I32))
    graph.replay()
    assert out[0].tolist() == [True, True, True, False, False] and out[1].tolist() == [3, 0, 0]
    assert not torch.equal(out[1], want[1])


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(windows(max_reqs=40))
def test_cuda_op_matches_reference(w):
    from nwor_lab.ops.backend import backend
    if backend("cuda").name != "cuda":
        pytest.skip("the CUDA extension is not available here")
    w = [t.cuda() for t in w]
    for tok in (w[3:], (None, None)):
        got = scv_mask(*w[:3], *tok)
        want = scv_mask_reference(*w[:3], *tok)
        for x, y in zip(got, want):
            assert (x is None and y is None) or torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["graph", "adaptive"])
def test_runner_on_cuda_equals_off(mode):
    if mode == "graph":                                   # graph mode needs the graph runner
        pytest.importorskip("nwor_lab.speculative.scv_graph")
    drafts, cu, sampled, tr, tp = (t.cuda() for t in example())
    ref = compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode="off")
    runner = ScvRunner(mode)
    for _ in range(3):                                    # capture, then replays
        assert_same(ref, runner(drafts, cu, sampled, token_req=tr, token_draft_pos=tp))
    assert runner.how.startswith(("CUDA graph", "vectorised eager"))


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_debug_commit_accepts_vllm_count_and_rejects_id_count(mode):
    """Debug mode's cross-check against the sampler's output (check_against_sampler, run by the
    engine before the commit): the zero-probability case commits with the emitted count (0
    accepted) and no complaint; an acceptance that counted by ids (1 accepted) is an error."""
    from nwor_lab import LabConfig
    from nwor_lab.kv import KVCacheSpec, PagedKVCache
    from nwor_lab.policies import make_policy
    from nwor_lab.speculative import check_against_sampler
    from nwor_lab.window import Window

    drafts, cu, sampled, _, _ = zero_probability_case()
    cache = PagedKVCache(KVCacheSpec(num_layers=2, num_blocks=4, block_size=4, num_kv_heads=2, head_size=8,
                                     dtype=torch.float32))
    for claimed, ok in ((0, True), (1, False)):
        policy = make_policy(LabConfig(nwor_mode=mode, scv_mode="graph", debug=True), cache)
        window = Window.from_counts([3], [2], torch.tensor([0, 1, 2]), draft_token_ids=drafts)
        policy.begin(window)
        for layer in range(2):
            policy.write(layer, torch.randn(3, 2, 8), torch.randn(3, 2, 8))
        mask = torch.tensor([False, False]) if claimed == 0 else torch.tensor([True, False])
        acceptance = Acceptance.from_draft_mask(window, mask)
        assert torch.equal(ScvRunner("graph").accept(window, sampled).accepted_len, torch.tensor([0], dtype=I32))
        if ok:
            check_against_sampler(window, acceptance, sampled, "graph")
            assert policy.commit(acceptance).num_accepted == 0
        else:
            with pytest.raises(AssertionError, match="comparing ids|sampler"):
                check_against_sampler(window, acceptance, sampled, "graph")
            policy.cancel()
