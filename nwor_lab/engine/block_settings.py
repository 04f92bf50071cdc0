"""The engine's prefix caching and preemption settings, from its LabConfig and its keywords, decided
once when the engine is built (`SpecEngine(..., prefix_cache=, preemption=)`).

Which wins: a keyword object (`PrefixCacheConfig`, `Preemption`) wins over its LabConfig field left
at the default (`prefix_cache=""`, `preemption="recompute"`); a field set to something else and a
keyword that says otherwise are a contradiction, refused with a ValueError naming both. Without the
keyword the field decides. The engine's config is then spelled as what runs (`settled_config`), so
a printed `engine.config` shows the prefix cache and preemption in effect.
"""
from __future__ import annotations

from nwor_lab.config import LabConfig
from nwor_lab.engine.preemption import Preemption, check_preemption
from nwor_lab.engine.prefix_settings import PrefixCacheConfig

_DEFAULT = LabConfig()


def prefix_cache_for(config: LabConfig, given) -> PrefixCacheConfig | None:
    """The engine's PrefixCacheConfig (None: off) from `config.prefix_cache` and the keyword `given`."""
    if given is not None and not isinstance(given, PrefixCacheConfig):
        raise TypeError(f"prefix_cache: expected a PrefixCacheConfig (nwor_lab.engine.prefix) or None, "
                        f"got {type(given).__name__}")
    settings = config.prefix_cache_settings
    field = None if settings is None else PrefixCacheConfig.from_settings("LabConfig.prefix_cache",
                                                                          config.prefix_cache, settings)
    if given is None:
        return field
    if field is not None and field != given:
        raise ValueError(f"prefix_cache={given!r} contradicts LabConfig.prefix_cache={config.prefix_cache!r} "
                         f"({field.spelling}); give one of them (or the same settings in both)")
    return given


def preemption_for(config: LabConfig, given) -> Preemption:
    """The engine's Preemption from `config.preemption` and the keyword `given`."""
    if given is None:
        return Preemption(config.preemption)
    given = check_preemption(given)
    if config.preemption != _DEFAULT.preemption and config.preemption != given.mode:
        raise ValueError(f"preemption=Preemption({given.mode!r}) contradicts LabConfig.preemption="
                         f"{config.preemption!r}; give one of them (or the same mode in both)")
    return given


def settled_config(config: LabConfig, prefix_cache: PrefixCacheConfig | None, preemption: Preemption) -> LabConfig:
    """`config` with `prefix_cache` and `preemption` spelled as what the engine runs."""
    spelling = "" if prefix_cache is None else prefix_cache.spelling
    if config.prefix_cache == spelling and config.preemption == preemption.mode:
        return config
    return config.replace(prefix_cache=spelling, preemption=preemption.mode)
