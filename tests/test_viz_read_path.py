"""viz.read_path (chapter 16): the torch model of stage's verify-attention key loop agrees with the lab's
reference, reads the window from the buffer with the committed cache's bits, merges splits exactly, and
plans the tiles as the kernel does; viz.read_path_cost reads the stored runs and refuses a file without them."""
import json

import plotly.graph_objects as go
import pytest
import torch

from nwor_lab.ops.verify_attention import verify_attention_reference
from nwor_lab.ops.verify_attention_cases import make_verify_attention_case
from nwor_lab.viz.perf import BenchmarkFileError
from nwor_lab.viz.read_path import (CACHE, WINDOW, key_loop_figure, key_plan, merge_figure, request_sources,
                                    split_weights, two_source_attention)
from nwor_lab.viz.read_path_cost import load_window_vs_cache, step_rows, window_cost_figure, window_ratio_range
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_key_plan_main_loop_tail_tile_and_splits():
    plan = key_plan(150, 5, 64, 64)
    assert [(t["tile"], t["cache"], t["window"], t["loop"], t["split"]) for t in plan["tiles"]] == [
        (0, 64, 0, "main", 0), (1, 64, 0, "main", 1), (2, 22, 5, "tail", 2)]
    assert plan["source"][149] == CACHE and plan["source"][150] == WINDOW and len(plan["source"]) == 155
    starts = key_plan(128, 5, 64)                            # the window starts a tile: nothing mixes
    assert [(t["cache"], t["window"], t["loop"]) for t in starts["tiles"]] == [(64, 0, "main"), (64, 0, "main"),
                                                                                (0, 5, "tail")]
    assert key_plan(10, 3, 64, 64)["splits"] == [(0, 13)]
    with pytest.raises(ValueError, match="keys_per_split=96: must be a multiple of block_n=64"):
        key_plan(300, 5, 64, 96)


@pytest.mark.parametrize("ctx, per_split", [([150, 70, 0], 64), ([33, 1, 200], None)])
def test_the_model_matches_the_reference_and_the_buffer_read_has_the_committed_bits(ctx, per_split):
    case = make_verify_attention_case(num_reqs=len(ctx), query_lens=[5, 1, 3], context_lens=ctx, window_extra=[0, 2, 1],
                                      num_kv_heads=2, num_q_heads=2, head_size=16, dtype=torch.float32,
                                      window=True, seed=2)
    ref = verify_attention_reference(**case.kwargs())
    for r in range(len(ctx)):
        for h in range(2):
            src = request_sources(case, r, head=h, q_head=h)
            out, parts = two_source_attention(**src, scale=case.scale, block_n=16, keys_per_split=per_split and 32)
            q0, q1 = int(case.query_start_loc[r]), int(case.query_start_loc[r + 1])
            assert (out - ref[q0:q1, h]).abs().max() < 1e-5, (r, h)
            k = torch.cat([src["cache_k"], src["win_k"]])
            v = torch.cat([src["cache_v"], src["win_v"]])
            committed, _ = two_source_attention(src["q"], k, v, k[:0], v[:0], src["positions"], scale=case.scale,
                                                block_n=16, keys_per_split=per_split and 32)
            assert torch.equal(out, committed), (r, h)
            w = split_weights(parts, q1 - q0 - 1)
            assert abs(sum(w) - 1) < 1e-6 and all(x >= 0 for x in w)


def test_figures_build():
    plans = [key_plan(150, 5, 64, 64), key_plan(70, 5, 64, 64)]
    assert isinstance(key_loop_figure(plans, ["request 0", "request 1"]), go.Figure)
    case = make_verify_attention_case(num_reqs=1, query_lens=3, context_lens=[100], window_extra=0, num_kv_heads=1,
                                      num_q_heads=1, head_size=8, dtype=torch.float32, window=True, seed=0)
    _, parts = two_source_attention(**request_sources(case, 0), scale=case.scale, block_n=16, keys_per_split=32)
    merge_figure(parts, 2).to_json()


def test_the_stored_runs_are_read_and_a_file_without_them_is_named(tmp_path):
    result = load_window_vs_cache(RESULTS / "verify_attention_h200.json")
    lo, hi = window_ratio_range(result)
    rows = result["window_vs_cache"]
    assert lo == min(r["ratio"] for r in rows) and hi == max(r["ratio"] for r in rows)
    for r in rows:                                     # the ratio the file stores is its own two times'
        assert r["ratio"] == pytest.approx(r["window_kernel_us"] / r["cache_kernel_us"], abs=6e-4)
    window_cost_figure(result).to_json()
    step, by = step_rows(RESULTS / "step_8b_onestep_h200.json")
    assert {r["batch"] for r in by} == {r["batch"] for r in step["results"]}
    bad = tmp_path / "attention.json"
    bad.write_text(json.dumps({"device": "x", "rows": []}))
    with pytest.raises(BenchmarkFileError, match="no 'window_vs_cache' rows"):
        load_window_vs_cache(bad)
