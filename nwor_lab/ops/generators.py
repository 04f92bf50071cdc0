"""Input generators for the kernels: shapes, dtypes, layouts, scales and slot patterns.

Every kernel test (torch reference on CPU, CUDA kernel vs reference on the GPU) draws its cases
from here, so both see the same corner cases: slot -1 padding, block_size == num_kv_heads (where
only strides tell NHD from HND), fp8 with scalar and per-head scales, head sizes that break
16-byte vectorisation, and windows of more than 512 tokens.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from nwor_lab.kv.cache import KVCacheSpec, PagedKVCache
from nwor_lab.kv.layout import allocate
from nwor_lab.ops.quant import raw

SRC_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPE_NAMES = ("auto", "fp8_e4m3", "fp8_e5m2")


@dataclass
class KVCase:
    """One generated case: a filled stacked cache plus a window of new K/V and its slots.

    key/value:    [L, T, H, D] new K/V per layer (model dtype)
    slot_mapping: [T] unique slots, -1 where padded
    commit_mask:  [T] bool (a random accepted subset, for commit)
    """

    name: str
    cache: PagedKVCache
    key: torch.Tensor
    value: torch.Tensor
    slot_mapping: torch.Tensor
    commit_mask: torch.Tensor
    meta: dict = field(default_factory=dict)


def random_slots(num_tokens: int, num_slots: int, pad_frac: float, gen: torch.Generator,
                 dtype=torch.int64) -> torch.Tensor:
    """`[num_tokens]` distinct slots in [0, num_slots) with about `pad_frac` of them set to -1."""
    if num_tokens > num_slots:
        raise ValueError(f"num_tokens={num_tokens} exceeds num_slots={num_slots}")
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    pad = torch.rand(num_tokens, generator=gen) < pad_frac
    return torch.where(pad, torch.full_like(slots, -1), slots).to(dtype)


def make_case(*, num_layers=2, num_tokens=16, num_kv_heads=4, head_size=64, block_size=16,
              num_blocks=None, dtype=torch.bfloat16, cache_dtype="auto", layout="NHD",
              scale_kind="per_head", pad_frac=0.2, accept_frac=0.5, slot_dtype=torch.int64,
              seed=0, device="cpu", fill=True) -> KVCase:
    """Build a case. `fill` puts random old contents in the cache (so 'untouched' is checkable)."""
    gen = torch.Generator().manual_seed(seed)
    if num_blocks is None:
        num_blocks = max(2, -(-2 * num_tokens // block_size))
    spec = KVCacheSpec(num_layers, num_blocks, block_size, num_kv_heads, head_size, dtype, cache_dtype, layout)
    cache = PagedKVCache(spec, device="cpu")
    if cache.is_fp8:
        for layer in range(num_layers):
            if scale_kind == "scalar":
                cache.set_scales(layer, 0.05 + 0.1 * torch.rand((), generator=gen).item(),
                                 0.05 + 0.1 * torch.rand((), generator=gen).item())
            else:
                cache.set_scales(layer, 0.05 + 0.1 * torch.rand(num_kv_heads, generator=gen),
                                 0.05 + 0.1 * torch.rand(num_kv_heads, generator=gen))
    if fill:
        old = torch.randn(cache.key.shape, generator=gen)
        cache.key.copy_(old.to(spec.storage_dtype))
        cache.value.copy_((old * 0.5 + 1).to(spec.storage_dtype))
    shape = (num_layers, num_tokens, num_kv_heads, head_size)
    key = (torch.randn(shape, generator=gen) * 2).to(dtype)
    value = (torch.randn(shape, generator=gen) * 2).to(dtype)
    slots = random_slots(num_tokens, spec.num_slots, pad_frac, gen, slot_dtype)
    mask = torch.rand(num_tokens, generator=gen) < accept_frac
    case = KVCase(
        name=(f"L{num_layers}-T{num_tokens}-H{num_kv_heads}-D{head_size}-BS{block_size}-{layout}-"
              f"{str(dtype).replace('torch.', '')}-{cache_dtype}-{scale_kind}-s{seed}"),
        cache=cache, key=key, value=value, slot_mapping=slots, commit_mask=mask,
        meta=dict(layout=layout, cache_dtype=cache_dtype, dtype=dtype))
    return to_device(case, device)


def to_device(case: KVCase, device) -> KVCase:
    device = torch.device(device)
    if device.type == "cpu":
        return case
    cache = PagedKVCache(case.cache.spec, device=device)
    cache.key.copy_(case.cache.key), cache.value.copy_(case.cache.value)
    cache.k_scale.copy_(case.cache.k_scale), cache.v_scale.copy_(case.cache.v_scale)
    return KVCase(case.name, cache, case.key.to(device), case.value.to(device),
                  case.slot_mapping.to(device), case.commit_mask.to(device), dict(case.meta))


def per_layer_caches(cache: PagedKVCache, device=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The cache as vLLM holds it: one key and one value tensor `[NB, BS, H, D]` per layer, each its
    own allocation (so only a table of base addresses can reach them all), in the same physical
    layout and with the same bytes as the stacked cache."""
    device = cache.device if device is None else torch.device(device)
    spec = cache.spec
    shape = (spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    keys, values = [], []
    for layer in range(spec.num_layers):
        for out, stacked in ((keys, cache.key), (values, cache.value)):
            t = allocate(shape, spec.layout, spec.storage_dtype, device)
            raw(t).copy_(raw(stacked[layer]))
            out.append(t)
    return keys, values


def vllm_flash_layer_caches(cache: PagedKVCache, device=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The cache in vLLM 0.33's FlashAttention layout: one tensor `[NB, H, BS, 2 * D]` per layer, K in
    the first D and V in the last D of the last dimension. Returns the logical `[NB, BS, H, D]` views
    its `do_kv_cache_update` hands to `reshape_and_cache_flash` (`kv.transpose(1, 2).split(D, -1)`),
    with the stacked cache's bytes. Their strides (stride(BS) = 2 D, stride(H) = BS * 2 D) make them
    HND views with padded rows, which `detect_layout` accepts and the kernels take as they are."""
    device = cache.device if device is None else torch.device(device)
    spec = cache.spec
    keys, values = [], []
    for layer in range(spec.num_layers):
        kv = torch.empty((spec.num_blocks, spec.num_kv_heads, spec.block_size, 2 * spec.head_size),
                         dtype=spec.storage_dtype, device=device)
        k, v = kv.transpose(1, 2).split(spec.head_size, dim=-1)
        raw(k).copy_(raw(cache.key[layer]))
        raw(v).copy_(raw(cache.value[layer]))
        keys.append(k)
        values.append(v)
    return keys, values


def vllm_cpu_layer_caches(cache: PagedKVCache) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The cache in vLLM 0.32's CPU layout (`kv.KVLayout.VLLM_CPU`): one tensor `[NB, H, BS, 2 * D]`
    per layer, keys transposed per block x head, then values; returns (packed tensors, logical key
    views, logical value views) with the stacked cache's bytes (`kv.vllm_cpu_views`)."""
    from nwor_lab.kv.layout import vllm_cpu_views

    spec = cache.spec
    packed, keys, values = [], [], []
    for layer in range(spec.num_layers):
        kv = torch.empty((spec.num_blocks, spec.num_kv_heads, spec.block_size, 2 * spec.head_size),
                         dtype=spec.storage_dtype, device=cache.device)
        k, v = vllm_cpu_views(kv)
        raw(k).copy_(raw(cache.key[layer]))
        raw(v).copy_(raw(cache.value[layer]))
        packed.append(kv), keys.append(k), values.append(v)
    return packed, keys, values


def standard_cases(device="cpu", big: bool = True):
    """The matrix every kernel must pass: layouts × source dtypes × cache dtypes × scale kinds,
    plus shape corner cases (block_size == num_kv_heads, head sizes 80/72, > 512 tokens)."""
    seed = itertools.count()
    for layout, dtype, cache_dtype in itertools.product(("NHD", "HND"), SRC_DTYPES, CACHE_DTYPE_NAMES):
        scale_kinds = ("scalar", "per_head") if cache_dtype != "auto" else ("per_head",)
        for scale_kind in scale_kinds:
            yield make_case(layout=layout, dtype=dtype, cache_dtype=cache_dtype, scale_kind=scale_kind,
                            seed=next(seed), device=device)
    # block_size == num_kv_heads: only strides tell the layouts apart
    for layout in ("NHD", "HND"):
        yield make_case(num_kv_heads=8, block_size=8, head_size=32, layout=layout, seed=next(seed), device=device)
    # head sizes that are not a multiple of 16 bytes / 8 elements: scalar (non-vectorised) paths
    for head_size, dtype in ((80, torch.float16), (72, torch.bfloat16), (36, torch.float32), (24, torch.float16)):
        yield make_case(head_size=head_size, dtype=dtype, cache_dtype="fp8_e4m3", seed=next(seed), device=device)
        yield make_case(head_size=head_size, dtype=dtype, seed=next(seed), device=device, slot_dtype=torch.int32)
    if big:
        yield make_case(num_layers=3, num_tokens=700, num_kv_heads=8, head_size=128, block_size=16,
                        dtype=torch.bfloat16, layout="HND", seed=next(seed), device=device)
        yield make_case(num_layers=2, num_tokens=1100, num_kv_heads=2, head_size=64, block_size=32,
                        dtype=torch.float16, cache_dtype="fp8_e5m2", seed=next(seed), device=device)
    # all padding, and no padding
    yield make_case(pad_frac=1.0, seed=next(seed), device=device)
    yield make_case(pad_frac=0.0, accept_frac=1.0, seed=next(seed), device=device)


def saturating_cases(device="cpu"):
    """fp8 cases whose K/V reach and pass the fp8 maximum (the clamp in `quant.quantize`, the
    kernels' `__NV_SATFINITE`): both formats x scalar / per-head scales x every source dtype,
    NHD and HND. Per layer and head, elements are `f * fmax * scale` for factors f from just
    inside the range through exactly fmax, just past it, far beyond (1e3, 1e6), plus the source
    dtype's largest finite value and infinities, both signs, mixed with ordinary values. Without
    saturation e5m2 would store inf and e4m3fn NaN where `fmax` belongs."""
    from nwor_lab.kv.cache import CACHE_DTYPES

    factors = torch.tensor([0.25, 0.9, 1.0, 1.001, 1.02, 1.1, 1.5, 2.0, 4.0, 1e3, 1e6, float("inf")])
    seed = itertools.count(1000)
    for i, (cache_dtype, scale_kind, dtype) in enumerate(itertools.product(
            ("fp8_e4m3", "fp8_e5m2"), ("scalar", "per_head"), SRC_DTYPES)):
        case = make_case(num_layers=2, num_tokens=24, num_kv_heads=4, head_size=32, block_size=8, dtype=dtype,
                         cache_dtype=cache_dtype, layout=("NHD", "HND")[i % 2], scale_kind=scale_kind,
                         pad_frac=0.1, seed=next(seed))
        gen = torch.Generator().manual_seed(i)
        fmax = CACHE_DTYPES[cache_dtype][1]
        for tensor, scales in ((case.key, case.cache.k_scale), (case.value, case.cache.v_scale)):
            pick = torch.randint(0, len(factors), tensor.shape, generator=gen)
            sign = torch.where(torch.rand(tensor.shape, generator=gen) < 0.5, -1.0, 1.0)
            big = factors[pick] * sign * fmax * scales[:, None, :, None]             # [L, T, H, D]
            big = torch.where(pick == 0, torch.randn(tensor.shape, generator=gen), big)   # ordinary values too
            big[:, 0, 0, :2] = torch.tensor([1.0, -1.0]) * torch.finfo(dtype).max        # largest finite
            tensor.copy_(big.to(dtype))          # fp16 overflows past 65504 to inf: saturates as well
        case.name = "saturating-" + case.name
        yield to_device(case, device)


def gated_delta_inputs(num_tokens: int, num_heads: int = 2, head_k_dim: int = 8, head_v_dim: int = 6,
                       conv_dim: int = 12, conv_width: int = 4, seed: int = 0, dtype=torch.float32,
                       device="cpu") -> dict:
    """Inputs for the gated DeltaNet ops (nwor_lab.ops.gated_delta) as a real layer makes them: q, k
    L2-normalised `[T, H, K]`, v `[T, H, V]`, g = -exp(A_log) * softplus(a + dt_bias) <= 0 and
    beta = sigmoid(b) `[T, H]`, a non-zero state `[H, K, V]`, conv inputs `[T, C]`, conv weight
    `[C, W]` and a non-zero conv state `[W-1, C]`."""
    from nwor_lab.ops.gated_delta import l2norm
    gen = torch.Generator().manual_seed(seed)
    T, H = num_tokens, num_heads

    def rand(*shape):
        return torch.randn(*shape, generator=gen)
    out = dict(q=l2norm(rand(T, H, head_k_dim)), k=l2norm(rand(T, H, head_k_dim)), v=rand(T, H, head_v_dim),
               g=-torch.rand(H, generator=gen).mul(4).exp() * torch.nn.functional.softplus(rand(T, H)) * 0.1,
               beta=torch.sigmoid(rand(T, H)), state=rand(H, head_k_dim, head_v_dim) * 0.5,
               x=rand(T, conv_dim), weight=rand(conv_dim, conv_width) * 0.5, conv_state=rand(conv_width - 1, conv_dim))
    return {n: (t.to(dtype) if n not in ("g", "beta", "state") else t).to(device) for n, t in out.items()}


def selective_scan_inputs(num_tokens: int, num_heads: int = 2, state_size: int = 4, head_dim: int = 3,
                          conv_dim: int = 10, conv_width: int = 4, seed: int = 0, device="cpu") -> dict:
    """Inputs for Mamba2's selective scan (nwor_lab.ops.selective_scan) as a layer makes them: x
    `[T, H, P]`, dt = softplus(.) > 0 `[T, H]`, A = -exp(.) < 0 and D `[H]`, B, C `[T, H, N]`, a
    non-zero state `[H, N, P]`; and, for the short conv in front of it, conv inputs `conv_in`
    `[T, C]` and a conv weight `[C, W]`. All float32."""
    gen = torch.Generator().manual_seed(seed)
    T, H = num_tokens, num_heads

    def rand(*shape):
        return torch.randn(*shape, generator=gen)
    out = dict(x=rand(T, H, head_dim), dt=torch.nn.functional.softplus(rand(T, H) - 1),
               A=-torch.rand(H, generator=gen).mul(2).exp(), B=rand(T, H, state_size), C=rand(T, H, state_size),
               D=rand(H), state=rand(H, state_size, head_dim) * 0.5,
               conv_in=rand(T, conv_dim), weight=rand(conv_dim, conv_width) * 0.5)
    return {n: t.to(device) for n, t in out.items()}
