"""The paged KV cache: one stacked key and one stacked value tensor for all layers.

Stacking `[L, NB, BS, H, D]` (target layers first, then the EAGLE head's) is what lets CoW log
and restore, and stage commit, touch every layer in ONE kernel launch; per-layer views
(`cache.layer(l)`) are what attention and `write_kv` see, exactly like vLLM's per-layer tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.config import CACHE_DTYPE_NAMES
from nwor_lab.kv.blocks import slot_to_block_offset

from nwor_lab.kv.layout import CACHE_LAYOUTS, KVLayout, allocate_pair, detect_layout

# cache_dtype name -> storage dtype (None: the model dtype) and largest finite value.
CACHE_DTYPES = dict(zip(CACHE_DTYPE_NAMES, (
    (None, None),                         # auto
    (torch.float8_e4m3fn, 448.0),         # fp8_e4m3
    (torch.float8_e5m2, 57344.0),         # fp8_e5m2
)))
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_MAX


@dataclass(frozen=True)
class KVCacheSpec:
    """Everything that fixes a cache's shape and storage.

    num_layers: target layers + draft-head layers (all registered alike).
    dtype: the model's K/V dtype (what attention computes in); `cache_dtype` picks storage.
    """

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype = torch.float32
    cache_dtype: str = "auto"
    layout: KVLayout | str = KVLayout.NHD

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not hasattr(value, "__index__") or value.__index__() <= 0:
                raise ValueError(f"KVCacheSpec.{name}={value!r}: must be a positive int")
            object.__setattr__(self, name, value.__index__())      # numpy ints become ints
        if self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"KVCacheSpec.cache_dtype={self.cache_dtype!r}: choose one of "
                             f"{', '.join(CACHE_DTYPES)}")
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"KVCacheSpec.dtype={self.dtype}: use float32, float16 or bfloat16")
        if self.layout not in CACHE_LAYOUTS:      # a KVLayout, or its name ("NHD" == KVLayout.NHD)
            raise ValueError(f"KVCacheSpec.layout={self.layout!r}: choose one of "
                             f"{', '.join(layout.value for layout in CACHE_LAYOUTS)}")
        object.__setattr__(self, "layout", KVLayout(self.layout))

    @property
    def storage_dtype(self) -> torch.dtype:
        return CACHE_DTYPES[self.cache_dtype][0] or self.dtype

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def bytes_per_token_layer(self) -> int:
        """Bytes of K plus V that one token writes into one layer."""
        return 2 * self.num_kv_heads * self.head_size * torch.empty((), dtype=self.storage_dtype).element_size()

    @property
    def nbytes(self) -> int:
        """Bytes the key and value tensors of the whole cache take (allocated at construction)."""
        return self.num_layers * self.num_slots * self.bytes_per_token_layer


def available_memory(device) -> int | None:
    """Bytes that can still be allocated on `device` (CUDA: free device memory; CPU: the kernel's
    MemAvailable), or None where it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_cache_memory(spec: KVCacheSpec, device, max_bytes: int | None = None) -> None:
    """Raise MemoryError, before anything is allocated, when the cache of `spec` would need more
    than `max_bytes` (the caller's cap) or than `device` has available."""
    need = spec.nbytes
    what = (f"the KV cache needs {format_bytes(need)} ({spec.num_layers} layers x {spec.num_blocks} blocks x "
            f"{spec.block_size} x {spec.num_kv_heads} KV heads x {spec.head_size} x K and V, "
            f"{spec.storage_dtype})")
    fix = "lower num_blocks (or max_new_tokens, max_num_seqs), or use an fp8 cache_dtype"
    if max_bytes is not None and need > max_bytes:
        raise MemoryError(f"{what}, more than max_cache_memory={format_bytes(max_bytes)}; {fix}")
    free = available_memory(device)
    if free is not None and need > free:
        raise MemoryError(f"{what}, more than the {format_bytes(free)} available on {torch.device(device)}; {fix}")


class PagedKVCache:
    """Stacked paged K/V for `spec.num_layers` layers on one device.

    key, value: logical `[L, NB, BS, H, D]` in `spec.storage_dtype`, physical order `spec.layout`;
        or, for a cache built over tensors someone else owns (`from_layers`, e.g. vLLM's), lists
        of L per-layer `[NB, BS, H, D]` views (the ops take stacked tensors and lists alike, and
        `key[a:b]` is a list then).
    k_scale, v_scale: float32 `[L, H]`; all ones unless fp8. A scalar scale per layer is the same
    value in every head (`set_scales(layer, 0.02)`), a per-head scale a `[H]` tensor.
    """

    def __init__(self, spec: KVCacheSpec, device="cpu", max_bytes: int | None = None):
        self.spec = spec
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}: CUDA is not available here (no GPU or driver visible); "
                             f"use device='cpu'")
        check_cache_memory(spec, self.device, max_bytes)   # one clear error instead of a failed allocation
        shape = (spec.num_layers, spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
        self.key, self.value = allocate_pair(shape, spec.layout, spec.storage_dtype, self.device)
        self._setup(self.key.device)

    def _setup(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device  # with its index: "cuda" -> "cuda:0"
        self.k_scale = torch.ones(spec.num_layers, spec.num_kv_heads, dtype=torch.float32, device=self.device)
        self.v_scale = torch.ones_like(self.k_scale)
        # per-layer views made once: layer() runs for every layer of every window (host time)
        self._layers = [(self.key[l], self.value[l]) for l in range(spec.num_layers)]
        self._scales = [(self.k_scale[l], self.v_scale[l]) for l in range(spec.num_layers)]
        # per layer: the owner's own row write `write(key, value, slots)` (slot -1 skipped), or None.
        # The vLLM plugin sets vLLM's C++ op here; write policies use it (`native_writes`) for
        # their writes, commits and restores (same bytes, one op instead of two strided index-puts)
        self.native_writers = [None] * spec.num_layers

    def native_writes(self, a: int, b: int) -> list | None:
        """The owner's row writes of layers `a .. b-1` when every one has one (never for fp8, whose
        scales the owner's op does not apply), else None: the lab's own kernels write."""
        if self.is_fp8:
            return None
        writers = self.native_writers[a:b]
        return writers if all(w is not None for w in writers) else None

    @classmethod
    def from_layers(cls, keys: list[torch.Tensor], values: list[torch.Tensor], *, dtype: torch.dtype,
                    layout: KVLayout | str) -> "PagedKVCache":
        """A cache over per-layer tensors that already exist (vLLM's: `keys[l]`, `values[l]`
        logical NHD views `[NB, BS, H, D]`, e.g. `kv.vllm_cpu_views(kv_caches[l])`). Nothing is
        allocated or copied: the policies and ops write where their owner reads. `dtype`: the
        model's K/V dtype; `layout`: the cache layout the views were made in (checked against
        their strides). Storage must be the model dtype (fp8 caches are not adapted)."""
        keys, values = list(keys), list(values)
        if not keys or len(keys) != len(values):
            raise ValueError(f"values: {len(values)} layers but keys has {len(keys)}; give one view per layer in each")
        first = keys[0]
        if first.dim() != 4:
            raise ValueError(f"keys[0]: expected [num_blocks, block_size, num_kv_heads, head_size], got "
                             f"{tuple(first.shape)}")
        nb, bs, h, d = first.shape
        spec = KVCacheSpec(num_layers=len(keys), num_blocks=nb, block_size=bs, num_kv_heads=h, head_size=d,
                           dtype=dtype, layout=layout)
        want = {KVLayout.VLLM_CPU: (KVLayout.HDN, KVLayout.HND)}.get(spec.layout, (spec.layout, spec.layout))
        for name, views, order in (("keys", keys, want[0]), ("values", values, want[1])):
            for l, t in enumerate(views):
                if t.shape != first.shape or t.dtype != dtype or t.device != first.device:
                    raise ValueError(f"{name}[{l}]: {tuple(t.shape)} {t.dtype} on {t.device}; every layer must be "
                                     f"{tuple(first.shape)} {dtype} on {first.device}")
                got = detect_layout(t)
                if got is not order:
                    raise ValueError(f"{name}[{l}]: strides {t.stride()} read as {got.value}, but a "
                                     f"{spec.layout.value} cache keeps {name} in {order.value}")
        cache = cls.__new__(cls)
        cache.spec, cache.key, cache.value = spec, keys, values
        cache._setup(first.device)
        return cache

    # -- shape facts -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.spec.num_layers

    @property
    def num_slots(self) -> int:
        return self.spec.num_slots

    @property
    def is_fp8(self) -> bool:
        return is_fp8(self.spec.storage_dtype)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views `(key [NB,BS,H,D], value [NB,BS,H,D])` of one layer (same storage)."""
        self._check_layer(layer)
        return self._layers[layer]

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`(k_scale [H], v_scale [H])` of one layer."""
        self._check_layer(layer)
        return self._scales[layer]

    def set_scales(self, layer: int, k_scale, v_scale=None) -> None:
        """Set a layer's fp8 scales: a float (scalar) or a `[H]` tensor (per head), > 0."""
        self._check_layer(layer)
        for name, target, value in (("k_scale", self.k_scale, k_scale),
                                    ("v_scale", self.v_scale, k_scale if v_scale is None else v_scale)):
            t = torch.as_tensor(value, dtype=torch.float32, device=self.device)
            if t.dim() > 1 or (t.dim() == 1 and t.numel() not in (1, self.spec.num_kv_heads)):
                raise ValueError(f"{name}: expected a float or a [{self.spec.num_kv_heads}] "
                                 f"(num_kv_heads) tensor, got shape {tuple(t.shape)}")
            if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name}: scales must be finite and > 0, got {t.tolist()}")
            target[layer] = t

    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not hasattr(layer, "__index__"):    # numpy / torch ints are fine
            raise TypeError(f"layer={layer!r}: expected an integer layer index, got {type(layer).__name__}")
        if not 0 <= layer.__index__() < self.spec.num_layers:
            raise IndexError(f"layer={layer.__index__()}: this cache has layers 0..{self.spec.num_layers - 1}; "
                             f"register draft-head layers by counting them in KVCacheSpec.num_layers")

    # -- reading back ------------------------------------------------------------------------
    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantised `(key, value)` `[n, H, D]` in the model dtype at `slots` (no -1 allowed)."""
        k_cache, v_cache = self.layer(layer)
        if not isinstance(slots, torch.Tensor) or slots.dtype not in (torch.int32, torch.int64) or slots.dim() != 1:
            raise TypeError(f"slots: expected a 1-D int32/int64 tensor of slot ids, got "
                            f"{getattr(slots, 'dtype', type(slots).__name__)} {tuple(getattr(slots, 'shape', ()))}")
        capturing = slots.is_cuda and torch.cuda.is_current_stream_capturing()     # no host sync then
        if slots.numel() and not capturing and (int(slots.min()) < 0 or int(slots.max()) >= self.num_slots):
            bad = slots[(slots < 0) | (slots >= self.num_slots)][:4].tolist()
            raise IndexError(f"slots: {bad} are not slots of this cache; gather reads slots 0..{self.num_slots - 1} "
                             f"(-1, 'padding', holds nothing to read)")
        block, offset = slot_to_block_offset(slots.to(device=self.device, dtype=torch.long), self.spec.block_size)
        return self.dequantize_rows(layer, k_cache[block, offset], v_cache[block, offset])

    def dequantize_rows(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `[n, H, D]` as stored in this cache (e.g. a CoW log) -> the model dtype, exactly
        as `gather` hands back the same bytes read from a slot."""
        if not self.is_fp8:
            return key, value
        ks, vs = self.layer_scales(layer)
        dtype = self.spec.dtype
        return (key.float() * ks[:, None]).to(dtype), (value.float() * vs[:, None]).to(dtype)

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the whole key/value storage (for tests and teaching: before/after diffs),
        stacked `[L, NB, BS, H, D]` whether the cache is stacked or per layer."""
        if isinstance(self.key, list):
            return torch.stack([k.clone() for k in self.key]), torch.stack([v.clone() for v in self.value])
        return self.key.clone(), self.value.clone()

    def __repr__(self) -> str:
        s = self.spec
        return (f"PagedKVCache(layers={s.num_layers}, blocks={s.num_blocks}x{s.block_size}, "
                f"kv_heads={s.num_kv_heads}, head_size={s.head_size}, dtype={s.storage_dtype}, "
                f"layout={s.layout.value}, device={self.device})")
