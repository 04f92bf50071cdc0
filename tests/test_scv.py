"""SCV acceptance: the host loop (`off`) and the vectorised op agree, bounds clamp, errors."""
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nwor_lab.ops.scv import scv_mask, scv_mask_reference
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
def test_fewer_columns_than_drafts_rejects_out_of_bounds(mode):
    drafts, cu, sampled, _, _ = example()
    acc = compute_acceptance(drafts, cu, sampled[:, :1], mode=mode)
    assert acc.draft_mask.tolist() == [True, False, False, True, False]
    assert acc.accepted_len.tolist() == [1, 0, 1]
    acc = compute_acceptance(drafts, cu, sampled[:, :0], mode=mode)   # zero columns: all rejected
    assert acc.draft_mask.tolist() == [False] * 5 and acc.accepted_len.tolist() == [0, 0, 0]


def test_match_after_a_mismatch_is_not_accepted():
    # Prefix rule: d2 and d3 equal their columns but d1 does not.
    drafts = torch.tensor([1, 2, 3], dtype=I32)
    sampled = torch.tensor([[9, 2, 3, -1]], dtype=I32)
    dm, al, _ = scv_mask_reference(drafts, torch.tensor([3], dtype=I32), sampled)
    assert dm.tolist() == [False, False, False] and al.tolist() == [0]


def naive_accepted_len(drafts, cu, sampled):
    out, start = [], 0
    for r, end in enumerate(cu):
        a = 0
        while start + a < end and a < len(sampled[r]) and sampled[r][a] == drafts[start + a]:
            a += 1
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
        d = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        if draw(st.booleans()):
            a = draw(st.integers(0, n))
            nxt = draw(st.integers(0, 3).filter(lambda t: a == n or t != d[a]))
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
def test_off_equals_vectorised(w):
    drafts, cu, sampled, tr, tp = w
    ref = compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode="off")
    assert ref.accepted_len.tolist() == naive_accepted_len(drafts.tolist(), cu.tolist(), sampled.tolist())
    for mode in ("graph", "adaptive"):
        assert_same(ref, compute_acceptance(drafts, cu, sampled, token_req=tr, token_draft_pos=tp, mode=mode))
    runner = ScvRunner("graph")
    assert_same(ref, runner(drafts, cu, sampled, token_req=tr, token_draft_pos=tp))
    # Without the token map there is no commit mask, the rest is unchanged.
    no_tok = compute_acceptance(drafts, cu, sampled, mode="graph")
    assert no_tok.commit_mask is None and torch.equal(no_tok.draft_mask, ref.draft_mask)


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
        start += int(n[r])
    cu = torch.cumsum(n, 0).to(dtype)
    ref = compute_acceptance(drafts, cu, sampled, mode="off")
    assert int(ref.num_accepted) > 200                    # the case really exercises acceptance
    assert_same(ref, compute_acceptance(drafts, cu, sampled, mode="graph"))
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
    assert full.accepted_len.tolist() == [2, 0, 2] and short.accepted_len.tolist() == [2, 0, 2]
    assert short.draft_mask.tolist() == [True, True, False, True, True]
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
