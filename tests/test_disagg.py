"""Prefill-to-decode hand-off (nwor_lab.disagg), CPU:

- every strategy that declares itself exact: the decode engine's tokens (and acceptance, where the
  strategy keeps it) equal one engine's, greedy and seeded T > 0, under write-all (`off`) and `stage`;
- write_all ships rows past num_computed; under `off` the ones holding a rejected row are named (the
  head's layer, the draft chain's rows), under `stage` none holds one; nwor ships no junk row;
- bytes per strategy, from the cache's shape; the frame round-trips and a mismatched engine is refused;
- no_head on the shipped pair: the same greedy tokens, lower acceptance; no_state on the shipped
  hybrid: other tokens (the state is the prompt);
- two processes over gloo decode one engine's tokens at T > 0 (the sampler's stream travels).
"""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.disagg import (HANDOFF_STRATEGIES, EnginePair, InProcess, Shipment, handoff, handoff_strategy,
                             prefill, run_handoff)
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.generate import acceptance_stats
from nwor_lab.model.toy import toy_pair

BS, K, NEW = 4, 3, 12


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def prompts(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 16, (m,), generator=g).tolist() for m in (5, 9, 2, 8)]   # 8: no partial block


def engine(pair, mode="off", temperature=0.0, head=True, seed=3, block_size=BS):
    t, h = pair
    return SpecEngine(t, h if head else None, LabConfig(nwor_mode=mode, debug=True), k=K, num_blocks=64,
                      block_size=block_size, max_num_seqs=4, temperature=temperature, seed=seed)


def one_engine(e, ps, new=NEW):
    reqs = [e.add_request(p, new) for p in ps]
    e.run()
    return [r.output for r in reqs], acceptance_stats(e.trace, e.k)[0]


EXACT = [(name, t) for name, cls in HANDOFF_STRATEGIES.items() for t in (0.0, 0.8)
         if (cls.exact_sampled if t else cls.exact_greedy)]


@pytest.mark.parametrize("mode", ["off", "stage"])
@pytest.mark.parametrize("strategy,temperature", EXACT)
def test_exact_strategies_decode_one_engines_tokens(pair, mode, strategy, temperature):
    ref, ref_acc = one_engine(engine(pair, mode, temperature), prompts())
    # the decode engine's own seed is another: at T > 0 the shipped sampler stream is what it draws from
    res = handoff(engine(pair, mode, temperature), engine(pair, mode, temperature, seed=99), prompts(), NEW, strategy)
    assert res.token_ids == ref
    if handoff_strategy(strategy).keeps_acceptance:
        assert res.mean_acceptance_length == ref_acc


def test_write_all_ships_junk_rows_and_names_the_rejected_ones(pair):
    head_layer = pair[0].num_layers
    written = handoff(engine(pair, "off"), engine(pair, "off"), prompts(), NEW, "write_all")
    assert sum(written.junk_rows) > 0
    named = [x for per in written.rejected_rows_shipped for x in per]
    assert named, "under write-all the partial block carries the draft chain's rejected rows"
    assert all(head_layer in x["layers"] for x in named)
    staged = handoff(engine(pair, "stage"), engine(pair, "stage"), prompts(), NEW, "write_all")
    assert staged.junk_rows == written.junk_rows and not any(staged.rejected_rows_shipped)
    nwor = handoff(engine(pair, "off"), engine(pair, "off"), prompts(), NEW, "nwor")
    assert sum(nwor.junk_rows) == 0 and not any(nwor.rejected_rows_shipped)


def test_bytes_per_strategy(pair):
    ps = prompts()
    e = engine(pair)
    row = 2 * e.cache.spec.num_kv_heads * e.cache.spec.head_size * 4      # key + value, float32
    layers, target_layers = e.cache.num_layers, pair[0].num_layers
    committed = [len(p) for p in ps]                                        # after the prefill step
    whole = [-(-n // BS) * BS for n in committed]
    got = {s: handoff(engine(pair), engine(pair), ps, NEW, s).kv_bytes for s in ("nwor", "write_all", "no_head")}
    assert got["nwor"] == [n * row * layers for n in committed]
    assert got["write_all"] == [n * row * layers for n in whole]
    assert got["no_head"] == [n * row * target_layers for n in committed]


def test_frame_round_trips_and_a_mismatch_is_refused(pair):
    shipped = prefill(engine(pair), prompts()[:1], NEW, "nwor")[0]
    back = Shipment.decode(shipped.encode())
    assert back.header == shipped.header
    assert back.tensors.keys() == shipped.tensors.keys()
    assert all(torch.equal(back.tensors[n], t) for n, t in shipped.tensors.items())
    assert shipped.encode().numel() == shipped.nbytes
    with pytest.raises(ValueError, match="cache_layers"):
        from nwor_lab.disagg import install
        install(engine(pair, head=False), back)
    bad = shipped.encode().clone()
    bad[8 + bad[8:].tolist().index(ord("1"))] = ord("9")    # the protocol number (the header's first digit)
    with pytest.raises(ValueError, match="protocol"):
        Shipment.decode(bad)
    with pytest.raises(ValueError, match="strategy='bogus'"):
        handoff_strategy("bogus")


@pytest.fixture(scope="module")
def tiny():
    from nwor_lab.model.shipped import load_tiny
    return load_tiny()


def test_no_head_keeps_greedy_tokens_and_loses_acceptance_on_the_shipped_pair(tiny):
    target, head, tok = tiny
    ps = [tok.encode("Once upon a time, there was a little girl named Lily. She").ids, tok.encode("The cat sat").ids]

    def make():
        return SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=4, num_blocks=64, block_size=16)
    ref, ref_acc = one_engine(make(), ps, 24)
    nwor = handoff(make(), make(), ps, 24, "nwor")
    no_head = handoff(make(), make(), ps, 24, "no_head")
    assert nwor.token_ids == ref == no_head.token_ids
    assert nwor.mean_acceptance_length == ref_acc
    assert no_head.mean_acceptance_length < ref_acc


def test_no_state_forgets_the_prompt_on_the_shipped_hybrid():
    from nwor_lab.model.shipped import load_hybrid
    target, head, tok = load_hybrid()
    ps = [tok.encode("Once upon a time, there was a little girl named Lily. She").ids]

    def make():
        return SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, num_blocks=32, block_size=16)
    ref, _ = one_engine(make(), ps, 12)
    assert handoff(make(), make(), ps, 12, "nwor").token_ids == ref
    no_state = handoff(make(), make(), ps, 12, "no_state")
    assert no_state.token_ids != ref
    assert sum(no_state.kv_bytes) < sum(handoff(make(), make(), ps, 12, "nwor").kv_bytes)


def test_in_process_transport_counts_its_frames(pair):
    link = InProcess()
    res = handoff(engine(pair), engine(pair), prompts(), NEW, "nwor", transport=link)
    assert link.bytes_sent == sum(res.frame_bytes) and not link.frames


def test_two_processes_over_gloo_decode_one_engines_tokens(pair):
    spec = EnginePair("toy", 0, LabConfig(nwor_mode="off"),
                      (("k", K), ("num_blocks", 64), ("block_size", BS), ("temperature", 0.8), ("seed", 3)))
    ref, ref_acc = one_engine(spec.build(), prompts())
    res = run_handoff(spec, prompts(), NEW, "nwor", transport="gloo")
    assert res.transport == "gloo"
    assert res.token_ids == ref and res.mean_acceptance_length == ref_acc
    assert sum(res.kv_bytes) > 0 and res.prefill_s > 0


def test_bench_disagg_reports_bytes_and_acceptance():
    from nwor_lab.bench.disagg import main
    out = main(["--strategies", "nwor,no_head", "--nwor", "stage", "--max-new-tokens", "8"])
    rows = {r["strategy"]: r for r in out["rows"]}
    assert rows["nwor"]["tokens_equal_one_engine"] and rows["no_head"]["tokens_equal_one_engine"]
    assert rows["nwor"]["mean_acceptance_length"] == rows["one engine"]["mean_acceptance_length"]
    assert 0 < rows["no_head"]["kv_bytes"] < rows["nwor"]["kv_bytes"]


def test_shipped_rows_arrive_in_fresh_blocks_bit_for_bit(pair):
    """After admission the decode cache holds, at the request's positions, the prefill cache's committed
    rows in every shipped layer; a layer not shipped (no_head's layer N) holds zeros there."""
    src = engine(pair, "off")
    ps = prompts()[:2]
    reqs = [src.add_request(p, NEW) for p in ps]
    src.step_with_progress()
    expect = {}
    for r in reqs:
        slots = torch.tensor(r.block_table.slots(range(r.num_computed)))
        expect[r.req_id] = [src.cache.layer(l)[0][slots // BS, slots % BS] for l in range(src.cache.num_layers)]
    from nwor_lab.disagg import export_request, install
    for strategy in ("nwor", "no_head"):
        dst = engine(pair, "off", block_size=8)          # another block size: rows are placed by position
        got = [install(dst, Shipment.decode(export_request(src, r, strategy).encode())) for r in reqs]
        dst.scheduler.schedule()                          # admission: fresh blocks, the bytes copied in
        for r, g in zip(reqs, got):
            assert g.block_table.blocks and g.drafts == r.drafts and g.num_computed == r.num_computed
            slots = torch.tensor(g.block_table.slots(range(g.num_computed)))
            for layer, want in enumerate(expect[r.req_id]):
                have = dst.cache.layer(layer)[0][slots // 8, slots % 8]
                shipped = handoff_strategy(strategy).ships_head or layer < pair[0].num_layers
                assert torch.equal(have, want if shipped else torch.zeros_like(want)), (strategy, layer)


def test_a_request_that_ends_in_its_prefill_step_is_not_decoded(pair):
    ref, _ = one_engine(engine(pair), prompts(), 1)
    res = handoff(engine(pair), engine(pair), prompts(), 1, "nwor")
    assert res.token_ids == ref and res.kv_bytes == [0] * len(ref) and res.decode_windows == 0


def test_refusals_name_the_setting(pair):
    t, h = pair
    few = SpecEngine(t, h, LabConfig(), k=K, num_blocks=64, block_size=BS, max_num_seqs=2)
    with pytest.raises(ValueError, match="max_num_seqs=2"):
        prefill(few, prompts(), NEW)
    assert not few.scheduler.has_work and few.scheduler.allocator.num_free == 64
    tree = SpecEngine(t, h, LabConfig(tree="topk=2,depth=3,nodes=6"), k=K, num_blocks=64, block_size=BS)
    with pytest.raises(ValueError, match="tree"):
        prefill(tree, prompts()[:1], NEW)
    assert not tree.trace and not tree.scheduler.has_work
    from nwor_lab.engine.prefix import PrefixCacheConfig
    cached = SpecEngine(t, h, LabConfig(), k=K, num_blocks=64, block_size=BS, prefix_cache=PrefixCacheConfig())
    with pytest.raises(ValueError, match="prefix caching"):
        prefill(cached, prompts()[:1], NEW)
    ring = SpecEngine(t, h, LabConfig(sliding_window=8, kv_ring="ring"), k=K, num_blocks=64, block_size=BS)
    with pytest.raises(ValueError, match="ring"):
        prefill(ring, prompts()[:1], NEW)


@pytest.mark.parametrize("mode", ["off", "stage"])
def test_shipped_target_rows_are_target_onlys(pair, mode):
    """The auditor's question for a shipped block: did its committed rows arrive as target-only's? Every
    strategy's target layers do; a corrupted row is named by layer, position and block."""
    from nwor_lab.disagg import differing_rows
    ps = prompts()
    ref = prefill(engine(pair, mode, head=False), ps, NEW, "nwor")
    for strategy in ("nwor", "write_all", "no_head"):
        shipped = prefill(engine(pair, mode), ps, NEW, strategy)
        assert all(not differing_rows(s, r) for s, r in zip(shipped, ref)), strategy
    bad = prefill(engine(pair, mode), ps[:1], NEW, "nwor")[0]
    bad.tensors["value.1"][4] += 1
    assert differing_rows(bad, ref[0]) == [{"layer": 1, "position": 4, "block": 4 // BS, "store": "value"}]


def test_junk_rows_make_equal_blocks_look_different(pair):
    """What trusts a whole shipped block's bytes (a content hash, a dedup) sees write-all's junk: the
    same prompt's partial blocks shipped from `off` and from `stage` hold the same committed rows and
    differ in the head's layer past num_computed (the draft chain's rejected rows)."""
    from nwor_lab.disagg import differing_rows
    ps = prompts()
    off = prefill(engine(pair, "off"), ps, NEW, "write_all")
    stage = prefill(engine(pair, "stage"), ps, NEW, "write_all")
    head_layer = pair[0].num_layers
    for a, b in zip(off, stage):
        assert not differing_rows(a, b)
        junk = differing_rows(a, b, junk=True)
        assert {x["layer"] for x in junk} <= {head_layer}
        assert {x["position"] for x in junk} == {x["position"] for x in a.header["rejected_rows_shipped"]}
    assert any(differing_rows(a, b, junk=True) for a, b in zip(off, stage))


def test_fp8_rows_travel_with_their_scales(pair):
    t, h = pair

    def make():
        return SpecEngine(t, h, LabConfig(nwor_mode="stage"), k=K, num_blocks=64, block_size=BS,
                          cache_dtype="fp8_e4m3")
    ref, _ = one_engine(make(), prompts())
    res = handoff(make(), make(), prompts(), NEW, "nwor")
    assert res.token_ids == ref
    fp32 = handoff(engine(pair), engine(pair), prompts(), NEW, "nwor").kv_bytes
    assert res.kv_bytes == [b // 4 for b in fp32]            # a stored element is 1 byte, not 4
    other = make()
    other.cache.set_scales(1, 2.0)
    from nwor_lab.disagg import install
    with pytest.raises(ValueError, match=r"k_scale differs .* layers \[1\]"):
        install(other, prefill(make(), prompts()[:1], NEW)[0])
