"""Kernel benchmarks: `nwor-lab bench kernels --json [--out PATH] [--quick]`.

For each op at 8, 16, ..., 4096 tokens and two cache shapes (a Llama-3-8B layer: 8 KV heads x 128,
bf16, block 16; the shipped tiny model: 4 KV heads x 64, bf16, block 16), measured in ONE process:
  us         eager: CUDA events around `iters` back-to-back calls of `torch.ops.nwor_lab.<op>`
             from Python, divided, median of `reps` repeats. A launch-bound op reports its launch
             interval here (host: Python + dispatcher + launch), as an eager decode step sees it.
  kernel_us  the same calls captured in a CUDA graph, replayed, divided: GPU time per kernel
             with the host out of the way (what a graph-captured step pays)
  GB/s       bytes the op must move (valid rows: K+V source read + cache write; slots; masks)
             over kernel_us
  %copy      of the device-to-device copy bandwidth measured in the same run (read + write),
             on a 1 GiB copy; %same: of a torch copy moving write_kv's bytes at this size (same
             rotation, in a graph), the ceiling a kernel of this size can reach
  ref_us     the torch reference (`nwor_lab.ops.*_reference`) in the same run, eager
plus the floor of a custom-op launch (`torch.ops.nwor_lab.noop`), a 32-layer window commit
(320 tokens, half accepted) in one launch vs 32 per-layer write_kv launches, and SCV for 64
requests x k=8 (eager op, and replayed from a CUDA graph).

Inputs rotate among several buffer sets whose footprint exceeds the L2 cache at large sizes, so
bandwidth is DRAM bandwidth, not L2's. Targets are reported (`targets` in the JSON), not asserted.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from nwor_lab.bench.output import save_json
from nwor_lab.bench.timing import in_order, in_turn
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError

TOKENS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SHAPES = {
    "llama3-8b": dict(num_kv_heads=8, head_size=128, block_size=16, dtype=torch.bfloat16),
    "tiny": dict(num_kv_heads=4, head_size=64, block_size=16, dtype=torch.bfloat16),
}
TARGETS = {
    "write_kv_4096_pct_copy_bw": 70.0,
    "small_op_vs_empty_launch": 1.5,
    "commit_32_layers_us": 25.0,
    "scv_64x8_us": 10.0,
}


def time_us(fn, *, iters: int = 20, reps: int = 25, warmup: int = 3) -> float:
    """Median over `reps` of (CUDA-event time of `iters` calls) / iters, in microseconds."""
    return interleaved_time_us({"fn": fn}, iters=iters, reps=reps, warmup=warmup)["fn"]


def interleaved_time_us(fns: dict, *, iters: int = 5, reps: int = 21, warmup: int = 2, abba: bool = False) -> dict:
    """`time_us` for several callables measured round-robin: each repeat times every one of them
    once, so host-speed drift (clocks, a noisy neighbour) hits them alike and their ratios hold;
    `abba`: every other repeat in reverse order, so none is always timed first.
    -> {name: median µs per call}."""
    times = interleaved_times_us(fns, iters=iters, reps=reps, warmup=warmup, abba=abba)
    return {name: statistics.median(t) for name, t in times.items()}


def interleaved_times_us(fns: dict, *, iters: int = 5, reps: int = 21, warmup: int = 2, abba: bool = False,
                         order: str | None = None) -> dict:
    """interleaved_time_us's repeats themselves: {name: [µs per call, one per repeat]}, repeat i of every
    name taken back to back (pair them: a ratio per repeat cancels what drifts between repeats). The
    order within a repeat: as given, ABBA (`abba`), or `order` (`timing.in_order`: abba or shuffle)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for i in range(reps):
        turn = in_order(fns.items(), i, order) if order else (in_turn(fns.items(), i) if abba else fns.items())
        for name, fn in turn:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / iters)
    return times


def graph_time_us(fns, *, per_graph: int = 40, reps: int = 15) -> float:
    """GPU time per call: `per_graph` calls (cycling through `fns`) captured in one CUDA graph,
    replayed; median over repeats, divided by `per_graph`."""
    def calls():
        for i in range(per_graph):
            fns[i % len(fns)]()
    graph = capture_graph(calls)
    us = time_us(graph.replay, iters=3, reps=reps) / per_graph
    del graph
    return us


def rotating(fns):
    """One callable that runs the next of `fns` on each call (buffer rotation)."""
    state = {"i": 0}

    def call():
        fns[state["i"] % len(fns)]()
        state["i"] += 1
    return call


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), iters=5, reps=15)
    return 2 * nbytes / (us * 1e-6) / 1e9


def _sets(num_tokens: int, row_bytes: int) -> int:
    """How many buffer sets to rotate so the footprint exceeds ~150 MB (L2 is 50-60 MB)."""
    per_set = max(1, num_tokens * row_bytes * 2)
    return int(min(8, max(1, -(-150_000_000 // per_set))))


def bench_shape(name: str, shape: dict, tokens, copy_bw: float, quick: bool) -> list[dict]:
    from nwor_lab.ops.commit import commit_reference
    from nwor_lab.ops.slots import log_slots_reference, restore_slots_reference
    from nwor_lab.ops.write_kv import write_kv_reference

    ops = torch.ops.nwor_lab
    write_kv, commit = ops.write_kv.default, ops.commit.default
    log_slots, restore_slots = ops.log_slots.default, ops.restore_slots.default
    h, d, bs, dtype = shape["num_kv_heads"], shape["head_size"], shape["block_size"], shape["dtype"]
    esize = torch.empty((), dtype=dtype).element_size()
    row = h * d * esize  # bytes of one token's K (or V) in one layer
    rows = []
    reps = 10 if quick else 25
    for t in tokens:
        nsets = _sets(t, row)
        num_slots = max(4 * t * nsets, 4096)
        nb = -(-num_slots // bs)
        gen = torch.Generator(device="cuda").manual_seed(t)
        kc = torch.zeros(1, nb, bs, h, d, dtype=dtype, device="cuda")
        vc = torch.zeros_like(kc)
        kc0, vc0 = kc[0], vc[0]
        sets = []
        perm = torch.randperm(nb * bs, device="cuda", generator=gen)
        for i in range(nsets):
            key = torch.randn(1, t, h, d, dtype=dtype, device="cuda", generator=gen)
            value = torch.randn(1, t, h, d, dtype=dtype, device="cuda", generator=gen)
            slots = perm[i * t:(i + 1) * t].clone()
            mask = torch.rand(t, device="cuda", generator=gen) < 0.5
            log_k = torch.empty(1, t, h, d, dtype=dtype, device="cuda")
            log_v = torch.empty_like(log_k)
            sets.append((key, value, key[0], value[0], slots, mask, log_k, log_v))
        n_acc = sum(int(s[5].sum()) for s in sets) / nsets  # accepted rows per commit call

        def calls(kind, ref=False):
            fns = []
            for key, value, k0, v0, slots, mask, log_k, log_v in sets:
                if kind == "write_kv":
                    f = (lambda k=k0, v=v0, s=slots: write_kv_reference(k, v, kc0, vc0, s)) if ref \
                        else (lambda k=k0, v=v0, s=slots: write_kv(k, v, kc0, vc0, s, None, None))
                elif kind == "commit":
                    f = (lambda k=key, v=value, s=slots, m=mask: commit_reference(k, v, kc, vc, s, m)) if ref \
                        else (lambda k=key, v=value, s=slots, m=mask: commit(k, v, kc, vc, s, m, None, None))
                elif kind == "log_slots":
                    f = (lambda s=slots: log_slots_reference(kc, vc, s)) if ref \
                        else (lambda s=slots, a=log_k, b=log_v: log_slots(kc, vc, s, a, b))
                else:  # restore_slots
                    f = (lambda s=slots, a=log_k, b=log_v: restore_slots_reference(kc, vc, s, a, b)) if ref \
                        else (lambda s=slots, a=log_k, b=log_v: restore_slots(kc, vc, s, a, b))
                fns.append(f)
            return fns

        moved = {  # bytes each op must move (K and V)
            "write_kv": 2 * t * row * 2 + t * 8,
            "commit": 2 * n_acc * row * 2 + t * 9,
            "log_slots": 2 * t * row * 2 + t * 8,
            "restore_slots": 2 * t * row * 2 + t * 8,
        }
        half = int(moved["write_kv"]) // 2
        copies = [tuple(torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(2)) for _ in range(nsets)]
        same_copy_us = graph_time_us([lambda a=a, b=b: b.copy_(a) for a, b in copies], reps=max(5, reps // 2))
        same_copy_gbps = 2 * half / (same_copy_us * 1e-6) / 1e9
        del copies
        for kind in ("write_kv", "commit", "log_slots", "restore_slots"):
            us = time_us(rotating(calls(kind)), reps=reps)
            kernel_us = graph_time_us(calls(kind), reps=max(5, reps // 2))
            ref_us = time_us(rotating(calls(kind, ref=True)), iters=5, reps=max(5, reps // 3))
            gbps = moved[kind] / (kernel_us * 1e-6) / 1e9
            rows.append(dict(shape=name, op=kind, tokens=t, us=round(us, 2), kernel_us=round(kernel_us, 2),
                             ref_us=round(ref_us, 2), bytes=int(moved[kind]), GBps=round(gbps, 1),
                             pct_copy_bw=round(100 * gbps / copy_bw, 1),
                             same_size_copy_GBps=round(same_copy_gbps, 1),
                             pct_same_size_copy=round(100 * gbps / same_copy_gbps, 1),
                             speedup_vs_ref=round(ref_us / us, 1)))
        del kc, vc, sets
        torch.cuda.empty_cache()
    return rows


def bench_window_commit(quick: bool) -> dict:
    """32 layers, 320 window tokens (64 requests x (1 + 4)), half accepted: one commit launch vs
    32 per-layer write_kv launches (rejected rows as slot -1, i.e. what `off` must launch)."""
    write_kv, commit = torch.ops.nwor_lab.write_kv.default, torch.ops.nwor_lab.commit.default
    num_layers, t, h, d, bs = 32, 320, 8, 128, 16
    nb = 4096 // bs * 4
    kc = torch.zeros(num_layers, nb, bs, h, d, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    staged_k = torch.randn(num_layers, t, h, d, dtype=torch.bfloat16, device="cuda")
    staged_v = torch.randn_like(staged_k)
    slots = torch.randperm(nb * bs, device="cuda")[:t]
    mask = torch.rand(t, device="cuda") < 0.5
    masked_slots = torch.where(mask, slots, torch.full_like(slots, -1))
    reps = 10 if quick else 25

    views = [(staged_k[i], staged_v[i], kc[i], vc[i]) for i in range(num_layers)]

    def per_layer():
        for sk, sv, k, v in views:
            write_kv(sk, sv, k, v, masked_slots, None, None)

    def one_commit():
        commit(staged_k, staged_v, kc, vc, slots, mask, None, None)

    one = time_us(one_commit, reps=reps)
    many = time_us(per_layer, iters=5, reps=reps)
    one_graph = graph_time_us([one_commit], per_graph=20)
    many_graph = graph_time_us([per_layer], per_graph=2)
    accepted = int(mask.sum())
    nbytes = 2 * num_layers * accepted * h * d * 2 * 2
    return dict(layers=num_layers, tokens=t, accepted=accepted, commit_one_launch_us=round(one, 2),
                write_kv_per_layer_32_launches_us=round(many, 2), speedup=round(many / one, 1),
                commit_kernel_us=round(one_graph, 2), write_kv_32_launches_in_graph_us=round(many_graph, 2),
                commit_GBps=round(nbytes / (one_graph * 1e-6) / 1e9, 1))


def bench_scv(quick: bool) -> dict:
    """64 requests x k = 8 drafts: the eager op, the torch reference, and a CUDA-graph replay."""
    from nwor_lab.ops.scv import scv_mask_reference
    from nwor_lab.speculative.scv_graph import GraphedScv

    scv_mask = torch.ops.nwor_lab.scv_mask.default
    num_reqs, k = 64, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    drafts = torch.randint(0, 4, (num_reqs * k,), device="cuda", dtype=torch.int32, generator=gen)
    cu = torch.arange(1, num_reqs + 1, device="cuda", dtype=torch.int32) * k
    sampled = torch.randint(0, 4, (num_reqs, k + 1), device="cuda", dtype=torch.int32, generator=gen)
    token_req = torch.arange(num_reqs, device="cuda", dtype=torch.int32).repeat_interleave(k + 1)
    token_pos = torch.arange(k + 1, device="cuda", dtype=torch.int32).repeat(num_reqs)
    dm = torch.empty(num_reqs * k, dtype=torch.bool, device="cuda")
    acc = torch.empty(num_reqs, dtype=torch.int32, device="cuda")
    cm = torch.empty(num_reqs * (k + 1), dtype=torch.bool, device="cuda")
    reps = 10 if quick else 25
    eager = time_us(lambda: scv_mask(drafts, cu, sampled, token_req, token_pos, dm, acc, cm), reps=reps)
    ref = time_us(lambda: scv_mask_reference(drafts, cu, sampled, token_req, token_pos), iters=5, reps=reps)
    graphed = GraphedScv(copy_outputs=False)
    static = graphed.static_inputs(drafts, cu, sampled, token_req, token_pos)
    replay = time_us(lambda: graphed(*static), reps=reps)
    # The kernel alone, many replays of a graph holding 20 copies (launch gaps removed).
    def twenty():
        for _ in range(20):
            scv_mask(drafts, cu, sampled, token_req, token_pos, dm, acc, cm)
    g = capture_graph(twenty)
    in_graph = time_us(g.replay, iters=5, reps=reps) / 20
    return dict(num_reqs=num_reqs, k=k, eager_us=round(eager, 2), reference_us=round(ref, 2),
                graph_replay_us=round(replay, 2), kernel_in_graph_us=round(in_graph, 2))


def run(quick: bool = False, tokens=TOKENS) -> dict:
    from nwor_lab.ops import _ext

    if not torch.cuda.is_available():
        raise UsageError("bench kernels: needs a CUDA device (none is visible here); run it on a GPU machine")
    _ext.load()
    t0 = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    copy_bw = copy_bandwidth_gbps()
    x = torch.empty(1, device="cuda")
    noop = torch.ops.nwor_lab.noop.default
    empty_us = time_us(lambda: noop(x))
    empty_kernel_us = graph_time_us([lambda: noop(x)])
    sweeps = []
    for name, shape in SHAPES.items():
        sweeps += bench_shape(name, shape, tokens, copy_bw, quick)
    window = bench_window_commit(quick)
    scv = bench_scv(quick)

    def at(op, t, shape="llama3-8b"):
        return next((r for r in sweeps if r["op"] == op and r["tokens"] == t and r["shape"] == shape), None)

    big = at("write_kv", max(tokens))
    small = [r for r in sweeps if r["tokens"] <= 64]
    worst_small = max(small, key=lambda r: r["us"]) if small else None
    targets = {
        "write_kv_4096_pct_copy_bw": dict(target=f">= {TARGETS['write_kv_4096_pct_copy_bw']}",
                                          value=big and big["pct_copy_bw"],
                                          met=bool(big and big["pct_copy_bw"] >= TARGETS["write_kv_4096_pct_copy_bw"])),
        "ops_le_64_tokens_vs_empty_launch": dict(
            target=f"<= {TARGETS['small_op_vs_empty_launch']}x",
            value=worst_small and round(worst_small["us"] / empty_us, 2),
            worst=worst_small and f"{worst_small['op']} {worst_small['shape']} T={worst_small['tokens']}",
            met=bool(worst_small and worst_small["us"] <= TARGETS["small_op_vs_empty_launch"] * empty_us)),
        "commit_32_layers_us": dict(target=f"<= {TARGETS['commit_32_layers_us']}", value=window["commit_one_launch_us"],
                                    met=window["commit_one_launch_us"] <= TARGETS["commit_32_layers_us"]),
        "scv_64x8_us": dict(target=f"<= {TARGETS['scv_64x8_us']}", value=scv["eager_us"],
                            met=scv["eager_us"] <= TARGETS["scv_64x8_us"]),
    }
    return dict(
        device=props.name, sm_count=props.multi_processor_count, torch=torch.__version__,
        cuda=torch.version.cuda, command=" ".join(["nwor-lab", "bench", "kernels"] + sys.argv[1:]),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), extension=_ext.build_info(),
        method="CUDA events around back-to-back calls, median of repeats; inputs rotated past L2",
        copy_bandwidth_GBps=round(copy_bw, 1), empty_op_us=round(empty_us, 2),
        empty_op_in_graph_us=round(empty_kernel_us, 2), sweeps=sweeps,
        window_commit=window, scv=scv, targets=targets, seconds=round(time.perf_counter() - t0, 1))


def table(result: dict) -> str:
    lines = [f"{result['device']}  torch {result['torch']}  CUDA {result['cuda']}  "
             f"copy {result['copy_bandwidth_GBps']} GB/s  empty op {result['empty_op_us']} us eager, "
             f"{result['empty_op_in_graph_us']} us in a graph", "",
             f"{'shape':<10} {'op':<14} {'tokens':>6} {'us':>7} {'kern us':>8} {'GB/s':>7} {'%copy':>6} "
             f"{'%same':>6} {'ref us':>8} {'x ref':>6}"]
    for r in result["sweeps"]:
        lines.append(f"{r['shape']:<10} {r['op']:<14} {r['tokens']:>6} {r['us']:>7.2f} {r['kernel_us']:>8.2f} "
                     f"{r['GBps']:>7.1f} {r['pct_copy_bw']:>6.1f} {r['pct_same_size_copy']:>6.1f} "
                     f"{r['ref_us']:>8.1f} {r['speedup_vs_ref']:>6.1f}")
    w, s = result["window_commit"], result["scv"]
    lines += ["", f"commit 32 layers x {w['tokens']} tokens ({w['accepted']} accepted): one launch "
                  f"{w['commit_one_launch_us']} us vs 32 x write_kv {w['write_kv_per_layer_32_launches_us']} us eager; "
                  f"in a graph {w['commit_kernel_us']} us vs {w['write_kv_32_launches_in_graph_us']} us",
              f"scv 64 req x k=8: eager {s['eager_us']} us, graph replay {s['graph_replay_us']} us, "
              f"kernel in graph {s['kernel_in_graph_us']} us, torch reference {s['reference_us']} us", "", "targets:"]
    for k, v in result["targets"].items():
        lines.append(f"  {k:<36} {str(v['value']):>8}  target {v['target']:<8} {'met' if v['met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = LabArgumentParser(prog="nwor-lab bench kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--out", type=types.output_file, help="also write the JSON to this path")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes (smoke run)")
    args = parser.parse_args(argv)
    tokens = (8, 64, 512, 4096) if args.quick else TOKENS
    result = run(quick=args.quick, tokens=tokens)
    text = save_json(result, args.out)
    print(table(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
