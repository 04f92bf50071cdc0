"""Prefix caching and preemption through the engine: `nwor-lab bench prefix --out prefix.json`.

    nwor-lab bench prefix                                CPU, the shipped pair (EAGLE-1 and EAGLE-3 heads)
    nwor-lab bench prefix --num-blocks 40 --preemption swap      a small cache: preemptions, swapped bytes
    nwor-lab bench prefix --model 8b --device cuda --out benchmarks/results/prefix_8b_h200.json
                                                         the Llama-3-8B shape, random bf16 weights, forced
                                                         acceptance (as `bench engine --model 8b`)
    nwor-lab bench prefix --model 8b-mini                the same code path at toy size (CPU tests)

The workload (`nwor_lab.audit.conversations`, stated in the JSON's `workload`): `--conversations`
conversations of `--turns` turns sharing a `--system-tokens` system prompt, closed loop (a turn is
sent once the conversation's previous reply is known; its prompt is the conversation so far plus a
question), `--max-new-tokens` a reply, fixed `--seed`. The shipped pair's prompts are its tokenizer's
text (the system text and code questions); the 8B shapes' are seeded random ids.

Configs (the product pruned, stated in the JSON's `pruning`): target-only with and without prefix
caching; per head (`--heads`): without prefix caching (the acceptance baseline) under `--policy`;
every write policy (`--policies`) with the exact strategy pair (`cached` + `boundary`); every
head-cache x lookahead strategy (`--head-caches`, `--lookaheads`, names from HEAD_CACHES / LOOKAHEADS
in nwor_lab.engine.prefix) under `--policy`. A strategy the engine refuses (`recompute`) is a row
with its refusal. The write policy does not change what is cached or hit (committed blocks only,
tests/test_prefix_engine.py), so it is crossed with the exact pair only.

Per config: one untimed run (its counters: `hit_rate`, `hit_tokens`, `recomputed_tokens` (drop_last's
re-prefilled blocks and recompute preemptions' re-prefills), `head_rows_recomputed`, `preemptions`,
`swapped_out_bytes`; `acceptance_length_after_hit` (mean tokens emitted per window with drafts, over
the requests that hit) beside `acceptance_length_same_requests_no_prefix` (the same requests of the
head's run without prefix caching), then `--repeats` timed runs interleaved over every config (ABBA,
`bench.timing.in_turn`): `tokens_per_s` (output tokens / run seconds) median with min and max,
`ttft_ms` and `tpot_ms` p50/p90/p99 over every request of the timed runs (TTFT from the turn's
submission to the step that emitted its first token; TPOT the rest of its tokens' time per token;
host clock after each engine step, the device synchronised on CUDA). Every run builds a fresh
engine (a warm prefix cache would hit everything), so steps run eagerly (a captured step would time
its own capture in every run; CUDA graphs with a warm-up workload are a follow-up). Forced acceptance (8B shapes): drafts are
accepted by a profile whatever the head's cache holds, so the `missing` head's acceptance loss does
not show there; hit rate, recomputed tokens and timing do. Not run on a GPU where this was written.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from nwor_lab.bench.output import save_json
from nwor_lab.audit.conversations import conversations, run_closed_loop
from nwor_lab.bench.engine8b import acceptance_text
from nwor_lab.bench.timing import bench_device, device_name, free_device, in_turn
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import LabConfig, nwor_modes
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.preemption import PREEMPTION_MODES, Preemption
from nwor_lab.engine.prefix import HEAD_CACHES, LOOKAHEADS, PrefixCacheConfig

MODELS = ("tiny", "8b", "8b-mini")
EXACT = PrefixCacheConfig()          # the defaults: the exact pair (cached + boundary)
# the 8B shapes' workload, unless given (a shared system prompt of 512 tokens, as serving traces have)
SIZES = {"tiny": dict(conversations=4, turns=3, system_tokens=48, max_new_tokens=16, block_size=16),
         "8b": dict(conversations=32, turns=3, system_tokens=512, max_new_tokens=64, block_size=16),
         "8b-mini": dict(conversations=3, turns=2, system_tokens=24, max_new_tokens=6, block_size=4)}


class _Pair:
    def __init__(self, target, tokenizer=None):
        self.target, self.tokenizer = target, tokenizer


def load(model: str, heads, device, dtype):
    """-> ({head name or None: (target, head)}, tokenizer). `tiny`: the shipped pair, a target per head
    (nwor_lab.model.shipped.load_tiny: eagle1, eagle3 both shipped); 8B shapes: random weights."""
    if model == "tiny":
        from nwor_lab.model.shipped import load_tiny
        out, tok = {}, None
        for name in heads:
            target, head, tok = load_tiny(device=device, head=name)
            out[name] = (target, head)
        if not heads:
            target, _, tok = load_tiny(device=device)
            out[None] = (target, None)
        out.setdefault(None, (next(iter(out.values()))[0], None))
        return out, tok
    from nwor_lab.model.shapes import random_head, random_target
    target = random_target(model, device, dtype)
    out = {name: (target, random_head(target, name, model)) for name in heads}
    out[None] = (target, None)
    return out, None


def configs(args) -> list[dict]:
    """The pruned product (module docstring); `prefix` is a (head_cache, lookahead) pair of names."""
    exact = (EXACT.head_cache, EXACT.lookahead)
    out = [dict(name="target-only", head=None, policy=args.policy, prefix=None),
           dict(name="target-only + prefix cache", head=None, policy=args.policy, prefix=exact)]
    for h in args.heads:
        out.append(dict(name=f"{h}", head=h, policy=args.policy, prefix=None))
        for mode in args.policies:
            out.append(dict(name=f"{h} {mode} {'+'.join(exact)}", head=h, policy=mode, prefix=exact))
        for p in ((hc, la) for hc in args.head_caches for la in args.lookaheads):
            if p != exact:                  # (the exact pair under --policy is a row above)
                out.append(dict(name=f"{h} {args.policy} {'+'.join(p)}", head=h, policy=args.policy, prefix=p))
    return out


def build(cfg: dict, pairs, args, device, acceptance):
    target, head = pairs[cfg["head"]]
    prefix = None if cfg["prefix"] is None else PrefixCacheConfig(*cfg["prefix"])
    k = args.k if head is not None else 0
    return SpecEngine(target, head, LabConfig(nwor_mode=cfg["policy"], cuda_graph=False), k=k,
                      num_blocks=args.num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens, prefix_cache=prefix,
                      preemption=Preemption(args.preemption), acceptance=acceptance if k else None)


class Clock:
    """Steps a wave to its end, stamping each request's first token and finish (host clock after a step)."""

    def __init__(self, device):
        self.device, self.sent, self.first, self.done = device, {}, {}, {}

    def __call__(self, engine, reqs) -> None:
        now = time.perf_counter()
        for r in reqs:
            self.sent[r.req_id] = now
        while engine.scheduler.has_work:
            engine.step_with_progress()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            now = time.perf_counter()
            for r in reqs:
                if r.output and r.req_id not in self.first:
                    self.first[r.req_id] = now
                if r.finished and r.req_id not in self.done:
                    self.done[r.req_id] = now


def acceptance_length(trace, req_ids: set) -> float | None:
    """Mean tokens emitted per verify window with drafts, over `req_ids` (GenerationResult's measure)."""
    produced = windows = 0
    for w in trace:
        if w.kind != "verify":
            continue
        for rid, n, out in zip(w.req_ids, w.drafted, w.emitted):
            if n and rid in req_ids:
                produced += len(out)
                windows += 1
    return round(produced / windows, 4) if windows else None


def one_run(cfg, pairs, args, device, acceptance, conv):
    engine = build(cfg, pairs, args, device, acceptance)
    clock = Clock(device)
    t0 = time.perf_counter()
    turns = run_closed_loop(engine, conv, args.max_new_tokens, run=clock)
    seconds = time.perf_counter() - t0
    return engine, turns, clock, seconds


def counters(engine, turns) -> dict:
    p = engine.prefix_stats() or {}
    pre = engine.preemption_stats
    hits = {r.req_id for _, _, r in turns if engine.prefix is not None and engine.prefix.hits.get(r.req_id, 0) > 0}
    return {"hit_rate": round(p.get("hit_rate", 0.0), 4), "hit_tokens": p.get("hit_tokens", 0),
            "prompt_tokens": sum(len(r.prompt) for _, _, r in turns), "hit_requests": p.get("hit_requests", 0),
            "recomputed_tokens": p.get("recomputed_tokens", 0) + pre.recomputed_tokens,
            "recomputed_prefix_tokens": p.get("recomputed_tokens", 0),
            "head_rows_recomputed": p.get("head_rows_recomputed", 0), "evictions": p.get("evictions", 0),
            "preemptions": pre.preemptions, "swapped_out_bytes": pre.swapped_out_bytes,
            "swapped_in_bytes": pre.swapped_in_bytes, "output_tokens": sum(len(r.output) for _, _, r in turns),
            "acceptance_length": acceptance_length(engine.trace, {r.req_id for _, _, r in turns}),
            "acceptance_length_after_hit": acceptance_length(engine.trace, hits), "_hit_keys": sorted(
                (c, t) for c, t, r in turns if r.req_id in hits)}


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": round(float(np.percentile(xs, q)), 3) for q in (50, 90, 99)}


def parser() -> LabArgumentParser:
    p = LabArgumentParser(prog="nwor-lab bench prefix", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=types.one_of(MODELS), default="tiny")
    p.add_argument("--device", type=types.device, default=None, help="default: cpu for tiny, cuda for 8b")
    p.add_argument("--dtype", type=types.one_of(("bfloat16", "float16", "float32")), default=None,
                   help="the 8B shapes' weights (default bfloat16; tiny is float32)")
    p.add_argument("--heads", type=types.listed(types.one_of(("eagle1", "eagle3")), "heads"), default=("eagle1", "eagle3"))
    p.add_argument("--policies", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=nwor_modes())
    p.add_argument("--policy", type=types.one_of(nwor_modes()), default="stage",
                   help="the write policy of the strategy grid and of the baselines")
    p.add_argument("--head-caches", type=types.listed(types.one_of(tuple(HEAD_CACHES)), "head caches"),
                   default=tuple(HEAD_CACHES))
    p.add_argument("--lookaheads", type=types.listed(types.one_of(tuple(LOOKAHEADS)), "lookaheads"),
                   default=tuple(LOOKAHEADS))
    p.add_argument("--k", type=types.integer(1, 16), default=3)
    p.add_argument("--conversations", type=types.integer(1, 4096), default=None)
    p.add_argument("--turns", type=types.integer(1, 64), default=None)
    p.add_argument("--system-tokens", type=types.integer(1, 65536), default=None)
    p.add_argument("--max-new-tokens", type=types.integer(1, 4096), default=None)
    p.add_argument("--block-size", type=types.integer(1, 256), default=None)
    p.add_argument("--max-num-seqs", type=types.integer(1, 1024), default=8)
    p.add_argument("--max-num-batched-tokens", type=types.integer(1, 1 << 20), default=4096)
    p.add_argument("--num-blocks", type=types.integer(1, 1 << 24), default=None,
                   help="KV blocks (default: room for every conversation twice); small: preemptions")
    p.add_argument("--preemption", type=types.one_of(PREEMPTION_MODES), default="recompute")
    p.add_argument("--acceptance", type=acceptance_text, default="shipped", help="8B shapes: the forced acceptance profile "
                                                           "(as bench engine --acceptance)")
    p.add_argument("--repeats", type=types.integer(1, 100), default=3)
    p.add_argument("--seed", type=types.seed, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
    return p


def resolve(args) -> None:
    """Fill the model's sizes where not given."""
    for key, value in SIZES[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dtype is None:
        args.dtype = "float32" if args.model in ("tiny", "8b-mini") else "bfloat16"
    if args.policy not in args.policies:
        raise UsageError(f"--policy {args.policy}: not among --policies ({', '.join(args.policies)})")


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    resolve(args)
    device = bench_device("prefix", args.device, args.model, default_cuda=args.model == "8b")
    acceptance = None
    if args.model != "tiny":
        from nwor_lab.speculative.synthetic import ForcedAcceptance
        try:
            acceptance = ForcedAcceptance.parse(args.acceptance, args.k)
            acceptance.for_k(args.k)
        except ValueError as err:
            raise UsageError(f"argument --acceptance: {err}") from None
    return run(args, argv, device, acceptance)


def run(args, argv, device, acceptance) -> dict:
    from nwor_lab.audit.prefix_run import default_num_blocks
    from nwor_lab.serve.driver import Progress
    t_start = time.perf_counter()
    pairs, tok = load(args.model, args.heads, device, getattr(torch, args.dtype))
    conv = conversations(_Pair(pairs[None][0], tok), args.conversations, args.turns, args.system_tokens, args.seed)
    if args.num_blocks is None:
        args.num_blocks = default_num_blocks(conv, args.max_new_tokens, args.k, args.block_size)
    todo = configs(args)
    progress = Progress(len(todo) * (1 + args.repeats), f"bench prefix {args.model}", enabled=not args.quiet)
    done, rows, live = 0, [], []
    for cfg in todo:                                     # the untimed run: counters and acceptance
        row = {"config": cfg["name"], "head": cfg["head"], "policy": cfg["policy"],
               "head_cache": None if cfg["prefix"] is None else cfg["prefix"][0],
               "lookahead": None if cfg["prefix"] is None else cfg["prefix"][1], "k": args.k if cfg["head"] else 0}
        try:
            engine, turns, _, _ = one_run(cfg, pairs, args, device, acceptance, conv)
        except ValueError as err:                        # a strategy the engine refuses, by name
            row["refused"] = str(err)
            rows.append(row)
            done += 1 + args.repeats
            progress.update(done)
            continue
        row.update(counters(engine, turns))
        row["_outputs"] = [r.output for _, _, r in turns]
        row["_trace"], row["_turns"] = engine.trace, [(c, t, r.req_id) for c, t, r in turns]
        rows.append(row)
        live.append((cfg, row))
        del engine
        free_device(device)
        done += 1
        progress.update(done)
    header = dict(argv=argv, device=device, acceptance=acceptance, conv=conv, t_start=t_start)
    if args.out:                                        # the counters survive a timeout
        write(args, header, [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], complete=False)
    timed = {row["config"]: dict(times=[], ttft=[], tpot=[]) for _, row in live}
    for i in range(args.repeats):                        # timed runs, interleaved over the configs
        for cfg, row in in_turn(live, i):
            engine, turns, clock, seconds = one_run(cfg, pairs, args, device, acceptance, conv)
            t = timed[row["config"]]
            t["times"].append(seconds)
            for _, _, r in turns:
                if r.req_id in clock.first:
                    t["ttft"].append(1e3 * (clock.first[r.req_id] - clock.sent[r.req_id]))
                    if len(r.output) > 1 and r.req_id in clock.done:
                        t["tpot"].append(1e3 * (clock.done[r.req_id] - clock.first[r.req_id]) / (len(r.output) - 1))
            del engine
            free_device(device)
            done += 1
            progress.update(done)
    progress.update(done, force=True)
    finish_rows(rows, timed, args)
    out = write(args, header, rows, complete=True)
    if not args.quiet:
        for r in rows:
            print(json.dumps({k: v for k, v in r.items() if k in ("config", "hit_rate", "acceptance_length_after_hit",
                                                                  "tokens_per_s", "preemptions", "refused")}),
                  flush=True)
    return out


def write(args, h: dict, rows: list[dict], complete: bool) -> dict:
    conv, acceptance = h["conv"], h["acceptance"]
    out = {"command": "nwor-lab bench prefix " + " ".join(h["argv"]), "device": device_name(h["device"]),
           "torch": torch.__version__, "model": args.model, "dtype": args.dtype, "k": args.k,
           "heads": list(args.heads), "heads_note": "tiny: nwor_lab/checkpoints/tiny ships EAGLE-1 (eagle.safetensors) "
           "and EAGLE-3 (eagle3.safetensors); 8B shapes: random heads of both shapes",
           "workload": {**conv.sizes(), "max_new_tokens": args.max_new_tokens, "closed_loop": True,
                        "block_size": args.block_size, "num_blocks": args.num_blocks,
                        "max_num_seqs": args.max_num_seqs, "preemption": args.preemption},
           "pruning": "target-only with and without prefix caching; per head: no prefix caching (--policy), "
                      "every write policy with cached+boundary, every head-cache x lookahead under --policy",
           "cuda_graph": False,
           "acceptance": None if acceptance is None else {"source": args.acceptance, **acceptance.describe(args.k)},
           "repeats": args.repeats, "complete": complete,
           "seconds_total": round(time.perf_counter() - h["t_start"], 1), "results": rows}
    save_json(out, args.out)
    return out


def finish_rows(rows: list[dict], timed: dict, args) -> None:
    """Timing medians and percentiles; acceptance after a hit against the same requests without prefix
    caching (the head's run without it); tokens equal to target-only's (greedy, shipped pair)."""
    base = {r["head"]: r for r in rows if r.get("head_cache") is None and "refused" not in r}
    ref = base.get(None, {}).get("_outputs")
    for r in rows:
        if "refused" in r:
            continue
        t = timed[r["config"]]
        secs = t["times"]
        tps = [r["output_tokens"] / s for s in secs]
        r.update(tokens_per_s=round(float(np.median(tps)), 2), tokens_per_s_min=round(min(tps), 2),
                 tokens_per_s_max=round(max(tps), 2), seconds_median=round(float(np.median(secs)), 4),
                 ttft_ms=percentiles(t["ttft"]), tpot_ms=percentiles(t["tpot"]))
        b = base.get(r["head"])
        same = None
        if b is not None and r["head"] is not None and r["_hit_keys"]:
            ids = {rid for c, tt, rid in b["_turns"] if (c, tt) in set(r["_hit_keys"])}
            same = acceptance_length(b["_trace"], ids)
        r["acceptance_length_same_requests_no_prefix"] = same
        r["tokens_equal_target_only"] = None if ref is None or args.model != "tiny" else r["_outputs"] == ref
    for r in rows:
        for key in ("_outputs", "_trace", "_turns", "_hit_keys"):
            r.pop(key, None)


if __name__ == "__main__":
    main()
