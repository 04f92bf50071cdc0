"""Benchmark (not a test): where an engine step's time goes, in two parts.

    python -m nwor_lab.bench.step_profile spans --model 8b --clients 32 --out step_spans_8b_h200.json
    python -m nwor_lab.bench.step_profile chain --batch 64 --out chain_kernels_8b_h200.json      (CUDA)
    python -m nwor_lab.bench.step_profile spans --model 8b-mini --device cpu   (the same path at toy size)

`spans` (the host time per step at N clients): per config (target-only, and the EAGLE-3 head at k
under each write policy), an engine built as `bench serve` builds it (`bench.engine8b.build_engine`,
SCV graph, CUDA graphs, pre-launch on), warmed up by one full run of the same load (every bucket
captured), then N fresh requests of `--prompt-len` random tokens with `--output-len` to go; once every
request decodes, `--steps` steps are timed piece by piece (`bench.step_spans`: schedule, inputs fill
and upload, launch/replay, readback start and wait, the next step's pre-launch, the host's
bookkeeping: host window, records, hand-out, trace), then `--profile-steps` more under
torch.profiler: the host syncs inside the steps, named by piece, the device's busy time per step and
the launches per step. `readback` is the wait for the device; the rest of the step is host time.

`spans --serve`: the same pieces over closed-loop serving (requests join and finish: steps with a
prefill, decode steps pre-launched, decode steps the host laid out after the readback), one table per
kind of step, no profiler.

`chain` (CUDA only; the graphed 8B step at batch `--batch`: verify, head pass, draft chain, as `bench
step` builds it, EAGLE-1 head, forced rate `--rate`): each policy's captured step replayed in turn
(ABBA, `bench.graph_profile.replay_profile`), every kernel's µs per step, median over the rounds; the
kernels whose time differs from `off`'s, largest first; and the replays' µs from CUDA events,
interleaved (`bench.kernels.interleaved_time_us`), with each policy's ratio to off. One graph holds
the whole step: the chain's own kernels are found by what differs, not by a separate pass.
`chain --temperatures 0,0.8`: the same for `off` at each temperature (what sampling adds, kernel by kernel).
"""
from __future__ import annotations

import json
import sys
import time

import torch

from nwor_lab.bench import trace_profile as tp
from nwor_lab.bench.output import save_json
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import nwor_modes

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaMemcpyAsync", "cudaMemsetAsync")


# -- spans: the host time per step at N clients ---------------------------------------------------
def spans_config(target, head, k: int, mode: str, device, args, acceptance) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from nwor_lab.bench.engine8b import build_engine, prompts_for
    from nwor_lab.bench.step_spans import StepSpans
    from nwor_lab.bench.timing import free_device, run_prompts
    cuda = device.type == "cuda"
    e = build_engine(target, head, k, mode, "graph" if cuda else "off", args.clients, args.prompt_len,
                     args.output_len, acceptance, "auto", cuda)
    vocab = target.config.vocab_size
    run_prompts(e, prompts_for(args.clients, args.prompt_len, vocab, False, seed=11), args.output_len)   # warm-up
    reqs = [e.add_request(p, args.output_len) for p in prompts_for(args.clients, args.prompt_len, vocab, False, seed=12)]
    while any(r.is_prefill for r in reqs):
        e.step_with_progress()
    spans = StepSpans(e)
    with spans:
        for _ in range(args.steps):
            if not e.scheduler.has_work:
                break
            spans.step()
    table = spans.table()
    probe = StepSpans(e)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with probe, profile(activities=acts) as prof:
        for _ in range(args.profile_steps):
            if not e.scheduler.has_work:
                break
            probe.step()
    events = tp.trace_of(prof)
    e.run()                                   # the rest, unrecorded
    n = max(1, len(probe.per_step))
    steps = tp.ranges(events, "step")
    names = tuple(table["pieces"])
    calls = {}
    for x in events:
        if x.get("cat") in tp.HOST_CATS and x["name"] in LAUNCH_CALLS and tp.inside(float(x["ts"]), steps):
            calls[x["name"]] = calls.get(x["name"], 0) + 1
    row = {"config": "target" if not k else f"eagle3:{k}", "k": k, "nwor": mode if k else None,
           "clients": args.clients, "timed": table,
           "profiled": {"steps": len(probe.per_step), "step_ms_under_profiler": probe.table()["step_ms"],
                        "host_syncs": tp.host_syncs(events, steps, names=names),
                        "launch_calls_per_step": {c: round(v / n, 2) for c, v in sorted(calls.items())}},
           "graphed_steps": e.runner.graphed_steps, "replays": e.runner.replays, "prelaunched": e.runner.prelaunched}
    if cuda:
        dev = tp.device_events(events)
        window = (min(a for a, _ in steps), max(b for _, b in steps)) if steps else (0.0, 0.0)
        busy = tp.busy_us(tp.span(x) for x in dev if window[0] <= float(x["ts"]) <= window[1])
        row["profiled"]["device_busy_ms_per_step"] = round(busy / n / 1e3, 4)
    else:
        row["not_measured"] = ["device busy time and CUDA runtime calls (no device on the CPU: host syncs "
                               "are empty by construction)"]
    del e
    free_device(device)
    return row


def serve_spans_config(target, head, k: int, mode: str, device, args, acceptance) -> dict:
    """`spans --serve`: closed-loop serving at `--clients` clients (4 requests a client, lengths
    +-25 %, as `bench serve`), every step timed piece by piece, one table per kind of step (the
    driver's: a prefill rode in it, decode pre-launched, decode laid out by the host), after one
    untimed run of the same load (every bucket captured)."""
    from nwor_lab.bench.engine8b import build_engine
    from nwor_lab.bench.step_spans import StepSpans
    from nwor_lab.bench.timing import free_device
    from nwor_lab.serve.driver import serve
    from nwor_lab.serve.metrics import step_kind, steps_by_kind
    from nwor_lab.serve.workload import random_specs
    cuda = device.type == "cuda"
    vocab = target.config.vocab_size
    specs = random_specs(4 * args.clients, args.prompt_len, args.output_len, 0.25, vocab, seed=5)
    e = build_engine(target, head, k, mode, "graph" if cuda else "off", args.clients,
                     max(len(s.prompt) for s in specs), max(s.output_len for s in specs), acceptance, "auto", cuda)
    serve(e, random_specs(2 * args.clients, args.prompt_len, args.output_len, 0.25, vocab, seed=6),
          concurrency=args.clients)                                  # warm-up
    spans = StepSpans(e)
    with spans:
        run = serve(e, specs, concurrency=args.clients, step=spans.step)
    kinds = [step_kind(s) for s in run.steps]
    tables = {kind: spans.table([i for i, x in enumerate(kinds) if x == kind]) for kind in dict.fromkeys(kinds)}
    row = {"config": "target" if not k else f"eagle3:{k}", "k": k, "nwor": mode if k else None,
           "clients": args.clients, "serve": True, "steps_by_kind": steps_by_kind(run), "timed_by_kind": tables,
           "steps": len(run.steps)}
    del e
    free_device(device)
    return row


def run_spans(args, device) -> dict:
    from nwor_lab.model.shapes import random_head, random_target
    from nwor_lab.speculative.synthetic import ForcedAcceptance
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = random_target(args.model, device, dtype)
    head = random_head(target, "eagle3", args.model)
    acceptance = ForcedAcceptance.parse(args.acceptance, args.k)
    one = serve_spans_config if args.serve else spans_config

    def said(row):
        short = ({kind: t["step_ms"] for kind, t in row["timed_by_kind"].items()} if args.serve
                 else row["timed"]["step_ms"])
        print(json.dumps({"config": row["config"], "nwor": row["nwor"], "timed_step_ms": short}), flush=True)
        return row
    rows = [said(one(target, None, 0, "off", device, args, None))]
    for mode in args.nwor:
        rows.append(said(one(target, head, args.k, mode, device, args, acceptance)))
    return {"part": "spans", "model": f"{args.model} shape, random weights, EAGLE-3 head, forced acceptance "
                                      f"{args.acceptance!r}", "prompt_len": args.prompt_len,
            "output_len": args.output_len, "rows": rows}


# -- chain: the graphed step's kernels per write policy ----------------------------------------
class _Replay:
    """A StepCase's graph as replay_profile wants it: `replay()` restores the inputs, then replays."""

    def __init__(self, case):
        self.case = case

    def replay(self):
        self.case.replay()


def kernel_diff(tables: dict, base: str = "off", min_us: float = 0.5) -> list[dict]:
    """Kernels whose µs per step differs from `base`'s by at least `min_us` under some policy, largest
    difference first: {kernel, base µs, per policy µs and delta}."""
    rows = {name: {r["kernel"]: r["us_per_step"] for r in t} for name, t in tables.items()}
    kernels = set().union(*rows.values()) - {"(all kernels)"}
    out = []
    for k in kernels:
        b = rows[base].get(k, 0.0)
        deltas = {name: round(r.get(k, 0.0) - b, 1) for name, r in rows.items() if name != base}
        if max(abs(d) for d in deltas.values()) >= min_us:
            out.append({"kernel": k, base: b, **{n: rows[n].get(k, 0.0) for n in deltas},
                        **{f"{n}_minus_{base}": d for n, d in deltas.items()}})
    return sorted(out, key=lambda r: -max(abs(v) for key, v in r.items() if key.endswith(f"_minus_{base}")))


def run_chain(args, device) -> dict:
    from nwor_lab.bench.graph_profile import replay_profile
    from nwor_lab.bench.kernels import interleaved_time_us
    from nwor_lab.bench.step import StepCase, make_pair
    if device.type != "cuda":
        raise UsageError("step_profile chain: the graphed step needs a CUDA device (no graph is captured on the CPU)")
    pair = make_pair("8b")
    if args.temperatures:      # one policy (`off`) at each temperature: what sampling adds to the step
        modes = [f"T{t:g}" for t in args.temperatures]
        cases = {name: StepCase(pair, args.batch, args.k, args.context, "off", args.rate, temperature=t)
                 for name, t in zip(modes, args.temperatures)}
    else:
        modes = nwor_modes()
        cases = {m: StepCase(pair, args.batch, args.k, args.context, m, args.rate) for m in modes}
    base = modes[0]
    bad = [m for m, c in cases.items() if c.inputs is None or c.inputs.graph is None]
    if bad:
        raise RuntimeError(f"step_profile chain: no captured decode graph for {bad} (the bucket stayed eager)")
    with torch.no_grad():
        graph_us = interleaved_time_us({m: c.replay for m, c in cases.items()}, iters=3, reps=11, abba=True)
        kernels = replay_profile({m: _Replay(c) for m, c in cases.items()}, rounds=args.rounds, top=args.top)
    out = {"part": "chain", "model": "8b shape, random weights, EAGLE-1 head (bench step's)", "batch": args.batch,
           "k": args.k, "context": args.context, "rate": args.rate,
           "graph_us": {m: round(v, 1) for m, v in graph_us.items()},
           f"graph_vs_{base}": {m: round(graph_us[m] / graph_us[base], 4) for m in modes}}
    if kernels is None:
        out["kernels"] = None
        out["note"] = "the replays could not be told apart on the device's timeline (bench.graph_profile.split_replays)"
    else:
        out["kernels"] = kernels
        out[f"differs_from_{base}"] = kernel_diff(kernels, base)
    return out


def main(argv=None) -> dict:
    from nwor_lab.bench.engine8b import acceptance_text
    from nwor_lab.bench.timing import bench_device, device_name
    p = LabArgumentParser(prog="python -m nwor_lab.bench.step_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=("spans", "chain"))
    p.add_argument("--model", type=types.one_of(("8b", "8b-mini")), default="8b", help="spans: the shape")
    p.add_argument("--device", type=types.device, default=None)
    p.add_argument("--clients", type=types.integer(1, 256), default=32, help="spans: requests decoding together")
    p.add_argument("--prompt-len", type=types.integer(1, 4096), default=64)
    p.add_argument("--output-len", type=types.integer(8, 4096), default=256)
    p.add_argument("--steps", type=types.integer(1, 1000), default=30, help="spans: steps timed piece by piece")
    p.add_argument("--serve", action="store_true",
                   help="spans: closed-loop serving at --clients (admissions, finishes), one table per kind of step")
    p.add_argument("--profile-steps", type=types.integer(1, 1000), default=8, help="spans: steps under torch.profiler")
    p.add_argument("--k", type=types.integer(1, 16), default=4)
    p.add_argument("--nwor", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("stage",),
                   help="spans: the EAGLE configs' write policies")
    p.add_argument("--acceptance", type=acceptance_text, default="shipped")
    p.add_argument("--batch", type=types.integer(1, 512), default=64, help="chain: the batch")
    p.add_argument("--context", type=types.integer(1, 1 << 16), default=1024, help="chain: cached tokens per request")
    p.add_argument("--rate", type=types.fraction, default=0.5, help="chain: forced acceptance rate")
    p.add_argument("--temperatures", type=types.listed(types.temperature, "temperatures"), default=None,
                   help="chain: `off` at each of these temperatures instead of every policy at T 0 (kernels "
                        "against the first)")
    p.add_argument("--rounds", type=types.integer(2, 64), default=6, help="chain: ABBA rounds under the profiler")
    p.add_argument("--top", type=types.integer(1, 500), default=40, help="chain: kernels listed per policy")
    p.add_argument("--out", type=types.output_file, default=None)
    args = p.parse_args(argv)
    device = bench_device("step_profile", args.device, args.model if args.part == "spans" else "8b")
    t0 = time.time()
    body = run_spans(args, device) if args.part == "spans" else run_chain(args, device)
    out = {"command": "python -m nwor_lab.bench.step_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": device_name(device), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(time.time() - t0, 1), **body}
    save_json(out, args.out, indent=2)
    return out


if __name__ == "__main__":
    main()
