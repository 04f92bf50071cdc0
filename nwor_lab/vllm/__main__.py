"""`python -m nwor_lab.vllm generate ...` (what `nwor-lab generate --engine vllm` runs): the lab's
generate flags, output and statistics, on real vLLM with the plugin.

Flags that mean nothing to vLLM's CPU engine are refused in one line (--device other than cpu,
--cuda-graph, an fp8 --cache-dtype, --num-blocks, --max-cache-memory, --truncate-prompt,
--tp-timeout); --tp N runs vLLM's own tensor parallelism (N worker processes, the `mp` executor,
`VLLM_CPU_OMP_THREADS_BIND` split over this process's CPUs unless set: nwor_lab.vllm.ranks);
--block-size must be a multiple of 32 (default 32 here); the cache is --kv-cache-memory (default
64M). Text is printed when the run ends (vLLM's offline engine does not stream).
"""
from __future__ import annotations

import json
import logging
import os
import sys

from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import EXIT_INTERRUPTED, PROG, UsageError
from nwor_lab.commandline.generate_flags import SEPARATOR, parser as lab_parser, stats_line

HEADS = {"eagle1": "eagle", "eagle3": "eagle3", "ngram": "ngram"}


def parser():
    p = lab_parser(prog=f"{PROG} generate --engine vllm")
    p.add_argument("--kv-cache-memory", type=types.memory_size, default=64 << 20, metavar="SIZE",
                   help="vLLM's KV cache (kv_cache_memory_bytes; its automatic CPU check fails on small machines)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's dtype in vLLM")
    p.add_argument("--check", action="store_true", help="after every window compare vLLM's cache bytes with the "
                                                        "policy's invariants (slower)")
    p.add_argument("--record", default=None, metavar="PATH.jsonl", help="one JSON line per window")
    return p


def refuse_unsupported(args, argv: list[str]) -> None:
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    bad = [("--tp-timeout" in given, "--tp-timeout"), (args.device != "cpu", "--device"), (args.cuda_graph is not None, "--cuda-graph"),
           (args.cache_dtype != "auto", "--cache-dtype"), (args.num_blocks is not None, "--num-blocks"),
           (args.max_cache_memory is not None, "--max-cache-memory"), (args.truncate_prompt, "--truncate-prompt"),
           (args.state_mode is not None, "--state-mode"), (args.prefix_cache, "--prefix-cache"),
           (args.head_cache is not None, "--head-cache"), (args.lookahead is not None, "--lookahead"),
           (args.preemption is not None, "--preemption")]
    for is_bad, flag in bad:
        if is_bad:
            raise UsageError(f"{flag}: not with --engine vllm (vLLM's CPU engine; its cache is --kv-cache-memory, "
                             f"its ranks --tp)")
    if "--block-size" not in given:
        args.block_size = 32
    elif args.block_size % 32:
        raise UsageError(f"--block-size {args.block_size}: vLLM's CPU attention backend needs a multiple of 32")
    if args.k == 0 and args.head == "ngram":
        raise UsageError("--head ngram with --k 0: give --k >= 1 drafts")


def cli_generate(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    refuse_unsupported(args, argv)
    if args.stream and args.json:
        raise UsageError("--stream and --json: choose one (JSON is printed once, at the end)")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    from nwor_lab.config import LabConfig
    from nwor_lab.vllm.generate import VllmLab
    from nwor_lab.vllm.settings import SettingsError

    method = "none" if args.k == 0 else HEADS[args.head]
    try:
        cfg = LabConfig.from_env(LabConfig(nwor_mode=args.nwor, scv_mode=args.scv))
        lab = VllmLab(method, max(args.k, 1), nwor_mode=cfg.nwor_mode, scv_mode=cfg.scv_mode, debug=cfg.debug,
                      check=args.check, record=args.record, dtype=args.dtype, block_size=args.block_size,
                      kv_cache_memory_bytes=args.kv_cache_memory, max_num_seqs=args.max_num_seqs, seed=args.seed,
                      models_root=None, source=args.checkpoint, tp=args.tp,
                      extra={"max_num_batched_tokens": max(args.max_num_batched_tokens, 2048)})
    except (SettingsError, ValueError) as err:       # bad settings, or --tp beyond this process's CPUs
        raise UsageError(str(err)) from err
    try:
        res = lab.generate(args.prompts, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                           stop_at_eos=args.stop_at_eos)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; vLLM's offline engine returns nothing before it finishes", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        lab.close()
    if args.json:
        print(json.dumps({"texts": res.texts, "token_ids": res.token_ids, **res.summary(), "nwor": cfg.nwor_mode,
                          "scv": cfg.scv_mode, "k": args.k, "tp": args.tp, "interrupted": False, "engine": "vllm",
                          "nwor_totals": res.totals, "vllm_metrics": res.vllm_metrics,
                          "engine_start_seconds": lab.start_seconds, "generate_seconds": res.seconds}))
    else:
        for prompt, text in zip(args.prompts, res.texts):
            print(prompt + text)
            print(SEPARATOR)
        print(stats_line(res, args, cfg) + f" [vLLM {res.totals.get('steps', 0)} steps, rejected writes in "
              f"vLLM's cache: {res.totals.get('rejected_left', 0)}]")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from nwor_lab.vllm.bench import main as bench
        return bench(argv[1:])
    if argv[:1] != ["generate"]:
        print(f"usage: python -m nwor_lab.vllm generate PROMPT ... (the flags of {PROG} generate)\n"
              f"       python -m nwor_lab.vllm bench [--methods eagle,eagle3,ngram] [--out FILE.json]", file=sys.stderr)
        return 2
    try:
        return cli_generate(argv[1:])
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
