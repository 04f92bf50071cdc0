"""nwor_lab.viz.crossover and serving.ratio_curves on a hand-made `bench serve` result: the napkin,
the per-step and end-to-end ratios, the time split, adaptive k's per-point draft counts, the goal
check and the crossover verdicts, each against numbers worked out by hand."""
import pytest

from nwor_lab.viz import crossover as cx
from nwor_lab.viz.serving import ratio_curves


def step(n, d, steps, ms, tokens):
    return {"requests": n, "drafts": d, "steps": steps, "mean_ms": ms, "p50_ms": ms, "tokens_per_step": tokens}


def row(config, c, tput, tpot, steps, duration, L=None, k_auto=None):
    r = {"config": config, "mode": "closed", "concurrency": c, "output_throughput": tput, "p50_tpot_ms": tpot,
         "duration_s": duration, "steps_by_batch": steps, "accept_length": L}
    if k_auto:
        r["k_auto"] = k_auto
    return r


def result():
    """Two clients. Target-only: 100 full steps of 10 ms (1 token a request) + 10 steps of one request
    of 8 ms, 1.5 s in all. EAGLE k 2: 40 full steps of 12 ms emitting 2.5 tokens a request, 5 of one
    request, 0.7 s. k auto: like EAGLE plus 3 zero-draft steps, its controller's cumulative counts."""
    tgt = row("target-only", 2, 140.0, 10.0, [step(1, 0, 10, 8.0, 1), step(2, 0, 100, 10.0, 2)], 1.5)
    eag = row("eagle3 k=2 nwor=stage", 2, 300.0, 4.0, [step(1, 2, 5, 10.0, 2.5), step(2, 2, 40, 12.0, 5.0)], 0.7, 2.5)
    auto = row("eagle3 k=auto nwor=stage", 2, 280.0, 4.5, [step(2, 0, 3, 30.0, 2), step(2, 2, 40, 12.0, 5.0)], 0.75, 2.5,
               {"chosen": {"0": 9, "2": 300}, "explored": 7})
    cross = [{"config": r["config"], "mode": "closed", "rate": None, "concurrency": 2,
              "tpot_p50_speedup": round(10.0 / r["p50_tpot_ms"], 3),
              "output_throughput_ratio": round(r["output_throughput"] / 140.0, 3)} for r in (eag, auto)]
    comps = [{"batch": 2, "decode_ms": 9.0, "verify_k2_ms": 9.5, "eagle3_pass_ms": 0.25}]
    return {"model": "8b", "device": "test", "torch": "x", "workload": {"output_len": 64},
            "results": [tgt, eag, auto], "crossover": cross, "components": comps}


def test_step_budget_sets_napkin_step_and_end_to_end_side_by_side():
    b = cx.step_budget(result(), "eagle3 k=2 nwor=stage", 2)
    assert b["k"] == 2 and b["napkin_step_ms"] == pytest.approx(10.0)            # 9.5 + 2 x 0.25
    assert b["napkin_speedup"] == pytest.approx(2.5 * 9.0 / 10.0, abs=1e-3)
    assert b["step_speedup"] == pytest.approx((5.0 / 12.0) / (2 / 10.0), abs=1e-3)
    assert b["eagle_outside_components_ms"] == pytest.approx(2.0) and b["target_outside_components_ms"] == pytest.approx(1.0)
    assert b["end_to_end"] == pytest.approx(300 / 140, abs=1e-3)
    assert b["target_time"] == {"duration_s": 1.5, "full_batch_s": 1.0, "partial_batch_s": 0.08, "rest_s": 0.42}
    assert b["eagle_time"]["full_batch_s"] == pytest.approx(0.48) and b["eagle_time"]["rest_s"] == pytest.approx(0.17)
    with pytest.raises(ValueError, match="--concurrency 8"):
        cx.step_budget(result(), "eagle3 k=2 nwor=stage", 8)
    with pytest.raises(ValueError, match="--components 2"):
        cx.step_budget({**result(), "components": []}, "eagle3 k=2 nwor=stage", 2)


def test_adaptive_k_per_point_and_summary():
    r = result()
    (p,) = cx.adaptive_points(r, "eagle3 k=auto nwor=stage", "eagle3 k=2 nwor=stage")
    assert p["steps_by_drafts"] == {0: {"steps": 3, "mean_ms": 30.0}, 2: {"steps": 40, "mean_ms": 12.0}}
    assert p["fixed_throughput"] == pytest.approx(2.143) and p["chosen_so_far"] == {"0": 9, "2": 300}
    s = cx.adaptive_summary({"short": r}, "eagle3 k=auto nwor=stage", "eagle3 k=2 nwor=stage")
    assert s["above_everywhere"] and s["steps_by_drafts"] == {0: 3, 2: 40} and s["most_behind"][0] == "short"
    assert s["chosen"] == {"short": ({"0": 9, "2": 300}, 7)}


def test_goal_verdicts_and_sign():
    r = result()
    (row_,) = cx.side_by_side({"a": r}, "eagle3 k=2 nwor=stage", {2: 2.2})
    assert row_["ratios"] == {"a": pytest.approx(2.143)} and row_["met"] == {"a": False}
    v = cx.verdicts({"a": r})
    assert [x["tpot_below_from"] for x in v] == [None, None] and v[0]["lowest_throughput"] == pytest.approx(2.143)
    pts = [{"label": f"{n} clients", "tpot": t} for n, t in ((1, 1.3), (4, 1.1), (8, 0.9))]
    assert cx.sign_over_load(pts, "tpot") == "above up to 4 clients, below from 8 clients"
    assert cx.sign_over_load(pts[:2], "tpot") == "above at every load measured"
    assert cx.sign_over_load([pts[2], pts[0]], "tpot").startswith("mixed")
    assert "| 1 | x |" in cx.markdown_table(["n", "v"], [[1, "x"]])


def test_ratio_curves_draw_each_config_per_result_with_the_goal():
    r = result()
    fig = ratio_curves({"64": r, "256": r}, "closed", goal={2: 2.2})
    names = {t.name for t in fig.data}
    assert {"eagle3 k=2, 64", "eagle3 k=auto, 256", "target-only (ratio 1)", "goal"} <= names   # nwor=stage shared: dropped
    with pytest.raises(ValueError, match="--rates"):
        ratio_curves({"64": r}, "open")


def test_phase_rows_stay_out_of_the_steady_figures():
    """A `--phases` run holds phase-switching rows at the same loads: the crossover reads the steady ones."""
    import copy
    import json
    from pathlib import Path

    from nwor_lab.viz.crossover import adaptive_points
    from nwor_lab.viz.serving import serve_table
    stored = json.loads((Path(__file__).parents[1] / "benchmarks/results/serve_8b_h200.json").read_text())
    mixed = copy.deepcopy(stored)
    for r in stored["results"]:
        ghost = dict(r, traffic="phases", output_throughput=1.0, request_throughput=1.0)
        mixed["results"].append(ghost)
    assert serve_table(mixed) == serve_table(stored)
    assert adaptive_points(mixed, "eagle3 k=auto nwor=stage") == adaptive_points(stored, "eagle3 k=auto nwor=stage")
