"""The pairs shipped with the lab: the tiny Llama pair (`nwor_lab/checkpoints/tiny`) and the tiny hybrid
(`nwor_lab/checkpoints/hybrid`, gated DeltaNet + attention); each folder's TRAINING.md says how."""
from __future__ import annotations

from pathlib import Path

import torch

TINY_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny"
HYBRID_DIR = TINY_DIR.parent / "hybrid"


HEADS = {"eagle1": ("eagle_config.json", "eagle.safetensors"),
         "eagle3": ("eagle3_config.json", "eagle3.safetensors")}


def load_tiny(device="cpu", dtype=torch.float32, directory=None, head: str = "eagle1"):
    """-> (target LlamaForCausalLM, draft head, tokenizers.Tokenizer), weights upcast to `dtype`.

    head: `eagle1` (EagleHead, the default) or `eagle3` (Eagle3Head, draft vocabulary of 1024).
    """
    from nwor_lab.model.loader import CheckpointError, load_eagle, load_llama, load_tokenizer
    if head not in HEADS:
        raise ValueError(f"head={head!r}: the shipped heads are {', '.join(HEADS)}")
    d = Path(directory or TINY_DIR)
    if not d.is_dir():
        raise CheckpointError(f"{d}: no such checkpoint directory (one laid out like {TINY_DIR})")
    target = load_llama(d, device=device, dtype=dtype)
    cfg, weights = HEADS[head]
    draft = load_eagle(d / cfg, d / weights, target, device=device, dtype=dtype)
    return target, draft, load_tokenizer(d / "tokenizer.json")


def load_hybrid(device="cpu", dtype=torch.float32, head: str = "eagle1"):
    """-> (target HybridForCausalLM, draft head, tokenizers.Tokenizer): the shipped tiny hybrid (layers
    0-2 gated DeltaNet, layer 3 attention; the tiny pair's tokenizer) and its EAGLE-1 or EAGLE-3 head."""
    return load_tiny(device=device, dtype=dtype, directory=HYBRID_DIR, head=head)
