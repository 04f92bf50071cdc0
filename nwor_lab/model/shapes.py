"""Models of a real size with random weights: a Llama-3-8B-shaped target and its EAGLE heads.

    SHAPES["8b"]       Llama-3-8B: 32 layers, hidden 4096, 32 query / 8 KV heads x 128, MLP 14336,
                       vocabulary 128256, RoPE theta 500000, 8192 positions, bf16 (about 16 GB)
    SHAPES["8b-mini"]  the same structure at toy size (4 layers, hidden 64, vocabulary 512): the
                       CPU tests run the 8B code path on it

Heads, shaped as the published ones for Llama-3-8B (random weights, the same init):
  eagle1   fc [2h -> h] with bias, one Llama layer (no input norm); the target's embedding and its
           128k LM head (yuhuili/EAGLE-LLaMA3-Instruct-8B): a head pass reads ~1 GB of LM head
  eagle3   fc [3h -> h] over the target's layers (2, 16, 29), one layer over [embed, hidden] (2h in),
           its own norm and LM head over a 32000-token draft vocabulary with d2t
           (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): a pass reads ~0.5 GB

Weights are N(0, 0.02), norms 1, biases 0, from one seeded generator on the device; the model is
built on the meta device and allocated once in its dtype (no fp32 copy of 16 GB on the way). The
outputs are meaningless; every kernel, graph and policy runs as it would on the real model, which
is what `nwor-lab bench engine --model 8b` (with forced acceptance) measures.
"""
from __future__ import annotations

import torch

from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.rope import inv_frequencies

SHAPES = {
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=8192,
               draft_vocab_size=32000),
    "8b-mini": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0, max_position_embeddings=1024,
                    draft_vocab_size=128),
}
HEAD_SHAPES = ("eagle1", "eagle3")
INIT_STD = 0.02


def config_for(shape: str, num_hidden_layers: int | None = None) -> LlamaConfig:
    """The target's LlamaConfig of `shape` (optionally with fewer layers)."""
    if shape not in SHAPES:
        raise ValueError(f"shape={shape!r}: choose one of {', '.join(SHAPES)}")
    fields = {k: v for k, v in SHAPES[shape].items() if k != "draft_vocab_size"}
    if num_hidden_layers is not None:
        fields["num_hidden_layers"] = num_hidden_layers
    return LlamaConfig(**fields)


def head_config(target_cfg: LlamaConfig) -> LlamaConfig:
    """An EAGLE head's config: the target's shape with one decoder layer (a Llama layer also for a
    hybrid target: its config's own fields beyond LlamaConfig's are left out)."""
    fields = {f: getattr(target_cfg, f) for f in LlamaConfig.__dataclass_fields__ if f != "extra"}
    return LlamaConfig(**{**fields, "num_hidden_layers": 1})


@torch.no_grad()
def _materialize(module: torch.nn.Module, device, dtype, generator: torch.Generator) -> torch.nn.Module:
    """Meta module -> `device` in `dtype`, weights N(0, INIT_STD), norms 1, biases 0, RoPE buffers real."""
    module = module.to(dtype).to_empty(device=device)
    for name, p in module.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, INIT_STD, generator=generator)
    for sub in module.modules():           # to_empty left the RoPE frequencies uninitialised
        if hasattr(sub, "inv_freq"):
            cfg = getattr(module, "config")
            sub.inv_freq = inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    return module.eval()


def random_target(shape: str = "8b", device="cuda", dtype=torch.bfloat16, seed: int = 0,
                  num_hidden_layers: int | None = None):
    """-> LlamaForCausalLM of `shape` with random weights on `device`."""
    from nwor_lab.model.llama import LlamaForCausalLM
    cfg = config_for(shape, num_hidden_layers)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    gen = torch.Generator(device).manual_seed(seed)
    return _materialize(model, device, dtype, gen)


def random_head(target, kind: str = "eagle1", shape: str = "8b", seed: int = 1):
    """-> an EAGLE-1- or EAGLE-3-shaped head for `target` (random weights, on its device and dtype)."""
    from nwor_lab.model.eagle import EagleHead
    from nwor_lab.model.eagle3 import Eagle3Head, default_aux_layers
    if kind not in HEAD_SHAPES:
        raise ValueError(f"head={kind!r}: choose one of {', '.join(HEAD_SHAPES)}")
    p = next(target.parameters())
    device, dtype = p.device, p.dtype
    cfg = head_config(target.config)
    with torch.device("meta"):
        if kind == "eagle1":
            head = EagleHead(cfg, fc_bias=True)
        else:
            head = Eagle3Head(cfg, default_aux_layers(target.config.num_hidden_layers),
                              draft_vocab_size=SHAPES[shape]["draft_vocab_size"])
    gen = torch.Generator(device).manual_seed(seed)
    head = _materialize(head, device, dtype, gen)
    if kind == "eagle3":
        # the draft vocabulary: a fixed random subset of the target's, in id order (d2t: offsets)
        ids = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(seed))
        ids = ids[:head.draft_vocab_size].sort().values
        head.d2t.copy_((ids - torch.arange(head.draft_vocab_size)).to(device))
    return head.attach(target)


def parameter_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
