"""End-to-end engine correctness on a toy pair (CPU, seconds):

- greedy speculative decoding == greedy target-only, for every NWOR mode x SCV mode;
- off / cow / stage give identical tokens (greedy, and stochastic with the same seed);
- after every window the cache holds exactly the committed tokens' K/V (dense recompute), cow
  leaves rejected slots bit-identical, stage never touches them, no slot outside the window moves;
- committed == accepted every window; bad inputs raise.
"""
import itertools

import pytest
import torch

from nwor_lab.config import NWOR_MODES, SCV_MODES, LabConfig
from nwor_lab.engine import SpecEngine, generate
from nwor_lab.model.toy import toy_pair

VOCAB = 16


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def prompts(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    lens = [3, 9, 1, 14, 6, 2, 11, 5][:n]
    return [torch.randint(0, VOCAB, (m,), generator=g).tolist() for m in lens]


def run(pair, k=4, mode="off", scv="off", observers=(), **kw):
    target, head = pair
    kw = {"max_new_tokens": 16, "max_num_seqs": 3, "block_size": 4, **kw}
    # debug: every window asserts committed == accepted by the sampler (host loop cross-check)
    cfg = LabConfig(nwor_mode=mode, scv_mode=scv, debug=True)
    return generate(prompts(), k=k, config=cfg, target=target, head=head, observers=observers, **kw)


@pytest.fixture(scope="module")
def target_only(pair):
    return run(pair, k=0)


@pytest.fixture(scope="module")
def greedy_reference(target_only):
    return target_only.token_ids


@pytest.mark.parametrize("mode,scv", list(itertools.product(NWOR_MODES, SCV_MODES)))
def test_greedy_spec_equals_target_only(pair, target_only, greedy_reference, mode, scv):
    res = run(pair, mode=mode, scv=scv)
    assert res.token_ids == greedy_reference
    assert all(len(t) == 16 for t in res.token_ids)
    acc = [a for w in res.trace if w.kind == "verify" for n, a in zip(w.drafted, w.accepted) if n]
    assert 0 in acc and 4 in acc and any(0 < a < 4 for a in acc), "toy pair should give mixed acceptance"
    assert res.target_forwards < target_only.target_forwards


def test_mixed_windows_and_continuous_batching(pair):
    res = run(pair)
    kinds = [set(w.kinds) for w in res.trace if w.kind == "verify"]
    assert any({"prefill", "spec"} <= s for s in kinds), "a prefill should join running speculative requests"
    # every request drafts k to the end (one shape per decode step): its last window verifies
    # k drafts and emits just the one token it had left
    last = {}
    for w in res.trace:
        if w.kind == "verify":
            for rid, n, out in zip(w.req_ids, w.drafted, w.emitted):
                last[rid] = (n, out)
    assert all(n == 4 for n, _ in last.values())
    assert any(len(out) == 1 for _, out in last.values())
    assert max(len(w.req_ids) for w in res.trace) <= 3


@pytest.mark.parametrize("k", [1, 2, 5])
def test_other_k(pair, greedy_reference, k):
    assert run(pair, k=k, mode="stage").token_ids == greedy_reference


def test_stochastic_same_seed_same_tokens_in_every_mode(pair, greedy_reference):
    kw = {"temperature": 0.8, "max_new_tokens": 12}
    outs = [run(pair, mode=m, scv=s, seed=7, **kw).token_ids
            for m, s in [("off", "off"), ("cow", "graph"), ("stage", "adaptive")]]
    assert all(o == outs[0] for o in outs[1:])
    assert run(pair, mode="stage", seed=8, **kw).token_ids != outs[0]
    assert outs[0] != [t[:12] for t in greedy_reference]  # it really sampled


class CacheAudit:
    """Checks every window, at its commit, against the snapshot taken at its begin (an engine
    observer: the draft chain's window follows the verify window inside the same step), and after
    every verify window that each committed position holds the dense K/V."""

    def __init__(self, judge_as_preserving: bool | None = None):
        self.windows = 0
        self.judge_as_preserving = judge_as_preserving   # None: what the policy declares

    def on_phase(self, event):
        if event.phase == "begin":
            self.before = event.policy.cache.snapshot()
        elif event.phase == "commit":
            self.check_window(event)

    def check_window(self, event):
        policy, w, rec = event.policy, event.window, event.record
        preserving = policy.preserves_rejected_slots if self.judge_as_preserving is None \
            else self.judge_as_preserving
        assert rec.drafts_committed == rec.num_accepted
        after_k, after_v = policy.cache.key, policy.cache.value
        real = w.slot_mapping >= 0                                       # padding rows write nowhere
        slots, commit = w.slot_mapping[real], event.acceptance.commit_mask[real]
        changed = (after_k != self.before[0]).flatten(3).any(-1) | (after_v != self.before[1]).flatten(3).any(-1)
        changed = changed.flatten(1, 2)                                  # [L, slots]
        in_window = torch.zeros(changed.shape[1], dtype=torch.bool)
        in_window[slots] = True
        assert not changed[:, ~in_window].any(), "a slot outside the window changed"
        rejected = slots[~commit]
        if preserving:
            assert not changed[:, rejected].any(), f"{policy.name}: a rejected slot changed"
        elif event.kind == "draft":
            assert changed[event.layers.start, rejected].all(), "off writes the draft chain"

    def on_window_end(self, engine, entry, window):
        self.windows += 1
        assert entry.record.drafts_committed == entry.record.num_accepted == sum(entry.accepted)
        if entry.kind == "verify":
            self.check_committed(engine, entry, engine.cache.spec.block_size)

    def check_committed(self, engine, entry, bs):
        """Every committed position of every request in the window holds the dense K/V."""
        target, head = engine.target, engine.head
        reqs = {r.req_id: r for r in engine.scheduler.running}
        for rid in entry.req_ids:
            r = reqs[rid]
            n = r.num_computed
            slots = torch.tensor(r.block_table.slots(range(n)))
            for layer, (k, v) in enumerate(dense_kv(target, head, r.tokens, n)):
                ck, cv = engine.cache.gather(layer, slots)
                torch.testing.assert_close(ck, k, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(cv, v, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def dense_kv(target, head, tokens, n):
    """Per cache layer (target layers, then the head), the K/V `[n, H, D]` of positions 0..n-1."""
    ids = torch.tensor([tokens[:n]])
    x = target.model.embed_tokens(ids)
    cos, sin = target.model.rotary.cos_sin(torch.arange(n), x.dtype)
    out, aux = [], {}
    for i, layer in enumerate(target.model.layers):
        aux[i] = x
        _, k, v = layer.self_attn.qkv(layer.input_layernorm(x), cos, sin)
        out.append((k[0], v[0]))
        x = layer(x, cos, sin)
    if head is None:
        return out
    emb = head.embed(torch.tensor([tokens[1:n + 1]]))
    if hasattr(head, "midlayer"):   # EAGLE-3: [input_norm(embed), hidden_norm(fc(aux streams))]
        fused = head.fc(torch.cat([aux[i] for i in head.aux_layers], -1))
        hx = torch.cat([head.midlayer.input_layernorm(emb), head.midlayer.hidden_norm(fused)], -1)
        _, k, v = head.midlayer.self_attn.qkv(hx, cos, sin)
    else:                           # EAGLE-1: fc([embed, final-norm hidden])
        hx = head.fc(torch.cat([emb, target.model.norm(x)], dim=-1))
        _, k, v = head.layers[0].self_attn.qkv(hx, cos, sin)
    out.append((k[0], v[0]))
    return out


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_cache_holds_exactly_the_committed_kv(pair, greedy_reference, mode):
    audit = CacheAudit()
    res = run(pair, mode=mode, observers=[audit])
    assert res.token_ids == greedy_reference
    assert audit.windows == len(res.trace) and any(w.kind == "draft" for w in res.trace)


def test_cow_and_stage_byte_counts(pair):
    cow = run(pair, mode="cow")
    stage = run(pair, mode="stage")
    v_cow = [w.record for w in cow.trace if w.kind == "verify"]
    v_stage = [w.record for w in stage.trace if w.kind == "verify"]
    assert sum(r.bytes_restored for r in v_cow) > 0
    assert sum(r.bytes_skipped for r in v_stage) > 0
    d_stage = [w.record for w in stage.trace if w.kind == "draft"]
    assert d_stage and all(r.tokens_committed == 0 for r in d_stage)


def test_eos_stops_a_request(pair, greedy_reference):
    target, head = pair
    ref = greedy_reference
    eos = ref[0][5]
    target.config.__dict__["eos_token_id"] = eos   # frozen dataclass: tests only
    try:
        res = run(pair, stop_at_eos=True)
    finally:
        target.config.__dict__["eos_token_id"] = None
    assert res.token_ids[0] == ref[0][:ref[0].index(eos) + 1]


def test_bad_inputs(pair):
    target, head = pair
    with pytest.raises(ValueError, match="bigger cache"):
        generate([[1] * 40], max_new_tokens=8, k=4, target=target, head=head, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="empty"):
        generate([[]], max_new_tokens=8, target=target, head=head)
    with pytest.raises(ValueError, match="tokenizer"):
        generate(["text"], max_new_tokens=8, target=target, head=head)
    with pytest.raises(ValueError, match="nwor_mode"):
        LabConfig(nwor_mode="sometimes")
    with pytest.raises(ValueError, match="k=-1"):
        SpecEngine(target, head, k=-1)


def test_audit_catches_rejected_writes(pair):
    """The audit is not vacuous: `off` judged by cow's rule (rejected slots untouched) fails."""

    with pytest.raises(AssertionError, match="rejected slot changed"):
        run(pair, mode="off", observers=[CacheAudit(judge_as_preserving=True)])


@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_same_tokens_in_every_mode(pair, cache_dtype):
    outs = {m: run(pair, mode=m, cache_dtype=cache_dtype).token_ids for m in NWOR_MODES}
    assert outs["off"] == outs["cow"] == outs["stage"]
