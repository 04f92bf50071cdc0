"""Decode buckets keyed by the step's draft count d, captured (issue 39, item 3). UNVERIFIED when
written: the author's machine has no GPU; the CPU side is tests/test_draft_count_buckets.py (the
same bodies eagerly on the buckets' buffers, and tests/graph_like.py's stand-in for graphs).

A `draft_counts` hook that varies the count per step: every reachable (slots, d) bucket is captured
at start, a graph of each count d in 0..k replays (graphed steps at every count), and the tokens
equal the eager engine's (T = 0: target-only greedy's too) in every policy. At T = 0.8 a seeded
graphed run equals the same bodies run eagerly on the same padded buffers, token for token, with
the probabilities handed to the requests as views of each graph's output (no per-step copy)."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.config import NWOR_MODES
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.capture_sizes import reachable_buckets
from nwor_lab.engine.runner import StepRunner

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3], [7, 1, 7, 1, 7, 1]]
COUNTS = [0, 0, 3, 3, 1, 1, 2, 2, 0, 3]


@pytest.fixture(scope="module")
def pair(toy_pair16):
    return toy_pair16


def decode(pair, *, mode="stage", k=3, temperature=0.0, hook=True, graphs=True, eager_buckets=False,
           prompts=PROMPTS, max_new=24, max_num_seqs=4, max_num_batched_tokens=1024):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, cuda_graph=graphs), k=k, block_size=4,
                   max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                   temperature=temperature, seed=5)
    if eager_buckets:        # the same bodies, eagerly, on the same padded buffers
        e.runner = StepRunner(e, max_num_seqs, max_num_batched_tokens, capture=False, pad=True)
    if hook and k:
        it = iter(COUNTS * 100)
        e.draft_counts = lambda eng, reqs: [next(it)] * len(reqs)
    keys = reachable_buckets(e.runner)
    reqs = [e.add_request(p, max_new) for p in prompts]
    e.run()
    return [r.output for r in reqs], e, keys


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_a_varying_count_replays_a_graph_of_every_count_and_decodes_the_eager_tokens(pair, mode):
    greedy, _, _ = decode(pair, mode=mode, k=0, graphs=False)
    eager, _, _ = decode(pair, mode=mode, graphs=False)
    graphed, e, keys = decode(pair, mode=mode)
    assert graphed == eager == greedy
    assert e.graphed_off is None and e.runner.replays > 0
    assert e.runner.startup_capture is not None and e.runner.startup_capture[0] > 0
    decode_buckets = {key: inp for key, inp in e.runner.buckets.items() if key.max_query_len}
    assert set(decode_buckets) <= set(keys)                                # all captured at start
    assert all(inp.graph is not None for inp in decode_buckets.values())
    assert {key.k for key, inp in decode_buckets.items() if inp.replays} == {0, 1, 2, 3}   # replayed at every count


def test_seeded_sampling_with_a_varying_count_replays_what_the_buckets_draw_eagerly(pair):
    graphed, e, _ = decode(pair, temperature=0.8)
    eager, _, _ = decode(pair, temperature=0.8, eager_buckets=True)
    assert graphed == eager and e.runner.replays > 0


def test_a_request_left_out_of_a_step_keeps_its_probabilities(pair):
    """Three running requests, a token budget for two (t_last + 3 drafts each): the third waits a
    step while the bucket replays for the other two; its handed-out probabilities are copied first
    (`StepRunner._keep_lent_probs`), so the graphed run equals the eager buckets' run."""
    kw = dict(temperature=0.8, hook=False, prompts=[[1, 2], [4, 5], [9, 10]], max_new=16, max_num_batched_tokens=8)
    graphed, e, _ = decode(pair, **kw)
    eager, _, _ = decode(pair, eager_buckets=True, **kw)
    assert graphed == eager and e.runner.replays > 0
