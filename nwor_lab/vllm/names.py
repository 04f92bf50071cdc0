"""The plugin's names: what vLLM is told to load, and the versions its hooks were read from (a leaf
module: every module of the plugin imports it, it imports none of them)."""

SUPPORTED_VLLM = ("0.32.0",)          # the versions whose internals the hooks below were read from
BACKEND_CLS = "nwor_lab.vllm.backend.NworCPUAttentionBackend"
EAGLE1_ARCH = "EagleLlamaFcBiasForCausalLM"      # vLLM's method "eagle" wants an "Eagle..." name
EAGLE1_CLS = "nwor_lab.vllm.eagle_head:EagleLlamaFcBiasForCausalLM"
WORKER_CLS = "nwor_lab.vllm.worker.NworCPUWorker"
VLLM_CPU_WORKER_CLS = "vllm.v1.worker.cpu_worker.CPUWorker"     # what vLLM's CpuPlatform picks for "auto"
PLATFORM_CLS = "nwor_lab.vllm.platform.NworCpuPlatform"
LOGGER = "vllm.nwor_lab"        # under vLLM's logger: its handler, format and VLLM_LOGGING_LEVEL
