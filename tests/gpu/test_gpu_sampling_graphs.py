"""T > 0 from CUDA graphs (issue 39, item 1) and every bucket captured at engine start (item 2).

The captured step draws from the engine's generator, registered with each graph
(`capture_graph(generators=)`): each replay draws what the same body run eagerly on the same
padded buffers draws. So (a) the captured T > 0 step's tokens follow the target's exact
distribution (chi-square, as tests/test_sampling_buckets.py on CPU), (b) a seeded graphed run
equals a seeded run of the same bodies eagerly on the bucket's buffers, token for token (the
exact-size eager engine draws over other shapes: the same distribution, other draws), and
(c) the defaults replay graphs at T = 0.8, with every bucket they reach captured before the first step."""
import sys
from pathlib import Path

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # tests/: the chi-square helper
from chi_square import assert_follows  # noqa: E402

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3], [7, 1, 7, 1, 7, 1]]


@pytest.fixture(scope="module")
def pair(toy_pair16):
    return toy_pair16


def decode(pair, *, prompts=PROMPTS, max_new=16, mode="stage", temperature=0.8, seed=5, max_num_seqs=4,
           eager_buckets=False, **cfg):
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode=mode, **cfg), k=3, block_size=4, max_num_seqs=max_num_seqs,
                   temperature=temperature, seed=seed)
    if eager_buckets:        # the same bodies, eagerly, on the same padded buffers
        e.runner = StepRunner(e, max_num_seqs, e.scheduler.max_num_batched_tokens, capture=False, pad=True)
    reqs = [e.add_request(p, max_new) for p in prompts]
    e.run()
    return [r.output for r in reqs], e


def test_registered_generator_replays_the_eager_draws():
    """One graph drawing from a registered generator: replay i draws what eager draw i draws."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from nwor_lab.ops.graphs import capture_graph
    g = torch.Generator("cuda").manual_seed(1)
    out = torch.empty(4096, device="cuda")
    graph = capture_graph(lambda: out.exponential_(generator=g), warmup=0, generators=[g])
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(out.clone())
    ref = torch.Generator("cuda").manual_seed(1)
    for got in replays:
        assert torch.equal(got, torch.empty(4096, device="cuda").exponential_(generator=ref))


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_seeded_graphed_equals_seeded_eager_on_the_same_buffers(pair, mode):
    graphed, e = decode(pair, mode=mode)
    assert e.graphed_off is None and e.runner.replays > 0 and e.runner.prelaunched > 0
    eager, x = decode(pair, mode=mode, eager_buckets=True)
    assert x.runner.replays == 0 and x.runner.graphed_steps > 0
    assert graphed == eager
    lazy, _ = decode(pair, mode=mode, capture_at_start=False)     # captured on first use: the same draws
    assert lazy == graphed
    assert decode(pair, mode=mode)[0] == graphed                   # run to run
    assert decode(pair, mode=mode, seed=6)[0] != graphed           # the seed matters


def test_captured_sampling_follows_the_target_distribution(pair):
    target, _ = pair
    prompt, n, temperature = [5, 9, 2], 4000, 4.0     # flat enough that many tokens have counts to test
    outs, e = decode(pair, prompts=[prompt] * n, max_new=3, temperature=temperature, seed=11, max_num_seqs=32)
    r = e.runner
    assert r.replays > 0.9 * r.steps, (r.replays, r.steps)        # (nearly) every step replayed a graph
    with torch.no_grad():
        last = target.compute_logits(target.forward_dense(torch.tensor([prompt], device="cuda"))[0, -1])
        p1 = torch.softmax(last.double() / temperature, -1).cpu()
        seqs = torch.tensor([prompt + [t] for t in range(p1.shape[0])], device="cuda")
        p2 = torch.softmax(target.compute_logits(target.forward_dense(seqs)[:, -1]).double() / temperature, -1).cpu()
    vocab = p1.shape[0]
    assert_follows(torch.bincount(torch.tensor([o[0] for o in outs]), minlength=vocab), p1, "first token")
    assert_follows(torch.bincount(torch.tensor([o[1] for o in outs]), minlength=vocab), p1 @ p2, "second token")


@pytest.mark.parametrize("k", [0, 4])
def test_defaults_replay_graphs_at_t_above_zero_captured_at_start(k):
    """`SpecEngine(target, head, LabConfig(), temperature=0.8)`: no step left eager for the
    temperature, every bucket the run reaches was captured when the engine was built."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device="cuda")
    e = SpecEngine(target, head, LabConfig(), k=k, max_num_seqs=4, temperature=0.8)
    assert e.graphed_off is None and e.runner.capture_at_start and e.runner.startup_capture is None
    for p in ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return", "x = ["]:
        e.add_request(tok.encode(p).ids, 24)
    e.run()
    assert e.runner.graphed_steps > 0 and e.runner.replays > 0
    at_start = e.runner.startup_capture[0]          # before the first step
    assert at_start == sum(inp.graph is not None for inp in e.runner.buckets.values()) > 0   # none later
    assert e.runner.replays == e.runner.graphed_steps   # every bucketed step replayed: none warmed or captured


def test_per_request_generators_are_refused_under_capture(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from nwor_lab.speculative.sampler import sample_from_probs
    probs = torch.full((2, 8), 0.125, device="cuda")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="generators: per-request generators cannot be captured"):
        sample_from_probs(probs, generators={0: torch.Generator("cuda")})
