"""Tree attention (nwor_lab.speculative.tree_window): each node attends the cache prefix and its ancestors, positions are
depths. The reference against an independent per-query oracle, a chain as a tree, the argument
checks; the Triton kernel runs the tree cases under the interpreter in tests/test_verify_attention.py."""
import pytest
import torch
import torch.nn.functional as F

from nwor_lab.ops.verify_attention import verify_attention, verify_attention_reference
from nwor_lab.ops.verify_attention_cases import make_tree_attention_case, make_verify_attention_case
from nwor_lab.speculative.tree_window import ancestor_rows, chain_parents

PARENTS = [[0, 0, 1, 1, 2, 4, 4], [0], [0, 1, 0, 3, 3, 3]]


def oracle(case):
    """Per query: keys = the request's cached prefix (positions < n) then its ancestors' rows in
    depth order, plain SDPA with no mask at all."""
    a = case.kwargs()
    q, kc, vc, bt = a["q"], a["key_cache"], a["value_cache"], a["block_tables"]
    bs, h = kc.shape[1], kc.shape[2]
    groups = q.shape[1] // h
    out = torch.empty_like(q)
    qsl = a["query_start_loc"].tolist()
    for r, parents in enumerate(case.meta["parents"]):
        n = int(case.tree_lo[r])
        p = torch.arange(n)
        blk, off = bt[r].long()[p // bs], p % bs
        prefix_k, prefix_v = kc[blk, off], vc[blk, off]
        if case.win_rows is not None:
            rows = case.win_rows[case.win_start[r]:case.win_start[r + 1]].long()
            tree_k, tree_v = case.win_key[rows], case.win_value[rows]
        else:
            p = torch.arange(n, n + 1 + len(parents))
            blk, off = bt[r].long()[p // bs], p % bs
            tree_k, tree_v = kc[blk, off], vc[blk, off]
        for i, anc in enumerate(ancestor_rows(parents)):
            t = qsl[r] + i
            keys = torch.cat([prefix_k, tree_k[sorted(anc)]]).repeat_interleave(groups, 1)
            values = torch.cat([prefix_v, tree_v[sorted(anc)]]).repeat_interleave(groups, 1)
            o = F.scaled_dot_product_attention(q[t][:, None], keys.transpose(0, 1), values.transpose(0, 1),
                                               scale=a["scale"])
            out[t] = o[:, 0]
    return out


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_equals_per_query_oracle(window, dtype):
    case = make_tree_attention_case(PARENTS, window=window, dtype=dtype, head_size=16, max_context=40, seed=3)
    got = verify_attention(**case.kwargs(), backend="reference")
    want = oracle(case)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (got.float() - want.float()).abs().max() < tol


@pytest.mark.parametrize("window", [False, True])
def test_a_chain_as_a_tree_is_the_chain(window):
    chain = make_verify_attention_case(num_reqs=2, query_lens=[5, 3], context_lens=[9, 20], window=window,
                                       window_extra=0, head_size=16, dtype=torch.float32, seed=5)
    tree = make_tree_attention_case([chain_parents(4), chain_parents(2)], context_lens=[9, 20], window=window,
                                    head_size=16, dtype=torch.float32, seed=5)
    assert torch.equal(chain.positions, tree.positions)
    assert torch.equal(verify_attention(**chain.kwargs(), backend="reference"),
                       verify_attention(**tree.kwargs(), backend="reference"))


def test_siblings_do_not_see_each_other():
    # change a sibling's K/V: only queries that have it as an ancestor (or are it) move
    case = make_tree_attention_case([[0, 0, 1]], window=True, dtype=torch.float32, head_size=16,
                                    context_lens=[6], seed=7)
    base = verify_attention(**case.kwargs(), backend="reference")
    row = int(case.win_rows[2])                      # node 2 (sibling of node 1)
    case.win_key[row] += 3.0
    moved = (verify_attention(**case.kwargs(), backend="reference") != base).flatten(1).any(1)
    assert moved.tolist() == [False, False, True, False]


def test_tree_arguments_are_checked():
    case = make_tree_attention_case([[0, 0]], dtype=torch.float32, head_size=16, context_lens=[30], seed=1)
    kw = case.kwargs()
    with pytest.raises(ValueError, match="tree_lo: missing"):
        verify_attention(**{**kw, "tree_lo": None}, backend="reference")
    with pytest.raises(ValueError, match="ring cache is not supported"):
        verify_attention(**kw, sliding_window=8, ring_slots=16, backend="reference")
    with pytest.raises(ValueError, match="tree_mask: expected"):
        verify_attention(**{**kw, "tree_mask": kw["tree_mask"][:2]}, backend="reference")
    staged = make_tree_attention_case([[0, 0, 1]], window=True, dtype=torch.float32, head_size=16, context_lens=[30],
                                      seed=1)
    with pytest.raises(ValueError, match=r"tree_lo: request 0's tree starts at key 30, inside its cache"):
        verify_attention(**{**staged.kwargs(), "cache_lens": staged.cache_lens + 2}, backend="reference")
    deep = make_tree_attention_case([chain_parents(6)], dtype=torch.float32, head_size=16, context_lens=[30], seed=1)
    with pytest.raises(ValueError, match="keep depth < W"):
        verify_attention(**deep.kwargs(), sliding_window=5, backend="reference")


def test_case_bits_equal_the_window_bits():
    from nwor_lab.speculative.tree_window import TreeWindow
    parents = PARENTS + [[max(0, i - 3) for i in range(70)]]
    case = make_tree_attention_case(parents, head_size=16, dtype=torch.float32, seed=2)
    slots = torch.arange(sum(1 + len(p) for p in parents))
    w = TreeWindow.from_parents(parents, slots, slots)
    assert torch.equal(case.tree_mask, w.ancestors)
    assert torch.equal(case.positions - case.tree_lo.long().repeat_interleave(
        torch.tensor([1 + len(p) for p in parents])), w.token_depth.long())
