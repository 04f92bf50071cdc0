"""The lab's kernels. Each has a torch reference (CPU and GPU), an input generator
(`nwor_lab.ops.generators`) and a CUDA implementation in `csrc/` (JIT-built on first use), except
`verify_attention`, whose GPU implementation is a Triton kernel (triton imported on first use).

`backend(device)` says which implementation runs and why.
"""
from nwor_lab.ops.backend import BackendInfo, backend, use_cuda
from nwor_lab.ops.commit import commit, commit_reference
from nwor_lab.ops.scv import scv_mask, scv_mask_reference
from nwor_lab.ops.slots import (layer_pointers, log_slots, log_slots_reference, restore_slots,
                                restore_slots_reference)
from nwor_lab.ops.verify_attention import verify_attention, verify_attention_reference
from nwor_lab.ops.write_kv import write_kv, write_kv_reference

__all__ = ["BackendInfo", "backend", "use_cuda", "write_kv", "write_kv_reference", "layer_pointers", "log_slots",
           "log_slots_reference", "restore_slots", "restore_slots_reference", "commit", "commit_reference",
           "scv_mask", "scv_mask_reference", "verify_attention", "verify_attention_reference"]
