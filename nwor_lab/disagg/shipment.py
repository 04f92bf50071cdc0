"""One request's hand-off from a prefill engine to a decode engine: export, wire format, install.

    export_request(engine, request, strategy, rejected=None) -> Shipment     (the prefill side)
    shipment.encode() -> frame [N] uint8;  Shipment.decode(frame) -> Shipment  (the wire)
    install(engine, shipment) -> Request | None                              (the decode side)

A `Shipment` is a JSON header and raw-byte tensors (docs/handoff.md is the protocol). The K/V rows
are the cache's storage bytes (fp8 included), positions 0 .. `rows` - 1 of every shipped layer, in
position order, read through the prefill engine's block table; the decode engine knows nothing of
the prefill side's block ids. It admits the request the way the preemption path admits a
swapped-out one (`Request.swapped`, nwor_lab.engine.preemption): the scheduler allocates
`ceil(num_computed / BS)` fresh blocks, `Lifecycle.on_resume` copies the rows in (positions the
strategy did not ship, and layers it did not ship, are zeros), the block table is those blocks in
position order, and the request continues with its drafts as if it had never left.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from nwor_lab.disagg.strategies import HandoffStrategy, handoff_strategy
from nwor_lab.engine.preemption import SwappedOut

PROTOCOL = 1
_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                               torch.float8_e5m2, torch.uint8, torch.int64, torch.int32)}


@dataclass
class Shipment:
    """`header`: the request (prompt, output, num_computed, drafts, max_new_tokens, finished), the
    cache's shape, what was shipped (`layers`, `rows`), the junk rows; `tensors`: name -> tensor,
    in the order the header's `tensors` list gives (the wire's order)."""

    header: dict
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V rows and state shipped (what the strategy decides)."""
        return sum(t.nbytes for n, t in self.tensors.items() if n.startswith(("key.", "value.", "state.")))

    @property
    def nbytes(self) -> int:
        """Every byte of the frame: header, K/V, state, draft probabilities, the sampler's stream."""
        return 8 + len(self._header_bytes()) + sum(t.nbytes for t in self.tensors.values())

    def _header_bytes(self) -> bytes:
        h = dict(self.header)
        h["tensors"] = [{"name": n, "dtype": str(t.dtype), "shape": list(t.shape)} for n, t in self.tensors.items()]
        return json.dumps(h, separators=(",", ":")).encode()

    def encode(self) -> torch.Tensor:
        """The frame: header length (8 bytes, little-endian), the header (JSON), then each tensor's raw
        bytes in the header's order. -> `[nbytes]` uint8 on the CPU."""
        head = self._header_bytes()
        parts = [torch.tensor(list(len(head).to_bytes(8, "little")), dtype=torch.uint8),
                 torch.frombuffer(bytearray(head), dtype=torch.uint8)]
        parts += [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in self.tensors.values()]
        return torch.cat(parts)

    @classmethod
    def decode(cls, frame: torch.Tensor) -> "Shipment":
        frame = frame.cpu()
        if frame.dtype != torch.uint8 or frame.dim() != 1 or frame.numel() < 8:
            raise ValueError(f"frame: expected a 1-d uint8 tensor from Shipment.encode, got {frame.dtype} "
                             f"{tuple(frame.shape)}")
        n = int.from_bytes(bytes(frame[:8].tolist()), "little")
        header = json.loads(bytes(frame[8:8 + n].tolist()).decode())
        if header.get("protocol") != PROTOCOL:
            raise ValueError(f"frame: protocol {header.get('protocol')!r}, this lab speaks {PROTOCOL}")
        tensors, at = {}, 8 + n
        for spec in header.pop("tensors"):
            dtype = _DTYPES[spec["dtype"]]
            size = torch.Size(spec["shape"]).numel() * torch.empty((), dtype=dtype).element_size()
            raw = frame[at:at + size].clone()
            tensors[spec["name"]] = raw.view(dtype).reshape(spec["shape"])
            at += size
        if at != frame.numel():
            raise ValueError(f"frame: {frame.numel()} bytes, the header accounts for {at}")
        return cls(header, tensors)


def check_exportable(engine) -> None:
    """The hand-off covers chains on whole-context caches; the rest is refused by name."""
    if engine.tree is not None:
        raise ValueError("hand-off with LabConfig.tree: a tree's drafts (parents) are not in the protocol; use chains")
    if engine.prefix is not None:
        raise ValueError("hand-off with prefix caching: shared (cached) blocks are not in the protocol yet; "
                         "build the engines with prefix_cache=None")
    if engine.sliding is not None and engine.sliding.ring_slots is not None:
        raise ValueError("hand-off on a sliding-window ring: a ring's block table is not in position order; "
                         "use kv_ring='full' or sliding_window=0")


def export_request(engine, request, strategy="nwor", rejected: dict | None = None, *,
                   on_device: bool = False) -> Shipment:
    """The shipment of `request` (after its prefill step on `engine`) under `strategy`.
    `rejected`: slot -> cache layers holding a rejected row there (`RejectedRows.slots`), to name the
    shipped junk rows that hold one. `on_device`: the K/V rows and the state stay on the engine's
    device (a CUDA IPC hand-off maps them into the decode process: no host copy on the way)."""
    check_exportable(engine)
    s: HandoffStrategy = handoff_strategy(strategy)
    cache, r = engine.cache, request
    bs = cache.spec.block_size
    finished = r.finished or r.remaining <= 0
    n = 0 if finished else s.shipped_positions(r.num_computed, bs)
    layers = s.shipped_layers(engine.target.num_layers, cache.num_layers) if n else []
    slots = torch.tensor(r.block_table.slots(range(n)), dtype=torch.long, device=cache.device)
    b, o = slots // bs, slots % bs
    here = (lambda x: x.clone()) if on_device else (lambda x: x.cpu())      # noqa: E731
    tensors = {}
    for layer in layers:
        k, v = cache.layer(layer)
        tensors[f"key.{layer}"], tensors[f"value.{layer}"] = here(k[b, o]), here(v[b, o])
    current = None
    if n and engine.states is not None and s.ships_state and r.state_slot is not None:
        store = engine.states.store
        tensors["state.recurrent"] = here(store.recurrent[:, r.state_slot])
        tensors["state.conv"] = here(store.conv[:, r.state_slot])
        current = int(store.current[r.state_slot])
    if r.draft_probs is not None and not finished:
        tensors["draft_probs"] = r.draft_probs.cpu()
    tensors["generator"] = engine.generator.get_state().cpu()
    if cache.is_fp8:          # the bytes mean values only under their scales: the decode side must hold the same
        tensors["k_scale"], tensors["v_scale"] = cache.k_scale.cpu(), cache.v_scale.cpu()
    junk = list(range(r.num_computed, n))
    named = []
    if rejected:
        for p, slot in zip(junk, slots[r.num_computed:].tolist()):
            if slot in rejected:
                named.append({"position": p, "block": p // bs, "block_id": r.block_table.blocks[p // bs],
                              "layers": sorted(l for l in rejected[slot] if l in layers)})
        named = [x for x in named if x["layers"]]
    spec = cache.spec
    header = {"protocol": PROTOCOL, "strategy": s.name, "prompt": list(r.prompt), "output": list(r.output),
              "num_computed": r.num_computed if not finished else len(r.tokens), "max_new_tokens": r.max_new_tokens,
              "drafts": [] if finished else list(r.drafts), "finished": finished, "block_size": bs,
              "cache_layers": cache.num_layers, "target_layers": engine.target.num_layers,
              "kv_heads": spec.num_kv_heads, "head_size": spec.head_size, "storage_dtype": str(spec.storage_dtype),
              "layers": layers, "rows": n, "state_current": current, "junk_rows": len(junk),
              "rejected_rows_shipped": named}
    return Shipment(header, tensors)


def check_compatible(engine, header: dict) -> None:
    """The decode engine's cache must be the prefill engine's shape (block size may differ)."""
    spec = engine.cache.spec
    want = {"cache_layers": engine.cache.num_layers, "target_layers": engine.target.num_layers,
            "kv_heads": spec.num_kv_heads, "head_size": spec.head_size, "storage_dtype": str(spec.storage_dtype)}
    bad = [f"{k}: shipped {header[k]}, decode engine {v}" for k, v in want.items() if header[k] != v]
    if bad:
        raise ValueError("the shipment does not fit the decode engine's cache (" + "; ".join(bad) +
                         "); build both engines on the same target, head and cache_dtype")
    check_exportable(engine)


def check_scales(engine, tensors: dict) -> None:
    """An fp8 shipment's rows are read under the prefill cache's scales: the decode cache's must be
    the same, layer by layer (nwor_lab.kv.PagedKVCache.set_scales), or the rows mean other values."""
    if "k_scale" not in tensors:
        return
    cache = engine.cache
    for name, mine in (("k_scale", cache.k_scale), ("v_scale", cache.v_scale)):
        bad = (tensors[name].to(mine.device) != mine).any(-1).nonzero().flatten().tolist()
        if bad:
            raise ValueError(f"the shipment's {name} differs from the decode cache's in layers {bad}: fp8 rows "
                             f"are values only under their scales; set the decode cache's scales "
                             f"(cache.set_scales) to the prefill cache's")


def install(engine, shipment: Shipment, *, sampler_stream: bool = True) -> object:
    """Queue the shipped request on the decode `engine` -> its Request (None for a request that
    finished in its prefill step: nothing to decode). `sampler_stream`: continue the prefill engine's
    random stream (T > 0 exactness needs it; see docs/handoff.md)."""
    h, t = shipment.header, shipment.tensors
    check_compatible(engine, h)
    check_scales(engine, t)
    if sampler_stream:
        try:
            engine.generator.set_state(t["generator"])
        except RuntimeError as err:     # a CPU generator's state in a CUDA generator, or the reverse
            raise ValueError(f"the shipped sampler state does not fit the decode engine's generator on "
                             f"{engine.device} ({err}); hand off between engines on the same kind of device, "
                             f"or install(..., sampler_stream=False) (T > 0 is then not one engine's tokens)") from err
    if h["finished"]:
        return None
    r = engine.add_request(h["prompt"], h["max_new_tokens"])
    r.output, r.num_computed, r.drafts = list(h["output"]), h["num_computed"], list(h["drafts"])
    probs = t.get("draft_probs")
    r.draft_probs = None if probs is None else probs.to(engine.device)
    bs = engine.cache.spec.block_size
    num_blocks = -(-h["num_computed"] // bs)
    spec = engine.cache.spec
    keys, values = [], []
    # rows that arrived on the decode engine's device (CUDA IPC) are assembled there; others on the host
    dev = next((x.device for n, x in t.items() if n.startswith("key.")), torch.device("cpu"))
    dev = dev if dev.type == engine.cache.device.type else torch.device("cpu")
    for layer in range(engine.cache.num_layers):
        k = torch.zeros(num_blocks * bs, spec.num_kv_heads, spec.head_size, dtype=spec.storage_dtype, device=dev)
        v = torch.zeros_like(k)
        if f"key.{layer}" in t:       # rows past the block's end (another block size) cannot be shipped
            rows = min(h["rows"], num_blocks * bs)
            k[:rows], v[:rows] = t[f"key.{layer}"][:rows], t[f"value.{layer}"][:rows]
        keys.append(k.view(num_blocks, bs, spec.num_kv_heads, spec.head_size))
        values.append(v.view(num_blocks, bs, spec.num_kv_heads, spec.head_size))
    state = None
    if "state.recurrent" in t:
        if engine.states is None:
            raise ValueError("the shipment carries a hybrid target's state; the decode engine's target has none")
        state = (t["state.recurrent"], t["state.conv"], h["state_current"])
    r.swapped = SwappedOut(keys, values, num_blocks, state, shipment.kv_bytes)
    return r


def differing_rows(shipment: Shipment, reference: Shipment, *, junk: bool = False) -> list[dict]:
    """The committed rows of `shipment` that are not `reference`'s bytes (e.g. target-only's: an
    engine without a head, k = 0, prefilling the same prompt): `[{layer, position, block, store}]`
    over the layers and committed positions both shipped, `block` the block's index in the request
    (position // block_size). Empty when every shared committed row arrived as the reference's.
    `junk`: compare every row both shipped, the rows past num_computed too (what a content hash or
    a dedup of whole shipped blocks would see)."""
    n = min(shipment.header["rows"], reference.header["rows"])
    if not junk:
        n = min(n, shipment.header["num_computed"], reference.header["num_computed"])
    bs = shipment.header["block_size"]
    out = []
    for layer in sorted(set(shipment.header["layers"]) & set(reference.header["layers"])):
        for kind in ("key", "value"):
            a, b = shipment.tensors[f"{kind}.{layer}"][:n], reference.tensors[f"{kind}.{layer}"][:n]
            diff = (a.view(torch.uint8) != b.view(torch.uint8)).reshape(n, -1).any(-1)
            for p in diff.nonzero().flatten().tolist():
                out.append({"layer": layer, "position": p, "block": p // bs, "store": kind})
    return out
