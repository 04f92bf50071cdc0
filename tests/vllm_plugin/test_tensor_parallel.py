"""The plugin under vLLM's own tensor parallelism: tensor_parallel_size=2, the mp executor (one
worker process per rank, each holding one of the shipped target's two KV heads), switched on by
additional_config alone (VllmLab passes nothing else).

ONE tp 2 engine (about 40 s to start on 2 cores) in a subprocess, so the ranks' log lines can be
read: vLLM alone (the plugin stood down on the same engine) and off / cow / stage, each greedy and
seeded at T 0.8, every window checked on every rank (check=True, debug=True), records in a file."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import MODES, PROMPTS, lab_generate

MAX_NEW = 24
T = 0.8

SCRIPT = """
import json, sys
from nwor_lab.vllm.generate import VllmLab
def main():
    lab = VllmLab("eagle3", 4, tp=2, check=True, debug=True, record={record!r})
    runs = {{}}
    def keep(name, res):
        runs[name] = {{"token_ids": res.token_ids, "totals": res.totals, "metrics": res.vllm_metrics,
                      "per_rank": res.per_rank, "windows": len(res.trace), "mode": res.nwor_mode}}
    lab.stand_down()
    keep("alone/0", lab.generate({prompts!r}, {max_new}))
    keep("alone/T", lab.generate({prompts!r}, {max_new}, temperature={t}, seed=100))
    for mode in {modes!r}:
        keep(mode + "/0", lab.generate({prompts!r}, {max_new}, nwor_mode=mode))
        keep(mode + "/T", lab.generate({prompts!r}, {max_new}, temperature={t}, seed=100, nwor_mode=mode))
    rpc = lab.llm.collective_rpc("nwor_totals")
    lab.close()
    sys.stdout.flush()
    print("RESULT" + json.dumps({{"runs": runs, "nwor_totals": rpc}}), flush=True)
if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp2")
    record = d / "windows.jsonl"
    script = d / "run.py"
    script.write_text(SCRIPT.format(record=str(record), prompts=PROMPTS, max_new=MAX_NEW, t=T, modes=MODES))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO")       # the ranks' "NWOR active" lines
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)             # VllmLab splits this process's CPUs
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and line, (proc.stdout[-3000:], proc.stderr[-3000:])
    res = json.loads(line[0][len("RESULT"):])
    rows = [json.loads(x) for x in record.read_text().splitlines()]
    return res, rows, proc.stdout + proc.stderr


def test_tokens_identical_in_every_policy_and_without_the_plugin(tp2, shipped):
    runs = tp2[0]["runs"]
    for t in ("0", "T"):
        alone = runs[f"alone/{t}"]["token_ids"]
        assert all(len(x) == MAX_NEW for x in alone)
        for mode in MODES:
            assert runs[f"{mode}/{t}"]["token_ids"] == alone, (mode, t)
    # greedy under tp 2 is the lab's own engine's greedy (its all-reduce did not move an argmax here)
    assert runs["alone/0"]["token_ids"] == lab_generate(shipped, "eagle3", PROMPTS, MAX_NEW).token_ids
    assert runs["alone/T"]["token_ids"] != runs["alone/0"]["token_ids"]


def test_each_rank_runs_the_policy_on_its_shard_and_checks_every_window(tp2):
    runs = tp2[0]["runs"]
    for name, run in runs.items():
        if name.startswith("alone"):
            assert run["totals"] == {} and run["per_rank"] == []
            continue
        ranks = run["per_rank"]
        assert [r["tp_rank"] for r in ranks] == [0, 1] and {r["tp_size"] for r in ranks} == {2}
        assert [r["num_kv_heads"] for r in ranks] == [1, 1]         # the target's 2 KV heads, one per rank
        t = run["totals"]
        assert t["ranks"] == 2 and run["windows"] > 0
        for r in ranks:                                               # every window checked on every rank
            assert r["totals"]["checks_passed"] == run["windows"], (name, r["rank"])
        assert t["bytes_written"] == sum(r["totals"]["bytes_written"] for r in ranks) > 0
        assert ranks[0]["totals"]["bytes_written"] == ranks[1]["totals"]["bytes_written"]
    off, cow, stage = (runs[f"{m}/0"]["totals"] for m in MODES)
    assert off["rejected_left"] == off["rejected_writes"] > 0
    assert cow["rejected_writes"] == off["rejected_writes"] and cow["rejected_left"] == 0
    assert stage["rejected_writes"] == 0 and stage["bytes_written"] < off["bytes_written"]


def test_totals_count_each_window_once_and_equal_vllms_counters(tp2):
    res, rows, _ = tp2
    runs = {k: v for k, v in res["runs"].items() if not k.startswith("alone")}
    for name, run in runs.items():
        t, m = run["totals"], run["metrics"]
        assert t["drafts"] == m["vllm:spec_decode_num_draft_tokens"] > 0, name
        assert t["accepted"] == m["vllm:spec_decode_num_accepted_tokens"], name
    # the nwor_totals RPC: the engine's totals (the last run's), the same answer on both ranks
    rpc = res["nwor_totals"]
    last = runs[f"{MODES[-1]}/T"]["totals"]
    assert len(rpc) == 2 and rpc[0] == rpc[1]
    assert {k: rpc[0][k] for k in ("accepted", "drafts", "steps", "bytes_written")} == \
        {k: last[k] for k in ("accepted", "drafts", "steps", "bytes_written")}


def test_records_carry_the_rank_and_the_summary_counts_each_window_once(tp2):
    from nwor_lab.vllm.ranks import summarize_records
    res, rows, _ = tp2
    runs = {k: v for k, v in res["runs"].items() if not k.startswith("alone")}
    windows = sum(r["windows"] for r in runs.values())
    assert sorted({r["rank"] for r in rows}) == [0, 1] and all(r["tp_size"] == 2 for r in rows)
    assert sum(r["rank"] == 0 for r in rows) == sum(r["rank"] == 1 for r in rows) == windows
    summary = summarize_records(rows)
    assert summary["windows"] == windows and summary["ranks"] == 2
    assert summary["accepted"] == sum(r["metrics"]["vllm:spec_decode_num_accepted_tokens"] for r in runs.values())
    assert summary["drafts"] == sum(r["metrics"]["vllm:spec_decode_num_draft_tokens"] for r in runs.values())
    assert summary["bytes_written"] == sum(r["totals"]["bytes_written"] for r in runs.values())


def test_one_log_line_per_rank(tp2):
    log = tp2[2]
    lines = re.findall(r"NWOR active, mode (\w+), rank (\d) \(tp rank (\d) of (\d)\)", log)
    assert sorted(lines) == [("off", "0", "0", "2"), ("off", "1", "1", "2")], lines
