"""Decode buckets keyed by the step's draft count d (`window_chain.step_drafts`: the most drafts any
request verifies now or may draft next): a d = 0 step is a decode step (one row a request slot, no
chain), a d < k step has d + 1 rows a slot and a chain of d drafts. Run on CPU without capture (the
runner's padded path, the same bodies a graph would hold): tokens equal the fixed-k run's and
target-only greedy's in every policy, and every bucket reached is one `reachable_buckets` lists. The
captured replay of each count is tests/gpu/test_gpu_draft_count_buckets.py's (unverified here)."""
import pytest
from graph_like import graph_like

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.capture_sizes import reachable_buckets
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3]]


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def decode(pair, mode, *, k=3, hook=None, padded=True, prelaunch=True, temperature=0.0, prompts=PROMPTS, max_new=14,
           graphed=False):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode), k=k, block_size=4, max_num_seqs=4,
                   temperature=temperature, seed=7)
    if padded:
        e.runner = StepRunner(e, 4, 1024, capture=graphed, pad=True)
        e.runner.prelaunch = prelaunch
        e.runner.capture_at_start = graphed     # (a graph-like runner: every reachable bucket first)
    if hook is not None:
        e.draft_counts = hook()
    keys = set(reachable_buckets(e.runner))
    reqs = [e.add_request(p, max_new) for p in prompts]
    e.run()
    return [r.output for r in reqs], e, keys


def cycling(counts):
    def make():
        it = iter(counts * 100)
        return lambda eng, reqs: [next(it)] * len(reqs)
    return make


def per_request(eng, reqs):
    """Each request its own count (by id): the step's d is the largest."""
    return [r.req_id % 4 for r in reqs]


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_count_keyed_buckets_decode_the_fixed_k_and_target_only_tokens(pair, mode):
    greedy, _, _ = decode(pair, mode, k=0, padded=False)
    fixed, fixed_e, _ = decode(pair, mode)
    varied, e, keys = decode(pair, mode, hook=cycling([0, 0, 3, 1, 1, 2, 2, 0, 3]))
    assert varied == fixed == greedy
    decode_keys = {key for key in e.runner.buckets if key.max_query_len}
    counts = {key.k for key in decode_keys}
    assert {0, 1, 2, 3} <= counts, counts                 # every count ran from its own bucket
    assert set(e.runner.buckets) <= keys                   # and each was listed before the first step
    for key, inp in e.runner.buckets.items():
        if key.max_query_len:                              # d + 1 rows a slot, one padding row, a chain of d
            assert inp.k == key.k and inp.tokens == key.size * (key.k + 1) + 1
            assert (inp.chain is None) == (key.k == 0) and (inp.chain is None or inp.chain.k == key.k)
    # with a fixed k every decode bucket keeps k (no count below it is reached or listed)
    assert {key.k for key in fixed_e.runner.buckets if key.max_query_len} == {3}


def test_a_count_per_request_keys_the_bucket_by_the_largest(pair):
    fixed, _, _ = decode(pair, "stage")
    varied, e, keys = decode(pair, "stage", hook=lambda: per_request)
    assert varied == fixed and set(e.runner.buckets) <= keys
    seen = {d for w in e.trace if w.kind == "verify" for d in w.drafted}
    assert {0, 1, 2, 3} <= seen
    assert 3 in {key.k for key in e.runner.buckets if key.max_query_len}     # request 3 drafts 3


@pytest.mark.parametrize("mode", ["off", "cow"])
def test_eager_steps_with_a_varying_count_decode_the_same(pair, mode):
    """The eager engine (exact sizes, the sampler's k layout) against the bucketed one, one hook."""
    hook = cycling([0, 3, 0, 2, 1])
    eager, e_eager, _ = decode(pair, mode, hook=hook, padded=False)
    bucketed, e, _ = decode(pair, mode, hook=hook)
    assert eager == bucketed and e_eager.runner.graphed_steps == 0 and e.runner.graphed_steps > 0


def test_an_eager_step_that_drafts_nothing_runs_no_chain(pair):
    """Count 0 throughout, eagerly: every decode step verifies no draft and drafts none, so, as its
    d = 0 bucket would, it runs no chain (the head's pass keeps its cache, proposing nothing); the
    tokens stay target-only's."""
    greedy, _, _ = decode(pair, "stage", k=0, padded=False)
    zero, e, _ = decode(pair, "stage", hook=lambda: (lambda eng, reqs: [0] * len(reqs)), padded=False)
    assert zero == greedy
    decode_keys = [key for key in e.runner.exact if key.max_query_len]
    assert decode_keys and not any(key.chain for key in decode_keys)


def test_seeded_sampling_with_a_varying_count_is_the_same_prelaunched_or_filled(pair):
    """T > 0 with a hook: a count-keyed bucket draws over its own (d-slot) layout, so its seeded
    stream is its own; pre-launched and host-filled steps draw the same numbers."""
    hook, few = cycling([3, 3, 3, 3, 0, 0, 2, 2, 2, 3]), dict(prompts=PROMPTS[:2], max_new=40)
    launched, e, _ = decode(pair, "stage", hook=hook, temperature=0.8, **few)
    filled, _, _ = decode(pair, "stage", hook=hook, temperature=0.8, prelaunch=False, **few)
    assert launched == filled and e.runner.prelaunched > 0
    assert {key.k for key in e.runner.buckets if key.max_query_len} >= {0, 2, 3}


def test_the_graph_count_stays_bounded(pair):
    """k = 4, 64 requests: 7 decode buckets with a fixed k, 7 x 5 = 35 with a draft_counts hook."""
    target, head = pair
    e = SpecEngine(target, head, LabConfig(), k=4, block_size=4, max_num_seqs=64, num_blocks=64)
    e.runner = StepRunner(e, 64, 1024, capture=False, pad=True)
    assert len([key for key in reachable_buckets(e.runner) if key.max_query_len]) == 7
    e.draft_counts = lambda eng, reqs: [0] * len(reqs)
    decode_keys = [key for key in reachable_buckets(e.runner) if key.max_query_len]
    assert len(decode_keys) == 35 and {key.k for key in decode_keys} == {0, 1, 2, 3, 4}
    assert min(key.tokens for key in decode_keys if key.size == 64) == 65       # d = 0: a decode step's rows


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_graph_like_buckets_replay_at_every_count_and_decode_the_eager_tokens(pair, mode, monkeypatch):
    """The CPU stand-in for graphs (tests/graph_like.py: fixed output buffers overwritten by each
    replay), every reachable bucket captured at start: a varying count replays a bucket of each
    count and decodes the eager engine's tokens."""
    hook = cycling([0, 0, 3, 3, 1, 1, 2, 2, 0, 3])
    eager, _, _ = decode(pair, mode, hook=hook, padded=False)
    graph_like(monkeypatch)
    graphed, e, keys = decode(pair, mode, hook=hook, graphed=True)
    assert graphed == eager
    replayed = {key.k for key, inp in e.runner.buckets.items() if key.max_query_len and inp.replays}
    assert replayed == {0, 1, 2, 3} and e.runner.replays > 0
    assert e.runner.startup_capture[0] == len([key for key in keys if key.max_query_len or key.tokens <= 1024])


def test_a_hybrid_target_decodes_from_count_keyed_buckets():
    """A hybrid target's decode buckets open the state window in the device layout with d + 1 rows
    a request: a varying count decodes the eager engine's tokens."""
    from nwor_lab.bench.state import toy_pair as hybrid_pair
    target, head = hybrid_pair()
    outs = []
    for padded in (False, True):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage", state_mode="stage"), k=3, block_size=4,
                       max_num_seqs=4)
        if padded:
            e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
        e.draft_counts = cycling([0, 0, 3, 3, 1, 1, 2, 2, 0, 3])()
        reqs = [e.add_request(p, 14) for p in ([1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12])]
        e.run()
        outs.append([r.output for r in reqs])
    assert outs[0] == outs[1]
    assert {key.k for key in e.runner.buckets if key.max_query_len} == {0, 1, 2, 3}
