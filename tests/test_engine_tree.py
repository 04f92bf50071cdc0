"""Draft trees through the engine's one step body (eager, CPU, the shipped tiny pair): greedy tree
decoding equals target-only under every write policy and both heads, seeded T > 0 runs agree across
policies, a chain is the tree of topk 1, forced acceptance from a tree profile, and the head's
provisional K/V of frontier nodes never stays in the cache under stage and cow."""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import generate
from nwor_lab.engine.generate import prepare
from nwor_lab.engine.tree_plan import host_path, tree_plan
from nwor_lab.config import parse_tree
from nwor_lab.model import load_tiny
from nwor_lab.speculative.tree_forced import TreeForcedAcceptance

PROMPTS = ["def parse_header(line):\n    \"\"\"Split", "class Stack:\n    def __init__(self):\n"]
TREE = "topk=2,depth=3,nodes=6"


@pytest.fixture(scope="module", params=["eagle1", "eagle3"])
def pair(request):
    return load_tiny(head=request.param)


@pytest.fixture(scope="module")
def eagle1():
    return load_tiny()


def run(pair, mode, tree=TREE, prompts=PROMPTS, n=16, **kw):
    t, h, tok = pair
    return generate(prompts, n, k=4, config=LabConfig(nwor_mode=mode, tree=tree, **kw.pop("cfg", {})),
                    target=t, head=h, tokenizer=tok, **kw)


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_greedy_tree_equals_target_only(pair, mode):
    t, h, tok = pair
    ref = generate(PROMPTS, 16, k=0, target=t, head=h, tokenizer=tok)
    res = run(pair, mode, cfg=dict(debug=True, scv_mode="graph"))
    assert res.token_ids == ref.token_ids
    verify = [w for w in res.trace if w.kind == "verify" and w.kinds[0] == "tree"]
    assert verify and all(d == 6 for w in verify for d in w.drafted)
    assert res.mean_acceptance_length > 1.5, res.summary()     # the trees are accepted, not just correct
    assert [w for w in res.trace if w.kind == "draft"]          # the head's tree windows are traced


def test_static_tree_and_mixed_batches(eagle1):
    """A static tree; three prompts on two sequence slots and a token budget that cuts trees (short
    trees pad; a step with prefills and decodes runs the prefills first)."""
    t, h, tok = eagle1
    prompts = ["x = 1\n", "def f(", "import os\n"]
    ref = generate(prompts, 12, k=0, target=t, head=h, tokenizer=tok)
    res = run(eagle1, "stage", tree="paths=0|1|0.0|1.0", prompts=prompts, n=12, max_num_seqs=2,
              max_num_batched_tokens=8, cfg=dict(debug=True))
    assert res.token_ids == ref.token_ids
    assert any(d < 4 for w in res.trace if w.kind == "verify" for d, k in zip(w.drafted, w.kinds) if k == "tree")


def test_a_chain_is_the_tree_of_topk_1(eagle1):
    t, h, tok = eagle1
    chain = generate(PROMPTS, 16, k=4, config=LabConfig(nwor_mode="off"), target=t, head=h, tokenizer=tok)
    tree = run(eagle1, "off", tree="topk=1,depth=4,nodes=4")
    assert tree.token_ids == chain.token_ids
    acc = lambda r: [w.accepted for w in r.trace if w.kind == "verify"]   # noqa: E731
    assert acc(tree) == acc(chain)


def test_sampled_trees_agree_across_policies(eagle1):
    outs = [run(eagle1, m, n=8, temperature=0.8, seed=3).token_ids for m in ("off", "cow", "stage")]
    assert outs[0] == outs[1] == outs[2]
    assert outs[0] != run(eagle1, "off", n=8, temperature=0.8, seed=4).token_ids


def test_forced_tree_profile(eagle1):
    """A tree profile drives acceptance: rank weights reach the second child, rates 0 accept nothing."""
    acc = TreeForcedAcceptance.parse("tree:0.9,0.8,0.7;ranks=0.5,0.5")
    runs = [run(eagle1, m, n=12, acceptance=acc) for m in ("off", "stage")]
    assert runs[0].token_ids == runs[1].token_ids
    ranks = [r for w in runs[0].trace if w.path_ranks for p in w.path_ranks for r in p]
    assert 0 in ranks and 1 in ranks
    assert runs[0].mean_acceptance_length > 2.0
    none = run(eagle1, "stage", n=4, acceptance=TreeForcedAcceptance.parse("tree:0,0,0"))
    assert none.mean_acceptance_length == 1.0
    with pytest.raises(ValueError, match="positions"):
        run(eagle1, "stage", n=8, acceptance=TreeForcedAcceptance.parse("tree:0.9,0.5"))
    assert TreeForcedAcceptance.from_dict(acc.as_dict()) == acc


@pytest.mark.parametrize("mode,clean", [("stage", True), ("cow", True), ("off", False)])
def test_provisional_head_kv_is_not_left_in_the_cache(eagle1, mode, clean):
    """After every step, positions at and past num_computed (where the verify window's rejected nodes
    and the head's frontier nodes went under write-all) hold nothing under stage (never written) and
    cow (restored); off leaves them, as vLLM / SGLang do."""
    t, h, tok = eagle1
    g = prepare(PROMPTS[:1], 12, k=4, config=LabConfig(nwor_mode=mode, tree=TREE), target=t, head=h, tokenizer=tok)
    e, req = g.engine, g.requests[0]
    leftovers = []
    while g.step():
        if req.finished:
            break
        bs = e.cache.spec.block_size
        slots = req.block_table.slots(range(req.num_computed, len(req.block_table.blocks) * bs))
        for layer in (0, h.layer_index):        # a target layer and the head's
            k, _ = e.cache.gather(layer, torch.tensor(slots))
            leftovers.append(bool(k.abs().sum() > 0))
    assert leftovers and (not any(leftovers)) == clean


def test_plan_and_host_path():
    plan = tree_plan(parse_tree("t", "topk=4,depth=5,nodes=32"))
    assert (plan.nodes, plan.depth, plan.children, plan.frontier, plan.steps) == (32, 5, 4, 4, 4)
    assert plan.lookahead == max(32, 5 + 1 + 16) + 1
    with pytest.raises(ValueError, match="same number"):
        tree_plan(parse_tree("t", "paths=0|1|0.0|0.0.0|0.0.1|1.0"))
    assert host_path([0, 0, 1, 2], [5, 6, 7, 8], [6, 8, 9], 2) == [2, 4]
    with pytest.raises(ValueError, match="sliding"):
        run(load_tiny(), "stage", cfg=dict(sliding_window=64))


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_bucketed_tree_steps_decode_what_eager_steps_do(pair, mode):
    """The captured path's body on CPU (`runner.pad`: padded buckets, device-built metadata, the
    head's tree drafted by `HeadTreeStep` on the device, run eagerly): the tokens, accepted lengths and
    records of exact-size eager steps; three prompts pad a bucket of four."""
    t, h, tok = pair
    prompts = PROMPTS + ["import os\n"]
    outs = {}
    for pad in (False, True):
        g = prepare(prompts, 12, k=4, config=LabConfig(nwor_mode=mode, tree=TREE, scv_mode="graph"), target=t,
                    head=h, tokenizer=tok, acceptance=TreeForcedAcceptance.parse("tree:0.9,0.8,0.7;ranks=0.5,0.5"))
        g.engine.runner.pad = pad
        r = g.run().result()
        assert (g.engine.runner.graphed_steps > 0) == pad
        outs[pad] = (r.token_ids, [(w.accepted, w.record.to_dict() if w.record else None) for w in r.trace])
    assert outs[False] == outs[True]


def test_tree_is_a_sweep_parameter():
    """`nwor-lab sweep notebooks/10_sweep.ipynb --grid 'tree=chain,"topk=4,depth=5,nodes=32"'`: quoted
    values keep their commas; every value is a LabConfig.tree spelling."""
    from pathlib import Path

    from nwor_lab.sweep.grid import parse_grid
    from nwor_lab.sweep.plan import plan_runs
    grid = parse_grid(['tree=chain,"topk=4,depth=5,nodes=32"'])
    assert grid == {"tree": ["chain", "topk=4,depth=5,nodes=32"]}
    runs = plan_runs(Path(__file__).resolve().parents[1] / "notebooks" / "10_sweep.ipynb", grid)
    assert len(runs) == 2
    assert [LabConfig(tree=v).tree for v in grid["tree"]] == ["", "topk=4,depth=5,nodes=32"]


def test_profile_from_trace():
    """Per-depth reach rates and sibling ranks, windows whose output was cut left out."""
    from nwor_lab.bench.tree_engine import profile_from_trace
    from nwor_lab.engine.trace import WindowTrace
    w = WindowTrace(0, "verify", [0, 1, 2], ["tree"] * 3, [6, 6, 6], [2, 0, 3], [[1, 2, 3], [4], [5, 6]],
                    path_ranks=[[0, 1], [], [0, 0, 0]])
    p = profile_from_trace([w], 3)
    assert p["windows"] == 2 and p["profile"] == [0.5, 0.5, 0.0]
    assert p["ranks"] == [[1.0], [0.0, 1.0], [1.0]]
    TreeForcedAcceptance.from_dict(p)          # a valid tree profile


def test_cli_generate_tree(capsys):
    import json

    from nwor_lab.cli.generate import cli_generate
    assert cli_generate(["x = 1\n", "--k", "4", "--nwor", "stage", "--tree", "topk=2,depth=2,nodes=3",
                         "--max-new-tokens", "6", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tree"] == "topk=2,depth=2,nodes=3" and len(res["token_ids"][0]) == 6
    from nwor_lab.commandline.errors import UsageError
    with pytest.raises((SystemExit, UsageError)):
        cli_generate(["x", "--tree", "topk=2,depth=2,nodes=99"])


def test_both_window_kinds_have_the_seams_members():
    """The engine asks its window kind, never which kind it is: ChainKind and TreeKind both carry
    every member of the `WindowKind` interface (a missing one would surface as an AttributeError
    only on the kind's first step of that shape)."""
    from nwor_lab.engine.window_chain import ChainKind
    from nwor_lab.engine.window_kind import WindowKind
    from nwor_lab.engine.window_tree import TreeKind
    from types import SimpleNamespace
    members = set(WindowKind.__annotations__) | {n for n in vars(WindowKind) if not n.startswith("_")}
    chain_engine = SimpleNamespace(k=3, drafting=True)
    tree_engine = SimpleNamespace(tree_plan=SimpleNamespace(nodes=4, draft_rows=2, lookahead=9),
                                  tree=SimpleNamespace(is_static=False))
    for kind in (ChainKind(chain_engine), TreeKind(tree_engine)):
        missing = sorted(m for m in members if not hasattr(kind, m))
        assert not missing, f"{type(kind).__name__} lacks {missing}"
    assert ChainKind(chain_engine).verify_rows == 4 and TreeKind(tree_engine).verify_rows == 5
