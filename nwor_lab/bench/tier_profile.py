"""Benchmark (not a test): the prefix cache's host tier under torch.profiler, with evictions and host hits
happening in steps that also decode other requests. Does a step wait on the tier's copies?

    python -m nwor_lab.bench.tier_profile --device cuda --out tier_profile_h200.json
    python -m nwor_lab.bench.tier_profile --device cpu        (the same path; the device questions unanswered)

Workload: the shipped tiny pair, a device cache too small for the prompts (`--num-blocks`), a pinned
host pool (`--host-blocks`), `--prompts` random prompts each visited twice, arriving one every
`--gap` steps into a batch of `--max-num-seqs`: a second visit's blocks come back from the host
(`host_tier.restore`, inside the scheduler's admission) while the others decode, and the allocations
of growing requests evict idle cached blocks to the host (`host_tier.offload`). A first pass of
other prompts warms the engine up (compiles, captures every bucket's graph) outside the profile.

JSON: per write policy, the profiled steps' wall time (all, and those with an offload or a restore);
the tier's counters; the copies' streams against the streams of the step's other device work and
their overlap with it in µs (on CUDA the copies run on the tier's own stream: `kv.host_tier`); the
host syncs (SYNC_CALLS) inside the steps, by call, each attributed to the innermost named range that
holds it (`host_tier.*` or a step piece of `bench.step_spans`): the tier adds none iff
`tier_syncs` is empty. The step's own readback (`readback`) is its one sync by design.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from nwor_lab.bench import trace_profile as tp
from nwor_lab.bench.output import save_json
from nwor_lab.bench.step_spans import TIER, StepSpans
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser
from nwor_lab.config import LabConfig, nwor_modes

TIER_RANGES = tuple(n for n, _ in TIER)


def build(target, head, mode: str, device, args):
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.prefix import PrefixCacheConfig
    cuda = device.type == "cuda"
    cfg = LabConfig(nwor_mode=mode, scv_mode="graph" if cuda else "off", cuda_graph=cuda)
    return SpecEngine(target, head, cfg, k=args.k, block_size=args.block_size, num_blocks=args.num_blocks,
                      max_num_seqs=args.max_num_seqs,
                      prefix_cache=PrefixCacheConfig(host_blocks=args.host_blocks, offload=args.offload))


def prompts_for(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def drive(engine, prompts, new: int, gap: int, each_step) -> None:
    """Every prompt twice (all first visits, then all second ones), one arriving every `gap` steps;
    `each_step()` runs one step."""
    queue = list(prompts) + list(prompts)
    step = 0
    while queue or engine.scheduler.has_work:
        if queue and step % gap == 0:
            engine.add_request(queue.pop(0), new)
        if engine.scheduler.has_work:
            each_step()
        step += 1


def profile_mode(target, head, mode: str, device, args) -> dict:
    from torch.profiler import ProfilerActivity, profile
    e = build(target, head, mode, device, args)
    vocab = target.config.vocab_size
    drive(e, prompts_for(args.prompts, args.prompt_len, vocab, 100), args.max_new_tokens, args.gap,
          e.step_with_progress)                                   # warm-up: compiles, captures, fills the pool
    before = dict(e.prefix.host.stats())
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    walls, kinds = [], []
    with StepSpans(e, tier=True) as spans:
        def each_step():          # no sync before the step: its wall time is the engine's own pace
            n0 = (e.prefix.host.counts["host_offloads"], e.prefix.host.counts["host_restores"])
            t0 = time.perf_counter()
            spans.step()
            walls.append(time.perf_counter() - t0)
            n1 = (e.prefix.host.counts["host_offloads"], e.prefix.host.counts["host_restores"])
            kinds.append(("offload" if n1[0] > n0[0] else "") + ("restore" if n1[1] > n0[1] else ""))
        with profile(activities=acts) as prof:
            drive(e, prompts_for(args.prompts, args.prompt_len, vocab, 200), args.max_new_tokens, args.gap, each_step)
        events = tp.trace_of(prof)
    after = e.prefix.host.stats()
    counts = {k: after[k] - before[k] for k in (*e.prefix.host.counts, "host_dropped")}

    def ms(xs):
        return {"steps": len(xs), "median_ms": round(1e3 * statistics.median(xs), 3), "min_ms": round(1e3 * min(xs), 3),
                "max_ms": round(1e3 * max(xs), 3)} if xs else {"steps": 0}
    out = {"nwor": mode, "offload": args.offload, "tier_counts": counts,
           "step_wall": {"all": ms(walls), "with_offload": ms([w for w, k in zip(walls, kinds) if "offload" in k]),
                         "with_restore": ms([w for w, k in zip(walls, kinds) if "restore" in k]),
                         "without_tier": ms([w for w, k in zip(walls, kinds) if not k])},
           "spans": spans.table(),
           "graphed_steps": e.runner.graphed_steps, "replays": e.runner.replays}
    steps = tp.ranges(events, "step")
    tier_ranges = [r for n in TIER_RANGES for r in tp.ranges(events, n)]
    syncs = tp.host_syncs(events, steps, names=TIER_RANGES + tuple(p for p in out["spans"]["pieces"]))
    out["host_syncs_in_steps"] = syncs
    out["tier_syncs"] = {call: {w: c for w, c in row["in"].items() if w in TIER_RANGES}
                         for call, row in syncs.items() if any(w in TIER_RANGES for w in row["in"])}
    if device.type != "cuda":
        out["not_measured"] = ["the copies' stream and their overlap with the step's device work (no device on the CPU)",
                               "host syncs: the CPU trace has no CUDA runtime calls, so `host_syncs_in_steps` is "
                               "empty by construction, not by measurement"]
        return out
    copies = tp.launched_in(events, tier_ranges)
    mine = {id(x) for x in copies}
    others = [x for x in tp.launched_in(events, steps) if id(x) not in mine]
    copy_streams = tp.streams(copies)
    other_streams = tp.streams(others)
    # copies.events 0: the tier launched nothing the trace could tie to its ranges (then nothing is claimed)
    out.update(copies={"events": len(copies), "streams": copy_streams,
                       "us": round(tp.busy_us(tp.span(x) for x in copies), 1)},
               step_device_streams=other_streams,
               copies_on_their_own_stream=bool(copies) and not set(copy_streams) & set(other_streams),
               copy_overlap_with_step_device_us=round(tp.overlap_us([tp.span(x) for x in copies],
                                                                    [tp.span(x) for x in others]), 1),
               verdict=("no host sync on the tier's path" if not out["tier_syncs"] else
                        "the tier's path syncs the host: " + ", ".join(out["tier_syncs"])))
    return out


def main(argv=None) -> dict:
    from nwor_lab.bench.timing import bench_device, device_name
    from nwor_lab.engine.offload import OFFLOADS
    p = LabArgumentParser(prog="python -m nwor_lab.bench.tier_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=types.device, default=None, help="default: cuda when present")
    p.add_argument("--nwor", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("stage",))
    p.add_argument("--offload", type=types.one_of(tuple(OFFLOADS)), default="target_head")
    p.add_argument("--prompts", type=types.integer(2, 64), default=6)
    p.add_argument("--prompt-len", type=types.integer(8, 1024), default=40)
    p.add_argument("--max-new-tokens", type=types.integer(2, 256), default=24)
    p.add_argument("--max-num-seqs", type=types.integer(1, 64), default=3)
    p.add_argument("--gap", type=types.integer(1, 64), default=4, help="steps between arrivals")
    p.add_argument("--num-blocks", type=types.integer(4, 4096), default=24, help="device cache blocks (small: evictions)")
    p.add_argument("--host-blocks", type=types.integer(1, 4096), default=64)
    p.add_argument("--block-size", type=types.integer(1, 64), default=8)
    p.add_argument("--k", type=types.integer(1, 8), default=4)
    p.add_argument("--out", type=types.output_file, default=None)
    args = p.parse_args(argv)
    device = bench_device("tier_profile", args.device, "tiny")
    from nwor_lab.model.shipped import load_tiny
    target, head, _ = load_tiny(device=device)
    rows = [profile_mode(target, head, mode, device, args) for mode in args.nwor]
    for r in rows:
        print(json.dumps({k: r[k] for k in ("nwor", "tier_counts", "step_wall", "tier_syncs") if k in r}), flush=True)
    out = {"command": "python -m nwor_lab.bench.tier_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": device_name(device), "torch": torch.__version__, "model": "tiny (shipped pair)",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    save_json(out, args.out, indent=2)
    return out


if __name__ == "__main__":
    main()
