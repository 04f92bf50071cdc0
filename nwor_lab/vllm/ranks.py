"""NWOR across vLLM's tensor-parallel workers: where each rank is, and each window counted once.

Under `tensor_parallel_size=N` vLLM runs N workers; each holds every layer's KV tensor for its
shard of the KV heads (`num_kv_heads / N` of them) and runs the plugin's runtime on it: its own
windows, policy, commit and invariant checks. Every rank all-gathers the full logits and runs
the same rejection sampler on them with the same seeds (vLLM 0.32's `LogitsProcessor` with
`use_all_gather`, then `GPUModelRunner.sample_tokens -> _sample` on every rank; only rank 0's
output goes back to the scheduler), so every rank sees the same acceptance, window for window.

What a rank reports is therefore of two kinds:
- window facts (steps, windows, drafts, accepted, rejected rows x layers): the same on every
  rank, counted once here, and compared across ranks (a difference raises: the ranks would have
  committed different tokens' K/V);
- its own work on its shard (bytes written, windows it checked, seconds in its hooks): summed
  over ranks (bytes), or the least / the longest (checks, seconds: the ranks run side by side).

The record file: every rank appends its own line per window (one `os.write` each, `O_APPEND`),
carrying `rank`, `tp_rank` and `tp_size`; `summarize_records` counts each window once.
"""
from __future__ import annotations

import os

WINDOW_KEYS = ("steps", "verify_windows", "drafts", "accepted", "draft_windows", "chain_rows",
               "rejected_writes", "rejected_left")
SUMMED_KEYS = ("bytes_written",)
# per rank: a window counts as checked when every rank checked it; the ranks' hooks run side by side
LEAST_KEYS = ("checks_passed",)
LONGEST_KEYS = ("seconds_in_nwor",)


class RankMismatch(AssertionError):
    """Two tensor-parallel ranks disagree on a window fact (they must commit the same tokens)."""


def merge_totals(per_rank: list[dict]) -> dict:
    """The engine's totals from each rank's `Totals.to_dict()` (in rank order): each window once,
    bytes over all shards; `ranks` the number of ranks, `per_rank` what each one reported."""
    if not per_rank:
        raise ValueError("merge_totals: no rank reported")
    first = per_rank[0]
    for r, other in enumerate(per_rank[1:], 1):
        differ = [k for k in WINDOW_KEYS if other.get(k) != first.get(k)]
        if differ:
            raise RankMismatch(f"nwor_lab.vllm: rank {r} counted {', '.join(f'{k}={other.get(k)}' for k in differ)}, "
                               f"rank 0 {', '.join(f'{k}={first.get(k)}' for k in differ)}; every rank must see the "
                               f"same windows and acceptance")
    out = {k: first[k] for k in WINDOW_KEYS if k in first}
    out.update({k: sum(t.get(k, 0) for t in per_rank) for k in SUMMED_KEYS})
    out.update({k: min(t.get(k, 0) for t in per_rank) for k in LEAST_KEYS})
    out.update({k: max(t.get(k, 0) for t in per_rank) for k in LONGEST_KEYS})
    out["ranks"] = len(per_rank)
    out["per_rank"] = [dict(t) for t in per_rank]
    return out


def compare_traces(traces: list[list]) -> None:
    """Raise unless every rank committed the same windows with the same acceptance
    (`WindowTrace` lists in rank order)."""
    first = traces[0]
    for r, trace in enumerate(traces[1:], 1):
        if len(trace) != len(first):
            raise RankMismatch(f"nwor_lab.vllm: rank {r} committed {len(trace)} windows, rank 0 {len(first)}")
        for a, b in zip(first, trace):
            if (a.step, a.kind, a.accepted, a.drafted) != (b.step, b.kind, b.accepted, b.drafted):
                raise RankMismatch(f"nwor_lab.vllm: step {a.step} {a.kind} window: rank {r} accepted {b.accepted} of "
                                   f"{b.drafted}, rank 0 {a.accepted} of {a.drafted}")


def summarize_records(rows: list[dict]) -> dict:
    """Totals from the `record` JSONL rows of one engine, each window counted once: window facts
    from the lowest rank's rows (after checking every rank wrote the same windows), bytes summed
    over ranks. Rows without a rank (single-process files) are rank 0."""
    by_rank: dict[int, list[dict]] = {}
    for row in rows:
        by_rank.setdefault(int(row.get("rank", 0)), []).append(row)
    if not by_rank:
        return {"windows": 0, "ranks": 0, "verify_windows": 0, "drafts": 0, "accepted": 0, "rejected_writes": 0,
                "rejected_left": 0, "bytes_written": 0}
    ranks = sorted(by_rank)
    first = by_rank[ranks[0]]
    key = lambda w: (w.get("vllm_step"), w.get("kind"), w.get("num_drafts"), w.get("num_accepted"))  # noqa: E731
    for r in ranks[1:]:
        if [key(w) for w in by_rank[r]] != [key(w) for w in first]:
            raise RankMismatch(f"nwor_lab.vllm: the records of rank {r} and rank {ranks[0]} differ in their windows "
                               f"or acceptance")
    verify = [w for w in first if w.get("kind") == "verify" and w.get("num_drafts")]
    return {"windows": len(first), "ranks": len(ranks), "verify_windows": len(verify),
            "drafts": sum(w["num_drafts"] for w in verify), "accepted": sum(w["num_accepted"] for w in verify),
            "rejected_writes": sum(w.get("rejected_writes", 0) for w in first),
            "rejected_left": sum(w.get("rejected_left", 0) for w in first),
            "bytes_written": sum(w.get("bytes_written", 0) for w in rows)}


def omp_bind(tp: int, cpus=None) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `tp` CPU workers: the CPUs this process may use, split into
    `tp` contiguous groups ("0|1" on 2 cores, "0-7|8-15" on 16). vLLM's default ("auto") binds one
    NUMA node per rank and refuses tp > 1 on a machine with one node."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if tp < 1 or len(cpus) < tp:
        raise ValueError(f"tp={tp}: needs 1 to {len(cpus)} (the CPUs this process may use: one or more per rank)")
    per = len(cpus) // tp
    return "|".join(_id_list(cpus[i * per:(i + 1) * per]) for i in range(tp))


def _id_list(ids: list[int]) -> str:
    """vLLM's CPU-list syntax: "2-5" for a run, else "0,2,7"."""
    if len(ids) > 1 and ids[-1] - ids[0] == len(ids) - 1:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(str(i) for i in ids)
