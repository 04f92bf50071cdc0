"""Megatron-style sharding of the lab's Llama and its EAGLE-1 / EAGLE-3 heads over a TPGroup.

Per rank, with tp ranks, the same classes are built from a per-rank config (`tp_config`):

  attention   q heads split evenly (rank r: heads r*Hq/tp ..); KV heads split evenly when there are
              at least tp of them, else replicated: rank r holds KV head r // (tp // KV), the one its
              q heads read (GQA groups never straddle ranks). q/k/v are column-parallel (rows of
              their weights sliced, no communication); o_proj is row-parallel: its input columns
              are sliced and its output is all-reduced, its bias (if any) added once, after.
  MLP         gate/up column-parallel (intermediate rows sliced), down_proj row-parallel (all-reduce).
  the rest    replicated: embeddings, norms, RoPE, the LM head, EAGLE's fc / EAGLE-3's norm,
              lm_head and d2t. Every rank holds the same residual stream after each all-reduce, so
              every rank computes the same logits.

So a decoder layer costs exactly two all-reduces (after attention, after the MLP), and each rank's
`config.num_key_value_heads` is its own KV heads: an engine built on the shards sizes its paged
cache for those heads, for every layer, the head's layer N included.

Row-parallel layers are `RowParallelLinear` (an `nn.Linear` subclass, so parameter names and
checkpoint keys do not change) swapped in for `o_proj` and `down_proj`; nothing in
`nwor_lab.model` is edited. Checkpoints load as they are and are sliced per rank
(`slice_state`): `load_llama_tp` slices the target's tensors before building the shard; heads
are small and are loaded whole, then sliced (`shard_head`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nwor_lab.distributed.group import TPGroup
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.eagle import EagleHead
from nwor_lab.model.eagle3 import Eagle3Head
from nwor_lab.model.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from nwor_lab.model.loader import load_state, read_config, read_weights


# -- the arithmetic ------------------------------------------------------------------------------
def check_tp(cfg: LlamaConfig, tp: int, what: str = "model") -> None:
    """Raise a ValueError saying why `cfg` cannot be split over `tp` ranks."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp={tp!r}: expected an integer >= 1")
    h, kv, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    if h % tp:
        raise ValueError(f"tp={tp}: the {what}'s {h} attention heads do not split evenly over {tp} ranks")
    if inter % tp:
        raise ValueError(f"tp={tp}: the {what}'s intermediate_size {inter} does not split evenly over {tp} ranks")
    if kv >= tp and kv % tp:
        raise ValueError(f"tp={tp}: the {what}'s {kv} KV heads do not split evenly over {tp} ranks")
    if kv < tp and tp % kv:
        raise ValueError(f"tp={tp}: {kv} KV heads cannot be replicated evenly over {tp} ranks "
                         f"(tp must be a multiple of the KV head count)")


def tp_config(cfg: LlamaConfig, tp: int) -> LlamaConfig:
    """The config of one rank's shard: Hq/tp heads, max(1, KV/tp) KV heads, intermediate/tp;
    head_dim and hidden size unchanged."""
    check_tp(cfg, tp)
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=max(1, cfg.num_key_value_heads // tp),
                               head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size // tp)


def q_heads(cfg: LlamaConfig, rank: int, tp: int) -> range:
    """The full model's query heads rank `rank` computes."""
    n = cfg.num_attention_heads // tp
    return range(rank * n, (rank + 1) * n)


def kv_heads(cfg: LlamaConfig, rank: int, tp: int) -> range:
    """The full model's KV heads rank `rank` holds (its cache shard's heads, in order)."""
    kv = cfg.num_key_value_heads
    if kv >= tp:
        n = kv // tp
        return range(rank * n, (rank + 1) * n)
    r = rank // (tp // kv)                 # replicated: tp // kv ranks share each KV head
    return range(r, r + 1)


def intermediate_rows(cfg: LlamaConfig, rank: int, tp: int) -> range:
    n = cfg.intermediate_size // tp
    return range(rank * n, (rank + 1) * n)


def _head_rows(heads: range, d: int) -> slice:
    return slice(heads.start * d, heads.stop * d)


def slice_state(state: dict[str, torch.Tensor], cfg: LlamaConfig, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """A full state dict (target, EAGLE-1 or EAGLE-3 head: any key layout of the lab's classes) ->
    rank `rank`'s slice, keyed as the per-rank module expects. Sliced by the parameter's name:
    `self_attn.{q,k,v}_proj.*` rows, `self_attn.o_proj.weight` columns, `mlp.{gate,up}_proj.weight`
    rows, `mlp.down_proj.weight` columns; everything else (o_proj's bias too) is replicated."""
    check_tp(cfg, tp)
    d = cfg.head_dim
    q, kv, inter = _head_rows(q_heads(cfg, rank, tp), d), _head_rows(kv_heads(cfg, rank, tp), d), \
        intermediate_rows(cfg, rank, tp)
    inter = slice(inter.start, inter.stop)
    out = {}
    for name, t in state.items():
        if ".self_attn.q_proj." in f".{name}":
            t = t[q]
        elif ".self_attn.k_proj." in f".{name}" or ".self_attn.v_proj." in f".{name}":
            t = t[kv]
        elif name.endswith("self_attn.o_proj.weight"):
            t = t[:, q]
        elif name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            t = t[inter]
        elif name.endswith("mlp.down_proj.weight"):
            t = t[:, inter]
        out[name] = t.contiguous()
    return out


# -- the row-parallel layer ----------------------------------------------------------------------
class RowParallelLinear(nn.Linear):
    """`y = all_reduce(x_r @ W_r^T) + b`: this rank's input columns of W, the partial products
    summed over the group, the bias added once after the sum. Parameter names as `nn.Linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TPGroup, **kw):
        super().__init__(in_features, out_features, bias=bias, **kw)
        self.group = group

    @classmethod
    def replacing(cls, linear: nn.Linear, group: TPGroup) -> "RowParallelLinear":
        """A row-parallel layer with `linear`'s shape, device, dtype and (shared) parameters."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new.group = group
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce_(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp={self.group.world_size}"


def parallelize(module: nn.Module, group: TPGroup) -> nn.Module:
    """Swap every attention's `o_proj` and every MLP's `down_proj` in `module` for row-parallel
    ones (in place). `module` must have been built from a `tp_config` so q/k/v/gate/up already
    have this rank's widths."""
    for m in list(module.modules()):
        if isinstance(m, LlamaAttention) and not isinstance(m.o_proj, RowParallelLinear):
            m.o_proj = RowParallelLinear.replacing(m.o_proj, group)
        elif isinstance(m, LlamaMLP) and not isinstance(m.down_proj, RowParallelLinear):
            m.down_proj = RowParallelLinear.replacing(m.down_proj, group)
    return module


# -- targets -------------------------------------------------------------------------------------
def _finish(module: nn.Module, device, dtype) -> nn.Module:
    return module.to(device=device, dtype=dtype).eval()


def build_llama_shard(cfg: LlamaConfig, group: TPGroup) -> LlamaForCausalLM:
    """An uninitialised (default-initialised) rank shard of a Llama with full config `cfg`.
    `model.full_config` keeps the full config, `model.tp_group` the group."""
    model = parallelize(LlamaForCausalLM(tp_config(cfg, group.world_size)), group)
    model.full_config, model.tp_group = cfg, group
    return model


def shard_llama(full: LlamaForCausalLM, group: TPGroup, device=None, dtype=None) -> LlamaForCausalLM:
    """This rank's shard of an in-memory Llama (its weights sliced; `full` is left as it was)."""
    p = next(full.parameters())
    cfg = full.config
    shard = build_llama_shard(cfg, group)
    ignored = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    state = {k: v for k, v in full.state_dict().items() if k not in ignored}
    load_state(shard, slice_state(state, cfg, group.rank, group.world_size), f"Llama shard {group.rank}", ignored)
    return _finish(shard, device or p.device, dtype or p.dtype)


def load_llama_tp(directory, group: TPGroup, device="cpu", dtype=torch.float32) -> LlamaForCausalLM:
    """A Hugging Face Llama directory -> this rank's shard: the checkpoint's tensors sliced for the
    rank before the shard is built (the full model is never built)."""
    directory = Path(directory)
    cfg = read_config(directory / "config.json")
    check_tp(cfg, group.world_size, f"checkpoint {directory}")
    ignored = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    weights = {k: v for k, v in read_weights(directory).items() if k not in ignored}
    shard = build_llama_shard(cfg, group)
    load_state(shard, slice_state(weights, cfg, group.rank, group.world_size),
               f"Llama checkpoint {directory} (tp rank {group.rank})", ignored)
    return _finish(shard, device, dtype)


# -- draft heads ---------------------------------------------------------------------------------
def build_head_shard(full, group: TPGroup):
    """An empty rank shard with `full`'s class and options (EagleHead or Eagle3Head)."""
    cfg = tp_config(full.config, group.world_size)
    if isinstance(full, Eagle3Head):
        head = Eagle3Head(cfg, full.aux_layers, full.draft_vocab_size, own_embedding=full.embed_tokens is not None)
    elif isinstance(full, EagleHead):
        head = EagleHead(cfg, fc_bias=full.fc.bias is not None, own_embedding=full.embed_tokens is not None)
    else:
        raise TypeError(f"shard_head: no sharding rule for {type(full).__name__} (EagleHead, Eagle3Head)")
    head = parallelize(head, group)
    head.full_config, head.tp_group = full.config, group
    return head


def shard_head(full, target_shard: LlamaForCausalLM, group: TPGroup, device=None, dtype=None):
    """This rank's shard of a draft head (its decoder layer split like the target's, fc / norms /
    LM head replicated), attached to this rank's target shard."""
    check_tp(full.config, group.world_size, "draft head")
    p = next(full.parameters())
    head = build_head_shard(full, group)
    load_state(head, slice_state(full.state_dict(), full.config, group.rank, group.world_size),
               f"draft head shard {group.rank}")
    return _finish(head, device or p.device, dtype or p.dtype).attach(target_shard)


def random_shards(cfg: LlamaConfig, group: TPGroup, head: bool = True, device="cpu", dtype=torch.float32):
    """(target shard, EAGLE-1 head shard or None) with random weights, built directly on `device` in
    `dtype` (no full model anywhere: what a benchmark of an 8B-shaped model needs). Every rank
    draws from the same seed, so replicated weights (embeddings, norms, LM head) agree."""
    prev = torch.get_default_dtype()
    torch.manual_seed(0)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            target = build_llama_shard(cfg, group).eval()
            h = None
            if head:
                hcfg = dataclasses.replace(cfg, num_hidden_layers=1)
                h = parallelize(EagleHead(tp_config(hcfg, group.world_size), fc_bias=False), group)
                h.full_config, h.tp_group = hcfg, group
                h = h.eval().attach(target)
    finally:
        torch.set_default_dtype(prev)
    return target, h


def load_head_tp(config, weights, target_shard: LlamaForCausalLM, group: TPGroup, device="cpu",
                 dtype=torch.float32):
    """An EAGLE-1 / EAGLE-3 checkpoint (config path, weights path; as `load_eagle`) -> this rank's
    head shard attached to `target_shard`. Heads are small: loaded whole on the CPU, then sliced."""
    from nwor_lab.model.loader import load_eagle
    full_head = load_eagle(config, weights, target_shard, device="cpu", dtype=dtype)
    return shard_head(full_head, target_shard, group, device=device, dtype=dtype)


def load_tiny_tp(group: TPGroup, device="cpu", dtype=torch.float32, directory=None, head: str = "eagle1"):
    """`load_tiny` for one rank: (target shard, head shard, tokenizer) from the shipped pair (or a
    directory laid out like it), sliced for `group.rank`."""
    from nwor_lab.model.loader import CheckpointError, load_tokenizer
    from nwor_lab.model.shipped import HEADS, TINY_DIR
    if head not in HEADS:
        raise ValueError(f"head={head!r}: the shipped heads are {', '.join(HEADS)}")
    d = Path(directory or TINY_DIR)
    if not d.is_dir():
        raise CheckpointError(f"{d}: no such checkpoint directory (one laid out like {TINY_DIR})")
    target = load_llama_tp(d, group, device=device, dtype=dtype)
    cfg, weights = HEADS[head]
    return target, load_head_tp(d / cfg, d / weights, target, group, device, dtype), load_tokenizer(d / "tokenizer.json")
