"""vLLM's EAGLE-1 Llama head, with the `fc.bias` that EAGLE-1 checkpoints carry.

vLLM 0.32's `llama_eagle.LlamaModel` builds `fc` (2 x hidden -> hidden) with `bias=False`, and its
weight loader silently skips the checkpoint's `fc.bias`: the head then drafts with a different
function than it was trained as (tokens stay right; on the shipped pair EAGLE-1's mean accepted
length fell from the lab's 4.03 to 3.12). The plugin registers this class under
`EagleLlamaFcBiasForCausalLM` (vLLM's method "eagle" wants an architecture named "Eagle...");
`nwor_lab.vllm.checkpoints` writes that name into the head's config.json.
"""
from __future__ import annotations

from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.models.llama_eagle import EagleLlamaForCausalLM
from vllm.model_executor.models.utils import maybe_prefix


class EagleLlamaFcBiasForCausalLM(EagleLlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        old = self.model.fc
        hidden = self.config.hidden_size
        self.model.fc = ReplicatedLinear(input_size=2 * hidden, output_size=hidden, bias=True,
                                         params_dtype=vllm_config.model_config.dtype, quant_config=old.quant_config,
                                         prefix=maybe_prefix(maybe_prefix(prefix, "model"), "fc"),
                                         return_bias=False)
