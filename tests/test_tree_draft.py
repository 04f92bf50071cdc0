"""Draft trees: EAGLE-2's dynamic expansion and rerank against a brute-force host version, a chain as
topk 1, static trees, shape checks."""
import itertools

import pytest
import torch

from nwor_lab.speculative.tree_draft import check_tree_shape, dynamic_tree, static_tree
from nwor_lab.speculative.tree_window import TreeWindow

V = 7


def toy_logprobs(path: tuple) -> torch.Tensor:
    """A deterministic draft distribution for the children of the node reached by `path` (tokens)."""
    g = torch.Generator().manual_seed(hash(path) % (2 ** 31))
    return torch.log_softmax(torch.randn(V, generator=g) * 2, -1)


class ToyStep:
    """step() over R requests whose roots differ by a request token; remembers each row's path."""

    def __init__(self, roots):
        self.roots = roots
        self.paths = []          # per step row: [R] paths
        self.calls = 0

    def __call__(self, tokens, parent_rows, level):
        R, F = tokens.shape
        out = torch.empty(R, F, V)
        for f in range(F):
            row = []
            for r in range(R):
                pr = int(parent_rows[r, f])
                base = (self.roots[r],) if pr < 0 else self.paths[pr][r]
                path = base + (int(tokens[r, f]),)
                row.append(path)
                out[r, f] = toy_logprobs(path)
            self.paths.append(row)
        self.calls += 1
        return out


def brute_force(root, topk, depth, num_nodes):
    """EAGLE-2 on the host: every candidate with its cumulative score; the best num_nodes."""
    pool = []                                    # (score, order, path)
    lp = toy_logprobs((root,))
    front = []
    for t in lp.topk(topk).indices.tolist():
        pool.append((float(lp[t]), len(pool), (t,)))
        front.append(pool[-1])
    for _ in range(1, depth):
        cands = []
        for score, _, path in front:
            lp = toy_logprobs((root,) + path)
            vals, toks = lp.topk(topk)
            for v, t in zip(vals.tolist(), toks.tolist()):
                # same float32 sums as the device version
                cands.append((float(torch.tensor(score) + torch.tensor(v)), len(pool), path + (t,)))
                pool.append(cands[-1])
        front = sorted(cands, key=lambda c: (-c[0], c[1]))[:topk]
    kept = sorted(sorted(pool, key=lambda c: (-c[0], c[1]))[:num_nodes], key=lambda c: c[1])
    return [c[2] for c in kept]


@pytest.mark.parametrize("topk,depth,num_nodes", [(3, 4, 12), (2, 5, 9), (4, 2, 20), (1, 5, 5)])
def test_dynamic_tree_equals_brute_force(topk, depth, num_nodes):
    roots = [1, 4]
    step = ToyStep(roots)
    root_lp = torch.stack([toy_logprobs((r,)) for r in roots])
    tree = dynamic_tree(step, root_lp, topk, depth, num_nodes)
    assert step.calls == depth - 1
    for r, root in enumerate(roots):
        want = brute_force(root, topk, depth, num_nodes)
        par, tok = tree.parents[r].tolist(), tree.tokens[r].tolist()
        paths = []
        for i in range(num_nodes):            # rebuild each node's path from parents and tokens
            paths.append((paths[par[i] - 1] if par[i] else ()) + (tok[i],))
        assert paths == want
        assert all(p <= i for i, p in enumerate(par))
        # a node's step row (when expanded) ran with its own path
        for i, rw in enumerate(tree.row[r].tolist()):
            if rw >= 0:
                assert step.paths[rw][r] == (root,) + paths[i]


def test_chain_is_topk_one():
    step = ToyStep([2])
    tree = dynamic_tree(step, toy_logprobs((2,))[None], 1, 4, 4)
    assert tree.parents[0].tolist() == [0, 1, 2, 3]
    path = (2,)
    for i in range(4):
        t = int(toy_logprobs(path).argmax())
        assert int(tree.tokens[0, i]) == t
        path += (t,)


def test_static_tree_takes_the_ranked_children():
    paths = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    step = ToyStep([3])
    tree = static_tree(step, toy_logprobs((3,))[None], paths)
    assert tree.parents[0].tolist() == [0, 0, 1, 1, 2, 3]
    for i, p in enumerate(paths):
        toks = []
        for rank in p:
            toks.append(int(toy_logprobs((3, *toks)).topk(rank + 1).indices[-1]))
        assert int(tree.tokens[0, i]) == toks[-1]
    assert step.calls == 2                     # depths 1 and 2 have children; depth 3 does not


def test_a_drafted_tree_makes_a_window():
    step = ToyStep([0, 5, 6])
    tree = dynamic_tree(step, torch.stack([toy_logprobs((r,)) for r in (0, 5, 6)]), 2, 3, 6)
    R, N = tree.parents.shape
    slots = torch.arange(R * (N + 1))
    w = TreeWindow.from_tensors(tree.parents, slots, slots, tree.tokens.flatten(), tree.depth, N)
    assert w.acceptance_error(torch.zeros(R * N, dtype=torch.bool), torch.zeros(R, dtype=torch.int32)) is None
    assert int(w.token_depth.max()) <= tree.depth


def test_shape_errors():
    with pytest.raises(ValueError, match="num_nodes=30"):
        check_tree_shape(2, 3, 30)
    with pytest.raises(ValueError, match="topk=0"):
        check_tree_shape(0, 3, 3)
    with pytest.raises(ValueError, match="needs its parent"):
        static_tree(ToyStep([0]), toy_logprobs((0,))[None], [(0, 1)])
