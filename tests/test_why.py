"""Chapter 01's measurements as package code: block digests, the redraw experiment, what a
request's blocks carry, per-block statistics, the claims' arithmetic and the stored results."""
import json
from pathlib import Path

import pytest
import torch

from nwor_lab.kv import KVCacheSpec, KVLayout, PagedKVCache, block_digest, block_digests
from nwor_lab.why import (WriteTimeAmax, block_amax, differing_over_time, rejected_bytes, run_request, same_blocks)
from nwor_lab.why import claims

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _cache(layout=KVLayout.NHD, dtype=torch.float32):
    return PagedKVCache(KVCacheSpec(num_layers=2, num_blocks=4, block_size=4, num_kv_heads=2, head_size=8,
                                    dtype=dtype, layout=layout))


def test_block_digest_sees_every_byte_of_the_block_and_nothing_else():
    cache = _cache()
    cache.key.normal_(generator=torch.Generator().manual_seed(0))
    before = block_digests(cache, range(4))
    assert len(set(before)) == 4 and all(len(d) == 16 for d in before)
    cache.value[1, 2, 3, 1, 7] += 1.0                                   # one value, layer 1, block 2, last slot
    after = block_digests(cache, range(4))
    assert [a == b for a, b in zip(before, after)] == [True, True, False, True]
    assert block_digest(cache, 2, layers=[0]) != block_digest(cache, 2, layers=[1])
    twin = _cache()
    twin.key.copy_(cache.key), twin.value.copy_(cache.value)
    cache.key[0, 0, 0, 0, 0], twin.key[0, 0, 0, 0, 0] = 0.0, -0.0
    assert block_digest(twin, 0) != block_digest(cache, 0), "bytes, not values: -0.0 is not 0.0"


def test_block_digest_is_the_same_for_either_layout():
    nhd, hnd = _cache(KVLayout.NHD), _cache(KVLayout.HND)
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(nhd.key.shape, generator=g), torch.randn(nhd.value.shape, generator=g)
    for c in (nhd, hnd):
        c.key.copy_(k), c.value.copy_(v)
    assert block_digests(nhd, range(4)) == block_digests(hnd, range(4))


def test_write_time_amax_sees_what_reached_the_cache():
    from nwor_lab import LabConfig
    from nwor_lab.policies import make_policy
    from nwor_lab.viz import demo_cache, demo_window

    finals = {}
    for mode in ("off", "cow", "stage"):
        cache = demo_cache()
        demo = demo_window(cache, seed=1)
        policy = make_policy(LabConfig(nwor_mode=mode), cache)
        stat = WriteTimeAmax(cache).attach(policy)
        policy.begin(demo.window)
        for layer in range(cache.num_layers):
            policy.write(layer, demo.key[layer] * (1 + 9 * (demo.window.token_draft_pos > 0)).view(-1, 1, 1).float(),
                         demo.value[layer])
        policy.commit(demo.acceptance)
        finals[mode] = (stat.amax.clone(), block_amax(cache.key))
    # drafts carry 10x larger K: a rejected one raises the write-time amax under off and cow, not under stage
    assert torch.equal(finals["off"][0], finals["cow"][0])
    assert (finals["off"][0] > finals["stage"][0]).any()
    assert not (finals["stage"][0] > finals["stage"][1]).any()          # stage: only kept rows reached the cache
    assert torch.equal(finals["cow"][1], finals["stage"][1])            # cow's final bytes are clean again


@pytest.fixture(scope="module")
def toy_runs():
    """One request through each policy, twice: the head's drafts (A) and rejected drafts redrawn (B)."""
    from nwor_lab.model.toy import toy_pair
    from nwor_lab.why import reference_outputs
    target, head = toy_pair(0, noise=0.2)
    prompt, k, n = [1, 2, 3, 4, 5], 3, 20
    reference = reference_outputs([prompt], n + k + 1, target=target, head=head)[0]
    return {(m, v): run_request(prompt, m, k=k, max_new_tokens=n, reference=reference, redraw_seed=s, target=target,
                                head=head, block_size=4)
            for m in ("off", "cow", "stage") for v, s in (("A", None), ("B", 7))}, reference[:n]


def test_redraw_changes_only_the_rejected_drafts(toy_runs):
    runs, reference = toy_runs
    for (mode, variant), r in runs.items():
        assert r.token_ids == reference
        assert r.accepted == runs["stage", "A"].accepted
    assert runs["off", "B"].redrawn > 0 and runs["off", "A"].redrawn == 0


def test_blocks_differ_with_the_rejected_drafts_only_under_off(toy_runs):
    runs, _ = toy_runs
    over = {m: differing_over_time(runs[m, "A"], runs[m, "B"]) for m in ("off", "cow", "stage")}
    assert sum(over["off"]) > 0 and sum(over["cow"]) == sum(over["stage"]) == 0
    assert same_blocks(runs["stage", "A"], runs["stage", "B"]) == [True] * len(runs["stage", "A"].blocks)
    for s, t in zip(runs["off", "A"].snapshots, runs["off", "B"].snapshots):   # only past the kept length
        n = s.length // runs["off", "A"].block_size
        assert s.digests[:n] == t.digests[:n]


def test_rejected_bytes_a_request_carries(toy_runs):
    runs, _ = toy_runs
    clean = runs["stage", "A"]
    off, cow = rejected_bytes(runs["off", "A"], clean), rejected_bytes(runs["cow", "A"], clean)
    assert cow["bytes"] == 0 and rejected_bytes(clean, clean)["bytes"] == 0
    assert off["past_end"] == off["slots"] and off["bytes"] == off["slots"] * clean.bytes_per_slot_layer
    tails = {m: [s.tail_bytes for s in runs[m, "A"].snapshots] for m in ("off", "cow", "stage")}
    assert sum(tails["off"]) > 0 and sum(tails["cow"]) == sum(tails["stage"]) == 0
    assert (runs["off", "A"].write_amax >= clean.write_amax).all()
    import dataclasses
    with pytest.raises(ValueError, match="same accepted drafts"):
        rejected_bytes(runs["off", "A"], dataclasses.replace(clean, accepted=[[0]]))


def test_redraw_needs_a_long_enough_reference():
    from nwor_lab.model.toy import toy_pair
    target, head = toy_pair(0, noise=0.2)
    with pytest.raises(ValueError, match="max_new_tokens \\+ k \\+ 1"):
        run_request([1, 2, 3], "off", k=3, max_new_tokens=8, reference=[1] * 8, redraw_seed=1, target=target, head=head)
    with pytest.raises(ValueError, match="reference"):
        run_request([1, 2, 3], "off", k=3, max_new_tokens=8, redraw_seed=1, target=target, head=head)


def test_the_claims_arithmetic():
    seed = claims.seed_write_savings()
    assert seed["rejected"] == 1819 and round(seed["claimed_savings"], 3) == 0.899
    assert seed["t_last_rows"] == 506 and seed["stage_rows"] == 711 and seed["off_rows"] == 2530
    assert claims.write_fraction(2, 4) == 0.6 and claims.write_fraction(0, 4) == 0.2 and claims.write_fraction(4, 4) == 1


def test_write_share_points_sit_on_the_formula_where_they_are_measured():
    seed = claims.seed_write_savings()
    ncu = claims.ncu_write_ratio(json.loads((RESULTS / "step_ncu_h200.json").read_text()))
    lab = {"mean_accepted": 2.5, "ratio": 3.5 / 5}
    vllm = next(r for r in claims.vllm_rejected_writes(json.loads((RESULTS / "vllm_cpu.json").read_text()))
                if r["method"] == "eagle" and r["mode"] == "stage")
    points = {p["name"]: p for p in claims.write_share_points(seed, lab, ncu, vllm)}
    assert len(points) == 5 and {p["kind"] for p in points.values()} == {"claimed", "recomputed", "measured"}
    for name in ("the fork's run, every row counted", "the lab's runs (this notebook)", "ncu, H200, 8B-shaped step"):
        p = points[name]
        assert abs(p["share"] - claims.write_fraction(p["a"], 4)) < 0.005, name
    assert points["the fork's claim: 90 % saved"]["share"] < points["the fork's run, every row counted"]["share"]


def test_the_stored_results_answer_the_claims():
    ncu = claims.ncu_write_ratio(json.loads((RESULTS / "step_ncu_h200.json").read_text()))
    assert abs(ncu["stage"] - 0.600) < 0.001 and ncu["predicted_stage"] == 0.6 and ncu["cow"] > 1
    worth = claims.bytes_saved_worth(ncu, json.loads((RESULTS / "kernels_h200.json").read_text()),
                                     json.loads((RESULTS / "step_h200.json").read_text()))
    assert worth["rejected_rows"] == 128 and worth["saved_bytes"] == 128 * 32 * 4096 and worth["share"] < 0.001
    rows = claims.vllm_rejected_writes(json.loads((RESULTS / "vllm_cpu.json").read_text()))
    by = {(r["method"], r["mode"]): r for r in rows}
    assert by["eagle", "off"]["reached"] == by["eagle", "off"]["left"] > 0
    assert by["eagle", "cow"]["left"] == by["eagle", "stage"]["reached"] == 0 < by["eagle", "cow"]["reached"]
    assert by["eagle", "stage"]["bytes_vs_off"] < 1 == by["eagle", "cow"]["bytes_vs_off"]


def test_the_figures_build():
    from nwor_lab.viz.why import (block_digest_figure, consumers_figure, step_worth_figure, vllm_rejected_figure,
                                  write_share_figure)
    figs = [write_share_figure(4, [dict(name="x", a=2, share=0.6), dict(name="y", a=0.4, share=0.1, kind="claimed")]),
            step_worth_figure([("step", 1e4, "a"), ("path", 70, "b"), ("bytes", 8, "c", "#999999")], title="t"),
            block_digest_figure([dict(label="off · 0", differing=[0, 1, 2], held=[1, 2, 2]),
                                 dict(label="stage · 0", differing=[0, 0], held=[1, 2])], title="t"),
            consumers_figure({m: dict(tail_kib=v, raised_write_time=v, changed_final=v, blocks=10)
                              for m, v in (("off", 3), ("cow", 0), ("stage", 0))}, title="t"),
            vllm_rejected_figure(claims.vllm_rejected_writes(json.loads((RESULTS / "vllm_cpu.json").read_text())),
                                 title="t")]
    for fig in figs:
        assert fig.layout.width is None          # the notebook's width
        fig.to_json()
    assert [list(r) for r in figs[2].data[0].z] == [[0, 1, 1], [0, 0, None]]
    assert list(figs[2].data[0].text[0]) == ["=", "≠1", "≠2"]
