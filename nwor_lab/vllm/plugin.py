"""What the plugin's two entry points do in each vLLM process (see the package doc):
`register` (`vllm.general_plugins`) and `platform_plugin` (`vllm.platform_plugins`), and the
check that an engine configured for the plugin really runs its worker (`require_worker`)."""
from __future__ import annotations

import logging

from nwor_lab.config import env_bool
from nwor_lab.vllm.guards import check_version, require_worker, vllm_version  # noqa: F401
from nwor_lab.vllm.names import (BACKEND_CLS, EAGLE1_ARCH, EAGLE1_CLS, LOGGER, PLATFORM_CLS,  # noqa: F401
                                 SUPPORTED_VLLM, VLLM_CPU_WORKER_CLS, WORKER_CLS)


log = logging.getLogger(LOGGER)
VLLM_CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"
_registered = False


def register() -> None:
    """Idempotent. The backend override and the head class do nothing unless an engine is
    configured for the plugin; the expand fix is on whenever the plugin is installed."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        check_version()
    except RuntimeError as e:
        # A plugin must not break an engine it was not asked to change: say why and stand down.
        log.warning("%s", e)
        return
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_CLS)
    ModelRegistry.register_model(EAGLE1_ARCH, EAGLE1_CLS)
    if env_bool("NWOR_LAB_VLLM_EXPAND_FIX", True):
        from nwor_lab.vllm.expand_fix import install
        install()


def platform_plugin() -> str | None:
    """vLLM asks every platform plugin whether it applies (possibly twice); the plugin's platform
    applies exactly where vLLM's own detection picks its plain CPU platform, on the vLLM version
    the hooks were read from. Elsewhere (a GPU build, AMD Zen with zentorch, another version) it
    stands down and `require_worker` refuses engines configured for the plugin."""
    try:
        check_version()
        from vllm.platforms import cpu_platform_plugin
        return PLATFORM_CLS if cpu_platform_plugin() == VLLM_CPU_PLATFORM else None
    except Exception:          # never break vLLM's platform detection
        return None


