"""`nwor-lab generate "PROMPT" --k 4 --nwor stage`: text, mean acceptance length, per-position acceptance.

The lab's engine under the flags of `nwor_lab.commandline.generate_flags` (its docstring is the
`--help` text: streaming, Ctrl-C, the engine limits, the sliding-window check against target-only).
`--engine vllm` hands the command to `python -m nwor_lab.vllm` (`vllm_handoff`), `--tp N` to the
ranks (`generate_tp`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nwor_lab.commandline.environment import check_backend_arg, check_device_arg, lab_config
from nwor_lab.commandline.errors import EXIT_INTERRUPTED, UsageError, flag_names, interrupted_exit_code, run
from nwor_lab.commandline.generate_flags import (FLAGS, SEPARATOR, block_config, blocks_line, exit_status, parser,
                                                stats_line)


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
    if args.tree is not None:
        ring["tree"] = args.tree
    cfg = lab_config(nwor_mode=args.nwor, scv_mode=args.scv, **ring)
    if args.cuda_graph is not None:
        cfg = cfg.replace(cuda_graph=args.cuda_graph)
    if args.state_mode is not None:     # (--json names the strategy of a hybrid target: `state_mode`)
        cfg = cfg.replace(state_mode=args.state_mode)
    if args.checkpoint is not None and not Path(args.checkpoint).is_dir():
        raise UsageError(f"--checkpoint {args.checkpoint}: no such folder; give one laid out like "
                         f"nwor_lab/checkpoints/tiny (config.json, model.safetensors, eagle*.safetensors, "
                         f"tokenizer.json)")
    device = check_device_arg("--device", args.device)
    check_backend_arg(cfg, device)
    cfg = block_config(args, cfg)       # prefix caching and preemption: LabConfig fields (flags over NWOR_LAB_*)
    blocks = [flag for flag, on in (("--prefix-cache", cfg.prefix_cache), ("--preemption",
                                                                          cfg.preemption != "recompute")) if on]
    if args.tp > 1 and blocks:
        raise UsageError(f"{blocks[0]} (or its NWOR_LAB_* variable): not with --tp > 1 (the tensor-parallel "
                         f"ranks build their engines without prefix caching or a preemption mode)")
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
        from nwor_lab.engine.trace import first_divergence      # (imports torch: not at the CLI's import)
        d = first_divergence(res.token_ids, ref.token_ids)
        check = {"equals_target_only": d is None, "first_divergence": None if d is None else
                 {"prompt": d.prompt, "token": d.token, "got": d.got, "target_only": d.want}}
    if args.json:
        print(json.dumps({"texts": res.texts, "token_ids": res.token_ids, **res.summary(), **(check or {}),
                          "nwor": cfg.nwor_mode, "scv": cfg.scv_mode, "k": args.k, "tree": cfg.tree,
                          "interrupted": interrupted}))
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
        line = blocks_line(res.summary())
        if line:
            print(line)
    return exit_status(res, interrupted, code)


if __name__ == "__main__":          # through the one error path, as `nwor-lab generate`
    raise SystemExit(run(cli_generate, sys.argv[1:]))
