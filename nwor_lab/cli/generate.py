"""`nwor-lab generate "PROMPT" --k 4 --nwor stage`: text, mean acceptance length, per-position acceptance."""
from __future__ import annotations

import argparse
import json

from nwor_lab.config import NWOR_MODES, SCV_MODES, LabConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nwor-lab generate",
                                description="Speculative decoding with the shipped tiny Llama + EAGLE head.")
    p.add_argument("prompts", nargs="+", help="one or more prompts (batched together)")
    p.add_argument("--k", type=int, default=4, help="drafts per window (0: target only)")
    p.add_argument("--nwor", choices=NWOR_MODES, default="off", help="KV write policy")
    p.add_argument("--scv", choices=SCV_MODES, default="off", help="acceptance-mask mode")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--head", choices=("eagle1", "eagle3"), default="eagle1", help="which shipped draft head")
    p.add_argument("--checkpoint", default=None, help="directory laid out like nwor_lab/checkpoints/tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--stop-at-eos", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


def cli_generate(argv=None) -> int:
    args = parser().parse_args(argv)
    from nwor_lab.engine.generate import generate
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device=args.device, directory=args.checkpoint, head=args.head)
    cfg = LabConfig.from_env(LabConfig(nwor_mode=args.nwor, scv_mode=args.scv))
    res = generate(args.prompts, args.max_new_tokens, args.k, cfg, target=target, head=head, tokenizer=tok,
                   temperature=args.temperature, seed=args.seed, device=args.device,
                   stop_at_eos=args.stop_at_eos)
    if args.json:
        print(json.dumps({"texts": res.texts, "token_ids": res.token_ids, **res.summary(),
                          "nwor": cfg.nwor_mode, "scv": cfg.scv_mode, "k": args.k}))
        return 0
    for prompt, text in zip(args.prompts, res.texts):
        print(prompt + text)
        print("-" * 60)
    by_pos = " ".join(f"d{j + 1}={a:.2f}" for j, a in enumerate(res.acceptance_by_position)) if args.k else "-"
    print(f"nwor={cfg.nwor_mode} scv={cfg.scv_mode} k={args.k}: {res.target_forwards} target forwards, "
          f"mean acceptance length {res.mean_acceptance_length:.2f}, acceptance by position {by_pos}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli_generate())
