"""A tree window end to end on a random tiny model, no engine: verify forward with tree attention ->
greedy tree acceptance -> commit under every strategy. The emitted tokens equal target-only greedy
decoding, and the cache holds the accepted path's K/V at positions n .. n + a (t_last, then the path),
as a target-only pass over the same tokens writes them."""
import random

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.model.toy import toy_config, toy_pair
from nwor_lab.policies import make_policy
from nwor_lab.policies.tree import RemapPolicy
from nwor_lab.speculative.tree_accept import accept_tree_greedy
from nwor_lab.speculative.tree_window import TreeWindow

VOCAB = 16


def greedy_target_only(target, ids, steps):
    seq = list(ids)
    for _ in range(steps):
        logits = target.compute_logits(target.forward_dense(torch.tensor([seq]))[0, -1])
        seq.append(int(logits.argmax()))
    return seq[len(ids):]


def draft_tree(rng, greedy, depth, width):
    """Parents and tokens, level by level (`width` nodes a level, in random order): with probability
    3/4 the node on the greedy path gets a child with the next greedy token; the other nodes are
    children of random nodes of the level above with other tokens (siblings distinct)."""
    parents, tokens = [], []
    level, on_path = [0], 0                    # on_path: the node on the greedy path (or None)
    for d in range(1, depth + 1):
        plan = []
        if on_path is not None and rng.random() < 0.75:
            plan.append((on_path, greedy[d - 1]))
        while len(plan) < width:
            p = rng.choice(level)
            used = {t for q, t in plan if q == p}
            plan.append((p, rng.choice([t for t in range(VOCAB) if t not in used and
                                        not (p == on_path and t == greedy[d - 1])])))
        rng.shuffle(plan)
        level, nxt_path = [], None
        for p, t in plan:
            parents.append(p)
            tokens.append(t)
            level.append(len(parents))
            if p == on_path and t == greedy[d - 1]:
                nxt_path = len(parents)
        on_path = nxt_path
    return parents, tokens


def setup(seed, block_size):
    target, _ = toy_pair(seed, noise=0.2, cfg=toy_config(vocab_size=VOCAB))
    L = target.num_layers
    spec = KVCacheSpec(L, 64 if block_size > 1 else 256, block_size, 2, 8)
    return target, spec


@torch.no_grad()
def run_tree(target, spec, mode, prompt, parents, tokens, seed):
    """Prefill prompt[:-1] directly, then the tree window [t_last, nodes] through `mode`'s policy."""
    cache = PagedKVCache(spec)
    g = torch.Generator().manual_seed(seed)
    cache.key.copy_(torch.randn(cache.key.shape, generator=g))        # garbage: untouched slots show
    cache.value.copy_(torch.randn(cache.value.shape, generator=g))
    per = spec.num_blocks
    table = [list(range(per))]
    n = len(prompt) - 1
    md = AttentionMetadata.build(cache, None, list(range(n)), [n], table, [0], attention="torch")
    target(torch.tensor(prompt[:-1]), md)
    before = cache.snapshot()
    tables = torch.tensor(table, dtype=torch.int32)
    w = TreeWindow.build([parents], tables, [n], spec.block_size, torch.tensor(tokens))
    cfg = LabConfig(nwor_mode="off" if mode == "remap" else mode, attention="torch", debug=True)
    policy = RemapPolicy(cache, cfg) if mode == "remap" else make_policy(cfg, cache)
    policy.begin(w, kind="verify")
    positions = n + w.token_depth.long()
    md = AttentionMetadata.build(cache, policy, positions, [w.num_tokens], table, [n], attention="torch",
                                 slot_mapping=w.slot_mapping, tree_mask=w.ancestors)
    hidden = target(torch.tensor([prompt[-1]] + tokens), md)
    verdict = accept_tree_greedy(w, target.compute_logits(hidden))
    acc = verdict.acceptance(w)
    policy.commit(acc)
    if mode == "remap":
        new, _ = policy.remap(tables, torch.tensor([n]))
        table = [new[0].tolist()]
    return cache, before, table, w, verdict, acc, n


@torch.no_grad()
def reference_kv(target, spec, seq):
    """K/V of a target-only pass over `seq` (positions 0 .. len - 1), in a fresh cache."""
    cache = PagedKVCache(spec)
    table = [list(range(spec.num_blocks))]
    md = AttentionMetadata.build(cache, None, list(range(len(seq))), [len(seq)], table, [0], attention="torch")
    target(torch.tensor(seq), md)
    return cache


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", ["off", "cow", "stage", "remap"])
def test_greedy_tree_equals_target_only_and_commits_the_path(mode, seed):
    block_size = 1 if mode == "remap" else 4
    target, spec = setup(seed, block_size)
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(7)]
    greedy = greedy_target_only(target, prompt, 5)
    parents, tokens = draft_tree(rng, greedy, depth=4, width=3)
    cache, before, table, w, verdict, acc, n = run_tree(target, spec, mode, prompt, parents, tokens, seed)
    a = int(verdict.accepted_len[0])
    emitted = verdict.sampled[0, :a + 1].tolist()
    assert emitted == greedy[:a + 1]
    assert (verdict.sampled[0, a + 1:] == -1).all()
    # the cache: positions n .. n + a hold what a target-only pass over prompt + path writes there
    ref = reference_kv(target, spec, prompt + greedy[:a])
    bs = spec.block_size
    for p in range(n + a + 1):
        b, o = table[0][p // bs], p % bs
        rb, ro = p // bs, p % bs               # the reference's table is the identity
        assert torch.allclose(cache.key[:, b, o], ref.key[:, rb, ro], atol=1e-5), (mode, p)
        assert torch.allclose(cache.value[:, b, o], ref.value[:, rb, ro], atol=1e-5), (mode, p)
    # stage and cow: every write-all slot past the path holds what it held before the window
    past = w.restore_slots(acc)
    past = past[past >= 0]
    if mode in ("stage", "cow") and past.numel():
        assert torch.equal(cache.key[:, past // bs, past % bs], before[0][:, past // bs, past % bs])
    if mode == "stage":
        changed = (cache.key != before[0]).any(-1).any(-1).any(0).flatten().nonzero().flatten()
        assert changed.tolist() == [table[0][p // bs] * bs + p % bs for p in range(n, n + a + 1)]


def test_a_tree_with_an_accepted_path_exists_in_these_seeds():
    # the parametrised cases above mean something only if some accept more than t_last's bonus
    lens = []
    for seed in range(3):
        target, spec = setup(seed, 4)
        rng = random.Random(seed)
        prompt = [rng.randrange(VOCAB) for _ in range(7)]
        greedy = greedy_target_only(target, prompt, 5)
        parents, tokens = draft_tree(rng, greedy, depth=4, width=3)
        lens.append(int(run_tree(target, spec, "stage", prompt, parents, tokens, seed)[4].accepted_len[0]))
    assert max(lens) >= 2, lens


# -- drafting a tree with the EAGLE head ---------------------------------------------------------
@torch.no_grad()
def head_setup(seed, block_size=4):
    target, head = toy_pair(seed, noise=0.2, cfg=toy_config(vocab_size=VOCAB))
    spec = KVCacheSpec(target.num_layers + 1, 64, block_size, 2, 8)
    cache = PagedKVCache(spec)
    g = torch.Generator().manual_seed(seed)
    cache.key.copy_(torch.randn(cache.key.shape, generator=g))
    cache.value.copy_(torch.randn(cache.value.shape, generator=g))
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (6, 9)]
    tables = [list(range(0, 30)), list(range(30, 60))]
    g_root = []
    for prompt, table in zip(prompts, tables):
        n = len(prompt)
        md = AttentionMetadata.build(cache, None, list(range(n)), [n], [table], [0], attention="torch")
        hidden = target(torch.tensor(prompt), md)
        # the head's prefix: (next token, target feature) at each position, as a verify's head pass
        nxt = prompt[1:] + [int(target.compute_logits(hidden[-1]).argmax())]
        out = head(torch.tensor(nxt), hidden, md)
        g_root.append(out[-1])
    return target, head, cache, torch.stack(g_root), [len(p) for p in prompts], tables


@pytest.mark.parametrize("shape", [dict(topk=3, depth=3, num_nodes=8), dict(paths=[(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (1, 0, 0)])])
def test_head_tree_is_the_same_under_every_policy(shape):
    from nwor_lab.model.tree_draft import draft_tree_with_head
    trees, caches = {}, {}
    for mode in ("off", "cow", "stage"):
        target, head, cache, g_root, ctx, tables = head_setup(1)
        before = cache.snapshot()
        policy = make_policy(LabConfig(nwor_mode=mode, attention="torch", debug=True), cache)
        tree, rec = draft_tree_with_head(head, cache, policy, g_root, ctx, tables, **shape)
        trees[mode] = tree
        changed = (cache.key != before[0]).any(-1).any(-1)           # [L, NB, BS]
        if mode in ("stage", "cow"):      # the provisional head K/V never stays in the cache
            assert not changed.any(), mode
        else:                             # off: only the head layer, only past each request's prefix
            assert not changed[:-1].any() and changed[-1].any()
            for r, (n, table) in enumerate(zip(ctx, tables)):
                for p in range(n):
                    assert not changed[-1, table[p // 4], p % 4]
    for mode in ("cow", "stage"):
        assert torch.equal(trees[mode].tokens, trees["off"].tokens)
        assert torch.equal(trees[mode].parents, trees["off"].parents)
        assert torch.allclose(trees[mode].scores, trees["off"].scores)


@torch.no_grad()
def test_head_tree_with_topk_one_is_the_chain():
    from nwor_lab.model.tree_draft import draft_tree_with_head
    target, head, cache, g_root, ctx, tables = head_setup(2)
    policy = make_policy(LabConfig(nwor_mode="stage", attention="torch"), cache)
    tree, _ = draft_tree_with_head(head, cache, policy, g_root, ctx, tables, topk=1, depth=4, num_nodes=4)
    # the chain by hand: step s writes its row at n + s - 1 straight into the cache (DirectWriter)
    for r, (n, table) in enumerate(zip(ctx, tables)):
        g, tok, chain = g_root[r:r + 1], None, []
        for s in range(1, 5):
            tok = int(head.compute_logits(g).argmax())
            chain.append(tok)
            if s == 4:
                break
            md = AttentionMetadata.build(cache, None, [n + s - 1], [1], [table], [n + s - 1], attention="torch")
            g = head(torch.tensor([tok]), g, md)
        assert tree.tokens[r].tolist() == chain
