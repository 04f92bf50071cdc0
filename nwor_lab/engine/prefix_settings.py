"""Prefix caching's settings (`PrefixCacheConfig`, spelled as text in `LabConfig.prefix_cache`) and
what it refuses by name (`check_supported`): sliding windows and rings, and a hybrid target under a
state strategy whose live state keeps rejected drafts (`off`) while drafting.
"""
from __future__ import annotations

from dataclasses import dataclass

from nwor_lab.config import PREFIX_CACHE_KEYS, prefix_cache_spelling
from nwor_lab.engine.offload import OFFLOADS
from nwor_lab.engine.prefix_strategies import HEAD_CACHES, LOOKAHEADS


@dataclass(frozen=True)
class PrefixCacheConfig:
    """Prefix caching's settings: `head_cache` one of HEAD_CACHES, `lookahead` one of LOOKAHEADS;
    `host_blocks` block slots of host memory that evicted cached blocks go to (0: no host tier) and
    `offload` what goes with them, one of engine.offload.OFFLOADS."""
    head_cache: str = "cached"
    lookahead: str = "boundary"
    host_blocks: int = 0
    offload: str = "target_head"

    def __post_init__(self):
        for field, table in (("head_cache", HEAD_CACHES), ("lookahead", LOOKAHEADS), ("offload", OFFLOADS)):
            value = getattr(self, field)
            if value not in table:
                raise ValueError(f"PrefixCacheConfig.{field}={value!r}: choose one of {', '.join(table)}")
        if isinstance(self.host_blocks, bool) or not isinstance(self.host_blocks, int) or self.host_blocks < 0:
            raise ValueError(f"PrefixCacheConfig.host_blocks={self.host_blocks!r}: a number of host block slots, "
                             f">= 0 (0: no host tier)")

    @classmethod
    def from_settings(cls, name: str, text: str, settings: dict) -> "PrefixCacheConfig":
        """From `LabConfig.prefix_cache`'s parsed `settings` (the keys given; the rest default): a bad
        strategy name is a ValueError naming `name` (the field), its `text` and the choices."""
        try:
            return cls(**settings)
        except ValueError as err:
            raise ValueError(f"{name}={text!r}: {err}") from None

    @property
    def spelling(self) -> str:
        """The canonical `LabConfig.prefix_cache` text of these settings (every key)."""
        return prefix_cache_spelling({k: getattr(self, k) for k in PREFIX_CACHE_KEYS})


def check_supported(engine) -> None:
    """Refuse what prefix caching does not cover here, by name (ValueError)."""
    if engine.states is not None and engine.drafting and not engine.states.commits_accepted_only:
        raise ValueError(f"prefix_cache with a hybrid target under state_mode={engine.config.state_mode!r}: its live "
                         f"state keeps rejected drafts' rows, so the state at a block end holds them once any "
                         f"window has rejected (only blocks before the first rejection could be checkpointed); "
                         f"use a strategy that commits accepted rows only (stage, snapshots, cow, replay)")
    if engine.config.sliding_window:
        raise ValueError(f"prefix_cache with sliding_window={engine.config.sliding_window}: not built; a ring "
                         f"overwrites its blocks as positions advance, so a block is not final at commit, and "
                         f"even a whole-context sliding cache would share blocks whose keys later queries never "
                         f"read; use sliding_window=0")
