"""Issue 20 through the Python API: honest acceptance statistics, accepted nonsense refused, misuse
named. Each test failed before its fix (the message it matches did not exist, or the call
succeeded with a wrong result)."""
import json
import math

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.config import INT64_MAX, check_int
from nwor_lab.engine import SpecEngine, acceptance_stats, generate
from nwor_lab.engine.trace import WindowTrace
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.toy import toy_pair
from nwor_lab.policies import LogObserver, make_policy
from nwor_lab.window import Acceptance, Window


@pytest.fixture(scope="module")
def sure_pair():
    """A toy pair whose drafts are (nearly) always accepted: every window accepts all k drafts."""
    return toy_pair(0, noise=0.05)


def small_cache(**kw) -> PagedKVCache:
    return PagedKVCache(KVCacheSpec(num_layers=2, num_blocks=16, block_size=16, num_kv_heads=2, head_size=8, **kw))


def open_window(mode: str):
    """A policy of `mode` with one window written: t_last + 3 drafts at slots 0..3."""
    policy = make_policy(LabConfig(nwor_mode=mode), small_cache())
    window = Window.from_counts([4], [3], torch.tensor([0, 1, 2, 3]), draft_token_ids=torch.tensor([7, 8, 9]))
    policy.begin(window)
    for layer in range(2):
        policy.write(layer, torch.randn(4, 2, 8), torch.randn(4, 2, 8))
    return policy, window


# -- mean acceptance length counts what was emitted ---------------------------------------------------
@pytest.mark.parametrize("k, new", [(16, 4), (8, 3), (4, 4)])
def test_mean_acceptance_length_counts_emitted_tokens_only(sure_pair, k, new):
    """k drafts to the last window, all accepted, but only `new` tokens wanted: the last window
    emits what is left, and the statistics count that (it used to count accepted + 1 = k + 1)."""
    target, head = sure_pair
    out = generate([[1, 2, 3], [4, 5]], max_new_tokens=new, k=k, target=target, head=head)
    spec = [(n, len(e)) for w in out.trace if w.kind == "verify" for n, e in zip(w.drafted, w.emitted) if n]
    assert spec and all(w.accepted == w.drafted for w in out.trace if w.kind == "verify" and any(w.drafted))
    emitted = sum(e for _, e in spec)
    assert out.mean_acceptance_length == pytest.approx(emitted / len(spec))          # the README's definition
    assert out.mean_acceptance_length <= new and out.mean_acceptance_length <= k + 1
    assert out.summary()["tokens"] == sum(len(t) for t in out.token_ids) == 2 * new
    # positions past the emitted ones are not counted: d1..d(new-1) accepted, the rest never offered
    assert out.acceptance_by_position[: new - 1] == [1.0] * (new - 1)


def test_acceptance_stats_rule_on_a_hand_made_trace():
    trace = [WindowTrace(0, "verify", [0, 1], drafted=[0, 0], accepted=[0, 0], emitted=[[5], [6]]),
             WindowTrace(1, "verify", [0, 1], drafted=[4, 4], accepted=[4, 1], emitted=[[1, 2], [3, 4]]),
             WindowTrace(1, "draft", [0], drafted=[3], accepted=[0], emitted=[])]
    mean, by_pos = acceptance_stats(trace, 4)
    # request 0: cut after 2 emitted drafts -> positions 1..2, both accepted; request 1: 1 accepted + 1 own token
    assert mean == pytest.approx((2 + 2) / 2)
    assert by_pos == [1.0, 0.5, 0.0, 0.0]


@pytest.mark.slow
def test_tensor_parallel_statistics_count_what_was_emitted():
    from nwor_lab import distributed as D
    (res,) = D.generate_many([[1, 2, 3]], [{}], tp=2, max_new_tokens=3, k=6, model=D.ToyPair(0, kv_heads=2),
                             timeout_s=60)
    spec = [len(e) for w in res.trace if w.kind == "verify" for n, e in zip(w.drafted, w.emitted) if n]
    assert res.mean_acceptance_length == pytest.approx(sum(spec) / len(spec)) and res.mean_acceptance_length <= 3


# -- accepted nonsense ------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [("debug", "no"), ("validate", "false"), ("cuda_graph", 1)])
def test_labconfig_switches_must_be_bools(field, value):
    with pytest.raises(TypeError, match=rf"LabConfig.{field}={value!r}: expected True or False"):
        LabConfig(**{field: value})
    assert LabConfig(debug=False, validate=True).debug is False


@pytest.mark.parametrize("slot", [-1, 256, -5])
def test_gather_refuses_slots_outside_the_cache(slot):
    cache = small_cache()
    with pytest.raises(IndexError, match=rf"slots: \[{slot}\] are not slots of this cache; gather reads slots 0..255"):
        cache.gather(0, torch.tensor([slot]))
    k, v = cache.gather(0, torch.tensor([0, 255]))
    assert k.shape == (2, 2, 8)


def test_write_kv_refuses_a_value_dtype_other_than_the_keys():
    from nwor_lab import ops
    cache = small_cache()
    with pytest.raises(TypeError, match=r"value: dtype torch.bfloat16 differs from key's torch.float32"):
        ops.write_kv(torch.randn(1, 2, 8), torch.randn(1, 2, 8, dtype=torch.bfloat16), *cache.layer(0),
                     torch.tensor([0]))
    assert not cache.value.any()


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_commit_refuses_fractional_accepted_lengths(mode):
    policy, window = open_window(mode)
    before = policy.cache.snapshot()
    with pytest.raises(TypeError, match=r"acceptance.accepted_len: float32 values \[1.7"):
        policy.commit(Acceptance(torch.tensor([True, False, False]), torch.tensor([1.7])))
    with pytest.raises(TypeError, match=r"accepted_len: float32 values"):
        Acceptance.from_accepted_len(window, torch.tensor([1.7]))
    if mode == "stage":        # off and cow write at write time; stage must not have touched the cache
        assert torch.equal(policy.cache.key, before[0]) and torch.equal(policy.cache.value, before[1])
    assert policy.commit(Acceptance.from_accepted_len(window, [1])).num_accepted == 1


def test_ints_past_int64_are_refused_by_name():
    with pytest.raises(ValueError, match=r"seed=1000000000000000000000000: must be <= 9223372036854775807"):
        check_int("seed", 10 ** 24, 0)
    assert check_int("n", INT64_MAX) == INT64_MAX


def test_generate_checks_seed_and_k_before_sizing_the_cache(sure_pair):
    target, head = sure_pair
    with pytest.raises(ValueError, match=r"seed=1000000000000000000000000: must be <="):
        generate([[1]], 2, 2, target=target, head=head, seed=10 ** 24)
    with pytest.raises(ValueError, match=r"k=100000: a verify window of 1 \+ k tokens needs as many positions; "
                                         r"the model has 2048"):
        generate([[1]], 2, 100_000, target=target, head=head)


def test_a_prompt_that_is_not_utf8_is_named():
    with pytest.raises(ValueError, match=r"prompts\[1\]: not valid UTF-8 text \(character 0 is a lone surrogate"):
        generate(["ok", "\udcff"], max_new_tokens=2, k=2)


# -- API misuse named -------------------------------------------------------------------------------
def test_a_string_where_a_labconfig_is_expected(sure_pair):
    target, head = sure_pair
    for call in (lambda: SpecEngine(target, head, "stage"), lambda: make_policy("stage", small_cache()),
                 lambda: generate([[1]], 2, 2, "stage", target=target, head=head)):
        with pytest.raises(TypeError, match=r"config='stage': expected a nwor_lab.LabConfig, got str; pass e.g. "
                                            r"LabConfig\(nwor_mode='stage'\)"):
            call()


def test_an_observer_without_on_phase_is_named_before_the_window_opens():
    policy = make_policy(LabConfig(nwor_mode="stage"), small_cache())
    policy.observers += [LogObserver(), object()]
    window = Window.from_counts([2], [1], torch.tensor([0, 1]), draft_token_ids=torch.tensor([3]))
    with pytest.raises(TypeError, match=r"observers\[1\]: object object has no on_phase\(event\) method"):
        policy.begin(window)
    assert policy.window is None                      # nothing opened, the policy is still usable
    policy.observers.pop()
    policy.begin(window)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_a_cuda_cache_without_a_gpu_is_named():
    with pytest.raises(ValueError, match=r"device='cuda': CUDA is not available here .*use device='cpu'"):
        PagedKVCache(KVCacheSpec(1, 1, 1, 1, 2), device="cuda")


def test_the_meta_device_is_refused():
    from nwor_lab._checks import check_device
    with pytest.raises(ValueError, match=r"device='meta': the lab runs on cpu or cuda"):
        check_device("device", "meta")


@pytest.mark.parametrize("field, value, match", [
    ("num_attention_heads", "8", r"num_attention_heads='8': expected an integer >= 1, got str"),
    ("hidden_size", -1, r"hidden_size=-1: expected an integer >= 1"),
    ("rope_theta", math.inf, r"rope_theta=inf: expected a finite number > 0"),
    ("tie_word_embeddings", "yes", r"tie_word_embeddings='yes': expected true or false"),
    ("eos_token_id", 10 ** 9, r"eos_token_id=1000000000: expected null or a token id in 0..4095"),
])
def test_checkpoint_config_fields_are_named(tmp_path, field, value, match):
    from nwor_lab.model.loader import CheckpointError, read_config
    from nwor_lab.model.shipped import TINY_DIR
    config = json.loads((TINY_DIR / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, field: value}))
    with pytest.raises(CheckpointError, match=rf"config.json: {match}"):
        read_config(path)
