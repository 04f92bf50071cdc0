"""Tree verify attention, the tree in the cache (write-all + move, cow) against the tree in the staging
buffer (stage), kernel alone, under launch variants (CUDA only): which launch closes stage's gap.

    python -m nwor_lab.bench.tree_attention --out FILE.json [--nodes 16,64] [--batches 8,32]

One layer of the Llama-3-8B shape (8 KV heads, 32 query heads, head size 128, bf16, block size 16),
`--context` tokens before each request's tree, trees of EAGLE-2's shape (topk 4, depth 6,
`bench.tree.synthetic_trees`). `cache`: the N + 1 window rows committed to the cache (cache_lens
grown by them); `window`: the same rows read from the window source. Every variant is checked
against the torch reference and timed as CUDA-graph replays, round-robin (`interleaved_time_us`);
each row carries the compiled kernel's registers and spills (`attention_variants.compiled_info`).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from nwor_lab import atomic

VARIANTS = {
    "default": {},
    "split_tail": dict(split_tail=True),
    "warps8": dict(num_warps=8),
    "stages2": dict(num_stages=2),
    "block_m128": dict(block_m=128),
    "split_tail_warps8": dict(split_tail=True, num_warps=8),
    "block_m32": dict(block_m=32),
}


def cases(nodes: int, batch: int, context: int, seed: int = 0):
    """(window case, the same attention with the window committed to the cache)."""
    from nwor_lab.bench.tree import synthetic_trees
    from nwor_lab.ops.verify_attention_cases import make_tree_attention_case, window_written_to_cache
    parents, _ = synthetic_trees(batch, 4, 6, nodes, seed)
    win = make_tree_attention_case(parents, context_lens=[context] * batch, window=True, seed=seed,
                                   num_kv_heads=8, num_q_heads=32, head_size=128, block_size=16,
                                   dtype=torch.bfloat16, device="cuda")
    return win, window_written_to_cache(win)


def run(nodes=(16, 64), batches=(8, 32), context: int = 1024, variants=tuple(VARIANTS), reps: int = 11,
        per_graph: int = 10) -> list[dict]:
    from nwor_lab.bench.attention_variants import compiled_info
    from nwor_lab.bench.kernels import interleaved_time_us
    from nwor_lab.ops import _verify_attention_triton as kernels
    from nwor_lab.ops.graphs import capture_graph
    from nwor_lab.ops.verify_attention import verify_attention_reference
    rows = []
    for batch in batches:
        for n in nodes:
            win, cache = cases(n, batch, context)
            want = verify_attention_reference(**cache.kwargs(), trusted=True).float()
            graphs, info, errs = {}, {}, {}
            for source, case in (("cache", cache), ("window", win)):
                kw = case.kwargs()
                out = torch.empty_like(case.q)
                for name in variants:
                    knobs = {**VARIANTS[name], "max_query_len": n + 1}

                    def call(kw=kw, out=out, knobs=knobs):
                        return kernels.launch(
                            kw["q"], kw["key_cache"], kw["value_cache"], kw["block_tables"], kw["cache_lens"],
                            kw["query_start_loc"], kw["positions"], kw.get("win_key"), kw.get("win_value"),
                            kw.get("win_rows"), kw.get("win_start"), kw.get("k_scale"), kw.get("v_scale"),
                            kw["scale"], out, tree_mask=kw["tree_mask"], tree_lo=kw["tree_lo"], **knobs)
                    info[(source, name)] = compiled_info(call)
                    call()
                    errs[(source, name)] = float((out.float() - want).abs().max())
                    graphs[(source, name)] = capture_graph(lambda call=call: [call() for _ in range(per_graph)])
            us = interleaved_time_us({k: g.replay for k, g in graphs.items()}, iters=2, reps=reps)
            for (source, name), t in us.items():
                rows.append({"nodes": n, "batch": batch, "context": context, "source": source, "variant": name,
                             "kernel_us": round(t / per_graph, 2), "max_err_vs_reference": round(errs[(source, name)], 4),
                             **info[(source, name)]})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            del graphs, win, cache
            torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (nodes, batch, variant): window / cache, and each source against the default variant."""
    at = {(r["nodes"], r["batch"], r["source"], r["variant"]): r["kernel_us"] for r in rows}
    out = []
    for (n, b, s, v), t in sorted(at.items()):
        if s != "window":
            continue
        out.append({"nodes": n, "batch": b, "variant": v, "window_over_cache": round(t / at[n, b, "cache", v], 3),
                    "window_over_default_cache": round(t / at[n, b, "cache", "default"], 3),
                    "cache_over_default_cache": round(at[n, b, "cache", v] / at[n, b, "cache", "default"], 3)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="16,64")
    p.add_argument("--batches", default="8,32")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench tree_attention: needs a CUDA device", file=sys.stderr)
        return 2
    rows = run([int(x) for x in a.nodes.split(",")], [int(x) for x in a.batches.split(",")], a.context,
               tuple(a.variants.split(",")))
    res = {"bench": "tree_attention", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "command": "python -m nwor_lab.bench.tree_attention " + " ".join(argv or sys.argv[1:]),
           "summary": summary(rows), "rows": rows}
    text = json.dumps(res, indent=1)
    if a.out:
        atomic.write_text(a.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
