"""T > 0 from the bucketed step (the captured path's buffers, run eagerly on CPU; no CUDA graph
here): the step samples at T > 0 from its bucket (StepRunner no longer keeps it eager), a step
pre-launched on the inputs the step before computed on the device takes its drafts'
probabilities there and samples what a host-filled step samples, and the emitted tokens follow
the target's distribution (chi-square against the exact probabilities from a dense forward).

The capture itself (the engine's generator registered with each graph, captured == eager token
for token) needs a GPU: tests/gpu/test_gpu_sampling_graphs.py. The bucketed step draws its noise
over the bucket's padded shapes, so its seeded tokens are not the exact-size eager step's (the
same distribution, another stream of draws); the eager path is unchanged."""
import pytest
import torch

from chi_square import assert_follows
from graph_like import graph_like
from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3]]


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def decode(pair, *, mode="stage", padded=True, prelaunch=True, temperature=0.8, seed=5, prompts=PROMPTS,
           max_new=14, max_num_seqs=4):
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=3, block_size=4, max_num_seqs=max_num_seqs,
                   temperature=temperature, seed=seed)
    if padded:
        e.runner = StepRunner(e, max_num_seqs, 1024, capture=False, pad=True)
        e.runner.prelaunch = prelaunch
    reqs = [e.add_request(p, max_new) for p in prompts]
    e.run()
    recs = [(t.kind, t.accepted, t.record.to_dict() if t.record else None) for t in e.trace]
    return [r.output for r in reqs], recs, e


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_prelaunched_steps_at_t_above_zero_sample_what_host_filled_steps_do(pair, mode):
    """The pre-launched step's draft probabilities come from the chain's output on the device
    (`StepRunner._prelaunch`); the host-filled step copies them from the requests: same draws,
    same tokens and records, in every write policy."""
    launched = decode(pair, mode=mode)
    filled = decode(pair, mode=mode, prelaunch=False)
    r = launched[2].runner
    assert r.graphed_steps > 0 and r.prelaunched > 0            # the paths were taken
    assert filled[2].runner.prelaunched == 0
    assert launched[:2] == filled[:2]


def test_bucketed_sampling_is_seeded_and_the_same_in_every_policy(pair):
    outs = [decode(pair, mode=m)[0] for m in NWOR_MODES]
    assert all(o == outs[0] for o in outs[1:])
    assert decode(pair, seed=6)[0] != outs[0]                    # the seed matters
    assert decode(pair, temperature=0.0)[0] != outs[0]           # it really sampled


def test_the_eager_engine_on_cpu_runs_no_bucket_at_t_above_zero(pair):
    """The CPU default (no capture, no padding) keeps every step on exact-size buffers, as before."""
    tokens, _, e = decode(pair, padded=False)
    assert e.runner.graphed_steps == 0 and e.runner.steps > 0
    assert e.graphed_off is None                                 # nothing asked for graphs here
    assert decode(pair, padded=False)[0] == tokens               # seeded: the same draws


def exact_marginals(target, prompt: list[int], temperature: float):
    """(p(t1 | prompt), p(t2 | prompt) summed over t1) from dense forwards, float64."""
    with torch.no_grad():
        last = target.compute_logits(target.forward_dense(torch.tensor([prompt]))[0, -1])
        p1 = torch.softmax(last.double() / temperature, -1)
        vocab = p1.shape[0]
        seqs = torch.tensor([prompt + [t] for t in range(vocab)])
        p2 = torch.softmax(target.compute_logits(target.forward_dense(seqs)[:, -1]).double() / temperature, -1)
    return p1, p1 @ p2


def test_bucketed_sampling_follows_the_target_distribution(pair):
    """Many requests of one prompt, sampled at T = 1 from their buckets (padding, drafts from the
    head's own samples): the first and second tokens follow the target alone."""
    target, _ = pair
    prompt, n, temperature = [5, 9, 2], 800, 1.0
    outs, _, e = decode(pair, prompts=[prompt] * n, max_new=3, temperature=temperature, seed=11, max_num_seqs=8)
    assert e.runner.graphed_steps > 0
    p1, p2 = exact_marginals(target, prompt, temperature)
    vocab = p1.shape[0]
    assert_follows(torch.bincount(torch.tensor([o[0] for o in outs]), minlength=vocab), p1, "first token")
    assert_follows(torch.bincount(torch.tensor([o[1] for o in outs]), minlength=vocab), p2, "second token")


def test_a_hybrid_target_samples_from_its_decode_buckets_alike_prelaunched_or_filled():
    """A hybrid target's decode buckets at T > 0 (state window in the device layout): the same draws
    pre-launched or filled by the host."""
    from nwor_lab.bench.state import toy_pair as hybrid_pair
    target, head = hybrid_pair()
    outs = []
    for prelaunch in (True, False):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage", state_mode="stage"), k=3, block_size=4,
                       max_num_seqs=4, temperature=0.8, seed=4)
        e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
        e.runner.prelaunch = prelaunch
        reqs = [e.add_request(p, 14) for p in PROMPTS[:3]]
        e.run()
        assert e.runner.graphed_steps > 0 and (e.runner.prelaunched > 0) == prelaunch
        outs.append([r.output for r in reqs])
    assert outs[0] == outs[1]


def budget_run(pair, graphed: bool):
    """Three running requests under a token budget of 8 rows: two decode a step (t_last + 3 drafts
    each), the third waits its turn, holding the draft probabilities its last step handed it."""
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, block_size=4, max_num_seqs=4,
                   max_num_batched_tokens=8, temperature=0.8, seed=3)
    e.runner = StepRunner(e, 4, 8, capture=graphed, pad=True)
    e.runner.capture_at_start = False
    reqs = [e.add_request(p, 16) for p in ([1, 2], [4, 5], [9, 10])]
    e.run()
    return [r.output for r in reqs], e.runner


def test_probabilities_handed_out_of_a_graph_survive_its_replays_for_other_requests(pair, monkeypatch):
    """No per-step copy of the [B, k, V] probabilities: the requests hold views of the bucket's
    output, and a request left out of a step gets its own rows before the bucket replays for others
    (`StepRunner._keep_lent_probs`); the tokens are the padded run's without graphs."""
    plain, _ = budget_run(pair, graphed=False)
    graph_like(monkeypatch)
    graphed, runner = budget_run(pair, graphed=True)
    assert runner.replays > 0 and graphed == plain
    monkeypatch.setattr(StepRunner, "_keep_lent_probs", lambda self, inp, requests: setattr(inp, "lent", []))
    unguarded, runner = budget_run(pair, graphed=True)
    assert runner.replays > 0 and unguarded != plain          # the hazard is real: the guard is what keeps it
