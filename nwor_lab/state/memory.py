"""What each state strategy holds per request, from the strategies' own declarations.

`memory_rows(spec, k)` -> one dict per strategy: `strategy`, `state_bytes_steady` (held for the
request's life), `state_bytes_window` (steady + what is held only while a window is open),
`rows_per_slot`. `qwen3_next_spec()` is the linear-attention shape of Qwen3-Next-80B-A3B (48 layers,
36 of them gated DeltaNet; 16 key heads, 32 value heads, K = V = 128, conv width 4, bf16), the
shape where the choice costs gigabytes at batch 32 and beyond.
"""
from __future__ import annotations

import torch

from nwor_lab.state.policy import StatePolicy
from nwor_lab.state.store import RecurrentSpec


def qwen3_next_spec(dtype=torch.bfloat16) -> RecurrentSpec:
    """Qwen3-Next-80B-A3B's `config.json`: linear_num_key_heads 16, linear_num_value_heads 32,
    linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4, 48 layers with
    full_attention_interval 4 (36 linear)."""
    nk, nv, d = 16, 32, 128
    return RecurrentSpec(num_layers=36, num_heads=nv, head_k_dim=d, head_v_dim=d,
                         conv_dim=2 * nk * d + nv * d, conv_width=4, dtype=dtype)


def memory_rows(spec: RecurrentSpec, k: int, policies: dict[str, type[StatePolicy]] | None = None) -> list[dict]:
    if policies is None:
        from nwor_lab.state.registry import STATE_POLICIES as policies
    rows = []
    for name, cls in policies.items():
        steady = cls.steady_bytes_per_request(k, spec)
        rows.append({"strategy": name, "k": k, "rows_per_slot": cls.rows_per_slot(k),
                     "state_bytes_steady": steady,
                     "state_bytes_window": steady + cls.transient_bytes_per_request(k, spec)})
    return rows
