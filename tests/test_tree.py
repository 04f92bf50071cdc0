"""Tree windows: the window's maps, greedy / SCV / stochastic tree acceptance, and the accepted path
committed under every strategy (write-all + move, write-all + remap, cow, stage)."""
import random

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.policies import make_policy
from nwor_lab.policies.tree import RemapPolicy, remap_block_tables, tree_commit_costs
from nwor_lab.speculative.tree_accept import (accept_tree_from_sampled, accept_tree_greedy,
                                              accept_tree_sampled)
from nwor_lab.speculative.tree_window import TreeWindow, ancestor_rows, chain_parents, depths_of
from nwor_lab.window import Acceptance


def random_parents(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, i + 1) for i in range(n)]


def distinct_tokens(rng, parents, vocab):
    """Node tokens with distinct tokens among siblings."""
    used, out = {}, []
    for p in parents:
        choices = [t for t in range(vocab) if t not in used.setdefault(p, set())]
        t = rng.choice(choices)
        used[p].add(t)
        out.append(t)
    return out


def make_window(parents, ctx, block_size, num_blocks_per_req, tokens=None):
    R = len(parents)
    tables = torch.arange(R * num_blocks_per_req, dtype=torch.int32).view(R, num_blocks_per_req)
    ids = None if tokens is None else torch.tensor([t for ts in tokens for t in ts], dtype=torch.long)
    return TreeWindow.build(parents, tables, ctx, block_size, ids), tables


def test_window_maps_depths_slots_and_bits():
    #       t_last(0) -> 1 -> 3
    #                 -> 2 -> 4 -> 5
    parents = [0, 0, 1, 2, 4]
    w, _ = make_window([parents], [10], 4, 8, [[5, 6, 7, 8, 9]])
    assert depths_of(parents) == [1, 1, 2, 2, 3]
    assert w.token_depth.tolist() == [0, 1, 1, 2, 2, 3]
    assert w.token_parent.tolist() == [-1, 0, 0, 1, 2, 4]
    assert w.slot_mapping.tolist() == list(range(10, 16))            # write-all: n + row
    assert w.commit_slots.tolist() == [10, 11, 11, 12, 12, 13]       # n + depth
    bits = w.ancestors[:, 0].tolist()
    assert [sorted(j for j in range(6) if b >> j & 1) for b in bits] == \
        [sorted(s) for s in ancestor_rows(parents)] == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4], [0, 2, 4, 5]]


def test_window_refuses_bad_parents_and_duplicate_siblings():
    with pytest.raises(ValueError, match=r"parents\[0\]\[1\]=2"):
        make_window([[0, 2]], [0], 4, 4)
    with pytest.raises(ValueError, match="siblings must carry distinct tokens"):
        make_window([[0, 0]], [0], 4, 4, [[3, 3]])


def test_ancestor_bits_past_64_rows():
    parents = chain_parents(70)
    w, _ = make_window([parents], [0], 16, 8, [list(range(70))])
    assert w.ancestors.shape == (71, 2)
    last = w.ancestors[70]
    assert int(last[0]) == -1 and int(last[1]) == (1 << 7) - 1      # all 71 rows: 64 + 7 bits


# -- acceptance --------------------------------------------------------------------------------
def greedy_naive(parents, tokens, logits_rows):
    """Host walk: from t_last, take the child whose token is the target's argmax, until none."""
    cur, path, out = 0, [], []
    while True:
        best = int(logits_rows[cur].argmax())
        nxt = [i + 1 for i, p in enumerate(parents) if p == cur and tokens[i] == best]
        if not nxt:
            return path, out + [best]
        cur = nxt[0]
        path.append(cur)
        out.append(best)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_matches_host_walk_and_scv(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = 5
    parents = [random_parents(rng, rng.randrange(0, 9)) for _ in range(4)]
    tokens = [distinct_tokens(rng, p, vocab) for p in parents]
    w, _ = make_window(parents, [3, 0, 7, 12], 4, 8, tokens)
    # make matches likely: each row's argmax is usually one of its children's tokens
    logits = torch.randn(w.num_tokens, vocab, generator=gen)
    start = 0
    for p, ts in zip(parents, tokens):
        for i, q in enumerate(p):
            if rng.random() < 0.6:
                logits[start + q, ts[i]] += 10
        start += 1 + len(p)
    verdict = accept_tree_greedy(w, logits)
    start = 0
    for r, (p, ts) in enumerate(zip(parents, tokens)):
        path, out = greedy_naive(p, ts, logits[start:start + 1 + len(p)])
        assert int(verdict.accepted_len[r]) == len(path)
        assert verdict.path_mask[start:start + 1 + len(p)].nonzero().flatten().tolist() == [0] + path
        row = verdict.sampled[r].tolist()
        assert row[:len(out)] == out and all(x == -1 for x in row[len(out):])
        start += 1 + len(p)
    scv = accept_tree_from_sampled(w, verdict.sampled)
    assert torch.equal(scv.path_mask, verdict.path_mask) and torch.equal(scv.accepted_len, verdict.accepted_len)
    acc = verdict.acceptance(w)
    assert w.acceptance_error(acc.draft_mask, acc.accepted_len) is None


def test_acceptance_error_names_a_branching_mask():
    w, _ = make_window([[0, 0, 1]], [0], 4, 4, [[1, 2, 3]])
    assert w.acceptance_error(torch.tensor([True, True, False]), torch.tensor([2])) is not None
    assert w.acceptance_error(torch.tensor([False, False, True]), torch.tensor([1])) is not None
    assert w.acceptance_error(torch.tensor([True, False, True]), torch.tensor([2])) is None


def _emitted(parents, tokens, logits, probs, temperature, n, seed):
    """n requests of one tree, one batched call: the first two emitted tokens of each."""
    w, _ = make_window([parents] * n, [0] * n, 64, 2, [tokens] * n)
    lg = logits.repeat(n, 1)
    q = None if probs is None else probs.repeat(n, 1)
    v = accept_tree_sampled(w, lg, q, temperature, torch.Generator().manual_seed(seed))
    return v.sampled[:, 0].long(), v.sampled[:, 1].long()


@pytest.mark.parametrize("temperature,drafter", [(1.0, "topk"), (0.8, "sampled")])
def test_stochastic_tree_keeps_the_target_distribution(temperature, drafter):
    # Root with 3 children, the first two with 2 children each: what the target alone emits for the
    # first two tokens is p(x1) p(x2 | x1); the tree's candidates must not show through.
    vocab, n = 4, 20_000
    gen = torch.Generator().manual_seed(0)
    parents = [0, 0, 0, 1, 1, 2, 2]
    target = torch.randn(1 + vocab, vocab, generator=gen) * 1.5     # row 0: root; row 1 + x: after token x
    # a peaked q: a sampler that forgot to drop a rejected candidate from q shows here (0.056 off)
    q_root = torch.tensor([0.7, 0.1, 0.1, 0.1])
    q_next = torch.tensor([0.1, 0.1, 0.1, 0.7])
    # one tree per sample: candidates drawn without replacement from q (Gumbel top-k), or a fixed
    # top-k (q one-hot on each candidate: draft_probs None)
    rng = torch.Generator().manual_seed(1)
    m = n if drafter == "sampled" else 1

    def without_replacement(q, k, rows):
        gumbel = -torch.empty(rows, vocab).exponential_(generator=rng).log()
        return (q.log() + gumbel).topk(k, dim=1).indices

    if drafter == "sampled":
        tokens = torch.cat([without_replacement(q_root, 3, m), without_replacement(q_next, 2, m),
                            without_replacement(q_next, 2, m)], 1)              # [m, 7]
    else:
        tokens = torch.tensor([[2, 0, 3, 1, 0, 0, 2]])
    rows = torch.cat([torch.zeros(m, 1, dtype=torch.long), 1 + tokens], 1)    # target row of each tree row
    logits = target[rows].reshape(-1, vocab)
    if drafter == "sampled":
        w, _ = make_window([parents] * n, [0] * n, 64, 2, tokens.tolist())
        q = torch.cat([q_root[None], q_next.expand(7, vocab)]).repeat(n, 1)
        v = accept_tree_sampled(w, logits, q, temperature, torch.Generator().manual_seed(2))
        first, second = v.sampled[:, 0].long(), v.sampled[:, 1].long()
    else:
        first, second = _emitted(parents, tokens[0].tolist(), logits, None, temperature, n, 2)
    p1 = torch.softmax(target[0].double() / temperature, -1)
    p2 = torch.softmax(target[1:].double() / temperature, -1)           # [x1, x2]
    # the first token, whether accepted from the tree or recovered from the residual, follows p1
    # (binomial std <= 0.0036 at n = 20k; 0.02 is > 5 sigma, the seeds are fixed)
    freq1 = torch.bincount(first, minlength=vocab).double() / n
    assert (freq1 - p1).abs().max() < 0.02, (freq1, p1)
    # when x1 was accepted, this window emits a second token: it follows p(. | x1) (its test uses
    # randomness of its own level only)
    checked = 0
    for x1 in range(vocab):
        rows = (first == x1) & (second >= 0)
        if int(rows.sum()) < 2500:
            continue
        freq2 = torch.bincount(second[rows], minlength=vocab).double() / int(rows.sum())
        assert (freq2 - p2[x1]).abs().max() < 0.04, (x1, freq2, p2[x1])     # std <= 0.01 at 2.5k
        checked += 1
    assert checked >= 2


def test_stochastic_is_seeded():
    parents, tokens = [0, 0, 1], [1, 2, 0]
    lg = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    a = _emitted(parents, tokens, lg, None, 1.0, 50, 9)
    b = _emitted(parents, tokens, lg, None, 1.0, 50, 9)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# -- commit, every strategy --------------------------------------------------------------------
def filled_cache(spec, seed):
    cache = PagedKVCache(spec)
    g = torch.Generator().manual_seed(seed)
    cache.key.copy_(torch.randn(cache.key.shape, generator=g))
    cache.value.copy_(torch.randn(cache.value.shape, generator=g))
    return cache


def tree_case(seed, block_size, blocks_per_req=8):
    rng = random.Random(seed)
    parents = [random_parents(rng, rng.randrange(1, 10)) for _ in range(3)]
    tokens = [distinct_tokens(rng, p, 6) for p in parents]
    ctx = [rng.randrange(0, 12) for _ in parents]
    w, tables = make_window(parents, ctx, block_size, blocks_per_req, tokens)
    # a random accepted path per request: walk down random children
    mask, d0 = [], 0
    for p in parents:
        cur, on = 0, set()
        while True:
            kids = [i + 1 for i, q in enumerate(p) if q == cur]
            if not kids or rng.random() < 0.25:
                break
            cur = rng.choice(kids)
            on.add(cur)
        mask += [i + 1 in on for i in range(len(p))]
    acc = Acceptance.from_draft_mask(w, torch.tensor(mask))
    return w, tables, acc, ctx


def run_policy(mode, cache, w, acc, seed, block_tables=None):
    policy = RemapPolicy(cache, LabConfig(debug=True)) if mode == "remap" else \
        make_policy(LabConfig(nwor_mode=mode, debug=True), cache)
    g = torch.Generator().manual_seed(seed + 1)
    s = cache.spec
    kv = [(torch.randn(w.num_tokens, s.num_kv_heads, s.head_size, generator=g),
           torch.randn(w.num_tokens, s.num_kv_heads, s.head_size, generator=g)) for _ in range(s.num_layers)]
    policy.begin(w, kind="verify")
    for layer, (k, v) in enumerate(kv):
        policy.write(layer, k, v)
    rec = policy.commit(acc)
    return policy, rec, kv


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_commit_puts_the_path_at_n_plus_depth(mode, seed):
    spec = KVCacheSpec(2, 40, 4, 2, 8)
    w, tables, acc, ctx = tree_case(seed, spec.block_size)
    cache = filled_cache(spec, seed)
    before = cache.snapshot()
    _, rec, kv = run_policy(mode, cache, w, acc, seed)
    path_rows = acc.commit_mask.nonzero().flatten()                 # t_last + the path, row order
    dest = w.commit_slots[path_rows]
    for layer, (k, v) in enumerate(kv):
        got_k, got_v = cache.gather(layer, dest)
        assert torch.equal(got_k, k[path_rows]) and torch.equal(got_v, v[path_rows])
    # every write-all slot past the path: untouched (stage, cow) or a rejected row (off)
    left = w.restore_slots(acc)
    left = left[left >= 0]
    same = torch.equal(cache.key[:, left // 4, left % 4], before[0][:, left // 4, left % 4])
    assert same == (mode != "off") or left.numel() == 0
    assert rec.drafts_committed == rec.num_accepted == int(acc.accepted_len.sum())
    if mode == "stage":
        touched = (cache.key != before[0]).any(-1).any(-1).any(0).flatten().nonzero().flatten()
        assert set(touched.tolist()) <= set(dest.tolist())         # nothing but the path's positions


@pytest.mark.parametrize("seed", range(3))
def test_remap_points_the_table_at_the_path(seed):
    spec = KVCacheSpec(1, 120, 1, 1, 4)
    w, tables, acc, ctx = tree_case(seed, 1, blocks_per_req=40)
    cache = filled_cache(spec, seed)
    policy, rec, kv = run_policy("remap", cache, w, acc, seed)
    new, freed = policy.remap(tables, torch.tensor(ctx))
    d0 = 0
    for r, n in enumerate(ctx):
        a = int(acc.accepted_len[r])
        rows = acc.commit_mask.nonzero().flatten()
        rows = rows[w.token_req[rows] == r]
        blocks = new[r, n:n + a + 1].long()
        assert torch.equal(cache.key[0, blocks, 0], kv[0][0][rows])
        assert (new[r, n + a + 1:n + 1 + w.num_draft_tokens[r]] == -1).all()
    assert set(freed[freed >= 0].tolist()) == set(w.draft_slots[~acc.draft_mask].tolist())
    with pytest.raises(ValueError, match="block_size=1"):
        RemapPolicy(PagedKVCache(KVCacheSpec(1, 4, 4, 1, 4)))


def test_costs_per_strategy():
    # one request at n = 5, block size 4: t_last -> 1 -> 2 (accepted), 3 and 4 rejected siblings
    parents = [0, 0, 1, 2]
    w, _ = make_window([parents], [5], 4, 8, [[1, 2, 3, 4]])
    acc = Acceptance.from_draft_mask(w, torch.tensor([False, True, False, True]))
    costs = {s: tree_commit_costs(s, w, acc, num_layers=2, bytes_per_row=10, block_size=4, context_lens=[5])
             for s in ("move", "remap", "cow", "stage")}
    # path: node 2 (row 2, depth 1) and node 4 (row 4, depth 2): both move, to positions 6 and 7
    assert costs["stage"]["rows_written_per_token"] == 1.0
    assert costs["move"]["bytes_moved"] == 2 * 2 * 10 and costs["cow"]["bytes_moved"] == 40
    assert costs["remap"]["bytes_moved"] == costs["stage"]["bytes_moved"] == 0
    # rows written: 5 + 2 moves (move), 5 (remap), 5 + 2 restored (positions 8, 9) + 2 (cow), 3 (stage)
    assert [costs[s]["rows_written_per_token"] * 3 for s in ("move", "remap", "cow", "stage")] == [7, 5, 9, 3]
    # the path ends at position 7, the end of block 1 (positions 4..7): no rejected row left in it
    assert costs["move"]["rejected_bytes_in_blocks"] == 0
    acc1 = Acceptance.from_draft_mask(w, torch.tensor([False, True, False, False]))
    c1 = tree_commit_costs("move", w, acc1, num_layers=2, bytes_per_row=10, block_size=4, context_lens=[5])
    assert c1["rejected_bytes_in_blocks"] == 1 * 2 * 10      # position 7 holds a rejected row


@pytest.mark.parametrize("seed", range(3))
def test_device_built_window_equals_the_host_one(seed):
    rng = random.Random(seed)
    N, R, block_size = 9, 3, 4
    parents = [random_parents(rng, N) for _ in range(R)]
    tokens = [distinct_tokens(rng, p, 12) for p in parents]
    host, tables = make_window(parents, [5, 0, 11], block_size, 8, tokens)
    dev = TreeWindow.from_tensors(torch.tensor(parents), host.slot_mapping, host.commit_slots,
                                  host.draft_token_ids, max_depth=N, max_children=N)
    for f in ("token_req", "token_draft_pos", "draft_rows", "token_depth", "token_parent", "ancestors", "children"):
        a, b = getattr(host, f), getattr(dev, f)
        if f == "children":
            b = b[:, :a.shape[1]]
            assert (getattr(dev, f)[:, a.shape[1]:] == -1).all()
        assert torch.equal(a.long(), b.long()), f
    logits = torch.randn(host.num_tokens, 12, generator=torch.Generator().manual_seed(seed))
    rows = host.token_parent[host.draft_rows]
    logits[rows, host.draft_token_ids] += 5 * torch.rand(len(rows), generator=torch.Generator().manual_seed(seed))
    v1, v2 = accept_tree_greedy(host, logits), accept_tree_greedy(dev, logits)
    width = v1.sampled.shape[1]
    assert int(v1.accepted_len.max()) >= 1
    assert torch.equal(v1.sampled, v2.sampled[:, :width]) and (v2.sampled[:, width:] == -1).all()
    assert torch.equal(v1.path_mask, v2.path_mask) and torch.equal(v1.accepted_len, v2.accepted_len)
    assert dev.parents_host() == parents


def test_commit_op_takes_source_rows_to_other_slots():
    # the stage commit of a tree: rows 0, 2, 5 kept to slots 7, 8, 9; rejected siblings share slots
    from nwor_lab.ops import commit
    spec = KVCacheSpec(2, 4, 4, 1, 4)
    cache = filled_cache(spec, 0)
    before = cache.snapshot()
    staged = torch.randn(2, 8, 1, 4), torch.randn(2, 8, 1, 4)
    slots = torch.tensor([7, 8, 8, 9, 9, 9])
    keep = torch.tensor([True, False, True, False, False, True])
    commit(*staged, cache.key, cache.value, slots, keep, backend="torch")
    for layer in range(2):
        k, _ = cache.gather(layer, torch.tensor([7, 8, 9]))
        assert torch.equal(k, staged[0][layer, [0, 2, 5]])
    assert torch.equal(cache.key.flatten(1, 2)[:, :7], before[0].flatten(1, 2)[:, :7])
    with pytest.raises(ValueError, match="same slot appears twice"):
        commit(*staged, cache.key, cache.value, slots, torch.tensor([True, True, True, False, False, True]),
               backend="torch")


def test_policy_refuses_a_branching_tree_acceptance():
    spec = KVCacheSpec(1, 8, 4, 1, 4)
    w, _ = make_window([[0, 0, 1]], [2], 4, 8, [[1, 2, 3]])
    bad = Acceptance(torch.tensor([True, True, False]), torch.tensor([2], dtype=torch.int32),
                     torch.tensor([True, True, True, False]))
    policy = make_policy(LabConfig(nwor_mode="stage"), filled_cache(spec, 1))
    policy.begin(w)
    policy.write(0, torch.randn(4, 1, 4), torch.randn(4, 1, 4))
    with pytest.raises(ValueError, match="not one root path"):
        policy.commit(bad)
    with pytest.raises(ValueError, match="follows from the accepted path"):
        Acceptance.from_accepted_len(w, [1])


def test_on_device_window_and_path_rows():
    rng = random.Random(7)
    parents = [random_parents(rng, 6) for _ in range(2)]
    tokens = [distinct_tokens(rng, p, 9) for p in parents]
    host, tables = make_window(parents, [3, 10], 4, 8, tokens)
    dev = TreeWindow.on_device(torch.tensor(parents), torch.tensor(sum(tokens, [])), tables, torch.tensor([3, 10]),
                               4, max_depth=6, max_children=6)
    assert torch.equal(dev.slot_mapping, host.slot_mapping) and torch.equal(dev.commit_slots, host.commit_slots)
    logits = torch.randn(host.num_tokens, 9, generator=torch.Generator().manual_seed(1))
    logits[host.token_parent[host.draft_rows], host.draft_token_ids] += 6
    v = accept_tree_greedy(host, logits)
    rows = v.path_rows(host)
    for r in range(2):
        a = int(v.accepted_len[r])
        on = v.path_mask.nonzero().flatten()
        on = on[host.token_req[on] == r]
        assert rows[r, :a + 1].tolist() == on[torch.argsort(host.token_depth[on])].tolist()
        assert (rows[r, a + 1:] == -1).all()
