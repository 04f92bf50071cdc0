"""Reading a torch.profiler Chrome trace: which device work a host range launched, on which stream,
whether two ranges' device work overlapped, and which host syncs sit inside a range.

    events = trace_of(prof)                  # or load_trace(path): the complete ("X") events
    ranges(events, "nwor.step")              # [(start_us, end_us)] of a record_function range
    launched_in(events, ranges)              # the device events (kernels, copies, sets) whose launch
                                             # (the runtime call, matched by `correlation`) lies inside
    host_syncs(events, ranges)               # the runtime calls that block the host, by name
    overlap_us(a, b)                         # µs during which both interval sets were busy
    handoff_overlap(events)                  # the hand-off's receive against its decode steps

Event kinds (the trace's `cat`): `user_annotation` (record_function ranges, host side),
`cuda_runtime` / `cuda_driver` (the host's API calls), `kernel`, `gpu_memcpy`, `gpu_memset` (the
device's work, with `args.stream`). On the CPU a trace has only host events: every device question
is answered `None`, and the summaries say so.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence

# Runtime calls that block the calling host thread until device work finishes (a host sync).
# cudaMemcpy (not ...Async) waits for the copy; a cudaMemcpyAsync to pageable memory also waits, but the
# trace cannot tell pageable from pinned, so it is listed apart (`async_copies`), not as a sync.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpy2D", "cudaMemcpyPeer", "cuStreamSynchronize", "cuCtxSynchronize",
              "cuEventSynchronize", "cuMemcpyDtoH", "cuMemcpyHtoD")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cuda_runtime", "cuda_driver")
Interval = tuple[float, float]


def load_trace(path: str) -> list[dict]:
    """The complete events ({name, cat, ts, dur, args}, µs) of a Chrome trace file."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "ts" in e]


def trace_of(prof) -> list[dict]:
    """A finished torch.profiler.profile's complete events (through its Chrome trace)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return load_trace(path)


def span(e: Mapping) -> Interval:
    return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))


def ranges(events: Iterable[Mapping], name: str) -> list[Interval]:
    """The host intervals of every record_function range called `name`, in time order."""
    return sorted(span(e) for e in events if e.get("cat") == "user_annotation" and e["name"] == name)


def inside(t: float, intervals: Sequence[Interval]) -> bool:
    return any(a <= t <= b for a, b in intervals)


def device_events(events: Iterable[Mapping]) -> list[dict]:
    return [e for e in events if e.get("cat") in DEVICE_CATS]


def launched_in(events: Sequence[Mapping], within: Sequence[Interval]) -> list[dict]:
    """Device events launched from inside `within` (their runtime call, by `args.correlation`)."""
    launch_ts = {e["args"]["correlation"]: float(e["ts"]) for e in events
                 if e.get("cat") in HOST_CATS and "correlation" in e.get("args", {})}
    out = []
    for e in device_events(events):
        t = launch_ts.get(e.get("args", {}).get("correlation"))
        if t is not None and inside(t, within):
            out.append(e)
    return out


def union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def overlap_us(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """µs during which some interval of `a` and some interval of `b` were both open."""
    ua, ub = union(a), union(b)
    total, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        total += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def busy_us(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def host_syncs(events: Sequence[Mapping], within: Sequence[Interval], names: Sequence[str] = ()) -> dict:
    """The host-blocking runtime calls (SYNC_CALLS) inside `within`: {call: {count, us, in}} where `in`
    counts them by the innermost of the record_function ranges `names` that holds them ("(elsewhere in
    the range)" when none does)."""
    named = {n: ranges(events, n) for n in names}
    out: dict = {}
    for e in events:
        if e.get("cat") not in HOST_CATS or e["name"] not in SYNC_CALLS or not inside(float(e["ts"]), within):
            continue
        row = out.setdefault(e["name"], {"count": 0, "us": 0.0, "in": {}})
        row["count"] += 1
        row["us"] = round(row["us"] + float(e.get("dur", 0.0)), 1)
        holders = [(b - a, n) for n, rs in named.items() for a, b in rs if a <= float(e["ts"]) <= b]
        where = min(holders)[1] if holders else "(elsewhere in the range)"
        row["in"][where] = row["in"].get(where, 0) + 1
    return out


def streams(dev: Iterable[Mapping]) -> dict:
    """{stream: {events, us, kinds: {cat: count}}} of device events."""
    out: dict = {}
    for e in dev:
        s = str(e.get("args", {}).get("stream", "?"))
        row = out.setdefault(s, {"events": 0, "us": 0.0, "kinds": {}})
        row["events"] += 1
        row["us"] = round(row["us"] + float(e.get("dur", 0.0)), 1)
        row["kinds"][e["cat"]] = row["kinds"].get(e["cat"], 0) + 1
    return out


def handoff_overlap(events: Sequence[Mapping], recv: str = "handoff.recv", decode: str = "handoff.decode") -> dict:
    """The decode rank's trace (nwor_lab.disagg.ranks): the device work its receive launched (NCCL
    kernels, IPC clones) against the device work its decode steps launched -> µs of each, the overlap,
    and a verdict. With no device events (gloo on the CPU) the host ranges are compared instead."""
    r, d = ranges(events, recv), ranges(events, decode)
    if not r or not d:
        raise ValueError(f"handoff_overlap: the trace has no {recv!r} / {decode!r} ranges; record the decode "
                         f"rank with run_rounds(profile_round=, profile_to=)")
    dev = device_events(events)
    out = {"recv_host_us": round(busy_us(r), 1), "decode_host_us": round(busy_us(d), 1),
           "host_overlap_us": round(overlap_us(r, d), 1)}
    if not dev:
        out.update(device=None, verdict="no device events (CPU trace): the receive and the decode ran one after "
                                         "the other on the host" if not out["host_overlap_us"] else
                   "the receive and the decode overlapped on the host")
        return out
    # NCCL may launch through the driver where the trace keeps no correlation: its kernels count by name too
    nccl = [e for e in dev if "nccl" in e["name"].lower()]
    t = launched_in(events, r)
    t += [e for e in nccl if e not in t]
    k = [e for e in launched_in(events, d) if e not in nccl]
    tv, kv = [span(e) for e in t], [span(e) for e in k]
    both = overlap_us(tv, kv)
    out.update(device=True, transfer_events=len(t), transfer_kernels=sorted({e["name"][:60] for e in t})[:8],
               transfer_us=round(busy_us(tv), 1), decode_events=len(k), decode_device_us=round(busy_us(kv), 1),
               overlap_us=round(both, 1),
               transfer_ends_before_decode=bool(tv and kv and max(b for _, b in tv) <= min(a for a, _ in kv)))
    if not t:
        out["verdict"] = "no transfer work found on the device in this trace: the overlap cannot be told from it"
    elif not both:
        out["verdict"] = "no transfer overlaps a decode step: the protocol ships, then decodes"
    else:
        out["verdict"] = f"{both:.0f} us of transfer overlapped the decode's device work"
    return out
