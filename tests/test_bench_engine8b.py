"""`nwor-lab bench engine --model 8b` on CPU at the toy shape (`8b-mini`): the same code path (the
random target, EAGLE-1- and EAGLE-3-shaped heads, forced acceptance, the engine's graphed steps run
without capture, staggered arrivals), the JSON the chapter reads, and the ncu join of the
attention-variant benchmark. The timings themselves need the GPU and are not tested."""
import pytest
import torch

from nwor_lab.bench import attention_variants as av
from nwor_lab.bench.timing import run_prompts
from nwor_lab.bench.engine8b import build_engine, main, napkin, prompts_for
from nwor_lab.engine.runner import StepRunner
from nwor_lab.engine.buffers import token_bucket
from nwor_lab.model.shapes import SHAPES, config_for, random_head, random_target
from nwor_lab.speculative.synthetic import ForcedAcceptance, mean_acceptance_length


@pytest.fixture(scope="module")
def mini():
    target = random_target("8b-mini", "cpu", torch.float32)
    return target, {h: random_head(target, h, "8b-mini") for h in ("eagle1", "eagle3")}


def test_shapes_are_llama3_8b_and_its_heads():
    cfg = config_for("8b")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == \
        (32, 4096, 8, 128, 128256)
    # parameters without allocating them: 8.03 B (embedding and LM head 0.53 B each)
    from nwor_lab.model.llama import LlamaForCausalLM
    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    assert 8.0e9 < n < 8.1e9
    assert SHAPES["8b"]["draft_vocab_size"] == 32000


def test_mini_heads_are_shaped_like_the_published_ones(mini):
    target, heads = mini
    e1, e3 = heads["eagle1"], heads["eagle3"]
    h = target.config.hidden_size
    assert e1.fc.weight.shape == (h, 2 * h) and e1.fc.bias is not None and e1.embed_tokens is None
    assert e3.fc.weight.shape == (h, 3 * h) and e3.lm_head.weight.shape == (SHAPES["8b-mini"]["draft_vocab_size"], h)
    ids = torch.arange(e3.draft_vocab_size) + e3.d2t                       # draft id -> target id
    assert bool((ids.diff() > 0).all()) and int(ids.max()) < target.config.vocab_size
    assert torch.isfinite(target.model.rotary.inv_freq).all()


@pytest.mark.parametrize("head", ["eagle1", "eagle3"])
def test_graphed_steps_decode_the_eager_tokens_with_forced_acceptance(mini, head):
    """The bench's engines, steps on the padded static buffers (no capture on CPU), requests
    arriving mid-run: the tokens and the accepted lengths of the eager engine."""
    target, heads = mini
    forced = ForcedAcceptance()
    prompts = prompts_for(2, 10, target.config.vocab_size, staggered=True)
    out = {}
    for graphed in (False, True):
        engine = build_engine(target, heads[head], 3, "stage", "off", 2, 10, 12, forced, "auto", False)
        if graphed:
            engine.runner = StepRunner(engine, 2, engine.scheduler.max_num_batched_tokens, capture=False, pad=True)
        reqs = run_prompts(engine, prompts, 12, arrival_gap=2)
        out[graphed] = [r.output for r in reqs]
        if graphed:
            assert engine.runner.mixed_steps > 0 and engine.runner.graphed_steps > 0
    assert out[True] == out[False]


def test_bench_json_on_the_mini_shape(tmp_path):
    out = main(["--model", "8b-mini", "--device", "cpu", "--dtype", "float32", "--ks", "2", "--batch-sizes", "1",
                "--new-tokens", "6", "--prompt-len", "8", "--repeats", "1", "--policies", "stage", "--no-hf",
                "--out", str(tmp_path / "e.json")])
    assert (tmp_path / "e.json").is_file()
    rows = out["results"]
    assert [r["config"] for r in rows] == ["target-only", "eagle1 k=2 nwor=stage", "eagle3 k=2 nwor=stage"]
    eagle = rows[1]
    assert eagle["expected_mean_acceptance_length"] == pytest.approx(mean_acceptance_length(ForcedAcceptance().for_k(2)),
                                                                     abs=1e-3)
    assert {"napkin_speedup", "decode_tokens_per_s", "speedup_vs_target_only", "prefill_seconds"} <= set(eagle)
    c = out["components"][0]
    assert {"decode_ms", "verify_k2_ms", "eagle1_pass_ms", "eagle3_pass_ms"} <= set(c)
    assert out["acceptance"]["profile"] == list(ForcedAcceptance().for_k(2))


def test_napkin_formula_reproduces_the_h100_anchor():
    # decode 5.80 ms, a 5-token verify 5.85 ms, head passes 0.55 / 0.32 ms, L = 3.35, k = 4
    c = {"decode_ms": 5.80, "verify_k4_ms": 5.85, "eagle1_pass_ms": 0.55, "eagle3_pass_ms": 0.32}
    assert napkin(c, "eagle1", 4, 3.35)["napkin_speedup"] == pytest.approx(2.42, abs=0.01)
    assert napkin(c, "eagle3", 4, 3.35)["napkin_speedup"] == pytest.approx(2.72, abs=0.01)


def test_token_buckets_pad_little_above_1024():
    assert [token_bucket(n) for n in (1, 15, 16, 100, 1023, 1024, 2048, 2111)] == \
        [16, 16, 32, 128, 1024, 1536, 2560, 2560]


def test_token_buckets_pad_an_eighth_at_most_where_rows_cost_flops(monkeypatch):
    # a 160-row verify and one or two 64-token prompts: powers of two padded 224 to 256 and 288 to 512
    from nwor_lab.engine import buffers
    assert [token_bucket(n) for n in (127, 128, 224, 288, 390, 1000)] == [128, 144, 240, 320, 416, 1024]
    for n in range(128, 1024):
        assert n < token_bucket(n) <= n + max(16, n // 8)
    monkeypatch.setattr(buffers, "STEPS_PER_DOUBLING", 1)      # the rule before: powers of two
    assert [token_bucket(n) for n in (127, 128, 224, 288, 390, 1000)] == [128, 256, 256, 512, 512, 1024]


def test_ncu_csv_joins_the_manifest():
    order = [dict(batch=b, source=s, plan=p) for b, s, p in av.variants([1, 16])]
    metrics = list(av.NCU_METRICS)
    rows = ["==PROF== Connected to process",
            ",".join(f'"{h}"' for h in ["ID", "Kernel Name", *metrics]),
            ",".join(f'"{u}"' for u in ["", "", *["unit"] * len(metrics)])]
    for i in range(len(order)):
        rows.append(",".join(f'"{x}"' for x in [str(i), "_verify_attention_kernel", *[f"{(i + 1) * 1000:,}"] * len(metrics)]))
        if i == 0:        # the split plan's merge kernel, filtered out
            rows.append(",".join(f'"{x}"' for x in [str(i), "_merge_splits_kernel", *["1"] * len(metrics)]))
    joined = av.join_ncu("\n".join(rows), {"device": "x", "launch_order": order})
    assert len(joined["kernels"]) == 8 and joined["kernels"][1]["registers_per_thread"] == 2000
    ratio = next(r for r in joined["ratios"] if r["batch"] == 1 and r.get("plan") == "before")
    assert ratio["what"] == "window / cache" and ratio["duration_ns"] == 2.0
    with pytest.raises(ValueError, match="manifest lists 7"):
        av.join_ncu("\n".join(rows), {"launch_order": order[:7]})


def test_interleaved_engine_timing_alternates_and_pairs(monkeypatch):
    """time_engines_interleaved: per engine a cold and a capture run, then the timed runs in turn,
    ABBA (so drift falls on every engine alike); each result's trace and forwards are its timed runs'."""
    from nwor_lab.bench import timing

    calls = []

    class Fake:
        def __init__(self, name):
            self.name, self.trace, self.target_forwards = name, [], 0

    def fake_run(engine, prompts, new_tokens, arrival_gap=0):
        calls.append(engine.name)
        engine.trace.append(len(calls))
        engine.target_forwards += 2
        return [engine.name]

    clock = iter(range(1000))
    monkeypatch.setattr(timing, "run_prompts", fake_run)
    monkeypatch.setattr(timing, "timed", lambda fn, device: (fn(), float(next(clock) % 7 + 1)))
    out = timing.time_engines_interleaved({"off": Fake("off"), "stage": Fake("stage")}, [[1]], 4, 3,
                                          torch.device("cpu"))
    assert calls == ["off", "off", "stage", "stage", "off", "stage", "stage", "off", "off", "stage"]
    assert [len(out[n]["times"]) for n in ("off", "stage")] == [3, 3]
    assert out["off"]["trace"] == [5, 8, 9] and out["stage"]["trace"] == [6, 7, 10]
    assert out["off"]["forwards"] == 2 and out["off"]["requests"] == ["off"]
    assert out["off"]["paired"] == [1.0, 1.0, 1.0]
    assert out["stage"]["paired"] == [b / a for a, b in zip(out["off"]["times"], out["stage"]["times"])]
