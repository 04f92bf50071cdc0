"""NWOR write policies: `off`, `cow`, `stage` behind one interface (see policy.py)."""
from __future__ import annotations

from nwor_lab.config import LabConfig
from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.metrics import LabMetrics
from nwor_lab.policies.cow import CowPolicy
from nwor_lab.policies.off import OffPolicy
from nwor_lab.policies.policy import WindowStateError, WritePolicy
from nwor_lab.policies.stage import StagePolicy
from nwor_lab.window import Window

POLICIES = {"off": OffPolicy, "cow": CowPolicy, "stage": StagePolicy}


def make_policy(config: LabConfig, cache: PagedKVCache, metrics: LabMetrics | None = None,
                records: bool = True) -> WritePolicy:
    """The write policy `config.nwor_mode` for `cache` (one policy per cache, i.e. per device)."""
    return POLICIES[config.nwor_mode](cache, config, metrics, records=records)


__all__ = ["make_policy", "POLICIES", "WritePolicy", "OffPolicy", "CowPolicy", "StagePolicy", "Window",
           "WindowStateError"]
