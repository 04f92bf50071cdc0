"""Mamba2's selective scan as a recurrence of the state store (nwor_lab.ops.selective_scan has the math).

A second plug-in beside gated DeltaNet: a spec built with `recurrence=Mamba2Recurrence()` gives a
store whose every strategy (off, snapshots, cow, replay, stage) runs the scan; nothing in the base
class or the strategies names it (tests/test_mamba2.py).

Per-row inputs x `[T, H, P]`, dt `[T, H]`, B, C `[T, H, N]`; options A `[H]` (required) and D `[H]`
(the skip, optional): per-head parameters, not rows. State `[H, N, P]`: the spec's `head_k_dim` is
N, its `head_v_dim` P, so the store's `[H, K, V]` layout holds it as is. Identity: dt = 0 (the
decay exp(0 * A) is exactly 1 and the write dt * B x^T is +-0).

The torch reference only (token by token, at any number of rows: no chunked form is dispatched,
so the device layout has no row bound of its own); `backend` is ignored. No Mamba2 model layer uses
it yet.
"""
from __future__ import annotations

import torch

from nwor_lab.ops.selective_scan import selective_scan_reference
from nwor_lab.state.recurrence import Recurrence


class Mamba2Recurrence(Recurrence):
    name = "mamba2"
    inputs = ("x", "dt", "B", "C")
    options = ("A", "D")
    identity = {"dt": 0.0}
    max_token_rows = 1 << 16

    def input_tails(self, spec):
        H, N, P = spec.num_heads, spec.head_k_dim, spec.head_v_dim
        return ((H, P), (H,), (H, N), (H, N))

    def check(self, spec, inputs, options, num_rows):
        super().check(spec, inputs, options, num_rows)
        for name, required in (("A", True), ("D", False)):
            t = options.get(name)
            if (required or t is not None) and not (torch.is_tensor(t) and tuple(t.shape) == (spec.num_heads,)):
                raise ValueError(f"recur: mamba2's option {name} (the layer's per-head "
                                 f"{'decay, < 0' if required else 'skip, optional'}) must be a "
                                 f"[H={spec.num_heads}] tensor, got {t!r:.60}")

    def run(self, state, inputs, options, keep_from, backend):
        """The G requests folded into the heads, the per-head A and D repeated to match: state
        `[G, H, N, P]`, inputs `[G, s, H, ...]` -> (y `[G, s, H, P]`, kept `[G, n, H, N, P]`)."""
        G = state.shape[0]
        x, dt, B, C = map(self.fold_heads, inputs)
        D = options.get("D")
        y, kept = selective_scan_reference(x, dt, options["A"].repeat(G), B, C, None if D is None else D.repeat(G),
                                           state.flatten(0, 1), keep_from)
        return self.unfold_heads(y, G), self.unfold_heads(kept, G)
