"""nwor_lab — No-Write-On-Reject (NWOR) for EAGLE speculative decoding, as a lab.

Sub-packages (each small, one job):
  kv      paged KV cache: layouts, block tables, slot mapping, fp8 scales
  ops     kernels: torch references (CPU and GPU) and the JIT-built CUDA extension
  window       the verify window (which token is which draft) and its Acceptance
  speculative  SpecDecodeMetadata, rejection sampler, SCV acceptance masks
  policies     the write policies `off` / `cow` / `stage` behind one interface
  model   tiny Llama with paged attention, EAGLE draft head, checkpoint loaders
  engine  batch scheduler and the speculative decoding loop
"""
__version__ = "0.1.0"

from nwor_lab.config import LabConfig  # noqa: E402

__all__ = ["LabConfig", "__version__"]
