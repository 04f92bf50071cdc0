"""The pairs the auditor runs, and their prompts.

    tiny        the shipped Llama pair (nwor_lab/checkpoints/tiny) with its EAGLE-1 head: a tiny pair
                that rejects often under greedy decoding
    hybrid      the shipped hybrid pair (`nwor_lab.model.shipped.HYBRID_DIR`: gated DeltaNet layers
                0-2 + attention layer 3, its EAGLE-1 head, the tiny pair's tokenizer) when the lab has
                one, else `toy-hybrid`
    toy-hybrid  a random gated DeltaNet + attention target (`model.toy.toy_hybrid`) with a random
                EAGLE-1 head (fixed seed): greedy drafts both accepted and rejected (tests/test_engine_hybrid.py)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

MODELS = ("tiny", "hybrid", "toy-hybrid")

# text prompts for the shipped tokenizer (the pairs were trained on Python code)
TEXT_PROMPTS = ("def parse_args(argv):", "import os\n", "class Foo:", "for i in range(", "def main():",
                "with open(path) as f:", "if __name__ == ", "return [x for x in")
TOY_VOCAB = 32


@dataclasses.dataclass
class Pair:
    """What one audit runs: `name` (what the report calls the model), target, EAGLE head, tokenizer
    (None: prompts are token ids)."""

    name: str
    target: object
    head: object
    tokenizer: object = None


def toy_hybrid_pair(seed: int = 2, head_seed: int = 3) -> Pair:
    """A random hybrid target (3 gated DeltaNet layers, 1 attention layer, vocabulary 32) and a random
    EAGLE-1 head whose `fc` passes the target's feature through: greedy drafts that the target both
    accepts and rejects."""
    from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head

    target = toy_hybrid(seed, vocab_size=TOY_VOCAB)
    return Pair("toy-hybrid", target, toy_hybrid_head(target, head_seed))


def shipped_hybrid_dir() -> Path | None:
    """The shipped hybrid checkpoint's folder (`nwor_lab.model.shipped.HYBRID_DIR`,
    nwor_lab/checkpoints/hybrid), when the lab ships one."""
    from nwor_lab.model import shipped
    d = Path(getattr(shipped, "HYBRID_DIR", shipped.TINY_DIR.parent / "hybrid"))
    return d if (d / "config.json").is_file() else None


def load_pair(model: str, device="cpu") -> Pair:
    """`model` (one of MODELS) on `device`, float32."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}: choose one of {', '.join(MODELS)}")
    if model == "tiny":
        from nwor_lab.model.shipped import load_tiny
        target, head, tok = load_tiny(device=device)
        return Pair("tiny", target, head, tok)
    if model == "hybrid" and shipped_hybrid_dir() is not None:
        return load_shipped_hybrid(shipped_hybrid_dir(), device)
    pair = toy_hybrid_pair()
    pair.target.to(device)
    pair.head.to(device)
    return pair


def load_shipped_hybrid(directory: Path, device="cpu") -> Pair:
    """The hybrid pair in `directory` (laid out like the tiny pair: config.json with the hybrid's
    layer types, model.safetensors, the EAGLE-1 head, tokenizer.json), float32."""
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device=device, directory=directory)
    if not hasattr(target, "state_spec"):
        raise ValueError(f"{directory}: holds a model without recurrent state ({type(target).__name__}), not a hybrid")
    return Pair("hybrid", target, head, tok)


def prompts_for(pair: Pair, n: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts as token ids: the text prompts through the pair's tokenizer (cycled, each repeat
    one more line), or for a pair without one, random ids of 3 to 6 tokens (seeded)."""
    if pair.tokenizer is not None:
        out = []
        for i in range(n):
            text = TEXT_PROMPTS[i % len(TEXT_PROMPTS)] + "\n" * (i // len(TEXT_PROMPTS))
            out.append(pair.tokenizer.encode(text).ids)
        return out
    gen = torch.Generator().manual_seed(seed)
    vocab = pair.target.config.vocab_size
    return [torch.randint(1, vocab, (int(torch.randint(3, 7, (), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]
