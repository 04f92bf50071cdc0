"""`nwor-lab audit --json`: which store a rejected draft's bytes reached, and in which window.

Runs `--prompts N` prompts for `--max-new-tokens` under the strategy (`--nwor-mode` for the paged
K/V, `--state-mode` for a hybrid target's recurrent and conv state, `--sliding-window` / `--kv-ring`
for a ring) with the EAGLE head drafting `--k` tokens greedily, checks every store's bytes after every
window, then decodes the same prompts target-only. `--json` prints one JSON line per store (`kv`,
`kv_digests`, `ring`, `recurrent_state`, `conv_state`, `draft_kv`), then a summary line; without it,
a table. Exit 0 whatever the audit finds (it reports, it does not judge); docs/audit.md.

With `--prefix-cache` (strategies `--head-cache`, `--lookahead`) or `--preemption` (a small
`--num-blocks` makes it preempt), it runs `--conversations N` conversations of `--turns` turns
sharing a `--system-tokens`-token system prompt, closed loop (nwor_lab.audit.conversations),
and reports three more stores: `prefix_cache`, `head_cache`, `swap` (nwor_lab.audit.prefix).
"""
from __future__ import annotations

import json

from nwor_lab.commandline import args as types
from nwor_lab.commandline.environment import check_device_arg, lab_config
from nwor_lab.commandline.errors import UsageError, flag_names
from nwor_lab.commandline.generate_flags import block_config
from nwor_lab.config import KV_RINGS, nwor_modes, state_modes

MODELS = ("tiny", "hybrid", "toy-hybrid")     # nwor_lab.audit.models.MODELS (kept torch-free here)


class Names:
    """The names of a registry (`module.attribute`), read when a flag is parsed, not when the parser is
    built (the parser stays torch-free): `types.one_of(Names(...))`."""

    def __init__(self, module: str, attribute: str):
        self.module, self.attribute = module, attribute

    def _names(self) -> tuple:
        import importlib
        return tuple(getattr(importlib.import_module(self.module), self.attribute))

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())
FLAGS = {"max_new_tokens": "--max-new-tokens", "max_num_seqs": "--max-num-seqs", "block_size": "--block-size",
         "k=": "--k=", "prompts[": "prompt[", "sliding_window": "--sliding-window", "kv_ring='full'": "--kv-ring full"}


def add_parsers(subparsers) -> None:
    a = subparsers.add_parser("audit", help="which store a rejected draft's bytes reached, and when (JSON lines "
                                            "with --json)", description=__doc__.split("\n\n")[1].replace("\n", " "))
    a.add_argument("--model", choices=MODELS, default="tiny",
                   help="tiny: the shipped Llama pair; hybrid: the shipped hybrid pair when the lab has one, else "
                        "toy-hybrid; toy-hybrid: a random gated DeltaNet + attention pair (fixed seed)")
    a.add_argument("--nwor-mode", choices=nwor_modes(), default="off", help="the paged K/V write policy")
    a.add_argument("--state-mode", choices=state_modes(), default="auto",
                   help="a hybrid target's recurrent-state strategy (auto: the one --nwor-mode's policy declares "
                        "as its counterpart)")
    a.add_argument("--k", type=types.int_at_least(1), default=3, help="drafts per window")
    a.add_argument("--max-new-tokens", type=types.int_at_least(1), default=24)
    a.add_argument("--prompts", type=types.int_at_least(1), default=2, metavar="N",
                   help="how many prompts (the shipped pair's text prompts, or random token ids for the toy)")
    a.add_argument("--sliding-window", type=types.int_at_least(0), default=0, metavar="W",
                   help="attend the last W positions (0: the whole context); a ring makes the `ring` store")
    a.add_argument("--kv-ring", choices=KV_RINGS, default="auto", help="with --sliding-window: how the cache is kept")
    a.add_argument("--block-size", type=types.int_at_least(1), default=16, help="tokens per KV block")
    a.add_argument("--max-num-seqs", type=types.int_at_least(1), default=8, help="requests in one window")
    a.add_argument("--device", type=types.device, default="cpu")
    p = a.add_argument_group("blocks that outlive a request (the multi-turn workload)")
    p.add_argument("--prefix-cache", action="store_true", help="prefix caching on (committed blocks are shared)")
    p.add_argument("--head-cache", type=types.one_of(Names("nwor_lab.engine.prefix", "HEAD_CACHES")), default=None,
                   metavar="NAME",
                   help="with --prefix-cache: the head's cache strategy, a name of HEAD_CACHES "
                        "(nwor_lab.engine.prefix; default cached)")
    p.add_argument("--lookahead", type=types.one_of(Names("nwor_lab.engine.prefix", "LOOKAHEADS")), default=None,
                   metavar="NAME",
                   help="with --prefix-cache: the lookahead strategy, a name of LOOKAHEADS "
                        "(nwor_lab.engine.prefix; default boundary)")
    p.add_argument("--preemption", type=types.one_of(Names("nwor_lab.engine.preemption", "PREEMPTION_MODES")),
                   default=None, metavar="MODE",
                   help="the workload with preemption in this mode, one of PREEMPTION_MODES (nwor_lab.engine."
                        "preemption: recompute, swap) (make it happen with a small --num-blocks)")
    p.add_argument("--num-blocks", type=types.int_at_least(1), default=None, metavar="N",
                   help="KV blocks (default: room for every conversation); small: requests are preempted")
    p.add_argument("--conversations", type=types.int_at_least(1), default=3, metavar="N")
    p.add_argument("--turns", type=types.int_at_least(1), default=2, help="turns per conversation")
    p.add_argument("--system-tokens", type=types.int_at_least(1), default=24, metavar="N",
                   help="the shared system prompt's length")
    a.add_argument("--json", action="store_true", help="one JSON line per store, then a summary line")
    a.set_defaults(func=run)


def run(args) -> int:
    if args.kv_ring != "auto" and not args.sliding_window:
        raise UsageError(f"--kv-ring {args.kv_ring}: a ring needs --sliding-window W > 0")
    cfg = lab_config(nwor_mode=args.nwor_mode, state_mode=args.state_mode, sliding_window=args.sliding_window,
                     kv_ring=args.kv_ring)
    cfg = block_config(args, cfg)       # prefix caching and preemption: LabConfig fields (flags over NWOR_LAB_*)
    device = check_device_arg("--device", args.device)
    from nwor_lab.audit import load_pair, table_rows
    from nwor_lab.audit.report import divergence_text
    pair = load_pair(args.model, device=device)
    if args.state_mode != "auto" and not hasattr(pair.target, "state_spec"):
        raise UsageError(f"--state-mode {args.state_mode}: --model {args.model} has no recurrent state; "
                         f"use --model hybrid (or leave --state-mode auto)")
    if conversation_mode(args, cfg):
        report = run_conversations(args, cfg, pair)
    else:
        report = run_prompts(args, cfg, pair)
    if args.json:
        print("\n".join(report.json_lines()), flush=True)
        return 0
    rows = table_rows(report)
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print(f"{pair.name}, {report.run['strategy']}" + (f" + state {report.run['state_mode']}" if report.run["state_mode"]
                                                        else "") + f", k={args.k}: {divergence_text(report)}")
    print("  ".join(c.ljust(width[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(width[c]) for c in cols))
    return 0


def conversation_mode(args, cfg) -> bool:
    """The multi-turn workload: prefix caching, preemption or a cache size asked for (by a flag or
    NWOR_LAB_PREFIX_CACHE / NWOR_LAB_PREEMPTION, in `cfg`)."""
    return bool(cfg.prefix_cache or args.preemption or cfg.preemption != "recompute" or args.num_blocks)


def run_conversations(args, cfg, pair):
    from nwor_lab.audit.conversations import conversations
    from nwor_lab.audit.prefix_run import audit_conversations
    conv = conversations(pair, args.conversations, args.turns, args.system_tokens)
    try:
        return audit_conversations(cfg, pair, conv, args.max_new_tokens, k=args.k,     # the engine reads cfg's
                                   num_blocks=args.num_blocks, block_size=args.block_size,
                                   max_num_seqs=args.max_num_seqs)
    except (ValueError, TypeError, MemoryError) as err:        # an engine limit: say it with the flags
        raise UsageError(flag_names(str(err), {**FLAGS, "num_blocks": "--num-blocks"})) from err


def run_prompts(args, cfg, pair):
    from nwor_lab.audit import prepare_audit, prompts_for
    prompts = prompts_for(pair, args.prompts)
    try:
        job = prepare_audit(cfg, prompts, args.max_new_tokens, target=pair.target, head=pair.head, k=args.k,
                            model=pair.name, block_size=args.block_size, max_num_seqs=args.max_num_seqs)
    except (ValueError, TypeError, MemoryError) as err:        # an engine limit: say it with the flags
        raise UsageError(flag_names(str(err), FLAGS)) from err
    return job.run()
