"""Command line: `python -m nwor_lab.train {corpus,pair,eagle3} ...` (see the package docstring)."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from nwor_lab import atomic
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.loader import save_eagle, save_llama
from nwor_lab.train import corpus
from nwor_lab.train.evaluate import acceptance_length, held_out_prompts
from nwor_lab.train.loop import train_head, train_target
from nwor_lab.train.tokenizer import train_tokenizer

TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
            rope_theta=10000.0, max_position_embeddings=1024, tie_word_embeddings=True,
            bos_token_id=0, eos_token_id=0)


# The tiny hybrid (`pair --hybrid`): gated DeltaNet layers 0-2, attention layer 3 (Qwen3-Next's 3:1),
# small enough to train on a CPU.
HYBRID_TINY = dict(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                   rope_theta=10000.0, max_position_embeddings=1024, tie_word_embeddings=True,
                   bos_token_id=0, eos_token_id=0, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4)


def cmd_corpus(args) -> None:
    train_files, _ = corpus.split()
    if args.limit_files:
        train_files = train_files[:args.limit_files]
    t0 = time.time()
    tok = train_tokenizer(train_files, args.vocab_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    info = corpus.pack(tok, out, limit_files=args.limit_files)
    print(json.dumps({k: v for k, v in info.items() if k != "eval_file_list"}), f"{time.time() - t0:.0f}s")


def _setup_run(args):
    """Output folder, a logger that also keeps its lines, and the packed train / eval token ids."""
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    train = np.fromfile(data / "train.bin", dtype=np.uint16)
    evald = np.fromfile(data / "eval.bin", dtype=np.uint16)
    return out, log, log_lines, train, evald


def cmd_pair(args) -> None:
    out, log, log_lines, train, evald = _setup_run(args)
    if args.hybrid:
        from nwor_lab.model.hybrid import HybridConfig
        cfg = HybridConfig.from_dict({**HYBRID_TINY, **json.loads(args.config or "{}")})
    else:
        cfg = LlamaConfig.from_dict({**TINY, **json.loads(args.config or "{}")})
    log(f"command: {' '.join(sys.argv)}; torch {torch.__version__}; device {args.device} "
        f"{torch.cuda.get_device_name() if args.device.startswith('cuda') else ''}; "
        f"train {train.size} tokens, eval {evald.size} tokens")
    target, t_stats = train_target(cfg, train, evald, steps=args.target_steps, batch_size=args.batch,
                                   seq=args.seq, lr=args.lr, device=args.device, log=log,
                                   time_limit=args.target_seconds)
    head_cfg = LlamaConfig.from_dict({**cfg.to_dict(), "num_hidden_layers": 1})
    head, h_stats = train_head(target, head_cfg, train, evald, steps=args.head_steps, batch_size=args.batch,
                               seq=args.seq, lr=args.head_lr, device=args.device, log=log,
                               time_limit=args.head_seconds)
    save_llama(target, out)
    save_eagle(head, out / "eagle_config.json", out / "eagle.safetensors")
    if (Path(args.data) / "tokenizer.json").is_file():
        shutil.copy(Path(args.data) / "tokenizer.json", out / "tokenizer.json")
    # Acceptance in the weights' shipped precision (bf16 round trip), evaluated in float32.
    from nwor_lab.model.loader import load_eagle, load_llama
    t32 = load_llama(out, device=args.device)
    h32 = load_eagle(out / "eagle_config.json", out / "eagle.safetensors", t32, device=args.device)
    prompts = held_out_prompts(evald, args.eval_prompts, args.eval_prompt_len)
    t0 = time.time()
    acc = acceptance_length(t32, h32, prompts, args.eval_new_tokens, args.k)
    log(f"held-out mean acceptance length (k={args.k}, greedy, dense oracle, {len(prompts)} prompts x "
        f"{args.eval_new_tokens} tokens): {acc:.3f} ({time.time() - t0:.0f}s)")
    n_t = sum(p.numel() for p in t32.parameters())
    n_h = sum(p.numel() for p in h32.parameters())
    stats = {"command": " ".join(sys.argv), "torch": torch.__version__, "device": args.device,
             "target_params": n_t, "head_params": n_h, "target": t_stats, "head": h_stats,
             "acceptance_length": acc, "k": args.k}
    atomic.write_text(out / "train_log.json", json.dumps({"stats": stats, "log": log_lines}, indent=1))


def cmd_eagle3(args) -> None:
    """An EAGLE-3 head for an already trained target (e.g. the shipped one)."""
    from nwor_lab.model.loader import load_eagle, load_llama
    from nwor_lab.train.loop import train_eagle3
    out, log, log_lines, train, evald = _setup_run(args)
    target = load_llama(args.target, device=args.device).eval()
    log(f"command: {' '.join(sys.argv)}; torch {torch.__version__}; device {args.device}; target {args.target}")
    head_cfg = LlamaConfig.from_dict({**target.config.to_dict(), "num_hidden_layers": 1})
    head, stats = train_eagle3(target, head_cfg, train, evald, draft_vocab_size=args.draft_vocab_size,
                               steps=args.head_steps, batch_size=args.batch, seq=args.seq, lr=args.head_lr,
                               device=args.device, log=log, time_limit=args.head_seconds)
    save_eagle(head, out / "eagle3_config.json", out / "eagle3.safetensors")
    h32 = load_eagle(out / "eagle3_config.json", out / "eagle3.safetensors", target, device=args.device)
    prompts = held_out_prompts(evald, args.eval_prompts, args.eval_prompt_len)
    acc = acceptance_length(target, h32, prompts, args.eval_new_tokens, args.k)
    log(f"EAGLE-3 held-out mean acceptance length (k={args.k}, greedy, dense oracle, {len(prompts)} prompts x "
        f"{args.eval_new_tokens} tokens): {acc:.3f}")
    stats.update(command=" ".join(sys.argv), torch=torch.__version__, acceptance_length=acc, k=args.k,
                 head_params=sum(p.numel() for p in h32.parameters()))
    atomic.write_text(out / "eagle3_train_log.json", json.dumps({"stats": stats, "log": log_lines}, indent=1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m nwor_lab.train", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="train the BPE tokenizer and pack train.bin / eval.bin")
    c.add_argument("--out", default="runs/corpus")
    c.add_argument("--vocab-size", type=int, default=4096)
    c.add_argument("--limit-files", type=int, default=0, help="smoke tests: use only the first N files")
    c.set_defaults(fn=cmd_corpus)
    # what training a head takes, for both heads: data, output, device, the head's steps, the evaluation
    head = argparse.ArgumentParser(add_help=False)
    head.add_argument("--data", default="runs/corpus")
    head.add_argument("--out", required=True)
    head.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    head.add_argument("--head-steps", type=int, default=2000)
    head.add_argument("--head-seconds", type=float, default=None)
    head.add_argument("--batch", type=int, default=64)
    head.add_argument("--seq", type=int, default=256)
    head.add_argument("--head-lr", type=float, default=2e-3)
    head.add_argument("--k", type=int, default=4)
    head.add_argument("--eval-prompts", type=int, default=16)
    head.add_argument("--eval-prompt-len", type=int, default=64)
    head.add_argument("--eval-new-tokens", type=int, default=96)
    t = sub.add_parser("pair", parents=[head], help="train the target, then the EAGLE-1 head; save both (bf16)")
    t.add_argument("--config", default="", help="JSON overrides of the tiny Llama config")
    t.add_argument("--hybrid", action="store_true",
                   help="train the tiny hybrid target (gated DeltaNet + attention, HYBRID_TINY) instead")
    t.add_argument("--target-steps", type=int, default=4000)
    t.add_argument("--target-seconds", type=float, default=None)
    t.add_argument("--lr", type=float, default=2e-3)
    t.set_defaults(fn=cmd_pair)
    e = sub.add_parser("eagle3", parents=[head], help="train an EAGLE-3 head for a trained target; save it (bf16)")
    e.add_argument("--target", default=str(Path(__file__).resolve().parents[1] / "checkpoints" / "tiny"))
    e.add_argument("--draft-vocab-size", type=int, default=1024)
    e.set_defaults(fn=cmd_eagle3)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
