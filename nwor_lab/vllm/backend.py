"""vLLM's CPU attention backend with the lab's write policies behind its two entry points.

`register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_CLS)` (plugin.py) makes vLLM build
this class wherever it would build `CPUAttentionBackend`. Without an active `NworRuntime` (the
engine was not configured for the plugin, or a forward outside a step) both methods are vLLM's.

    do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)   # per layer, before forward
        -> runtime.write(...): the policy writes (off, cow) or stages (stage) the rows
    forward(layer, query, key, value, kv_cache, attn_metadata, output)
        -> runtime.staged_metadata(...) when the policy keeps the window in its buffer (stage):
           the window copied into staging blocks (staging.py), vLLM's C++ kernel over them; when
           that cannot serve, runtime.attend(...): the cache prefix plus the staged rows with the
           lab's torch attention; else vLLM's C++ kernel as it is
"""
from __future__ import annotations

import functools

from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl
from vllm.v1.attention.backend import AttentionType

from nwor_lab.vllm.settings import NworSettings

class NworCPUAttentionBackendImpl(CPUAttentionBackendImpl):
    nwor = None       # the worker's NworRuntime, set on each layer's impl by the worker (worker.py)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from vllm.config import get_current_vllm_config
        vllm_config = get_current_vllm_config()
        settings = NworSettings.from_vllm_config(vllm_config)   # bad values: refused here
        if settings is not None:
            from nwor_lab.vllm.guards import require_worker
            require_worker(vllm_config)          # never silently inactive: the hooks live in the worker
        if settings is not None and self.attn_type == AttentionType.DECODER:
            unsupported = [what for what, bad in (("sliding_window", self.sliding_window != -1),
                                                  ("alibi_slopes", self.alibi_slopes is not None),
                                                  ("logits_soft_cap", bool(self.logits_soft_cap)),
                                                  ("sinks", self.sinks is not None)) if bad]
            if unsupported:
                raise ValueError(f"nwor_lab.vllm: the model's attention uses {', '.join(unsupported)}, which the "
                                 f"lab's verify attention (stage) does not implement; remove "
                                 f"additional_config['nwor_lab'] for this model")

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        rt = self.nwor
        if rt is not None and rt.active and self.attn_type == AttentionType.DECODER:
            md = functools.partial(_metadata_of, layer.layer_name)     # read only when the runtime needs it
            if rt.write(layer.layer_name, key, value, slot_mapping, md):
                return
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        rt = self.nwor
        if rt is not None and attn_metadata is not None and self.attn_type == AttentionType.DECODER:
            staged = rt.staged_metadata(layer.layer_name, attn_metadata)
            if staged is not None:          # stage: vLLM's kernel over the staging blocks
                attn_metadata = staged
            elif rt.attend(layer.layer_name, query[:attn_metadata.num_actual_tokens], attn_metadata,
                           self.scale, output):
                return output
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                               output_block_scale)


def _metadata_of(layer_name: str):
    from vllm.model_executor.layers.attention.attention import get_attention_context
    return get_attention_context(layer_name)[0]


class NworCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"             # vLLM's name: code that checks the backend by name still sees it

    @staticmethod
    def get_impl_cls():
        return NworCPUAttentionBackendImpl
