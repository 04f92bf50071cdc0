"""Write policies off / cow / stage: cache invariants over random windows, lifecycle, errors."""
import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nwor_lab import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.policies import WindowStateError, make_policy
from nwor_lab.policies.invariants import check_invariants, off_reference, random_window, run_window
from nwor_lab.speculative import ScvRunner, check_against_sampler
from nwor_lab.window import Acceptance, Window


def accept(window, mask):
    """The Acceptance of a host draft-mask list."""
    return Acceptance.from_draft_mask(window, torch.tensor(mask, dtype=torch.bool))

MODES = ("off", "cow", "stage")


def build_cache(spec, gen, scales=None):
    cache = PagedKVCache(spec)
    cache.key.copy_(torch.randn(cache.key.shape, generator=gen).to(spec.storage_dtype))
    cache.value.copy_(torch.randn(cache.value.shape, generator=gen).to(spec.storage_dtype))
    if scales is not None:
        cache.k_scale.copy_(scales), cache.v_scale.copy_(scales * 2)
    return cache


def run_all_modes(spec, seed, *, num_reqs, max_k, chunks, acceptance="mask", scv_mode="off", scales=None,
                  spec_frac=0.6, pad_frac=0.1):
    """Same window, same starting cache, every mode; returns {mode: (cache, record)} and the window."""
    gen = torch.Generator().manual_seed(seed)
    base = build_cache(spec, gen, scales)
    before = base.snapshot()
    rw = random_window(base, gen, num_reqs=num_reqs, max_k=max_k, spec_frac=spec_frac, pad_frac=pad_frac)
    out = {}
    for mode in MODES:
        cache = build_cache(spec, torch.Generator().manual_seed(seed), scales)
        metrics = LabMetrics()
        policy = make_policy(LabConfig(nwor_mode=mode, scv_mode=scv_mode, debug=True), cache, metrics)
        acc = None
        if acceptance == "sampled":   # SCV from the sampler's output, cross-checked as in debug mode
            acc = ScvRunner(scv_mode).accept(rw.window, rw.sampled_token_ids)
            check_against_sampler(rw.window, acc, rw.sampled_token_ids)
        rec = run_window(policy, rw, chunks=chunks, acceptance=acc)
        assert check_invariants(policy, cache, before, off_reference(cache, before, rw), rw) == []
        out[mode] = (cache, rec, metrics)
    return out, rw


@given(seed=st.integers(0, 10_000), layout=st.sampled_from(["NHD", "HND"]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       cache_dtype=st.sampled_from(["auto", "fp8_e4m3", "fp8_e5m2"]), per_head=st.booleans(),
       num_reqs=st.integers(1, 8), max_k=st.integers(1, 6), chunks=st.integers(1, 3),
       acceptance=st.sampled_from(["mask", "sampled"]), scv_mode=st.sampled_from(["off", "graph", "adaptive"]))
def test_invariants_hold_for_random_windows(seed, layout, dtype, cache_dtype, per_head, num_reqs, max_k, chunks,
                                            acceptance, scv_mode):
    # block_size == num_kv_heads: only strides tell NHD from HND
    spec = KVCacheSpec(3, 32, 4, 4, 16, dtype, cache_dtype, layout)
    scales = None
    if cache_dtype != "auto":
        g = torch.Generator().manual_seed(seed + 1)
        scales = 0.01 + 0.1 * torch.rand(3, 4, generator=g)
        if not per_head:
            scales = scales[:, :1].expand(3, 4).contiguous()
    out, rw = run_all_modes(spec, seed, num_reqs=num_reqs, max_k=max_k, chunks=chunks, acceptance=acceptance,
                            scv_mode=scv_mode, scales=scales)
    accepted = sum(rw.accepted_len)
    for mode, (cache, rec, metrics) in out.items():
        assert rec.num_accepted == accepted and rec.drafts_committed == accepted
        assert rec.per_request_accepted == rw.accepted_len
        assert metrics.value("accepted", mode) == accepted
        assert metrics.value("drafts", mode) == rw.window.num_drafts
    # every mode keeps the same committed tokens
    assert out["off"][1].tokens_committed == out["stage"][1].tokens_committed == out["cow"][1].tokens_committed


def test_more_than_512_drafts_and_bytes_accounting():
    spec = KVCacheSpec(2, 256, 16, 2, 8, torch.float16, "auto", "HND")
    out, rw = run_all_modes(spec, 7, num_reqs=100, max_k=12, chunks=3, spec_frac=1.0, pad_frac=0.0)
    w = rw.window
    assert w.num_drafts > 512
    bpt = spec.bytes_per_token_layer
    acc = sum(rw.accepted_len)
    rejected = w.num_drafts - acc
    off, cow, stage = (out[m][1] for m in MODES)
    assert off.bytes_written == w.num_tokens * 2 * bpt
    assert cow.bytes_logged == w.num_drafts * 2 * bpt and cow.bytes_restored == rejected * 2 * bpt
    assert stage.bytes_written == (w.num_tokens - rejected) * 2 * bpt
    assert stage.bytes_skipped == rejected * 2 * bpt


def test_all_rejected_and_all_accepted():
    spec = KVCacheSpec(2, 16, 4, 2, 8)
    for n_acc in (0, 3):
        for mode in MODES:
            gen = torch.Generator().manual_seed(3)
            cache = build_cache(spec, gen)
            before = cache.snapshot()
            slots = torch.arange(8) * 2
            w = Window.from_counts([4, 4], [3, 3], slots)
            p = make_policy(LabConfig(nwor_mode=mode), cache)
            p.begin(w)
            k = torch.randn(2, 8, 2, 8, generator=gen)
            for layer in range(2):
                p.write(layer, k[layer], -k[layer])
            rec = p.commit(accept(w, [j < n_acc for j in range(3)] * 2))
            assert rec.num_accepted == 2 * n_acc
            drafts = slots[w.draft_rows]
            rejected = drafts[[j >= n_acc for j in range(3)] * 2]
            bs = spec.block_size
            same = torch.equal(cache.key[:, rejected // bs, rejected % bs], before[0][:, rejected // bs, rejected % bs])
            assert same == (mode != "off" or n_acc == 3)


@pytest.mark.parametrize("mode", MODES)
def test_cancel_leaves_cache_as_off_would(mode):
    spec = KVCacheSpec(3, 16, 4, 2, 8, torch.bfloat16, "fp8_e4m3", "NHD")
    gen = torch.Generator().manual_seed(11)
    scales = torch.full((3, 2), 0.05)
    rw = random_window(build_cache(spec, gen, scales), gen, num_reqs=5)
    caches = {}
    for m in ("off", mode):
        cache = build_cache(spec, torch.Generator().manual_seed(11), scales)
        p = make_policy(LabConfig(nwor_mode=m), cache)
        p.begin(rw.window)
        t = rw.window.num_tokens
        for layer in range(2):  # layer 2 never written; layer 1 only half: a failure mid-forward
            n = t if layer == 0 else t // 2
            p.write(layer, rw.key[layer, :n], rw.value[layer, :n])
        rec = p.cancel()
        assert rec.cancelled and p.window is None
        caches[m] = cache
    assert torch.equal(caches["off"].key.view(torch.uint8), caches[mode].key.view(torch.uint8))
    assert torch.equal(caches["off"].value.view(torch.uint8), caches[mode].value.view(torch.uint8))


@pytest.mark.parametrize("mode", MODES)
def test_lifecycle_errors(mode):
    spec = KVCacheSpec(2, 8, 4, 2, 8)
    cache = PagedKVCache(spec)
    p = make_policy(LabConfig(nwor_mode=mode), cache)
    w = Window.from_counts([3], [2], torch.tensor([0, 1, 2]), torch.tensor([5, 6]))
    k = torch.zeros(3, 2, 8)
    with pytest.raises(WindowStateError, match="commit: no window is open"):
        p.commit(accept(w, [True, False]))
    with pytest.raises(WindowStateError, match="write: no window"):
        p.write(0, k, k)
    p.begin(w)
    with pytest.raises(WindowStateError, match="already open"):
        p.begin(w)
    with pytest.raises(IndexError, match="layer=5"):
        p.write(5, k, k)
    with pytest.raises(ValueError, match="key: expected shape"):
        p.write(0, k[:, :1], k[:, :1])
    with pytest.raises(TypeError, match="key: dtype"):
        p.write(0, k.half(), k.half())
    with pytest.raises(ValueError, match="token_offset"):
        p.write(0, k, k, token_offset=1)
    p.write(0, k[:2], k[:2])
    with pytest.raises(ValueError, match="already written"):
        p.write(0, k[1:2], k[1:2], token_offset=1)
    p.write(0, k[2:], k[2:], token_offset=2)
    p.write(1, k[:1], k[:1])
    with pytest.raises(WindowStateError, match=r"layers \[1\] received only part"):
        p.commit(accept(w, [True, False]))
    p.write(1, k[1:], k[1:], token_offset=1)
    one = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match="acceptance.draft_mask: expected shape"):
        p.commit(Acceptance(torch.tensor([True, False, False]), one))
    with pytest.raises(TypeError, match="Acceptance.from_draft_mask"):
        p.commit(torch.tensor([True, False]))
    with pytest.raises(ValueError, match="prefix rule"):
        p.commit(accept(w, [False, True]))
    with pytest.raises(ValueError, match="accepted_len=\\[3\\]"):
        p.commit(Acceptance(torch.tensor([True, True]), torch.tensor([3], dtype=torch.int32)))
    rec = p.commit(ScvRunner("off").accept(w, torch.tensor([[5, 9, -1]])))
    assert rec.num_accepted == 1
    with pytest.raises(WindowStateError, match="commit: no window is open"):
        p.commit(accept(w, [True, False]))  # double commit


@pytest.mark.parametrize("mode", MODES)
def test_contradictory_acceptance_is_refused_before_any_write(mode):
    """A commit mask that keeps drafts the draft mask rejects would make the modes diverge."""
    cache = build_cache(KVCacheSpec(1, 8, 4, 1, 4), torch.Generator().manual_seed(0))
    p = make_policy(LabConfig(nwor_mode=mode), cache)
    w = Window.from_counts([4], [3], torch.tensor([0, 1, 2, 3]))
    p.begin(w)
    p.write(0, torch.ones(4, 1, 4), torch.ones(4, 1, 4))
    written = cache.snapshot()
    bad = Acceptance(torch.zeros(3, dtype=torch.bool), torch.zeros(1, dtype=torch.int32),
                     torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="acceptance.commit_mask"):
        p.commit(bad)
    assert torch.equal(cache.key, written[0]), "nothing committed or restored by a refused commit"
    p.cancel()
    assert p.window is None


def test_begin_rejects_bad_slots_before_writing():
    cache = PagedKVCache(KVCacheSpec(1, 2, 4, 1, 4))
    p = make_policy(LabConfig(nwor_mode="stage"), cache)
    with pytest.raises(ValueError, match="window.slot_mapping: slot ids \\[8\\]"):
        p.begin(Window.from_counts([2], [1], torch.tensor([0, 8])))
    with pytest.raises(ValueError, match="same slot appears twice"):
        p.begin(Window.from_counts([2], [1], torch.tensor([3, 3])))
    assert p.window is None


def test_window_errors_and_metadata_shape():
    with pytest.raises(ValueError, match="cannot hold 3 drafts"):
        Window.from_counts([3], [3], torch.arange(3))
    with pytest.raises(ValueError, match="slot_mapping: 4 entries"):
        Window.from_counts([3], [2], torch.arange(4))
    w = Window.from_counts([4, 100, 3, 100, 2], [3, 0, 2, 0, 1], torch.arange(209))
    assert w.draft_rows.tolist() == [1, 2, 3, 105, 106, 208]
    assert w.token_draft_pos[:4].tolist() == [0, 1, 2, 3]
    assert w.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]


def test_stage_grows_and_window_kv_reads_staging():
    cache = PagedKVCache(KVCacheSpec(2, 64, 4, 2, 8))
    p = make_policy(LabConfig(nwor_mode="stage"), cache)
    assert p.capacity == 64
    w = Window.from_counts([100], [0], torch.arange(100))
    p.begin(w)
    assert p.capacity == 128
    k = torch.randn(100, 2, 8)
    p.write(0, k, k * 2)
    kw, vw = p.window_kv(0)
    assert torch.equal(kw, k) and torch.equal(vw, k * 2)
    assert not cache.key.any(), "stage writes nothing to the cache before commit"
    p.write(1, k, k)
    p.commit()
    assert torch.equal(cache.gather(0, torch.arange(100))[0], k)


def test_debug_logs_lifecycle(caplog):
    cache = PagedKVCache(KVCacheSpec(1, 8, 4, 1, 4))
    p = make_policy(LabConfig(nwor_mode="cow", debug=True), cache)
    with caplog.at_level(logging.INFO, logger="nwor_lab.policies"):
        p.begin(Window.from_counts([3], [2], torch.tensor([0, 1, 2])))
        p.write(0, torch.zeros(3, 1, 4), torch.zeros(3, 1, 4))
        p.commit(accept(p.window, [True, False]))
    text = caplog.text
    assert "window 0 begin: 3 tokens, 2 drafts" in text and "1/2 drafts accepted (per request [1])" in text


def test_env_overrides_config(monkeypatch):
    monkeypatch.setenv("NWOR_LAB_NWOR_MODE", "stage")
    monkeypatch.setenv("NWOR_LAB_SCV_MODE", "graph")
    monkeypatch.setenv("NWOR_LAB_DEBUG", "1")
    cfg = LabConfig.from_env(LabConfig(nwor_mode="cow"))
    assert (cfg.nwor_mode, cfg.scv_mode, cfg.debug) == ("stage", "graph", True)
    assert LabConfig(nwor_mode="cow").nwor_mode == "cow", "the constructor never reads the environment"
    monkeypatch.setenv("NWOR_LAB_NWOR_MODE", "bogus")
    with pytest.raises(ValueError, match="nwor_mode='bogus'.*NWOR_LAB"):
        LabConfig.from_env()
    monkeypatch.setenv("NWOR_LAB_NWOR_MODE", "off")
    monkeypatch.setenv("NWOR_LAB_DEBUG", "maybe")
    with pytest.raises(ValueError, match="NWOR_LAB_DEBUG"):
        LabConfig.from_env()


def test_metrics_registries_are_independent():
    a, b = LabMetrics(), LabMetrics()
    a.windows.labels("off").inc()
    assert a.value("windows", "off") == 1 and b.value("windows", "off") == 0
    assert "nwor_windows_total" in a.exposition()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_committed_equals_rejection_sampler_accepted(mode, temperature):
    """Metadata -> window -> sampler on target logits -> commit(sampled ids): counts agree."""
    from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
    gen = torch.Generator().manual_seed(5)
    num_draft = [3, 0, 2, 0, 4, 1]
    sched = [n + 1 if n else 5 for n in num_draft]
    cu = torch.tensor(sched).cumsum(0)
    vocab = 6  # a small vocabulary so that drafts are often accepted
    drafts = torch.randint(0, vocab, (sum(num_draft),), generator=gen)
    md = SpecDecodeMetadata.build(num_draft, cu, drafts)
    logits = torch.randn(len(md.logits_indices), vocab, generator=gen) * 3
    # a drafter that is right ~70% of the time: propose the target's argmax at most positions
    good = logits[md.target_logits_indices.long()].argmax(-1)
    drafts = torch.where(torch.rand(len(drafts), generator=gen) < 0.7, good, drafts)
    md = SpecDecodeMetadata.build(num_draft, cu, drafts)
    sampled = rejection_sample(md, None, logits, temperature=temperature, generator=gen)
    # the sampler's accepted count, read off its output: leading entries equal to the drafts
    want, start = [], 0
    for r, n in enumerate(num_draft):
        a = 0
        while a < n and int(sampled[r, a]) == int(drafts[start + a]):
            a += 1
        want.append(a)
        start += n
    spec = KVCacheSpec(2, 16, 4, 2, 8)
    cache = build_cache(spec, gen)
    window = Window.from_metadata(md, cu, torch.randperm(64, generator=gen)[: int(cu[-1])])
    policy = make_policy(LabConfig(nwor_mode=mode, debug=True), cache)
    policy.begin(window)
    for layer in range(2):
        kv = torch.randn(window.num_tokens, 2, 8, generator=gen)
        policy.write(layer, kv, kv)
    acceptance = ScvRunner("off").accept(window, sampled)
    check_against_sampler(window, acceptance, sampled)
    rec = policy.commit(acceptance)
    assert rec.per_request_accepted == want
    assert 0 < sum(want) < sum(num_draft), "the seed must give a mix of accepted and rejected drafts"
    assert rec.drafts_committed == rec.num_accepted == sum(want)
    assert rec.tokens_committed == window.num_tokens - (sum(num_draft) - sum(want))


@pytest.mark.parametrize("mode", MODES)
def test_window_over_a_layer_subset(mode):
    """A draft-chain window writes only the head's layer: CoW logs/restores that layer alone."""
    spec = KVCacheSpec(4, 16, 4, 2, 8)
    gen = torch.Generator().manual_seed(2)
    cache = build_cache(spec, gen)
    before = cache.snapshot()
    p = make_policy(LabConfig(nwor_mode=mode), cache)
    w = Window.from_counts([4], [3], torch.tensor([5, 6, 7, 8]))
    with pytest.raises(ValueError, match="layers=range\\(0, 5\\)"):
        p.begin(w, layers=range(0, 5))
    p.begin(w, layers=range(3, 4))
    kv = torch.randn(4, 2, 8, generator=gen)
    with pytest.raises(ValueError, match="layer=0: this window was opened for layers 3..3"):
        p.write(0, kv, kv)
    p.write(3, kv, kv)
    rec = p.commit(accept(w, [True, False, False]))
    bpt = spec.bytes_per_token_layer
    if mode == "cow":
        assert rec.bytes_logged == 3 * bpt and rec.bytes_restored == 2 * bpt
    assert torch.equal(cache.key[:3], before[0][:3]), "layers outside the window are untouched"
    kept = torch.tensor([5, 6])
    assert torch.equal(cache.gather(3, kept)[0], kv[:2])
    rejected = torch.tensor([7, 8])
    same = torch.equal(cache.gather(3, rejected)[0], before[0][3][rejected // 4, rejected % 4])
    assert same == (mode != "off")


def test_debug_cross_checks_acceptance_against_the_sampler():
    """The engine's debug check: an Acceptance must say what the sampler's output says."""
    w = Window.from_counts([3], [2], torch.tensor([0, 1, 2]), torch.tensor([5, 6]))
    sampled = torch.tensor([[5, 9, -1]])
    check_against_sampler(w, accept(w, [True, False]), sampled)
    with pytest.raises(AssertionError, match="sampler's output says \\[1\\]"):
        check_against_sampler(w, accept(w, [True, True]), sampled)
