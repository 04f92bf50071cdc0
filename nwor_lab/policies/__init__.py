"""The write policies behind one interface (policy.py): which K/V reach the paged cache, and when.

A new policy is one file (a `WritePolicy` subclass declaring its behaviour) plus one
`register_policy` line; the engine, the model, the invariants and the benchmarks only read what a
policy declares, never its name.
"""
from __future__ import annotations

from nwor_lab.config import LabConfig, Registry, check_config, nwor_modes
from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.policies.cow import CowPolicy
from nwor_lab.policies.observer import LogObserver, PhaseEvent, WindowObserver
from nwor_lab.policies.off import OffPolicy
from nwor_lab.policies.policy import WindowStateError, WritePolicy
from nwor_lab.policies.ring_ledger import RingCorruption, RingLedger
from nwor_lab.policies.stage import StagePolicy
from nwor_lab.window import Acceptance, Window

# name -> policy class; `register_policy(name, cls)` makes `cls` the policy `LabConfig(nwor_mode=name)`
# selects, and every flag and bench lists it (they read `config.nwor_modes()`, which it fills)
POLICIES: Registry = Registry(nwor_modes, WritePolicy, "register_policy")
register_policy = POLICIES.register

register_policy("off", OffPolicy)
register_policy("cow", CowPolicy)
register_policy("stage", StagePolicy)


def policy_class(config: LabConfig) -> type[WritePolicy]:
    """The write policy class `config.nwor_mode` names (what it declares decides `kv_ring='auto'`
    and `state_mode='auto'`)."""
    if config.nwor_mode not in POLICIES:
        raise ValueError(f"nwor_mode={config.nwor_mode!r}: no such write policy; registered: {', '.join(POLICIES)}")
    return POLICIES[config.nwor_mode]


def make_policy(config: LabConfig, cache: PagedKVCache, metrics: LabMetrics | None = None,
                records: bool = True, observers: list | None = None) -> WritePolicy:
    """The write policy `config.nwor_mode` for `cache` (one policy per cache, i.e. per device)."""
    config = check_config("config", config)
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache: expected a nwor_lab.kv.PagedKVCache, got {type(cache).__name__}")
    return policy_class(config)(cache, config, metrics, records=records, observers=observers)


__all__ = ["make_policy", "policy_class", "register_policy", "POLICIES", "WritePolicy", "OffPolicy", "CowPolicy",
           "StagePolicy", "Window", "Acceptance", "WindowStateError", "PhaseEvent", "WindowObserver",
           "LogObserver", "RingLedger", "RingCorruption"]
