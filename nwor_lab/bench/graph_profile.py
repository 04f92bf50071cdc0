"""Where several CUDA graphs' time goes, compared without drift (`bench tree --graphs --profile`).

Each graph is replayed in turn, ABBA, under torch.profiler, with a synchronise and a pause after each
replay, so that a replay's kernels form one group on the device's timeline. A group's kernels are summed
by name; a graph's µs per step for a kernel is the median over its replays. Interleaving is the point:
profiled one after the other, two strategies' identical GEMMs differed by up to 5 % (H200, clock drift),
which hid differences of a few tenths of a per cent in the step (issue 27's N = 64, batch 32 point).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

import torch

from nwor_lab.bench.timing import in_turn
from nwor_lab.bench.trace_profile import trace_of

PAUSE_S = 0.003      # the idle gap after each replay: longer than any gap inside one (kernels run back to back)
GAP_US = 1500.0      # a device-side gap this long separates two replays


def split_replays(events: Sequence[Mapping], replays: int, gap_us: float = GAP_US) -> list[list[Mapping]] | None:
    """Kernel events ({ts, dur, name}, µs) -> one list per replay, split where the device sat idle for more
    than `gap_us`; None when that does not give `replays` groups (then nothing can be attributed)."""
    groups, cur, end = [], [], None
    for e in sorted(events, key=lambda e: e["ts"]):
        if end is not None and e["ts"] - end > gap_us:
            groups.append(cur)
            cur = []
        cur.append(e)
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    if cur:
        groups.append(cur)
    return groups if len(groups) == replays else None


def per_replay_kernels(order: Sequence[str], groups: Sequence[Sequence[Mapping]], top: int = 8) -> dict:
    """Replays in `order` (a graph's name each) and their kernel groups -> {name: [{kernel, us_per_step,
    calls_per_step}] by time, the `top` kernels then "(all kernels)"}: medians over each name's replays
    (kernel names cut to 90 characters, as `bench.tree.kernel_profile` writes them)."""
    sums: dict = {}
    for name, grp in zip(order, groups):
        by: dict = {}
        for e in grp:
            key = e["name"][:90]
            us, n = by.get(key, (0.0, 0))
            by[key] = (us + e["dur"], n + 1)
        sums.setdefault(name, []).append(by)
    out = {}
    for name, reps in sums.items():
        kernels = set().union(*reps)
        rows = [{"kernel": k, "us_per_step": round(statistics.median(r.get(k, (0.0, 0))[0] for r in reps), 1),
                 "calls_per_step": statistics.median(r.get(k, (0.0, 0))[1] for r in reps)} for k in kernels]
        rows.sort(key=lambda r: -r["us_per_step"])
        total = statistics.median(sum(us for us, _ in r.values()) for r in reps)
        calls = statistics.median(sum(n for _, n in r.values()) for r in reps)
        out[name] = rows[:top] + [{"kernel": "(all kernels)", "us_per_step": round(total, 1), "calls_per_step": calls}]
    return out


def replay_profile(graphs: Mapping[str, torch.cuda.CUDAGraph], rounds: int = 6, top: int = 8) -> dict | None:
    """{name: graph} -> per_replay_kernels of `rounds` ABBA rounds (each graph replayed once a round), or None
    when the replays could not be told apart on the timeline."""
    from torch.profiler import ProfilerActivity, profile
    names = list(graphs)
    order = []
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for r in range(rounds):
            for name in in_turn(names, r):
                graphs[name].replay()
                torch.cuda.synchronize()
                time.sleep(PAUSE_S)
                order.append(name)
    events = [e for e in trace_of(prof) if e.get("cat") == "kernel"]
    groups = split_replays(events, len(order))
    return None if groups is None else per_replay_kernels(order, groups, top)
