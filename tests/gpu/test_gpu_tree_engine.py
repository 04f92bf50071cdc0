"""Draft trees through the engine on the GPU (Triton verify attention with the tree mask, the head's
tree drafting): greedy tree decoding equals target-only under every write policy and both heads; the
EAGLE-2 trees replayed from CUDA graphs decode what eager steps do (static trees stay eager,
declared in `graphed_off`); the Triton kernel and the torch reference agree; bf16 policies agree."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.engine import generate
from nwor_lab.model.shipped import load_tiny

pytestmark = pytest.mark.gpu

PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return"]
TREE = "topk=4,depth=5,nodes=16"


@pytest.fixture(scope="module", params=["eagle1", "eagle3"])
def pair(request):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return load_tiny(device="cuda", head=request.param)


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_tree_equals_target_only(pair, mode):
    t, h, tok = pair
    ref = generate(PROMPTS, 32, k=0, target=t, head=h, tokenizer=tok, device="cuda").token_ids
    res = generate(PROMPTS, 32, k=4, config=LabConfig(nwor_mode=mode, scv_mode="graph", tree=TREE, debug=True),
                   target=t, head=h, tokenizer=tok, device="cuda")
    assert res.token_ids == ref
    assert res.mean_acceptance_length > 1.5


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_tree_graphed_steps_decode_what_eager_steps_do(pair, mode):
    """EAGLE-2 trees captured like chains (a bucket per padded batch, the head's tree drafted in the
    same graph): tokens, accepted lengths and records of the same body run eagerly; the graphs were
    captured and replayed."""
    t, h, tok = pair
    outs = {}
    for graphs in (False, True):
        res = generate(PROMPTS[:3], 32, k=4, config=LabConfig(nwor_mode=mode, scv_mode="graph", tree=TREE,
                                                              cuda_graph=graphs), target=t, head=h, tokenizer=tok,
                       device="cuda")
        outs[graphs] = (res.token_ids, [(w.accepted, w.record.to_dict() if w.record else None) for w in res.trace])
        if graphs:
            assert res.engine.graphed_off is None
            assert res.engine.runner.replays > 0, "tree steps were not replayed from CUDA graphs"
    assert outs[False] == outs[True]


def test_gpu_static_tree_stays_eager_as_declared():
    t, h, tok = load_tiny(device="cuda")
    ref = generate(PROMPTS, 24, k=0, target=t, head=h, tokenizer=tok, device="cuda").token_ids
    res = generate(PROMPTS, 24, k=4, config=LabConfig(nwor_mode="stage", tree="paths=0|1|0.0|1.0|0.0.0|1.0.0"),
                   target=t, head=h, tokenizer=tok, device="cuda")
    assert res.token_ids == ref
    assert "static tree" in res.engine.graphed_off and res.engine.runner.graphed_steps == 0


def test_gpu_tree_triton_matches_torch_attention():
    t, h, tok = load_tiny(device="cuda")
    outs = [generate(PROMPTS, 24, k=4, config=LabConfig(nwor_mode="stage", tree=TREE, attention=a),
                     target=t, head=h, tokenizer=tok, device="cuda").token_ids for a in ("triton", "torch")]
    assert outs[0] == outs[1]


def test_gpu_tree_bf16_policies_agree():
    outs = {m: generate(PROMPTS, 24, k=4, device="cuda", dtype=torch.bfloat16,
                        config=LabConfig(nwor_mode=m, tree=TREE, attention="triton", debug=True)).token_ids
            for m in ("off", "cow", "stage")}
    assert outs["off"] == outs["cow"] == outs["stage"]


def test_gpu_tree_sampled_agree_across_policies():
    outs = [generate(PROMPTS, 24, k=4, device="cuda", temperature=0.8, seed=5,
                     config=LabConfig(nwor_mode=m, tree=TREE)).token_ids for m in ("off", "cow", "stage")]
    assert outs[0] == outs[1] == outs[2]


def test_gpu_forced_tree_acceptance_is_captured():
    """The 8B tree bench's path at toy size: forced tree acceptance (a tree profile) inside captured
    steps. `on_path[cur] = True` there once copied a host scalar, which a capture refuses."""
    from nwor_lab.bench.engine8b import prompts_for
    from nwor_lab.bench.timing import time_engine
    from nwor_lab.bench.tree_engine import build_engine_8b, tree_for
    from nwor_lab.model.shapes import random_head, random_target
    from nwor_lab.speculative.tree_forced import TreeForcedAcceptance
    dev = torch.device("cuda")
    target = random_target("8b-mini", dev, torch.bfloat16)
    head = random_head(target, "eagle1", "8b-mini")
    acc = TreeForcedAcceptance((0.9, 0.7, 0.5, 0.3, 0.2), ranks=((0.7, 0.2, 0.1),))
    prompts = prompts_for(2, 16, target.config.vocab_size, False)
    lens = {}
    for graphs in (False, True):
        eng = build_engine_8b(target, head, tree_for(16), 16, "stage", 2, 16, 12, acc, "auto", graphs)
        run = time_engine(eng, prompts, 12, 1, dev, arrival_gap=0)
        lens[graphs] = [w.accepted for w in run["trace"] if w.kind == "verify"]
        if graphs:
            assert eng.graphed_off is None and eng.runner.replays > 0
    assert lens[False] == lens[True] and any(a for acc_ in lens[True] for a in acc_)
