"""Prefix caching with draft trees (LabConfig.tree; the shipped tiny pair, CPU, eager): the accepted
path is compacted to n+1 .. n+a at the tree commit (`window.commit_slots`), so the blocks registered
after it hold the path's K/V, the head's included, and the lookahead boundary is kept at the row's
committed slot. Every tree kind the engine runs (a dynamic tree, a static one) under every write
policy decodes target-only's tokens with hits, and with the exact strategies (`cached`, `boundary`)
every window after a hit accepts what it accepts without prefix caching; `missing` does not."""
import pytest

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.kv.prefix import chain_hashes
from nwor_lab.model import load_tiny
from test_prefix_engine import RegisteredBlocks

BS = 8
TREES = ["topk=2,depth=3,nodes=6", "paths=0|1|0.0|1.0"]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def workload(tok):
    """A system prompt, the same with a question, the prompt again, a hit whose next token differs
    from the cached block's (the head's boundary row is recomputed), and a returning conversation."""
    sys_p = tok.encode("def parse_header(line):\n    \"\"\"Split the header").ids
    other = tok.encode("class Stack:\n    def __init__(self):\n").ids
    assert other[0] != sys_p[BS]
    return [sys_p, sys_p + other, list(sys_p), sys_p[:BS] + other[:7]]


def run(tiny, k, mode="stage", tree="", prefix=None, observers=()):
    t, h, tok = tiny
    e = SpecEngine(t, h if k else None, LabConfig(nwor_mode=mode, tree=tree, debug=True, scv_mode="graph"), k=k,
                   block_size=BS, num_blocks=128, max_num_seqs=1, prefix_cache=prefix)
    e.observers.extend(observers)
    prompts, outs = workload(tok), []
    for p in prompts:
        req = e.add_request(p, 16)
        e.run()
        outs.append(req.output)
    req = e.add_request(prompts[0] + outs[0] + prompts[1][:5], 8)
    e.run()
    outs.append(req.output)
    return outs, [w.accepted for w in e.trace if w.kind == "verify"], e


@pytest.fixture(scope="module")
def target_only(tiny):
    return run(tiny, 0, "off", prefix=PrefixCacheConfig())


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("mode", NWOR_MODES)
def test_trees_with_hits_decode_target_only_and_accept_as_without(tiny, target_only, mode, tree):
    ref, _, only = target_only
    plain, accepted, _ = run(tiny, 4, mode, tree)
    outs, acc_on, e = run(tiny, 4, mode, tree, PrefixCacheConfig(), observers=[RegisteredBlocks()])
    assert plain == outs == ref
    assert acc_on == accepted                   # the head's cache of every hit is exact
    st = e.prefix_stats()
    assert st["hit_tokens"] == only.prefix_stats()["hit_tokens"] >= 40 and st["head_rows_recomputed"] >= 1
    assert any(len(w) and max(w) > 1 for w in acc_on)       # paths longer than one node were committed


def test_tree_field_strategies_cost_what_they_say(tiny, target_only):
    ref, _, only = target_only
    tree = TREES[0]
    accepted = run(tiny, 4, "stage", tree)[1]
    outs, acc, e = run(tiny, 4, "stage", tree, PrefixCacheConfig(lookahead="drop_last"))
    assert outs == ref and e.prefix_stats()["recomputed_tokens"] == BS * only.prefix_stats()["hit_requests"]
    outs, acc, e = run(tiny, 4, "stage", tree, PrefixCacheConfig(head_cache="missing"))
    assert outs == ref and acc != accepted     # tokens stay the target's; the head reads zeros after a hit


@pytest.mark.parametrize("tree", TREES)
def test_the_boundary_kept_after_a_tree_commit_is_the_path_s(tiny, tree):
    """Blocks completed by tree windows: the token kept beside each is the one after the block in the
    decoded sequence (the path's row lands at n + depth, not at its node's row), and a conversation
    that returns and turns off exactly at such a block's end, its head row recomputed from the kept
    feature, accepts as it does without prefix caching."""
    t, h, tok = tiny
    prompt = workload(tok)[1]

    def go(prefix):
        e = SpecEngine(t, h, LabConfig(nwor_mode="stage", tree=tree, debug=True), k=4, block_size=BS,
                       num_blocks=128, max_num_seqs=1, prefix_cache=prefix)
        first = e.add_request(prompt, 32)
        e.run()
        seq = prompt + first.output
        m = (len(prompt) // BS + 3) * BS - len(prompt)          # a block end the decode wrote
        turn = (first.output[m] + 1) % 100
        again = e.add_request(prompt + first.output[:m] + [turn] + prompt[:6], 12)
        n_before = len([w for w in e.trace if w.kind == "verify"])
        e.run()
        return e, seq, again, [w.accepted for w in e.trace if w.kind == "verify"][n_before:]

    e, seq, again, acc_on = go(PrefixCacheConfig())
    p = e.prefix
    kept = 0
    for b, hsh in enumerate(chain_hashes(seq, BS)):
        block = p.allocator.block_of.get(hsh)
        if block is not None and (b + 1) * BS < len(seq):
            assert int(p.boundary_token[block]) == seq[(b + 1) * BS], b
            kept += 1
    assert kept >= 5
    st = e.prefix_stats()
    assert st["head_rows_recomputed"] >= 1 and p.hits[1] >= len(prompt) + 2 * BS
    _, _, again_plain, acc_plain = go(None)
    assert again.output == again_plain.output and acc_on == acc_plain


@pytest.mark.parametrize("tree", TREES)
def test_trees_with_the_head_recomputed(tiny, target_only, tree):
    ref, _, only = target_only
    accepted = run(tiny, 4, "stage", tree)[1]
    outs, acc, e = run(tiny, 4, "stage", tree, PrefixCacheConfig(head_cache="recompute"))
    assert outs == ref and acc == accepted
    assert e.prefix_stats()["recomputed_tokens"] == only.prefix_stats()["hit_tokens"]
