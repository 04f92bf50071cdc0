"""Which sliding-window cache an engine keeps, and what it costs per request.

`LabConfig.sliding_window` (W) and `LabConfig.kv_ring` pick the cache; the write policy is the
other half of a strategy (`strategy_name`: "off+ring", "off+slack", "off+full", "off+guard",
"cow+ring", "stage+ring", ...):

    ring   W slots per request and layer        exact iff the policy keeps a ring exact
    slack  W + k slots, every row written       exact (llama.cpp sizes its SWA cache so)
    full   no ring, the whole context           exact; memory grows with the context
    guard  W slots, drafts cut to what is safe  exact; speculation stops once the ring wraps (mlx-lm)
    auto   ring if `policy.keeps_ring_exact()`, else slack
"""
from __future__ import annotations

from dataclasses import dataclass

from nwor_lab.kv.ring import SlidingWindow


def resolve_kv_ring(config, policy_cls) -> str:
    """The cache `config.kv_ring` means for `policy_cls` ("auto" decided by what it declares)."""
    if config.kv_ring == "auto":
        return "ring" if policy_cls.keeps_ring_exact() else "slack"
    return config.kv_ring


def sliding_window_for(config, k: int, policy_cls) -> SlidingWindow | None:
    """The engine's SlidingWindow (None: `config.sliding_window` is 0, whole-context attention)."""
    w = config.sliding_window
    if not w:
        return None
    ring = resolve_kv_ring(config, policy_cls)
    if ring == "full":
        return SlidingWindow(w, None)
    if ring == "slack":
        return SlidingWindow(w, w + k)
    return SlidingWindow(w, w, guard=ring == "guard")


def exact_by_design(config, policy_cls) -> bool:
    """Whether greedy speculative decoding must give the target-only tokens under this strategy:
    always without a sliding window or with slack / full / guard; on a bare ring only when the
    policy keeps it exact (a write-all policy evicts positions its own queries still need)."""
    if not config.sliding_window:
        return True
    return resolve_kv_ring(config, policy_cls) != "ring" or policy_cls.keeps_ring_exact()


def strategy_name(config, policy_cls) -> str:
    """"<nwor_mode>+<kv_ring>" (resolved), or the write policy alone without a sliding window."""
    if not config.sliding_window:
        return config.nwor_mode
    return f"{config.nwor_mode}+{resolve_kv_ring(config, policy_cls)}"


@dataclass(frozen=True)
class KVMemory:
    """KV memory of one request (all layers, target and head): what it keeps for its whole life,
    and what the policy holds only while a window is open.

    slots:            positions kept per layer (a ring: its slots; else the request's positions)
    allocated_slots:  slots of the blocks it holds per layer (slots rounded up to whole blocks)
    persistent_bytes: allocated_slots x layers x bytes per token and layer
    transient_bytes:  staging rows (stage) or log rows (cow) per speculative window
    """

    slots: int
    allocated_slots: int
    persistent_bytes: int
    transient_bytes: int

    def as_dict(self) -> dict:
        return dict(slots=self.slots, allocated_slots=self.allocated_slots,
                    persistent_bytes=self.persistent_bytes, transient_bytes=self.transient_bytes)


def kv_memory(spec, sliding: SlidingWindow | None, policy_cls, k: int, positions: int) -> KVMemory:
    """Per-request KV memory for a request that reaches `positions` positions (prompt + new tokens
    + k lookahead) on a cache of `spec`."""
    slots = positions if sliding is None or sliding.ring_slots is None else sliding.ring_slots
    bs = spec.block_size
    allocated = -(-slots // bs) * bs
    transient = policy_cls.transient_bytes_per_request(k, spec) if k else 0
    return KVMemory(slots, allocated, allocated * spec.num_layers * spec.bytes_per_token_layer, transient)
