"""Sliding-window ring caches (CPU, the shipped pair; about a minute):

- the ring arithmetic: slots through the one builder, -1 padding kept, what a window evicts, the guard;
- greedy speculative output == target-only greedy with the same W for every exact strategy
  (off+slack, off+full, off+guard, cow+ring, stage+ring), k 1 and 8 (4 on fp8), staggered arrivals (prefills
  joining running speculative requests), many wraps of a ring of 16, fp8 caches; debug mode on,
  so every cache read of every layer is checked against the ring ledger;
- off+ring (W slots, write-all) really diverges, and the test locates it: the first diverging
  token, the evicted position, the layer (debug mode names it when it happens);
- the cache invariant: after every window the ring holds, for every live position, exactly the
  committed K/V that the whole-context cache holds (bit for bit, every layer, lockstep runs);
- the strategy is selectable from LabConfig, the environment and the CLI (--json says it).
"""
from __future__ import annotations

import json

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.engine import SpecEngine, prepare
from nwor_lab.engine.ring import exact_by_design, sliding_window_for, strategy_name
from nwor_lab.kv import BlockAllocator, BlockTable, SlidingWindow, build_slot_mapping, evicted_needed
from nwor_lab.ops.quant import raw
from nwor_lab.policies import POLICIES, RingCorruption

W = 16
NEW = 48                                   # prompts of 4..7 tokens: positions up to ~55, three wraps
PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "    return self._"]
EXACT = [("off", "slack"), ("off", "full"), ("off", "guard"), ("cow", "ring"), ("stage", "ring")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # a 7 M model on a shared 2-core machine: two torch threads mostly wait on each other
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair():
    from nwor_lab.model.shipped import load_tiny
    return load_tiny()


def staggered(pair, k, config, cache_dtype="auto"):
    """The prompts arriving one after the other (a prefill joins running speculative requests):
    -> (engine, requests)."""
    target, head, tok = pair
    engine = SpecEngine(target, head if k else None, config, k=k, num_blocks=64, block_size=8,
                        max_num_seqs=3, cache_dtype=cache_dtype)
    reqs = []
    for i, p in enumerate(PROMPTS):
        reqs.append(engine.add_request(tok.encode(p).ids, NEW))
        for _ in range(2 if i < len(PROMPTS) - 1 else 0):
            engine.step_with_progress()
    engine.run()
    return engine, reqs


@pytest.fixture(scope="module")
def reference(pair):
    """Target-only greedy with the same W, per cache dtype (a ring of W is exact without drafts)."""
    out = {}
    for cache_dtype in ("auto", "fp8_e4m3"):
        _, reqs = staggered(pair, 0, LabConfig(sliding_window=W), cache_dtype)
        out[cache_dtype] = [r.output for r in reqs]
    return out


# -- the arithmetic ---------------------------------------------------------------------------
def test_ring_slots_come_from_the_one_builder():
    tables = torch.tensor([[7, 2, 5], [1, 0, -1]])
    token_req = torch.tensor([0, 0, 0, 1, 1, 0])
    positions = torch.tensor([0, 11, 12, 5, 13, -1])
    slots = build_slot_mapping(tables, token_req, positions, 4, ring_slots=12)
    # ring index p mod 12: 0 -> block 7; 11 -> block 5, offset 3; 12 -> index 0 again; request 1:
    # 5 -> block 0, offset 1; 13 -> index 1 -> block 1, offset 1; padding stays -1
    assert slots.tolist() == [28, 23, 28, 1, 5, -1]
    alloc = BlockAllocator(8)
    bt = BlockTable(alloc, 4, ring_slots=10)
    bt.ensure(100, lookahead=4)
    assert len(bt.blocks) == 3 == bt.max_blocks                    # ceil(10 / 4), never more
    assert bt.slots([0, 9, 10, 23]) == build_slot_mapping(
        torch.tensor([bt.blocks]), torch.zeros(4, dtype=torch.long), torch.tensor([0, 9, 10, 23]), 4, 10).tolist()


def test_what_a_window_evicts_and_what_the_guard_allows():
    # brute force: a write-all window t_last at n + k drafts on a ring of S loses exactly the
    # positions n + j - S (j >= 1) that the query at n still needs
    for S, Wn, n, k in [(16, 16, 40, 4), (20, 16, 40, 4), (19, 16, 40, 4), (16, 16, 10, 4), (16, 16, 13, 4)]:
        lost = evicted_needed(S, Wn, n, k + 1)
        brute = [(p % S, p - S) for p in range(n, n + k + 1) if 0 <= p - S and p - S >= n - Wn + 1]
        assert lost == brute
        assert (lost == []) == (S >= Wn + k or n + k < S)
    guard = SlidingWindow(16, 16, guard=True)
    assert guard.drafts_allowed(5, 4) == 4            # the window fits before the ring wraps
    assert guard.drafts_allowed(13, 4) == 2           # drafts at 14, 15 write never-used slots
    assert guard.drafts_allowed(40, 4) == 0           # wrapped: no speculation (mlx-lm)
    assert SlidingWindow(16, 20).drafts_allowed(40, 4) == 4


def test_strategies_resolve_from_the_config():
    def resolve(mode, ring, k=4):
        cfg = LabConfig(nwor_mode=mode, kv_ring=ring, sliding_window=W)
        sw = sliding_window_for(cfg, k, POLICIES[mode])
        return strategy_name(cfg, POLICIES[mode]), sw.ring_slots, sw.guard, exact_by_design(cfg, POLICIES[mode])
    assert resolve("off", "ring") == ("off+ring", W, False, False)
    assert resolve("off", "slack") == ("off+slack", W + 4, False, True)
    assert resolve("off", "full") == ("off+full", None, False, True)
    assert resolve("off", "guard") == ("off+guard", W, True, True)
    assert resolve("off", "auto") == ("off+slack", W + 4, False, True)      # never wrong by default
    assert resolve("cow", "auto") == ("cow+ring", W, False, True)
    assert resolve("stage", "auto") == ("stage+ring", W, False, True)
    assert sliding_window_for(LabConfig(), 4, POLICIES["off"]) is None
    env = {"NWOR_LAB_SLIDING_WINDOW": "32", "NWOR_LAB_KV_RING": "Guard"}
    assert LabConfig.from_env(environ=env).replace() == LabConfig(sliding_window=32, kv_ring="guard")
    with pytest.raises(ValueError, match="NWOR_LAB_SLIDING_WINDOW"):
        LabConfig.from_env(environ={"NWOR_LAB_SLIDING_WINDOW": "-3"})
    with pytest.raises(ValueError, match=r"LabConfig.kv_ring='ringg': choose one of"):
        LabConfig(kv_ring="ringg")
    with pytest.raises(ValueError, match="sliding_window"):
        LabConfig(sliding_window=-1)


def test_a_prompt_longer_than_the_ring_is_refused(pair):
    target, head, tok = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode="stage", sliding_window=8), k=2, num_blocks=16,
                        block_size=4)
    with pytest.raises(ValueError, match=r"ring of 8 slots .* \(kv_ring='full'\)"):
        engine.add_request(list(range(1, 12)), 4)


# -- exact strategies -------------------------------------------------------------------------
# k = 1 and k = W / 2 (the smallest and largest window against the ring); k = 4 runs in the fp8 test below
@pytest.mark.parametrize("k", [1, 8])
@pytest.mark.parametrize("mode,ring", EXACT, ids=[f"{m}+{r}" for m, r in EXACT])
def test_exact_strategies_equal_target_only(pair, reference, mode, ring, k):
    engine, reqs = staggered(pair, k, LabConfig(nwor_mode=mode, kv_ring=ring, sliding_window=W, debug=True))
    assert [r.output for r in reqs] == reference["auto"]
    verify = [w for w in engine.trace if w.kind == "verify"]
    assert any({"prefill", "spec"} <= set(w.kinds) for w in verify), "a prefill should join speculative requests"
    drafted = [n for w in verify for n in w.drafted]
    if ring == "guard":           # speculation stops once the ring has wrapped
        assert 0 in drafted[-5:] and max(drafted) == k
    else:
        assert max(drafted) == k and all(len(r.prompt) + NEW > 3 * W for r in reqs)   # three wraps


@pytest.mark.parametrize("mode,ring", EXACT, ids=[f"{m}+{r}" for m, r in EXACT])
def test_exact_strategies_on_fp8_caches(pair, reference, mode, ring):
    _, reqs = staggered(pair, 4, LabConfig(nwor_mode=mode, kv_ring=ring, sliding_window=W, debug=True), "fp8_e4m3")
    assert [r.output for r in reqs] == reference["fp8_e4m3"]


# -- off on a bare ring: wrong, and located ---------------------------------------------------
def test_off_on_a_ring_of_w_diverges_and_debug_names_the_eviction(pair, reference):
    engine, reqs = staggered(pair, 4, LabConfig(nwor_mode="off", kv_ring="ring", sliding_window=W))
    got, want = [r.output for r in reqs], reference["auto"]
    assert got != want, "a write-all window on a ring of W slots must lose tokens once the ring wraps"
    first = min((j, i) for i, (g, w) in enumerate(zip(got, want)) for j, (a, b) in enumerate(zip(g, w)) if a != b)

    with pytest.raises(RingCorruption) as caught:
        staggered(pair, 4, LabConfig(nwor_mode="off", kv_ring="ring", sliding_window=W, debug=True))
    err = caught.value
    # the query at t_last (n) needs max(0, n - W + 1) onward; the window's draft at that + W overwrote it
    assert err.layer == 0 and err.by_this_window and err.kind == "verify"
    assert err.position == max(0, err.query_position - W + 1) and err.holder == err.position + W
    assert err.ring_index == err.position % W and err.req_id is not None and err.step is not None
    assert f"layer 0" in str(err) and f"position {err.position} was evicted" in str(err)
    # every token emitted before the first corrupted window is right; the first wrong one comes after
    before = sum(len(e) for w in engine.trace if w.kind == "verify" and w.step < err.step
                 for rid, e in zip(w.req_ids, w.emitted) if rid == err.req_id)
    assert got[err.req_id][:before] == want[err.req_id][:before]
    print(f"off+ring: first diverging token {first[0]} of prompt {first[1]}; {err}")


# -- the cache invariant ----------------------------------------------------------------------
@pytest.mark.parametrize("mode,ring", [("stage", "ring"), ("cow", "ring"), ("off", "slack")])
def test_ring_holds_the_committed_kv_of_every_live_position(pair, mode, ring):
    """Lockstep with the whole-context cache: after every step, every live position (the next
    query's window) of every request and layer holds the same bits in the ring."""
    target, head, tok = pair
    ids = [tok.encode(p).ids for p in PROMPTS]
    full = prepare(ids, 40, 4, LabConfig(nwor_mode="off", kv_ring="full", sliding_window=W), target=target,
                   head=head, block_size=8)
    ringed = prepare(ids, 40, 4, LabConfig(nwor_mode=mode, kv_ring=ring, sliding_window=W), target=target,
                     head=head, block_size=8)
    bs, checked = 8, 0
    while True:
        more = full.step()
        assert ringed.step() == more
        if not more:
            break
        for a, b in zip(full.requests, ringed.requests):
            assert a.output == b.output and a.num_computed == b.num_computed
            if a.finished:
                continue
            live = list(range(max(0, a.num_computed - W + 1), a.num_computed))
            rows = []
            for gen, req in ((full, a), (ringed, b)):
                s = torch.tensor(req.block_table.slots(live))
                rows.append([raw(t)[:, s // bs, s % bs] for t in (gen.engine.cache.key, gen.engine.cache.value)])
            assert all(torch.equal(x, y) for x, y in zip(*rows)), \
                f"{mode}+{ring}: a live position's K/V in the ring differs from the committed one"
            checked += len(live)
    assert checked > 200


# -- the front ends ---------------------------------------------------------------------------
def test_generate_json_names_the_strategy_and_compares_with_target_only(capsys):
    from nwor_lab.cli.main import main
    base = ["generate", "def parse_args(argv):", "--k", "4", "--sliding-window", str(W), "--max-new-tokens", "40",
            "--block-size", "8", "--json"]
    assert main(base + ["--nwor", "off", "--kv-ring", "ring"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == "off+ring" and out["kv_slots_per_request"] == W and out["ring_slots"] == W
    assert out["equals_target_only"] is False and out["first_divergence"]["token"] > 0
    assert main(base + ["--nwor", "stage"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == "stage+ring" and out["equals_target_only"] is True
    assert out["kv_memory_per_request"]["transient_bytes"] > 0


def test_bench_ring_step_path_on_cpu():
    """The 8B benchmark's code path on the shipped pair, eager on CPU: the engine's step per strategy
    on the same prompts of W tokens (the first decode step wraps the ring), correct = the step's
    verdicts and head features equal the whole-context cache's (the GPU adds the graphs)."""
    from nwor_lab.bench.ring import main
    out = main(["--model", "shipped", "--path", "step", "--device", "cpu", "--windows", "16", "--batches", "2",
                "--reps", "1", "--no-graphs", "--attention", "torch"])
    by = {r["strategy"]: r for r in out["results"]}
    assert set(by) == {f"{m}+{r}" for m, r in [("off", "ring"), *EXACT]}
    assert not by["off+ring"]["correct"] and by["off+ring"]["max_abs_diff_vs_full"] > 0
    assert all(r["correct"] for name, r in by.items() if name != "off+ring")
    assert by["stage+ring"]["kv_slots_per_request"] == 16 and by["off+slack"]["kv_slots_per_request"] == 20
