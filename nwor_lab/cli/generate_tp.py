"""`nwor-lab generate ... --tp N`: the same command over N tensor-parallel ranks.

The ranks are started here (torch.multiprocessing, spawn; NCCL with `--device cuda`, rank r on
cuda:r; gloo on the CPU), or, under `torchrun --nproc-per-node N -m nwor_lab.cli generate --tp N`,
this process is one of them and only rank 0 prints. The text prints once the run ends (no
`--stream`); a failed rank ends the run with one line naming it (`--traceback` shows its stack).
Ctrl-C stops every rank at the same step; what was generated and the statistics so far are
printed, and the command exits 130 (a second Ctrl-C stops at once, printing nothing).
"""
from __future__ import annotations

import json
import os

from nwor_lab.commandline.errors import EXIT_INTERRUPTED, UsageError, flag_names
from nwor_lab.commandline.generate_flags import SEPARATOR, exit_status, stats_line


def cli_generate_tp(args, cfg, device, flags: dict) -> int:
    from nwor_lab.distributed import generate as tp_generate
    from nwor_lab.distributed.launcher import in_torchrun
    if args.stream:
        raise UsageError("--stream: not with --tp > 1 (the ranks run in their own processes; the text "
                         "prints when the run ends)")
    try:
        res = tp_generate(args.prompts, args.max_new_tokens, args.k, cfg, tp=args.tp, head=args.head,
                          checkpoint=args.checkpoint, device=device, temperature=args.temperature, seed=args.seed,
                          stop_at_eos=args.stop_at_eos, cache_dtype=args.cache_dtype, num_blocks=args.num_blocks,
                          block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_cache_memory=args.max_cache_memory,
                          truncate_prompts=args.truncate_prompt, timeout_s=args.tp_timeout,
                          interruptible=not in_torchrun())
    except (ValueError, TypeError) as err:          # checked before any rank starts (e.g. heads % tp)
        raise UsageError(flag_names(str(err), {**flags, "tp=": "--tp="})) from err
    if in_torchrun() and int(os.environ["RANK"]) != 0:
        return 0                                    # rank 0 prints
    interrupted = not res.complete
    if args.json:
        print(json.dumps({"texts": res.texts, "token_ids": res.token_ids, **res.summary(), "nwor": cfg.nwor_mode,
                          "scv": cfg.scv_mode, "k": args.k, "interrupted": interrupted,
                          "kv_heads_per_rank": [r.kv_heads for r in res.ranks]}))
    else:
        for prompt, text in zip(args.prompts, res.texts):
            print(prompt + text)
            print(SEPARATOR)
        print(stats_line(res, args, cfg) + f", tp={args.tp} (KV heads per rank: "
              f"{' '.join(str(r.kv_heads) for r in res.ranks)})"
              + (" (interrupted: statistics so far)" if interrupted else ""))
    return exit_status(res, interrupted, EXIT_INTERRUPTED)
