"""The plugin as a user switches it on by hand: vLLM's default multi-process engine (engine core and
worker in their own processes, the plugin loaded in each by its entry points), the one argument
`additional_config={"nwor_lab": {...}}` (no worker_cls), the worker's one log line, and the
per-window records written to a JSONL file by the worker."""
import json
import os
import re
import subprocess
import sys

SCRIPT = """
import json, os
def main():
    from vllm import LLM, SamplingParams
    from nwor_lab.vllm.checkpoints import prepare
    d = prepare()
    llm = LLM(model=str(d["target"]), dtype="float32", block_size=32, kv_cache_memory_bytes=64 << 20,
              max_model_len=512, enforce_eager=True,
              speculative_config={{"method": "eagle", "model": str(d["eagle"]), "num_speculative_tokens": 4}},
              additional_config={{"nwor_lab": {{"nwor_mode": "cow", "check": True, "debug": True,
                                               "record": {record!r}}}}})
    out = llm.generate(["def parse_args(argv):", "import os\\n"], SamplingParams(temperature=0, max_tokens=24))
    print("RESULT" + json.dumps({{"tokens": [list(o.outputs[0].token_ids) for o in out],
                                  "totals": llm.collective_rpc("nwor_totals")[0]}}))
if __name__ == "__main__":
    main()
"""


def test_multiprocess_engine_with_records(tmp_path, shipped):
    from conftest import lab_generate
    record = tmp_path / "windows.jsonl"
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(record=str(record)))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)      # vLLM's default: engine core and worker processes
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    res = json.loads(line[0][len("RESULT"):])
    assert res["tokens"] == lab_generate(shipped, "eagle", ["def parse_args(argv):", "import os\n"], 24).token_ids
    rows = [json.loads(x) for x in record.read_text().splitlines()]
    t = res["totals"]
    assert len(rows) == t["checks_passed"] > 0
    assert {r["kind"] for r in rows} == {"verify", "draft"}
    assert sum(r["num_accepted"] for r in rows if r["kind"] == "verify") == t["accepted"]
    assert sum(r["rejected_writes"] for r in rows) == t["rejected_writes"] > 0 and t["rejected_left"] == 0
    assert all(r["mode"] == "cow" and r["vllm_step"] >= 1 and (r["rank"], r["tp_size"]) == (0, 1) for r in rows)
    # one line from the worker process: active, the mode, the rank
    log = proc.stdout + proc.stderr
    assert len(re.findall(r"NWOR active, mode cow, rank 0 \(tp rank 0 of 1\)", log)) == 1, log[-3000:]
