"""The `nwor-lab` command: doctor and selfcheck print JSON; selfcheck fails loudly on violations."""
import json

import pytest
import torch

from nwor_lab.cli import main
from nwor_lab.ops import write_kv
from nwor_lab.ops.generators import make_case
from nwor_lab.selfcheck import selfcheck


def test_doctor_reports_backend_and_reason(capsys):
    assert main(["doctor"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] in ("torch", "cuda") and report["backend_reason"]
    assert report["torch"] == torch.__version__


def test_doctor_names_the_settings_that_keep_steps_eager():
    from nwor_lab.cli.doctor import eager_settings
    assert eager_settings({}) == []
    lines = eager_settings({"NWOR_LAB_SCV_MODE": "off", "NWOR_LAB_DEBUG": "1", "NWOR_LAB_CUDA_GRAPH": "0"})
    assert [x.split("=")[0] for x in lines] == ["NWOR_LAB_CUDA_GRAPH", "NWOR_LAB_SCV_MODE", "NWOR_LAB_DEBUG"]


def test_engine_names_why_its_steps_stay_eager():
    """SpecEngine.graphed_off is the one line (checked on CPU through the reason function: capture
    itself needs CUDA, tests/gpu/test_gpu_engine.py checks the defaults replay graphs)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.engine import eager_reason
    from nwor_lab.model.toy import toy_pair
    target, head = toy_pair(0)
    assert eager_reason(SpecEngine(target, head, LabConfig(), k=2)) is None             # the defaults
    assert "scv_mode='off'" in eager_reason(SpecEngine(target, head, LabConfig(scv_mode="off"), k=2))
    assert eager_reason(SpecEngine(target, None, LabConfig(scv_mode="off"))) is None    # no drafts: nothing to loop over
    assert eager_reason(SpecEngine(target, head, LabConfig(), k=2, temperature=0.8)) is None   # T > 0 chains replay
    tree = LabConfig(tree="topk=2,depth=2,nodes=4")
    assert "temperature > 0" in eager_reason(SpecEngine(target, head, tree, temperature=0.8))  # a sampled tree does not


def test_doctor_answers_when_torch_cannot_be_imported(tmp_path):
    """The README promises doctor works whatever the environment holds: a torch that fails to import
    is a problem in the report (exit 0), not a traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    broken = tmp_path / "torch"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    proc = subprocess.run([sys.executable, "-m", "nwor_lab.cli", "doctor"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert "torch" not in report          # (set only when torch imported)
    assert any("importing torch failed" in p and "libtorch_cpu.so" in p for p in report["problems"]), report


@pytest.mark.parametrize("cache_dtype,layout,scv", [("auto", "HND", "off"), ("fp8_e4m3", "NHD", "adaptive")])
def test_selfcheck_passes_and_writes_json(tmp_path, capsys, cache_dtype, layout, scv):
    out = tmp_path / "sc.json"
    code = main(["selfcheck", "--cache-dtype", cache_dtype, "--layout", layout, "--scv", scv, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["ok"] and code == 0, "\n".join(v["message"] for v in result["violations"]) or result
    assert set(result["modes"]) == {"off", "cow", "stage"}
    recs = [m["record"] for m in result["modes"].values()]
    assert len({r["num_accepted"] for r in recs}) == 1
    assert result["modes"]["stage"]["record"]["bytes_skipped"] > 0 or sum(result["window"]["num_draft_tokens"]) == \
        sum(result["window"]["accepted_len"])


def test_selfcheck_detects_a_broken_policy(monkeypatch):
    """The checker must be able to fail: make stage commit every row (i.e. behave like off)."""
    from nwor_lab.policies import stage
    original = stage.StagePolicy._commit

    def leaky_commit(self, acceptance):
        from nwor_lab.window import Acceptance
        original(self, Acceptance(acceptance.draft_mask, acceptance.accepted_len,
                                  torch.ones_like(acceptance.commit_mask)))
    monkeypatch.setattr(stage.StagePolicy, "_commit", leaky_commit)
    result = selfcheck(seed=1)
    assert not result["ok"]
    assert any("rejected" in p for p in result["modes"]["stage"]["problems"])
    # the failure names the invariant, the mode and the first bad slot (a slot the window rejected)
    first = result["violations"][0]
    assert (first["mode"], first["invariant"]) == ("stage", "rejected-slots-preserved"), first
    assert first["slot"] is not None and f"slot {first['slot']}" in first["message"]
    assert {v["mode"] for v in result["violations"]} == {"stage"}


def test_selfcheck_failure_exits_1_with_one_line(monkeypatch, capsys):
    from nwor_lab.policies import stage
    original = stage.StagePolicy._commit

    def leaky_commit(self, acceptance):
        from nwor_lab.window import Acceptance
        original(self, Acceptance(acceptance.draft_mask, acceptance.accepted_len,
                                  torch.ones_like(acceptance.commit_mask)))
    monkeypatch.setattr(stage.StagePolicy, "_commit", leaky_commit)
    assert main(["selfcheck", "--seed", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stage: invariant rejected-slots-preserved broken" in err[0] and "slot " in err[0]


def test_device_mismatch_names_the_argument():
    case = make_case(num_layers=1, num_tokens=4)
    with pytest.raises(ValueError, match="key: is on meta but must be on cpu"):
        write_kv(case.key[0].to("meta"), case.value[0], *case.cache.layer(0), case.slot_mapping)


def test_generate_subcommand_runs_the_shipped_pair(capsys):
    assert main(["generate", "def f(x):", "--k", "3", "--nwor", "cow", "--max-new-tokens", "12", "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    assert result["mean_acceptance_length"] >= 1.0


def test_a_long_build_error_becomes_one_line_naming_what_failed():
    from nwor_lab.commandline.errors import describe
    from nwor_lab.ops._ext import ExtensionBuildError
    output = "\n".join([f"[{i}/70] c++ -O3 -c csrc/ops.cpp" for i in range(35)] + ["/bin/sh: 1: nvcc: not found"] +
                       [f"ninja: build stopped {i}" for i in range(34)])
    code, line = describe(ExtensionBuildError(f"building the nwor_lab CUDA extension in /x failed:\n{output}"))
    assert code == 2 and "\n" not in line
    assert line.startswith("nwor-lab: error: building the nwor_lab CUDA extension in /x failed: ")
    assert "nvcc: not found" in line and "--traceback" in line


def test_a_bug_is_one_line_exit_1_and_the_stack_on_request(monkeypatch, capsys):
    def broken(args):
        raise AssertionError("invariant x")
    monkeypatch.setattr("nwor_lab.cli.doctor.run", broken)
    assert main(["doctor"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["nwor-lab: internal error: AssertionError: invariant x; this is a bug in nwor_lab, rerun with "
                   "--traceback and report the stack"]
    assert main(["doctor", "--traceback"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_generate_interrupted_prints_json_so_far_and_exits_130(monkeypatch, capsys):
    from nwor_lab.engine.engine import SpecEngine
    step, calls = SpecEngine.step, []

    def step_then_ctrl_c(self):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return step(self)
    monkeypatch.setattr(SpecEngine, "step", step_then_ctrl_c)
    assert main(["generate", "def f(x):", "--k", "2", "--max-new-tokens", "64", "--json"]) == 130
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["interrupted"] and not result["complete"] and 0 < result["tokens"] < 64
    assert captured.err.strip().startswith("nwor-lab: interrupted after 3 target forwards")


def test_generate_engine_limits_are_flags(capsys):
    code = main(["generate", "def f(x):", "import os", "--k", "4", "--max-new-tokens", "6", "--max-num-seqs", "1",
                 "--max-num-batched-tokens", "8", "--num-blocks", "8", "--block-size", "8",
                 "--max-cache-memory", "64M", "--cache-dtype", "fp8_e5m2", "--no-stream"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("-" * 60) == 2 and "mean acceptance length" in out


def test_generate_truncate_prompt(capsys):
    assert main(["generate", "abc " * 600, "--max-new-tokens", "4", "--truncate-prompt", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 4


def test_generate_a_small_cache_preempts_and_says_so(capsys):
    """A cache too small for the batch used to be refused at admission: now the newest request is
    preempted (recompute by default; a 4-token budget also chunks every prompt) and the summary says so."""
    argv = ["generate", "def f(x):", "import os", "class A:", "--k", "2", "--max-new-tokens", "24",
            "--num-blocks", "6", "--block-size", "8", "--max-num-batched-tokens", "4", "--no-stream"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("-" * 60) == 3 and "preemption (recompute): " in out and " 0 preempted" not in out
    assert main(argv + ["--preemption", "swap", "--json"]) == 0
    pre = json.loads(capsys.readouterr().out)["preemption"]
    assert pre["mode"] == "swap" and pre["preemptions"] > 0 and pre["swapped_in_bytes"] == pre["swapped_out_bytes"] > 0


def test_generate_prefix_cache_flags(capsys):
    prompts = ["def fibonacci(n): return n", "def fibonacci(n): return n"]
    base = ["generate", *prompts, "--k", "2", "--max-new-tokens", "6", "--block-size", "4", "--max-num-seqs", "1"]
    assert main(base + ["--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["prefix_cache"] is None
    assert main(base + ["--prefix-cache", "--lookahead", "drop_last", "--json"]) == 0
    cached = json.loads(capsys.readouterr().out)
    pc = cached["prefix_cache"]
    assert cached["token_ids"] == plain["token_ids"] and pc["lookahead"] == "drop_last" and pc["hit_tokens"] > 0
    assert main(base + ["--prefix-cache", "--no-stream"]) == 0
    assert "prefix cache (cached, boundary): " in capsys.readouterr().out
