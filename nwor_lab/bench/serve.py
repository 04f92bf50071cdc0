"""Benchmark (not a test): the engine as a server, in wall-clock time: TTFT, TPOT, ITL, goodput.

    nwor-lab bench serve --device cpu --rates 1,2,4 --concurrency 1,4 --out serve_cpu.json
    nwor-lab bench serve --model 8b --device cuda --configs target,eagle3:4,eagle3:auto \\
        --rates 2,4,8,16,32 --concurrency 1,8,32 --out benchmarks/results/serve_8b_h100.json
    nwor-lab bench serve --device cpu --configs target,eagle1:1,eagle1:4,eagle1:auto \\
        --concurrency 4 --phases 0.9:0.1:0.9 --out serve_kauto_cpu.json

Load (`nwor_lab.serve.driver`): open loop, a Poisson process at each `--rates` request rate
(requests per second of wall time), and closed loop, each `--concurrency` clients sending their
next request the moment the last one finished (the batch never drains until the workload ends).
Requests (`nwor_lab.serve.workload`, fixed seed, the same for every config): prompt and output
lengths uniform in L (1 +- `--range-ratio`) (vLLM's random dataset); prompts are held-out corpus
text for the shipped pair, random ids for the 8B shape (`--model 8b` / `8b-mini`, drafts accepted
by the forced `--acceptance` profile, as `bench engine --model 8b`). Every output is generated
to its length (no end token: vLLM's --ignore-eos).

Phases (`--phases 0.9:0.1:0.9`, `nwor_lab.serve.phases`): every load point runs twice, `traffic`
`steady` (the `--acceptance` profile throughout) and `phases` (the forced acceptance switches profile
at equal shares of the point's output tokens: high, low, high), so a fixed k is wrong for part of the
run. Forced acceptance then drives every EAGLE engine, the shipped pair's too.
`kauto`: per point, `--k auto` against target-only and the best fixed k, paired repeat by repeat,
with the rules' verdicts (`nwor_lab.bench.serve_kauto`).

Configs (`--configs`): `target` (target-only), `HEAD:K` (eagle1 / eagle3, K drafts) and `HEAD:auto`
(an engine with `--k-max` drafts whose count is chosen per step by `nwor_lab.serve.AdaptiveK`),
each under every `--policies` write policy. One engine per config serves every load point in
turn (rates ascending, then concurrencies), after an untimed warm-up of `--warmup` requests at
`--max-num-seqs` (compiles kernels, captures CUDA graphs); the configs take turns at each load
point, so a drift of the machine hits them alike; an adaptive controller keeps what it learned
across the config's load points, as a server would.

Per load point (`nwor_lab.serve.metrics`, vLLM's names): TTFT, TPOT, ITL, E2EL (mean, p50, p90,
p99 ms), request / output / total token throughput, request goodput under `--goodput`
(default tpot:50), accept_length, occupancy (mean batch and a timeline), decode steps by
(requests, drafts), step time by kind of step (`steps_by_kind`: with a prefill, decode pre-launched,
decode laid out by the host), the slowest steps and Python's garbage collections (`gc_pauses`; the
start-up heap is frozen after the warm-ups and collected before each run). `components` (8B shape, `--components`): a decode step, a verify step and a
head pass timed alone at those batch sizes. `crossover`: per load point, each config's TPOT p50 and output throughput
against target-only's. JSON on stdout (one line per load point) and in `--out`; a progress bar on
stderr (`--quiet`: none).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import time

import torch

from nwor_lab.bench.flags import add_engine_flags, parsed
from nwor_lab.bench.output import save_json
from nwor_lab.bench.spread import paired, put_spread
from nwor_lab.commandline import args as types
from nwor_lab.bench.timing import bench_device, device_name, free_device, in_turn
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import SCV_MODES, nwor_modes
from nwor_lab.serve import AdaptiveK, Slo, serve, summarize
from nwor_lab.serve.driver import Progress
from nwor_lab.serve.phases import Observers
from nwor_lab.bench.serve_kauto import verdicts as kauto_verdicts
from nwor_lab.serve.workload import poisson_arrivals, random_specs, specs_from_stream

HEADS = ("eagle1", "eagle3")


def config_spec(text: str) -> tuple[str | None, int | str]:
    """`target` -> (None, 0); `eagle3:4` -> ("eagle3", 4); `eagle3:auto` -> ("eagle3", "auto")."""
    if text == "target":
        return None, 0
    head, _, k = text.partition(":")
    if head not in HEADS or not k:
        raise argparse.ArgumentTypeError(f"{text!r}: a config is `target`, HEAD:K or HEAD:auto, HEAD one of "
                                         f"{', '.join(HEADS)} (e.g. eagle3:4)")
    if k == "auto":
        return head, "auto"
    try:
        return head, types.integer(1, 16)(k)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: the K of HEAD:K is a draft count 1..16, or `auto`") from None


def slo_text(text: str) -> Slo:
    try:
        return Slo.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parser() -> LabArgumentParser:
    p = LabArgumentParser(prog="nwor-lab bench serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=types.one_of(("shipped", "8b", "8b-mini")), default="shipped")
    p.add_argument("--device", type=types.device, default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", type=types.one_of(("float32", "bfloat16", "float16")), default=None,
                   help="default: float32 for the shipped pair, bfloat16 for the 8B shape")
    p.add_argument("--configs", type=types.listed(config_spec, "configs"), default=(config_spec("target"),
                   config_spec("eagle3:4"), config_spec("eagle3:auto")),
                   help="comma-separated: target, HEAD:K, HEAD:auto (HEAD eagle1 or eagle3)")
    p.add_argument("--k-max", type=types.integer(1, 16), default=4, help="drafts an `auto` engine may verify")
    p.add_argument("--policies", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("stage",))
    p.add_argument("--scv", type=types.one_of(SCV_MODES), default="graph",
                   help="SCV mode of the EAGLE engines (graph: the acceptance mask on the device, as graphed steps "
                        "need it)")
    p.add_argument("--rates", type=types.listed(types.number_in(1e-3, math.inf), "request rates"), default=(),
                   help="open loop: Poisson request rates, requests per second of wall time (inf: all at once)")
    p.add_argument("--concurrency", type=types.listed(types.integer(1, 4096), "client counts"), default=(),
                   help="closed loop: concurrent clients")
    p.add_argument("--requests", type=types.integer(1, 100_000), default=32, help="requests per load point")
    p.add_argument("--requests-per-client", type=types.integer(1, 10_000), default=4,
                   help="closed loop: at least this many requests per client (max with --requests), so the "
                        "batch runs full for most of the point and drains only at its end")
    p.add_argument("--prompt-len", type=types.integer(1, 1 << 16), default=32)
    p.add_argument("--output-len", type=types.integer(1, 1 << 16), default=32)
    p.add_argument("--range-ratio", type=types.number_in(0.0, 0.99), default=0.25,
                   help="lengths uniform in L x (1 - r) .. L x (1 + r) (vLLM's --random-range-ratio)")
    p.add_argument("--max-num-seqs", type=types.integer(1, 4096), default=None,
                   help="the engine's batch limit (default: the largest --concurrency, at least 8)")
    p.add_argument("--goodput", type=slo_text, default=Slo(), help="SLOs in ms, e.g. tpot:50 or ttft:500,tpot:50")
    p.add_argument("--warmup", type=types.integer(0, 100_000), default=None,
                   help="untimed requests before the first load point (default: 2 x max-num-seqs)")
    p.add_argument("--acceptance", default="shipped", help="8B shape (and --phases' steady points): forced "
                   "acceptance profile (bench engine's)")
    p.add_argument("--phases", type=phase_texts, default=None,
                   help="forced-acceptance profiles separated by ':' (each as --acceptance), e.g. 0.9:0.1:0.9: every load "
                        "point also runs with the profile switching at equal shares of its output tokens")
    p.add_argument("--seed", type=types.integer(0), default=0)
    p.add_argument("--no-ride-dead", action="store_true",
                   help="LabConfig(ride_dead=False): a request that may finish keeps the next step for the host "
                        "(a newcomer joins a step sooner; less host work hidden)")
    p.add_argument("--repeats", type=types.integer(1, 100), default=3,
                   help="runs of every config at every load point, the configs' runs in turn (ABBA); rows give the "
                        "median run with every repeat's throughput and TPOT, ratios the median of per-repeat ratios")
    p.add_argument("--row-steps", type=types.integer(1, 64), default=None,
                   help="buckets a doubling for steps with prefills from 128 rows (engine.buffers.STEPS_PER_DOUBLING, "
                        "default 8; 1: powers of two, the rule before): an A/B of the padding")
    p.add_argument("--own-graph-pools", action="store_true",
                   help="each prefill bucket's graph in a memory pool of its own (StepRunner.share_prefill_pool "
                        "False), as before the shared pool: an A/B of its memory and speed")
    p.add_argument("--temperature", type=types.temperature, default=0.0,
                   help="sampling temperature of every engine (0: greedy)")
    add_engine_flags(p, scv=False)                  # its --scv above: the EAGLE engines' own help
    p.add_argument("--components", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(),
                   help="8B shape: also time a decode step, a verify step of 1 + k-max tokens and one head pass "
                        "at these batch sizes (CUDA-graph replays, bench engine --model 8b's napkin inputs)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def phase_texts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(":"))
    if len(parts) < 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give two or more forced-acceptance profiles separated by ':', "
                                         f"e.g. 0.9:0.1:0.9 (high, low, high)")
    return parts


def load_points(args) -> list[dict]:
    points = ([{"mode": "open", "rate": r} for r in sorted(args.rates)]
              + [{"mode": "closed", "concurrency": c} for c in sorted(args.concurrency)])
    if args.phases is None:
        return points
    return [{**p, "traffic": "steady"} for p in points] + [{**p, "traffic": "phases"} for p in points]


def schedules(args) -> dict:
    """{traffic: Phases} for --phases: `steady` (the --acceptance profile, one phase) and `phases`."""
    from nwor_lab.serve.phases import Phases
    try:
        return {"steady": Phases([args.acceptance], args.k_max, args.seed),
                "phases": Phases(args.phases, args.k_max, args.seed)}
    except ValueError as err:
        raise UsageError(f"argument --phases / --acceptance: {err}") from None


def load_models(args, device, dtype):
    """-> (target, {head name: head}, request specs, acceptance or None)."""
    heads_needed = sorted({h for h, _ in args.configs if h})
    forced = None
    if args.model != "shipped" or args.phases is not None:
        from nwor_lab.speculative.synthetic import ForcedAcceptance
        try:
            forced = ForcedAcceptance.parse(args.acceptance, args.k_max)
        except ValueError as err:
            raise UsageError(f"argument --acceptance: {err}") from None
    if args.model == "shipped":
        from nwor_lab.bench.engine import held_out_stream
        from nwor_lab.model.shipped import load_tiny
        target, heads, tok = None, {}, None
        for h in heads_needed or ["eagle1"]:
            target, head, tok = load_tiny(device=device, head=h, dtype=dtype)
            heads[h] = head
        heads = {h: heads[h] for h in heads_needed}
        stream = held_out_stream(tok)
        return target, heads, lambda n: specs_from_stream(stream, n, args.prompt_len, args.output_len,
                                                          args.range_ratio, args.seed), forced
    from nwor_lab.model.shapes import random_head, random_target
    acceptance = forced
    target = random_target(args.model, device, dtype)
    heads = {h: random_head(target, h, args.model) for h in heads_needed}
    vocab = target.config.vocab_size
    return target, heads, lambda n: random_specs(n, args.prompt_len, args.output_len, args.range_ratio, vocab,
                                                 args.seed), acceptance


def build(target, head, k: int, mode: str, args, specs, acceptance, max_num_seqs: int):
    """One engine for every load point of a config, sized for its longest request at max_num_seqs
    (with --phases, forced acceptance of its own that the phase schedules switch)."""
    from nwor_lab.bench.engine8b import build_engine
    if args.phases is not None and acceptance is not None:
        from nwor_lab.serve.phases import SwitchableAcceptance
        acceptance = SwitchableAcceptance(acceptance.profile, acceptance.seed)
    longest_prompt = max(len(s.prompt) for s in specs)
    longest_output = max(s.output_len for s in specs)
    return build_engine(target, head, k, mode, args.scv, max_num_seqs, longest_prompt, longest_output,
                        acceptance if k else None, args.attention, not args.no_cuda_graph,
                        temperature=args.temperature, seed=args.seed, ride_dead=not args.no_ride_dead)


def warm_up(engine, name: str, k_auto, warmup, args) -> None:
    """Untimed requests at max_num_seqs (compiles, captures each bucket's graph; teaches k_auto)."""
    if warmup:
        serve(engine, warmup, concurrency=engine.scheduler.max_num_seqs, controller=k_auto,
              progress=None if args.quiet else Progress(len(warmup), f"{name} warm-up"))


def point_specs(point: dict, specs, args) -> list:
    """The requests of one load point: `--requests` in open loop; in closed loop at least
    `--requests-per-client` per client (the same prefix of the fixed-seed workload for every config)."""
    if point["mode"] == "open":
        return specs[:args.requests]
    return specs[:max(args.requests, args.requests_per_client * point["concurrency"])]


def run_point(engine, name: str, k_auto, point: dict, specs, args, device, phases=None) -> dict:
    """One config at one load point -> its row (also printed as one JSON line). `phases`: the point's
    schedule (`--phases`), restarted for this run on the engine's switchable acceptance."""
    specs = point_specs(point, specs, args)
    controller = k_auto
    if phases is not None:
        phases.start(sum(s.output_len for s in specs), [engine.acceptance] if engine.acceptance is not None else [])
        controller = Observers(k_auto, phases)
    first = len(engine.trace)
    arrivals = poisson_arrivals(len(specs), point["rate"], args.seed + 3) if point["mode"] == "open" else None
    label = f"{name} {'rate ' + str(point['rate']) if arrivals is not None else str(point['concurrency']) + ' clients'}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    decided = len(k_auto.history) if k_auto is not None else 0      # this point's decisions start here
    run = serve(engine, specs, arrivals=arrivals, concurrency=point.get("concurrency"), rate=point.get("rate"),
                controller=controller, progress=None if args.quiet else Progress(len(specs), label))
    row = {"config": name, **point, **summarize(run, args.goodput, engine.trace[first:], engine.k)}
    if phases is not None and point.get("traffic") == "phases":
        row["phases"] = phases.run_record()
    if k_auto is not None and not k_auto.decisions:
        raise RuntimeError(f"{name}: the engine never asked its draft_counts hook for a draft count (an engine "
                           f"without the hook would run k_max every step: not an adaptive k)")
    if k_auto is not None:
        row["k_auto"] = k_auto.describe(since=decided)     # chosen: from the warm-up on; chosen_since: this point
    print(json.dumps({k: v for k, v in row.items() if k not in ("occupancy", "steps_by_batch", "steps_by_kind", "slowest_steps", "gc_pauses", "k_auto", "phases")}),
          flush=True)
    return row


SPREAD = ("output_throughput", "p50_tpot_ms")      # every repeat's value kept in the row


def with_spread(runs: list[dict]) -> dict:
    """One row for a config at a load point from its repeats: the median run's row (its percentiles and
    occupancy belong together), with `repeats`, and for each of SPREAD the value of every repeat (in run
    order, `<name>_reps`), their median (the row's value) and min–max."""
    order = sorted(range(len(runs)), key=lambda i: runs[i]["output_throughput"])
    row = dict(runs[order[len(order) // 2]])
    row["repeats"] = len(runs)
    for key in SPREAD:
        put_spread(row, key, [r[key] for r in runs])
    return row


def crossover(rows: list[dict]) -> list[dict]:
    """Per load point and config: TPOT p50 and output throughput against target-only's at that point
    (> 1: the config is faster); with repeats, each the median of the per-repeat ratios (repeat i of the
    config against repeat i of target-only, run next to each other) with their min–max."""
    def key(r):
        return (r["mode"], r.get("rate"), r.get("concurrency"), r.get("traffic"))
    base = {key(r): r for r in rows if r["config"] == "target-only"}
    out = []
    for r in rows:
        b = base.get(key(r))
        if b is None or r["config"] == "target-only":
            continue
        tpot, btpot = r["p50_tpot_ms"], b["p50_tpot_ms"]
        ratio = paired(r.get("output_throughput_reps", [r["output_throughput"]]),
                       b.get("output_throughput_reps", [b["output_throughput"]]), 3)
        out.append({"config": r["config"], "mode": r["mode"], "rate": r.get("rate"), "concurrency": r.get("concurrency"),
                    **({"traffic": r["traffic"]} if "traffic" in r else {}),
                    "tpot_p50_speedup": round(btpot / tpot, 3) if tpot and btpot else None,
                    "output_throughput_ratio": ratio["median"], "output_throughput_ratio_min": ratio["min"],
                    "output_throughput_ratio_max": ratio["max"], "output_throughput_ratio_reps": ratio["reps"],
                    "mean_batch": r["occupancy"]["mean_batch"], "target_mean_batch": b["occupancy"]["mean_batch"],
                    "accept_length": r.get("accept_length")})
    return out


def token_bucket_rule() -> dict:
    """How steps with prefills pad their rows (`engine.buffers.token_bucket`), as this run had it."""
    from nwor_lab.engine import buffers
    return {"fine_rows": buffers.FINE_ROWS, "steps_per_doubling": buffers.STEPS_PER_DOUBLING,
            "large_tokens": buffers.LARGE_TOKENS}


def engine_row(engine, name: str, device, held_before: int) -> dict:
    """What a config's engine cost to start: the graphs captured before its first step (and in how
    many seconds), the graphs it holds after the warm-ups, and the device memory it added (its
    cache, buffers and graph pools: torch's reserved bytes after the warm-ups less before it was built)."""
    runner = engine.runner
    graphs, seconds = runner.startup_capture or (0, 0.0)
    added = torch.cuda.memory_reserved(device) - held_before if device.type == "cuda" else None
    return {"config": name, "graphs_at_start": graphs, "capture_seconds": round(seconds, 2),
            "graphs_held": sum(1 for inp in runner.buckets.values() if inp.graph is not None),
            "device_memory_added_gib": None if added is None else round(added / 2**30, 2)}


def main(argv=None) -> dict:
    argv, args = parsed(parser(), argv)
    device = bench_device("serve", args.device, args.model)
    if args.row_steps is not None:
        from nwor_lab.engine import buffers
        buffers.STEPS_PER_DOUBLING = args.row_steps     # this process's engines (a bench's A/B)
    points = load_points(args)
    if not points:
        raise UsageError("bench serve: give --rates (open loop) and/or --concurrency (closed loop)")
    dtype = getattr(torch, args.dtype or ("float32" if args.model == "shipped" else "bfloat16"))
    max_num_seqs = args.max_num_seqs or max([8, *args.concurrency])
    n_warm = 2 * max_num_seqs if args.warmup is None else args.warmup
    args.warmup = n_warm
    t_start = time.perf_counter()
    target, heads, make_specs, acceptance = load_models(args, device, dtype)
    n_point = max([args.requests] + [args.requests_per_client * c for c in args.concurrency])
    every = make_specs(n_point + n_warm)
    specs, warmup = every[:n_point], every[n_point:]
    components = []
    if args.components:
        if args.model == "shipped":
            raise UsageError("bench serve --components: the component timings are the 8B shape's (--model 8b)")
        from nwor_lab.bench.engine8b import component_times
        context = args.prompt_len + args.output_len // 2
        for bs in args.components:
            components.append(component_times(target, heads, bs, [args.k_max], context, args.attention, device))
            print(json.dumps(components[-1]), flush=True)
    args.component_rows = components
    traffic = schedules(args) if args.phases is not None else {}
    rows = []
    configs = [(None, 0, "off")] if (None, 0) in args.configs else []
    configs += [(h, k, m) for h, k in args.configs if h for m in args.policies]
    engines = []                       # every config's engine, built and warmed up once
    args.engine_rows = []              # what each cost to start (graphs, seconds, device memory)
    for head, k, mode in configs:
        held = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
        k_engine = args.k_max if k == "auto" else k
        name = "target-only" if head is None else f"{head} k={k} nwor={mode}"   # (scv: --scv, in the JSON)
        engine = build(target, heads.get(head), k_engine, mode, args, every, acceptance, max_num_seqs)
        engine.runner.share_prefill_pool = not args.own_graph_pools      # (before the first step captures)
        k_auto = None
        if k == "auto":
            k_auto = AdaptiveK(k_engine)
            engine.draft_counts = k_auto
        if traffic:                     # warm up under the steady profile
            traffic["steady"].start(0, [engine.acceptance] if engine.acceptance is not None else [])
        warm_up(engine, name, k_auto, warmup, args)
        engines.append((engine, name, k_auto))
        args.engine_rows.append(engine_row(engine, name, device, held))
    # what start-up left (models, engines, graphs) is moved out of the collector's sight, as vLLM does
    # after its start-up: a full collection then walks what the runs themselves allocate, not the heap
    gc.collect()
    gc.freeze()
    # configs interleaved at each load point, repeat by repeat in ABBA order: a drift of the machine (a
    # neighbour's load, clocks) hits every config of a point alike, not one config's whole sweep
    for point in points:
        runs: dict[str, list] = {}
        for rep in range(args.repeats):
            for engine, name, k_auto in in_turn(engines, rep):
                gc.collect()            # (untimed) every run starts with the collector's counts at zero
                runs.setdefault(name, []).append(run_point(engine, name, k_auto, point, specs, args, device,
                                                           traffic.get(point.get("traffic"))))
        rows.extend(with_spread(runs[name]) for _, name, _ in engines)
        if args.out:                              # what is measured so far survives a timeout
            write(args, argv, device, dtype, acceptance, max_num_seqs, t_start, rows, traffic, complete=False)
    del engines
    gc.unfreeze()
    free_device(device)
    return write(args, argv, device, dtype, acceptance, max_num_seqs, t_start, rows, traffic, complete=True)


def write(args, argv, device, dtype, acceptance, max_num_seqs, t_start, rows, traffic, complete: bool) -> dict:
    out = {"command": "nwor-lab bench serve " + " ".join(argv),
           "device": device_name(device),
           "torch": torch.__version__, "model": args.model, "dtype": str(dtype).removeprefix("torch."),
           "cuda_graph": not args.no_cuda_graph and device.type == "cuda", "max_num_seqs": max_num_seqs,
           "ride_dead": not args.no_ride_dead,
           "token_buckets": token_bucket_rule(),
           "prefill_graph_pool": "own" if args.own_graph_pools else "shared",
           "gc": "frozen after the warm-ups (gc.freeze, as vLLM after start-up); collected before each run (untimed)",
           "workload": {"requests": args.requests, "requests_per_client": args.requests_per_client,
                        "prompt_len": args.prompt_len, "output_len": args.output_len,
                        "range_ratio": args.range_ratio, "seed": args.seed, "warmup_requests": args.warmup,
                        "prompts": "held-out corpus text" if args.model == "shipped" else "random ids"},
           "acceptance": None if acceptance is None else {"source": args.acceptance, **acceptance.describe(args.k_max)},
           "scv": args.scv, "temperature": args.temperature, "repeats": args.repeats, "goodput_slo_ms": args.goodput.describe(), "complete": complete,
           "seconds_total": round(time.perf_counter() - t_start, 1),
           "phases": traffic["phases"].describe() if traffic else None,
           "components": args.component_rows, "engines": getattr(args, "engine_rows", []), "results": rows, "crossover": crossover(rows),
           "kauto": kauto_verdicts(rows)}
    save_json(out, args.out)
    return out


if __name__ == "__main__":
    main()
