"""The profile benches' CPU side (their CUDA answers are tests/gpu/today_run.sh's):

- StepSpans names a step's pieces: their self times and the unnamed rest add up to the step's wall
  time, and every wrapper is gone after the `with` (the engine's and the classes' own methods back);
  its pieces are torch.profiler ranges while a profiler records, and cost no range otherwise;
- bench tier_profile runs evictions and host hits inside profiled decode steps on the CPU and says
  what it could not measure there; bench step_profile spans names the pieces at toy size, and its
  chain part is refused off CUDA by name;
- kernel_diff lists the kernels whose time differs from off's, largest first."""
import pytest
import torch

from nwor_lab.bench.step_spans import PIECES, StepSpans
from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.buffers import Readback
from nwor_lab.model.toy import toy_pair


def toy_engine():
    t, h = toy_pair(0)
    return SpecEngine(t, h, LabConfig(nwor_mode="stage"), k=3, num_blocks=64, block_size=4, max_num_seqs=4)


def test_step_spans_add_up_and_unwrap():
    e = toy_engine()
    rows = Readback.__dict__["rows"]
    for p in ([1, 2, 3, 4, 5], [6, 7, 8]):
        e.add_request(p, 10)
    with StepSpans(e) as spans:
        assert "_advance" in vars(e)
        for _ in range(4):
            spans.step()
    assert "_advance" not in vars(e) and Readback.__dict__["rows"] is rows and "schedule" not in vars(e.scheduler)
    t = spans.table()
    assert t["steps"] == 4 and not t["missing"]
    assert {"schedule", "fill", "launch", "readback", "advance", "records"} <= set(t["pieces"])
    total = sum(p["ms"] for p in t["pieces"].values())
    assert total == pytest.approx(t["step_ms"], rel=0.02)
    assert {n for n, _, _ in PIECES} >= set(t["pieces"]) - {"(unnamed)"}
    with pytest.raises(ValueError, match="host tier"):
        StepSpans(e, tier=True).__enter__()


def test_step_spans_are_profiler_ranges_only_while_a_profiler_records(monkeypatch):
    import torch.profiler as tprof
    e = toy_engine()
    e.add_request([1, 2, 3, 4], 8)
    with StepSpans(e) as spans, tprof.profile(activities=[tprof.ProfilerActivity.CPU]) as prof:
        spans.step()
        spans.step()
    assert {"step", "advance", "records", "host_window"} <= {ev.name for ev in prof.events()}

    def no_range(name):
        raise AssertionError(f"record_function({name!r}) entered with no profiler recording")
    monkeypatch.setattr(tprof, "record_function", no_range)
    with StepSpans(e) as spans:
        spans.step()
    assert "advance" in spans.table()["pieces"]


def test_tier_profile_on_the_cpu_hits_and_evicts_inside_profiled_steps(tmp_path):
    from nwor_lab.bench.tier_profile import main
    out = main(["--device", "cpu", "--prompts", "5", "--prompt-len", "24", "--max-new-tokens", "8",
                "--num-blocks", "12", "--max-num-seqs", "2", "--gap", "3", "--out", str(tmp_path / "t.json")])
    row = out["rows"][0]
    assert row["tier_counts"]["host_offloads"] > 0 and row["tier_counts"]["host_restores"] > 0
    assert row["step_wall"]["with_restore"]["steps"] > 0
    assert {"host_tier.offload", "host_tier.restore"} <= set(row["spans"]["pieces"])
    assert row["not_measured"] and "copies_on_their_own_stream" not in row


def test_step_profile_spans_at_toy_size_and_chain_refused_off_cuda():
    from nwor_lab.bench.step_profile import main
    from nwor_lab.commandline.errors import UsageError
    out = main(["spans", "--model", "8b-mini", "--device", "cpu", "--clients", "3", "--prompt-len", "8",
                "--output-len", "30", "--steps", "4", "--profile-steps", "2"])
    assert [r["config"] for r in out["rows"]] == ["target", "eagle3:4"]
    assert all(r["timed"]["steps"] == 4 and r["profiled"]["steps"] == 2 for r in out["rows"])
    served = main(["spans", "--serve", "--model", "8b-mini", "--device", "cpu", "--clients", "2", "--prompt-len", "8",
                   "--output-len", "12", "--nwor", "off"])
    for r in served["rows"]:      # one table per kind of step, over every step of the run
        assert sum(t["steps"] for t in r["timed_by_kind"].values()) == r["steps"]
        assert {k: t["steps"] for k, t in r["timed_by_kind"].items()} == \
            {k: v["steps"] for k, v in r["steps_by_kind"].items() if v["steps"]}
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA"):
            main(["chain", "--device", "cpu"])


def test_kernel_diff_orders_by_the_largest_difference():
    from nwor_lab.bench.step_profile import kernel_diff
    tables = {"off": [{"kernel": "gemm", "us_per_step": 100.0}, {"kernel": "attn", "us_per_step": 10.0},
                      {"kernel": "(all kernels)", "us_per_step": 110.0}],
              "stage": [{"kernel": "gemm", "us_per_step": 100.2}, {"kernel": "attn", "us_per_step": 14.0},
                        {"kernel": "commit", "us_per_step": 2.0}]}
    d = kernel_diff(tables)
    assert [r["kernel"] for r in d] == ["attn", "commit"]
    assert d[0]["stage_minus_off"] == 4.0 and d[1]["off"] == 0.0
