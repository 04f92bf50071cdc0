"""nwor_lab.serve: the workload, the wall-clock driver (open and closed loop) on a toy pair,
the metrics' definitions (vLLM's) on hand-made runs, AdaptiveK's decisions on fed measurements,
and the engine's `draft_counts` hook (tokens stay exact whatever counts it returns)."""
import math

import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine, WindowTrace
from nwor_lab.serve import AdaptiveK, Slo, serve, summarize
from nwor_lab.serve.driver import RequestTimes, ServeRun, StepRecord
from nwor_lab.serve.metrics import request_latencies
from nwor_lab.serve.workload import RequestSpec, poisson_arrivals, random_specs, sample_lengths


# -- workload ----------------------------------------------------------------------------------
def test_lengths_and_arrivals_are_seeded_and_in_range():
    a = sample_lengths(200, 40, 0.25, seed=3)
    assert a == sample_lengths(200, 40, 0.25, seed=3) and min(a) >= 30 and max(a) <= 50 and len(set(a)) > 5
    t = poisson_arrivals(400, rate=8.0, seed=1)
    assert t[0] == 0.0 and all(x <= y for x, y in zip(t, t[1:]))
    assert 0.8 < (len(t) - 1) / t[-1] / 8.0 < 1.25          # the mean rate, within sampling noise
    assert poisson_arrivals(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="range_ratio"):
        sample_lengths(1, 10, 1.5, 0)
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(3, 0.0)


# -- metrics: vLLM's definitions on a hand-made run ---------------------------------------------
def hand_run() -> ServeRun:
    r1 = RequestTimes(5, 4, arrival=0.0, chunks=[(0.1, 1), (0.3, 3)], finish=0.3)       # 4 tokens, 2 chunks
    r2 = RequestTimes(7, 3, arrival=0.2, chunks=[(0.5, 1), (0.6, 1), (0.9, 1)], finish=0.9)
    steps = [StepRecord(0.0, 0.1, 1, 0, True, 1, 1, 0), StepRecord(0.1, 0.2, 1, 4, False, 3, 0, 0),
             StepRecord(0.3, 0.2, 1, 0, True, 1, 1, 0), StepRecord(0.5, 0.1, 1, 0, False, 1, 1, 0),
             StepRecord(0.6, 0.3, 1, 0, False, 1, 0, 0)]
    return ServeRun("open", 2.0, None, 4, [r1, r2], steps, duration=0.9)


def test_ttft_tpot_itl_goodput_follow_vllm():
    run = hand_run()
    lat = request_latencies(run)
    assert lat[0]["ttft"] == pytest.approx(0.1) and lat[0]["tpot"] == pytest.approx((0.3 - 0.1) / 3)
    assert lat[1]["ttft"] == pytest.approx(0.3) and lat[1]["tpot"] == pytest.approx((0.7 - 0.3) / 2)
    assert lat[0]["itl"] == pytest.approx([0.2])               # one gap for a 3-token chunk
    assert lat[1]["itl"] == pytest.approx([0.1, 0.3])
    m = summarize(run, Slo(tpot_ms=100.0))
    assert m["completed"] == 2 and m["total_output_tokens"] == 7 and m["total_input_tokens"] == 12
    assert m["output_throughput"] == pytest.approx(7 / 0.9, rel=1e-3)
    assert m["request_goodput"] == pytest.approx(1 / 0.9, rel=1e-3)     # 66.7 ms meets 100, 200 ms does not
    assert m["p50_ttft_ms"] == pytest.approx(200.0) and m["mean_itl_ms"] == pytest.approx(200.0)
    occ = m["occupancy"]
    assert occ["mean_batch"] == pytest.approx(0.9 / 0.9) and occ["busy_fraction"] == pytest.approx(1.0)
    assert [(r["requests"], r["drafts"], r["steps"]) for r in m["steps_by_batch"]] == [(1, 0, 2), (1, 4, 1)]
    kinds = m["steps_by_kind"]
    assert {k: v["steps"] for k, v in kinds.items()} == {"prefill": 2, "decode, pre-launched": 0, "decode, host": 3}
    assert kinds["prefill"]["time_share"] == pytest.approx(0.3 / 0.9, abs=1e-3)
    assert kinds["decode, pre-launched"]["mean_ms"] is None
    assert [(x["t_s"], x["kind"]) for x in m["slowest_steps"][:2]] == [(0.6, "decode, host"), (0.1, "decode, host")]


def test_slo_parsing_names_the_bad_part():
    assert Slo.parse("ttft:200,tpot:50") == Slo(200.0, 50.0, None)
    assert Slo.parse("tpot:50 e2el:900").describe() == {"tpot_ms": 50.0, "e2el_ms": 900.0}
    for bad, match in (("itl:5", "names"), ("tpot:x", "NAME:MILLISECONDS"), ("tpot:0", "> 0"), ("", "at least")):
        with pytest.raises(ValueError, match=match):
            Slo.parse(bad)


# -- AdaptiveK ---------------------------------------------------------------------------------
def feed(ctl: AdaptiveK, n: int, k: int, seconds: float, accepted: int, times: int = 6):
    """`times` steps of one shape in a row: the controller times the ones between two of their own
    shape (the engine launches those ahead), all but the first of the shape: 6 steps give 3 times."""
    for _ in range(times):
        w = WindowTrace(0, "verify", list(range(n)), ["spec" if k else "decode"] * n, [k] * n, [accepted] * n)
        ctl.observe_step([w], seconds)


def test_adaptive_k_measures_anchors_first_then_follows_the_cost_model():
    ctl = AdaptiveK(4, explore_every=0)
    assert ctl.choose(1) == 4                     # nothing measured near batch 1: measure k_max
    feed(ctl, 1, 4, 0.010, accepted=3)            # a cheap verify at batch 1, 3 of 4 drafts accepted
    assert ctl.choose(1) == 0                     # then the decode anchor
    feed(ctl, 1, 0, 0.008, accepted=0)
    assert ctl.choose(1) >= 3                     # L(3) ~ 3 tokens for ~1.2x a decode step (d_4 rarely pays)
    # at batch 32 a step of 4 drafts costs 6x a decode step: no count pays, the controller decodes
    feed(ctl, 32, 4, 0.120, accepted=3)
    feed(ctl, 32, 0, 0.020, accepted=0)
    assert ctl.choose(32) == 0
    assert ctl.accept_length(4) == pytest.approx(1 + sum(math.prod(ctl.rates()[:j + 1]) for j in range(4)))
    assert ctl.rates()[0] > 0.8 and ctl.rates()[3] < 0.5  # position 4 was never accepted


def test_adaptive_k_interpolates_batch_sizes_it_has_not_seen():
    ctl = AdaptiveK(4, explore_every=0)
    for n, verify, decode in ((4, 0.012, 0.010), (16, 0.050, 0.015)):
        feed(ctl, n, 4, verify, accepted=3)
        feed(ctl, n, 0, decode, accepted=0)
    t8 = ctl.step_time(8, 4)
    assert 0.012 < t8 < 0.050
    assert ctl.step_time(8, 2) == pytest.approx((ctl.step_time(8, 0) + t8) / 2, rel=1e-6)


def test_adaptive_k_does_not_time_a_shapes_first_step():
    ctl = AdaptiveK(4, explore_every=0, half_life=None)        # counts kept whole (they fade by default)
    feed(ctl, 8, 4, 0.011, accepted=3, times=1)   # the bucket's warm-up (the first of a run: never timed)
    feed(ctl, 8, 4, 0.040, accepted=3, times=1)   # its capture, between two steps of its shape
    feed(ctl, 8, 4, 0.011, accepted=3, times=4)
    assert ctl.step_time(8, 4) == pytest.approx(0.011) and ctl.cells[(8, 4)][1] == 3
    assert ctl.tried[0] == 6 * 8                  # the acceptance counts every step
    fading = AdaptiveK(4, half_life=1.0)
    feed(fading, 8, 4, 0.011, accepted=3, times=3)
    assert fading.tried[0] == pytest.approx(8 * (1 + 0.5 + 0.25))   # each step halves what came before
    with pytest.raises(ValueError, match="half_life"):
        AdaptiveK(4, half_life=0.0)


def test_adaptive_k_times_a_count_only_while_it_holds():
    """A lone k = 0 step among k = 4 steps (how refreshes ran on the H200: 8.1-10.8 ms against 7.4-9.2
    for k 4) pays a change: the bucket of the drafts it makes for the next step, no pre-launch. It is
    not k = 0's cost; what it and its neighbour cost over their shapes' steady times is the switch cost."""
    ctl = AdaptiveK(4, explore_every=0)
    feed(ctl, 8, 0, 0.0060, accepted=0)                   # six in a row: three timed
    feed(ctl, 8, 4, 0.0075, accepted=3)
    feed(ctl, 8, 0, 0.0085, accepted=0, times=1)          # the lone step
    feed(ctl, 8, 4, 0.0085, accepted=3, times=1)          # the step after it, not launched ahead either
    feed(ctl, 8, 4, 0.0075, accepted=3, times=3)
    assert ctl.step_time(8, 0) == pytest.approx(0.006) and ctl.cells[(8, 0)][1] == 3
    assert ctl.step_time(8, 4) == pytest.approx(0.0075)
    assert 0.0002 < ctl.switch_cost < 0.0025


def test_adaptive_k_refreshes_the_unused_anchor_and_checks_its_arguments():
    # refreshes as often as explore_every allows (a budget of the whole run), one step each
    ctl = AdaptiveK(2, explore_every=3, refresh_budget=1.0, explore_run=1)
    feed(ctl, 1, 2, 0.01, accepted=2)
    feed(ctl, 1, 0, 0.01, accepted=0)
    picks = [ctl.choose(1) for _ in range(6)]
    assert picks == [2, 2, 0, 2, 2, 0] and [h[2] for h in ctl.history].count("refresh") == 2
    d = ctl.describe(since=3)                     # the decisions of a later load point only
    assert sum(d["chosen"].values()) == 6 and sum(d["chosen_since"].values()) == 3
    assert d["explored"] == 2 and d["explored_since"] == 1 and d["since"] == 3
    with pytest.raises(ValueError, match="k_max"):
        AdaptiveK(0)
    with pytest.raises(ValueError, match="refresh_budget"):
        AdaptiveK(2, refresh_budget=0.0)
    with pytest.raises(ValueError, match="explore_run"):
        AdaptiveK(2, explore_run=0)
    with pytest.raises(ValueError, match="candidates"):
        AdaptiveK(2, candidates=[5])


# -- the engine hook and the driver on a toy pair ---------------------------------------------
@pytest.fixture(scope="module")
def pair():
    from nwor_lab.model.toy import toy_pair
    return toy_pair(0)


def engine_for(pair, k):
    target, head = pair
    return SpecEngine(target, head if k else None, LabConfig(nwor_mode="stage"), k=k, block_size=4, num_blocks=64,
                      max_num_seqs=4)


def test_draft_counts_hook_keeps_tokens_exact(pair):
    specs = random_specs(3, 10, 14, 0.3, pair[0].config.vocab_size, seed=5)
    outs = {}
    for name, k, counts in (("target", 0, None), ("k3", 3, None), ("cycle", 3, lambda: iter([0, 1, 2, 3] * 100))):
        e = engine_for(pair, k)
        if counts is not None:
            it = counts()
            e.draft_counts = lambda eng, reqs: [next(it)] * len(reqs)
        reqs = [e.add_request(s.prompt, s.output_len) for s in specs]
        e.run()
        outs[name] = [r.output for r in reqs]
        if name == "cycle":
            drafted = {d for w in e.trace if w.kind == "verify" for d in w.drafted}
            assert drafted == {0, 1, 2, 3}
    assert outs["target"] == outs["k3"] == outs["cycle"]
    e = engine_for(pair, 2)
    e.draft_counts = lambda eng, reqs: [3] * len(reqs)
    e.add_request(specs[0].prompt, 4)
    with pytest.raises(ValueError, match="draft_counts"):
        e.run()


def test_serve_open_and_closed_loop(pair):
    specs = random_specs(5, 8, 6, 0.3, pair[0].config.vocab_size, seed=2)
    e = engine_for(pair, 2)
    ctl = AdaptiveK(2)
    e.draft_counts = ctl
    run = serve(e, specs, arrivals=poisson_arrivals(5, 50.0, seed=0), rate=50.0, controller=ctl)
    assert [r.generated for r in run.requests] == [s.output_len for s in specs]
    assert all(r.chunks[0][0] >= r.arrival and r.finish == r.chunks[-1][0] for r in run.requests)
    assert ctl.history and ctl.tried.sum() > 0
    m = summarize(run, Slo(), e.trace, e.k)
    assert m["completed"] == 5 and m["accept_length"] >= 1.0
    # closed loop: never more than `concurrency` requests out, a finished one replaced at once
    e = engine_for(pair, 0)
    run = serve(e, specs, concurrency=2)
    assert max(s.requests for s in run.steps) <= 2 and run.steady[1] > 0
    sends = sorted(r.arrival for r in run.requests)
    finishes = sorted(r.finish for r in run.requests)
    assert sends[:2] == [0.0, 0.0] and sends[2:] == finishes[:3]
    with pytest.raises(ValueError, match="not both"):
        serve(e, specs, arrivals=[0.0] * 5, concurrency=2)


def test_draft_counts_hook_on_the_graphed_path_keeps_tokens_exact():
    """The step body on bucket buffers (run on CPU without capture) drafts the next window with the
    hook's counts (missing drafts -1, the same bucket), and tokens stay the exact-size body's."""
    from nwor_lab.engine.runner import StepRunner
    from nwor_lab.model.toy import toy_pair
    target, head = toy_pair(0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3]]
    outs, seen = {}, set()
    for graphed, hook in ((False, False), (True, True)):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, block_size=4, max_num_seqs=4)
        if graphed:
            e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
        if hook:
            counts = iter([3, 0, 2, 3, 1] * 100)
            e.draft_counts = lambda eng, reqs: [next(counts)] * len(reqs)
        reqs = [e.add_request(p, 14) for p in prompts]
        e.run()
        outs[graphed] = [r.output for r in reqs]
        seen = {d for w in e.trace if w.kind == "verify" for d in w.drafted}
    assert outs[True] == outs[False]
    assert 0 in seen and len(seen) >= 3 and e.runner.graphed_steps > 0     # cut windows from buckets too


# -- the bench's arguments and the chapter's readings of a result ----------------------------------
def test_config_spec_parses_and_names_the_fix():
    import argparse
    from nwor_lab.bench.serve import config_spec
    assert config_spec("target") == (None, 0) and config_spec("eagle3:4") == ("eagle3", 4)
    assert config_spec("eagle1:auto") == ("eagle1", "auto")
    for bad in ("eagle2:4", "eagle3", "eagle3:0", "eagle3:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="HEAD:K"):
            config_spec(bad)


def fake_result():
    def row(config, c, tpot, tput, steps, L=None):
        return {"config": config, "mode": "closed", "concurrency": c, "p50_tpot_ms": tpot, "p90_tpot_ms": tpot,
                "p99_tpot_ms": tpot, "p50_ttft_ms": 1.0, "p90_ttft_ms": 1.0, "p99_ttft_ms": 1.0,
                "output_throughput": tput, "accept_length": L, "occupancy": {"mean_batch": float(c)},
                "steps_by_batch": steps}
    dec = lambda n, ms: {"requests": n, "drafts": 0, "steps": 10, "mean_ms": ms, "tokens_per_step": n}  # noqa: E731
    spec = lambda n, ms: {"requests": n, "drafts": 4, "steps": 10, "mean_ms": ms, "tokens_per_step": 3 * n}  # noqa: E731
    return {"results": [row("target-only", 1, 10.0, 100.0, [dec(1, 10.0)]),
                        row("target-only", 8, 12.0, 660.0, [dec(8, 12.0)]),
                        row("eagle", 1, 4.0, 250.0, [spec(1, 12.0)], 3.0),
                        row("eagle", 8, 15.0, 530.0, [spec(8, 45.0)], 3.0)]}


def test_the_crossover_is_found_and_explained_from_the_steps():
    from nwor_lab.viz.serving import crossover_points, explain, serve_table
    r = fake_result()
    rows = {(x["config"], x["load"]): x for x in serve_table(r)}
    assert rows["eagle", "1 client"]["tpot_speedup"] == 2.5 and rows["eagle", "8 clients"]["throughput_ratio"] < 1
    assert crossover_points(r, "eagle")["closed"] == {"tpot": "8 clients", "throughput": "8 clients"}
    e = {x["clients"]: x for x in explain(r, "eagle")}
    assert e[1]["predicted_speedup"] == pytest.approx(3 * 10 / 12, abs=1e-3)     # L x decode / EAGLE step
    assert e[8]["step_ratio"] == pytest.approx(45 / 12, abs=1e-3) and e[8]["predicted_speedup"] < 1
    assert "napkin_step_ms" not in e[8]                      # no components timed
    r["components"] = [{"batch": 8, "decode_ms": 11.0, "verify_k4_ms": 30.0, "eagle_pass_ms": 2.0}]
    r["results"] = [dict(x, config=x["config"].replace("eagle", "eagle k=4")) for x in r["results"]]
    e8 = {x["clients"]: x for x in explain(r, "eagle k=4")}[8]
    assert e8["napkin_step_ms"] == 38.0 and e8["component_verify_ms"] == 30.0


def test_a_hook_that_keeps_k_lets_the_runner_prelaunch_and_tokens_stay_exact():
    """With a draft_counts hook the runner still launches a step before the host read the one
    before, when the hook keeps k for everyone; a count below k (asked once, then filled in by the
    host) cuts the next window, and the tokens stay the eager engine's."""
    from nwor_lab.engine.runner import StepRunner
    from nwor_lab.model.toy import toy_pair
    target, head = toy_pair(0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    outs, asked = {}, []
    for graphed in (False, True):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, block_size=4, max_num_seqs=2)
        if graphed:
            e.runner = StepRunner(e, 2, 1024, capture=False, pad=True)
            counts = iter([3, 3, 3, 1, 3, 3, 3, 3, 0] * 100)

            def hook(eng, reqs):
                asked.append(len(reqs))
                return [next(counts)] * len(reqs)
            e.draft_counts = hook
        reqs = [e.add_request(p, 40) for p in prompts]
        e.run()
        outs[graphed] = [r.output for r in reqs]
    assert outs[True] == outs[False]
    seen = {d for w in e.trace if w.kind == "verify" for d in w.drafted}
    assert e.runner.prelaunched > 0 and {0, 1, 3} <= seen
    assert len(asked) <= e.runner.steps          # one decision per step at most


def test_serve_counts_the_prelaunched_steps_as_the_runner_does():
    """steps_by_kind's `decode, pre-launched` is the runner's own count of steps launched before the
    host read the step before (the driver reads it from the runner, not from timings)."""
    from nwor_lab.engine.runner import StepRunner
    from nwor_lab.model.toy import toy_pair
    target, head = toy_pair(0)
    e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=2, block_size=4, max_num_seqs=2)
    e.runner = StepRunner(e, 2, 1024, capture=False, pad=True)
    run = serve(e, random_specs(3, 4, 24, 0.0, 16, seed=1), concurrency=2)
    kinds = summarize(run, Slo())["steps_by_kind"]
    assert kinds["decode, pre-launched"]["steps"] == e.runner.prelaunched > 0
    assert sum(v["steps"] for v in kinds.values()) == e.runner.steps
    # rows: a decode step carries t_last + 2 drafts a request, its bucket 3 a slot and one padding row
    # (a dead rider's slot runs and counts as padding: the requests' rows are those the host reads)
    pre = [s for s in run.steps if s.prelaunched]
    assert (6, 7) in {(s.rows, s.padded_rows) for s in pre}
    assert all(s.rows == 3 * s.requests and s.padded_rows in (4, 7) for s in pre)
    assert kinds["prefill"]["mean_padded_rows"] > kinds["prefill"]["mean_rows"] > 0    # prompts padded to a bucket


def test_serve_records_the_garbage_collections_inside_its_steps():
    """A collection that runs during a step is counted in the run and charged to that step."""
    import gc
    from nwor_lab.serve.metrics import gc_summary, slowest_steps
    from nwor_lab.serve.driver import gc_pauses
    with gc_pauses() as pauses:
        gc.collect()
    assert len(pauses) == 1 and pauses[0][0] == 2 and pauses[0][2] >= 0
    run = hand_run()
    run.gc_pauses = [(2, 0.65, 0.01), (0, 0.15, 0.002)]
    assert gc_summary(run) == {"gen0": {"count": 1, "total_ms": 2.0, "max_ms": 2.0},
                               "gen2": {"count": 1, "total_ms": 10.0, "max_ms": 10.0}}
    assert [x["gc_ms"] for x in slowest_steps(run, 2)] == [10.0, 2.0]


def test_adaptive_k_reads_measured_counts_as_measured_and_shrugs_off_stalls():
    """The H200 serve run's batch-1 cells (ms): k_max pre-launched is the cheapest step, a cut count
    pays the host; one count also saw stalls. The controller must keep k_max (the old linear-in-k
    model with a moving mean chose 1 or 2 drafts there and lost to target-only on TPOT)."""
    ctl = AdaptiveK(4, explore_every=0)
    for k, ms in ((0, 8.1), (1, 8.5), (2, 8.5), (3, 9.3), (4, 7.0)):
        feed(ctl, 1, k, ms / 1e3, accepted=min(k, 3), times=9)
    for _ in range(3):
        feed(ctl, 1, 2, 0.5, accepted=2, times=1)             # stalls of 500 ms
    assert ctl.step_time(1, 2) == pytest.approx(0.0085)
    assert ctl.choose(1) == 4


def test_bench_serve_rows_carry_every_repeat_and_ratios_are_paired():
    """`bench serve --repeats N`: a row is the median run's with every repeat's throughput and TPOT; the
    crossover ratio is the median of per-repeat ratios (repeat i against target-only's repeat i), with
    its min–max, so one drifting repeat cannot tip it."""
    from nwor_lab.bench.serve import crossover, parser, with_spread

    def run(config, tput, tpot):
        return {"config": config, "mode": "closed", "concurrency": 8, "output_throughput": tput,
                "p50_tpot_ms": tpot, "occupancy": {"mean_batch": 8.0}, "marker": (config, tput)}
    base = with_spread([run("target-only", t, 10.0) for t in (100.0, 50.0, 104.0)])
    eagle = with_spread([run("eagle", t, 5.0) for t in (200.0, 100.0, 212.0)])
    assert base["repeats"] == 3 and base["output_throughput"] == 100.0
    assert (base["output_throughput_min"], base["output_throughput_max"]) == (50.0, 104.0)
    assert base["marker"] == ("target-only", 100.0)                  # the median run's own row
    assert eagle["output_throughput_reps"] == [200.0, 100.0, 212.0]     # run order kept
    (c,) = crossover([base, eagle])
    assert c["output_throughput_ratio_reps"] == [2.0, 2.0, 2.038]      # the slow repeat hit both configs alike
    assert c["output_throughput_ratio"] == 2.0 and c["output_throughput_ratio_max"] == 2.038
    args = parser().parse_args(["--concurrency", "8", "--temperature", "0.8"])
    assert args.repeats == 3 and args.temperature == 0.8
