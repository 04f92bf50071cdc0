"""The engine's new graphed paths on the GPU, with the graphs really captured and replayed: steps
with prefills (alone, and mixed with decodes as requests join mid-run) whose graph also drafts the
next window, and forced acceptance (the 8B bench's mode) at the 8B code path's toy shape, EAGLE-1
and EAGLE-3 heads. Tokens must be the eager engine's, in every write policy."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.bench.timing import run_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return",
           "with open(path) as f:", "class Stack:\n    def push(self, x):"]


@pytest.fixture(scope="module")
def shipped():
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device="cuda")
    return target, head, [tok.encode(p).ids for p in PROMPTS]


def staggered(target, head, prompts, mode, k, graphs, acceptance=None, gap=3, new_tokens=30, seqs=4):
    from nwor_lab.engine import SpecEngine
    engine = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, scv_mode="graph", backend="cuda", cuda_graph=graphs),
                        k=k, max_num_seqs=seqs, acceptance=acceptance)
    reqs = run_prompts(engine, prompts, new_tokens, arrival_gap=gap)
    return [r.output for r in reqs], engine


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
@pytest.mark.parametrize("k", [0, 4])
def test_gpu_mixed_steps_from_graphs_decode_what_eager_steps_do(shipped, mode, k):
    target, head, prompts = shipped
    eager, _ = staggered(target, head, prompts, mode, k, graphs=False)
    graphed, engine = staggered(target, head, prompts, mode, k, graphs=True)
    assert graphed == eager
    g = engine.runner
    assert g.mixed_steps > 0 and g.prefill_steps > 0
    assert any(b.graph is not None and key[2] == 0 for key, b in g.buckets.items())   # prefill buckets replayed


def test_gpu_mixed_steps_left_eager_still_decode_the_same(shipped):
    target, head, prompts = shipped
    eager, _ = staggered(target, head, prompts, "stage", 4, graphs=False)
    from nwor_lab.engine import SpecEngine
    engine = SpecEngine(target, head, LabConfig(nwor_mode="stage", scv_mode="graph", backend="cuda"), k=4,
                        max_num_seqs=4)
    engine.runner.mixed = False
    reqs = run_prompts(engine, prompts, 30, arrival_gap=3)
    assert [r.output for r in reqs] == eager
    assert engine.runner.mixed_steps == 0 and engine.runner.replays > 0


@pytest.mark.parametrize("head_kind", ["eagle1", "eagle3"])
@pytest.mark.parametrize("mode", ["off", "stage"])
def test_gpu_forced_acceptance_8b_code_path(head_kind, mode):
    """bf16, the 8B bench's engines at toy size: eager and graphed agree (prompts of 24 tokens, so
    both pick the same attention tiles), and the acceptance follows the profile."""
    from nwor_lab.bench.engine8b import build_engine, prompts_for
    from nwor_lab.engine.generate import acceptance_stats
    from nwor_lab.model.shapes import random_head, random_target
    from nwor_lab.speculative.synthetic import ForcedAcceptance, mean_acceptance_length
    target = random_target("8b-mini", "cuda", torch.bfloat16)
    head = random_head(target, head_kind, "8b-mini")
    forced = ForcedAcceptance()
    prompts = prompts_for(4, 24, target.config.vocab_size, staggered=True)
    out, stats = {}, {}
    for graphs in (False, True):
        engine = build_engine(target, head, 4, mode, "graph", 4, 24, 40, forced, "auto", graphs)
        reqs = run_prompts(engine, prompts, 40, arrival_gap=3)
        out[graphs] = [r.output for r in reqs]
        stats[graphs] = acceptance_stats(engine.trace, 4)
        if graphs:
            assert engine.runner.mixed_steps > 0 and engine.runner.replays > 0
    assert out[True] == out[False]
    assert stats[True] == stats[False]
    assert stats[True][0] == pytest.approx(mean_acceptance_length(forced.for_k(4)), abs=0.5)


@pytest.mark.parametrize("mode", ["off", "stage"])
def test_gpu_mixed_steps_in_buckets_between_powers_of_two(shipped, mode):
    """Prompts of ~130 tokens joining 8 decoding requests: steps of 130-200 rows run from the buckets
    of 144 .. 208 rows (`buffers.token_bucket`: 8 a doubling from 128), and decode what eager steps do."""
    target, head, prompts = shipped
    long = [(p * 40)[:130 + 3 * i] for i, p in enumerate(prompts + prompts[:2])]
    eager, _ = staggered(target, head, long, mode, 4, graphs=False, seqs=8, gap=2)
    graphed, engine = staggered(target, head, long, mode, 4, graphs=True, seqs=8, gap=2)
    assert graphed == eager
    used = [key.tokens for key, b in engine.runner.buckets.items() if key.max_query_len == 0 and b.replays]
    assert any(128 < rows < 256 and rows & (rows - 1) for rows in used), used
