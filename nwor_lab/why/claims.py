"""The claims a learner brings, and the lab's measurements that answer them.

The claims come from a vLLM fork's NWOR work (the project's starting point; not shipped here):
its validation notes ("NWOR/SCV Validation Results", 2025-10-17) and its pull request "Add NWOR
draft commit: kernel, bindings, and tests" (#8). The answers read the lab's stored benchmark
results (`benchmarks/results/*.json`, each written by the command it names) and traces of the
lab's own runs.

    write_fraction(a, k)         rows a verify window writes under stage / under off: (1 + a) / (1 + k)
    trace_write_fraction(trace)  the same, from the bytes a run's windows wrote
    seed_write_savings()         the fork's "~90 % write savings", recomputed with t_last counted
    ncu_write_ratio(result)      stage / off KV bytes written, measured by ncu (step_ncu_h200.json)
    bytes_saved_worth(...)       what the bytes stage skips are worth in a whole verify step
    vllm_rejected_writes(result) rejected writes per vLLM step that reached / stayed in vLLM's cache
    write_share_points(...)      those answers as the points of `nwor_lab.viz.why.write_share_figure`
"""
from __future__ import annotations

__all__ = ["SEED_CLAIMS", "SEED_RUN", "write_fraction", "trace_write_fraction", "seed_write_savings",
           "ncu_write_ratio", "bytes_saved_worth", "vllm_rejected_writes", "write_share_points"]

# What the fork's documents say, word for word where quoted.
SEED_CLAIMS = {
    "write_savings": {"claim": "Write Savings: ~90% (1,819 rejected tokens avoided KV cache writes)",
                      "source": "the fork's NWOR/SCV validation notes (2025-10-17), one run of "
                                "Llama-3.2-3B-Instruct with its EAGLE head, 8 requests, 4 drafts"},
    "throughput": {"claim": "Cumulative benefit calculation (3× throughput improvement)",
                   "source": "the fork's pull request #8, the commit adding its copy-on-write design "
                             "notes (an expectation written before any measurement; the same pull "
                             "request later measured its CoW iteration 4.8 % slower than vLLM's)"},
}
# The fork's run, as its notes report it.
SEED_RUN = {"windows": 92, "requests": 8, "k": 4, "drafts": 2024, "accepted": 205}


def write_fraction(accepted_per_request: float, k: int) -> float:
    """K/V rows a verify window writes under stage, as a share of off's: every speculative request
    writes `t_last` and its `a` accepted drafts instead of `t_last` and all `k` drafts."""
    return (1 + accepted_per_request) / (1 + k)


def trace_write_fraction(stage_trace, off_trace) -> dict:
    """Bytes written into the cache by the verify windows with drafts of two runs of the same
    requests (stage, off), and their ratio; with the acceptance the stage run saw, the ratio
    `(1 + a) / (1 + k)` predicts (a: mean accepted drafts per speculative request)."""
    def verify(trace):
        return [w for w in trace if w.kind == "verify" and any(w.drafted)]
    s, o = verify(stage_trace), verify(off_trace)
    written_s, written_o = sum(w.record.bytes_written for w in s), sum(w.record.bytes_written for w in o)
    rows = [(n, a) for w in s for n, a in zip(w.drafted, w.accepted) if n]
    k = max(n for n, _ in rows)
    a = sum(a for _, a in rows) / len(rows)
    # prefill or plain-decode rows riding in the same windows are kept by both: count them in the formula too
    other = sum(w.record.tokens_committed - sum(1 + x for n, x in zip(w.drafted, w.accepted) if n) for w in s)
    predicted = (len(rows) * (1 + a) + other) / (sum(1 + n for n, _ in rows) + other)
    return {"stage_bytes": written_s, "off_bytes": written_o, "ratio": written_s / written_o,
            "mean_accepted": a, "k": k, "predicted": predicted, "windows": len(s)}


def seed_write_savings(run: dict | None = None) -> dict:
    """The fork's "~90 %": rejected drafts over drafts. Counting the rows a window really writes
    (`t_last` too, one per request and window), stage writes `(t_last + accepted) / (t_last + drafts)`
    of off's rows; the fork's acceptance (10 % of drafts) is also far below what an EAGLE head reaches."""
    r = dict(SEED_RUN if run is None else run)
    t_last = r["drafts"] // r["k"]                 # requests x windows that verified drafts
    rejected = r["drafts"] - r["accepted"]
    stage_rows, off_rows = t_last + r["accepted"], t_last + r["drafts"]
    return {**r, "rejected": rejected, "claimed_savings": rejected / r["drafts"],
            "acceptance": r["accepted"] / r["drafts"], "t_last_rows": t_last,
            "stage_rows": stage_rows, "off_rows": off_rows, "savings_with_t_last": 1 - stage_rows / off_rows}


def ncu_write_ratio(result: dict) -> dict:
    """stage / off (and cow / off) KV bytes written by the KV-path kernels of one step, measured with
    ncu (L2 write sectors: the writes land in L2 and reach DRAM later, outside any kernel), beside
    the formula at the step's forced acceptance."""
    cfg, modes = result["config"], result["modes"]
    off = modes["off"]["l2_write_sectors"]
    a = cfg["accepted"] / cfg["batch"]
    return {"stage": modes["stage"]["l2_write_sectors"] / off, "cow": modes["cow"]["l2_write_sectors"] / off,
            "predicted_stage": write_fraction(a, cfg["k"]), "config": cfg, "device": result["device"],
            "bytes": {m: v["l2_write_sectors"] * 32 for m, v in modes.items()}}


def bytes_saved_worth(ncu: dict, kernels: dict, step: dict) -> dict:
    """What the bytes stage does not write are worth in one verify step of the ncu run's shape: the
    rejected rows' K/V at the device's copy bandwidth (read + write), against the step's graphed
    time (`nwor-lab bench step`, same model, batch, k and acceptance)."""
    cfg = ncu["config"]
    rejected_rows = cfg["batch"] * cfg["k"] - cfg["accepted"]
    saved = rejected_rows * cfg["layers"] * cfg["bytes_per_token_layer"]
    copy_us = 2 * saved / (kernels["copy_bandwidth_GBps"] * 1e3)
    row = next(r for r in step["results"] if r["model"] == cfg["model"] and r["batch"] == cfg["batch"]
               and r["k"] == cfg["k"] and abs(r["rate"] - cfg["rate"]) < 1e-9)
    step_us = row["off"]["graph_us"]
    return {"saved_bytes": saved, "copy_us": copy_us, "step_us": step_us, "share": copy_us / step_us,
            "stage_vs_off_step": row["stage"]["graph_vs_off"], "cow_vs_off_step": row["cow"]["graph_vs_off"],
            "kv_share": row["off"].get("graph_kv_share"), "rejected_rows": rejected_rows}


def vllm_rejected_writes(result: dict) -> list[dict]:
    """Per speculative method and write policy of `python -m nwor_lab.vllm bench`: rejected rows x
    layers written into vLLM's own cache per vLLM step (reached), still there after the window
    (left), the KV bytes written and their ratio to off's."""
    rows = []
    for m in result["methods"]:
        off_bytes = m["policies"]["off"]["kv_bytes_written"]
        for mode, p in m["policies"].items():
            steps = p["verify_steps"]
            rows.append({"method": m["method"], "k": m["k"], "mode": mode, "steps": steps, "drafts": p["drafts"],
                         "accepted": p["accepted"], "reached_per_step": p["rejected_writes_reached_cache"] / steps,
                         "left_per_step": p["rejected_writes_left_in_cache"] / steps,
                         "reached": p["rejected_writes_reached_cache"], "left": p["rejected_writes_left_in_cache"],
                         "kv_bytes_written": p["kv_bytes_written"], "bytes_vs_off": p["kv_bytes_written"] / off_bytes,
                         "checked": f"{p['windows_checked_bit_exact']}/{p['windows']}",
                         "tokens_identical": m.get("tokens_identical")})
    return rows


def write_share_points(seed: dict, lab: dict, ncu: dict, vllm_row: dict) -> list[dict]:
    """The share of off's K/V rows stage writes, as claimed and as measured, at each run's mean
    accepted drafts `a`: the fork's claim and its run recomputed (`seed_write_savings`), the lab's
    runs (`trace_write_fraction`), the ncu step (`ncu_write_ratio`), vLLM (a `vllm_rejected_writes`
    row of stage)."""
    seed_a = seed["accepted"] / seed["t_last_rows"]
    cfg = ncu["config"]
    return [
        dict(name="the fork's claim: 90 % saved", a=seed_a, share=1 - seed["claimed_savings"], kind="claimed",
             note="rejected drafts over drafts; t_last not counted"),
        dict(name="the fork's run, every row counted", a=seed_a, share=1 - seed["savings_with_t_last"],
             kind="recomputed", note="10 % of drafts accepted"),
        dict(name="the lab's runs (this notebook)", a=lab["mean_accepted"], share=lab["ratio"], kind="measured",
             note="bytes written by the verify windows, shipped pair", textposition="top left"),
        dict(name="ncu, H200, 8B-shaped step", a=cfg["accepted"] / cfg["batch"], share=ncu["stage"], kind="measured",
             note="KV bytes written by the KV-path kernels (L2 write sectors)"),
        dict(name="inside vLLM, EAGLE-1", a=vllm_row["accepted"] / (vllm_row["drafts"] / vllm_row["k"]),
             share=vllm_row["bytes_vs_off"], kind="measured",
             note="KV bytes written into vLLM's cache (its chain rows too)"),
    ]
