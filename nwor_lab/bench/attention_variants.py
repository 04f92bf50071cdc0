"""Verify attention's window variant against its cache variant, before and after the tail split
and the query bound (CUDA only): what stage's attention costs over off's, per kernel.

    python -m nwor_lab.bench.attention_variants --out DIR
        timings -> DIR/verify_attention_variants.json: every (batch, source, plan) as CUDA-graph
        replays measured round-robin, the window/cache ratio per plan, and each compiled kernel's
        registers per thread, spilled bytes and shared memory (from Triton)
    ncu --profile-from-start off ... python -m nwor_lab.bench.attention_variants --profile --out DIR
        one launch of each variant between cudaProfilerStart/Stop (warm-ups outside), in the order
        DIR/ncu_manifest.json lists
    python -m nwor_lab.bench.attention_variants --join-ncu RAW.csv --out DIR
        ncu's raw CSV (`ncu --import ... --csv --page raw`) joined with the manifest ->
        DIR/ncu_verify_attention.json: the counters of each variant and their ratios
        (tests/gpu/ncu_verify_attention.sh runs all three)

The shape is one layer of the 8B verify step (`nwor-lab bench step`): 8 KV heads, 32 query heads,
head size 128, bf16, block size 16, 5 query tokens per request (k = 4), 1024 tokens before the
window. `cache`: off / cow, the window committed first, 1029 keys from the cache. `window`: stage,
1024 keys from the cache and the 5 window rows from the staging buffer.
Plans: `before` is the launch the kernel had (query tile from T - R + 1: 64 rows and a row walk at
batch > 1; the tail in one loop that selects a source per row), `after` the current one (the
caller's bound of 5 tokens: a 32-row tile, no row walk; the same one tail loop). `--explore` adds
knobs around `after` (window tiles in a loop of their own, pipeline stages, warps, key tile).
"""
from __future__ import annotations

import json
import sys
import time

import torch

from nwor_lab import atomic
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError

Q_LEN, CONTEXT = 5, 1024
PLANS = {"before": dict(max_query_len=0, split_tail=False), "after": dict(max_query_len=Q_LEN, split_tail=False)}
# `--explore`: launch knobs around `after`, timed beside it (which one closes window vs cache).
# split_tail was `after` until the explore run showed it made the window variant slower.
EXPLORE = {"split_tail": dict(max_query_len=Q_LEN, split_tail=True),
           "stages2": dict(max_query_len=Q_LEN, split_tail=False, num_stages=2),
           "stages4": dict(max_query_len=Q_LEN, split_tail=False, num_stages=4),
           "warps8": dict(max_query_len=Q_LEN, split_tail=False, num_warps=8),
           "n32": dict(max_query_len=Q_LEN, split_tail=False, block_n=32),
           "n128": dict(max_query_len=Q_LEN, split_tail=False, block_n=128)}
SOURCES = {"cache": 0, "window": Q_LEN}          # keys of each request read from the staging buffer


def variants(batches) -> list[tuple[int, str, str]]:
    return [(b, source, plan) for b in batches for plan in PLANS for source in SOURCES]


def _batches(batches, seed: int = 0) -> dict:
    from nwor_lab.bench.attention import Batch
    return {(b, source): Batch(b, CONTEXT + Q_LEN, Q_LEN, window=w, seed=seed + b)
            for b in batches for source, w in SOURCES.items()}


def compiled_info(fn) -> dict:
    """Registers per thread, spills and shared memory of the Triton kernel `fn()` launches (the
    CompiledKernel its launch returned; best effort across Triton versions)."""
    from nwor_lab.ops import _verify_attention_triton as kernels
    seen = []
    jit = kernels._verify_attention_kernel

    class Spy:                       # launch() looks the kernel up by name at call time
        def __getitem__(self, grid):
            run = jit[grid]

            def call(*args, **kwargs):
                ck = run(*args, **kwargs)
                seen.append(ck)
                return ck
            return call
    kernels._verify_attention_kernel = Spy()
    try:
        fn()
    finally:
        kernels._verify_attention_kernel = jit
    if not seen:
        return {}
    ck = seen[-1]
    try:
        ck._init_handles()
    except Exception:   # noqa: BLE001 - older/newer Triton: the attributes may be there anyway
        pass
    meta = getattr(ck, "metadata", None)
    return {"registers_per_thread": getattr(ck, "n_regs", None), "spilled_bytes": getattr(ck, "n_spills", None),
            "shared_bytes": getattr(meta, "shared", None), "num_warps": getattr(meta, "num_warps", None)}


def plan_of(batch: int, plan: str) -> dict:
    """The tile choices `launch` makes for the plan (what the kernel is compiled with)."""
    from nwor_lab.ops import _verify_attention_triton as kernels
    import triton
    group, T = 4, batch * Q_LEN
    bound = PLANS[plan]["max_query_len"] or max(1, T - batch + 1)
    block_m = max(16, min(128, triton.next_power_of_2(min(16, bound) * group)))
    splits, _ = kernels.plan_splits(batch, 8, (-(-(CONTEXT + Q_LEN) // 16)) * 16, torch.device("cuda"),
                                    PLANS[plan].get("block_n", kernels.BLOCK_N))
    return dict(block_m=block_m, row_loop=bound * group > block_m, num_splits=splits, **PLANS[plan])


def timings(batches, reps: int = 15, per_graph: int = 20) -> dict:
    from nwor_lab.bench.kernels import interleaved_time_us, rotating
    from nwor_lab.ops.graphs import capture_graph
    from nwor_lab.ops.verify_attention import verify_attention_reference
    rows = []
    for b in batches:
        data = _batches([b])
        graphs, info = {}, {}
        for _, source, plan in variants([b]):
            calls = data[(b, source)].calls(**PLANS[plan])
            info[(source, plan)] = compiled_info(calls[0])
            fn = rotating(calls)
            graphs[f"{plan}/{source}"] = capture_graph(lambda fn=fn: [fn() for _ in range(per_graph)])
        us = interleaved_time_us({name: g.replay for name, g in graphs.items()}, iters=2, reps=reps)
        # every plan and source computes the same attention (window from the buffer = committed window)
        kw = data[(b, "cache")].args[0]
        want = verify_attention_reference(**{**kw, "out": None}, trusted=True).float()
        for _, source, plan in variants([b]):
            calls = data[(b, source)].calls(**PLANS[plan])
            calls[0]()
            out = data[(b, source)].args[0]["out"].float()
            err = float((out - want).abs().max()) if source == "cache" else None
            rows.append({**dict(batch=b, source=source, plan=plan, kernel_us=round(us[f"{plan}/{source}"] / per_graph, 2)),
                         **plan_of(b, plan), **info[(source, plan)],     # Triton's own num_warps last
                         **({"max_err_vs_reference": round(err, 4)} if err is not None else {})})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del graphs, data
        torch.cuda.empty_cache()
    ratios = []
    for b in batches:
        at = {(r["source"], r["plan"]): r["kernel_us"] for r in rows if r["batch"] == b}
        ratios.append(dict(batch=b, **{f"window_vs_cache_{p}": round(at["window", p] / at["cache", p], 4) for p in PLANS},
                           **{f"after_vs_before_{s}": round(at[s, "after"] / at[s, "before"], 4) for s in SOURCES}))
    return dict(rows=rows, ratios=ratios)


def profile(batches) -> list[dict]:
    """One launch of each variant inside the profiler range (ncu --profile-from-start off)."""
    data = _batches(batches)
    order = []
    for b, source, plan in variants(batches):      # warm-ups (compile) outside the range
        data[(b, source)].calls(**PLANS[plan])[0]()
        order.append(dict(batch=b, source=source, plan=plan, **plan_of(b, plan)))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for b, source, plan in variants(batches):
        data[(b, source)].calls(**PLANS[plan])[1 % len(data[(b, source)].args)]()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return order


# ncu's raw names -> short names (tests/gpu/ncu_verify_attention.sh collects them)
NCU_METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__shared_mem_per_block_dynamic": "shared_bytes_dynamic",
    "launch__occupancy_limit_registers": "blocks_per_sm_limit_registers",
    "launch__occupancy_limit_shared_mem": "blocks_per_sm_limit_shared",
    "launch__grid_size": "grid_size",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "lts__t_bytes.sum": "l2_bytes",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "smsp__inst_executed.sum": "instructions",
    "smsp__sass_inst_executed_op_local_ld.sum": "local_loads",
    "smsp__sass_inst_executed_op_local_st.sum": "local_stores",
}


def _number(text: str):
    text = text.strip().replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return text or None
    return int(value) if value.is_integer() else value


def join_ncu(csv_text: str, manifest: dict) -> dict:
    """ncu's raw CSV (one row per profiled kernel, in launch order; a units row after the header)
    and the manifest -> per variant the counters NCU_METRICS names, plus window/cache and
    after/before ratios of each counter."""
    import csv
    import io
    table = [row for row in csv.reader(io.StringIO(csv_text)) if row]
    start = next(i for i, row in enumerate(table) if "Kernel Name" in row)   # ncu may print lines first
    header = table[start]
    name_col = header.index("Kernel Name")
    # (the units row has no kernel name)
    rows = [r for r in table[start + 1:] if len(r) > name_col and "_verify_attention_kernel" in r[name_col]]
    order = manifest["launch_order"]
    if len(rows) != len(order):
        raise ValueError(f"ncu profiled {len(rows)} verify-attention launches, the manifest lists {len(order)}")
    out = []
    for variant, row in zip(order, rows):
        counters = {short: _number(row[header.index(raw)]) for raw, short in NCU_METRICS.items() if raw in header}
        out.append({**variant, **counters})

    def ratio(a, b):
        return {k: round(a[k] / b[k], 4) for k in NCU_METRICS.values()
                if isinstance(a.get(k), (int, float)) and isinstance(b.get(k), (int, float)) and b[k]}
    at = {(v["batch"], v["source"], v["plan"]): v for v in out}
    compare = []
    for b in sorted({v["batch"] for v in out}):
        for plan in PLANS:
            if (b, "window", plan) in at and (b, "cache", plan) in at:
                compare.append(dict(batch=b, plan=plan, what="window / cache",
                                    **ratio(at[b, "window", plan], at[b, "cache", plan])))
        for source in SOURCES:
            if (b, source, "after") in at and (b, source, "before") in at:
                compare.append(dict(batch=b, source=source, what="after / before",
                                    **ratio(at[b, source, "after"], at[b, source, "before"])))
    return {**{k: v for k, v in manifest.items() if k != "launch_order"}, "kernels": out, "ratios": compare}


def main(argv=None) -> int:
    p = LabArgumentParser(prog="python -m nwor_lab.bench.attention_variants", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 16, 64))
    p.add_argument("--profile", action="store_true", help="one launch of each variant for ncu (see above)")
    p.add_argument("--reps", type=types.integer(3, 1000), default=15)
    p.add_argument("--explore", action="store_true",
                   help="also time the launch knobs of EXPLORE (stages, warps, key tile, one tail loop)")
    p.add_argument("--join-ncu", type=types.existing_file, metavar="RAW_CSV",
                   help="join ncu's raw CSV with OUT/ncu_manifest.json (no GPU needed)")
    p.add_argument("--out", type=types.output_folder, required=True,
                   help="folder for the JSON")
    args = p.parse_args(argv)
    from pathlib import Path
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.join_ncu:
        manifest = json.loads((out / "ncu_manifest.json").read_text())
        joined = join_ncu(Path(args.join_ncu).read_text(), manifest)
        atomic.write_text(out / "ncu_verify_attention.json", json.dumps(joined, indent=1) + "\n")
        print(json.dumps(joined["ratios"], indent=1))
        return 0
    if not torch.cuda.is_available():
        raise UsageError("attention_variants: needs a CUDA device (none is visible here)")
    if args.explore:
        PLANS.update(EXPLORE)
    head = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "shape": dict(kv_heads=8, q_heads=32, head_size=128, dtype="bfloat16", block_size=16, q_len=Q_LEN,
                          context=CONTEXT), "plans": PLANS}
    if args.profile:
        order = profile(args.batches)
        atomic.write_text(out / "ncu_manifest.json", json.dumps({**head, "launch_order": order}, indent=1) + "\n")
        return 0
    result = {**head, "command": "python -m nwor_lab.bench.attention_variants " + " ".join(argv or sys.argv[1:]),
              **timings(args.batches, reps=args.reps)}
    atomic.write_text(out / "verify_attention_variants.json", json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
