"""Gated DeltaNet as a recurrence of the state store (nwor_lab.ops.gated_delta has the math).

Per-row inputs q, k `[T, H, K]`, v `[T, H, V]`, g (log decay), beta `[T, H]`; option `scale`
(default K^-1/2); state `[H, K, V]`. Identity: g = 0 and beta = 0, since then
S * exp(0) = S and the rank-one write is k (0 * (v - k^T S))^T = 0, so S passes bit for bit.
"""
from __future__ import annotations

from nwor_lab.ops.gated_delta import RECURRENT_MAX_ROWS, gated_delta_rule
from nwor_lab.state.recurrence import Recurrence


class GatedDeltaRecurrence(Recurrence):
    name = "gated_delta"
    inputs = ("q", "k", "v", "g", "beta")
    options = ("scale",)
    identity = {"g": 0.0, "beta": 0.0}
    # past it `gated_delta_rule` takes the chunked (prefill) form, which rounds differently
    max_token_rows = RECURRENT_MAX_ROWS

    def input_tails(self, spec):
        H, K, V = spec.num_heads, spec.head_k_dim, spec.head_v_dim
        return ((H, K), (H, K), (H, V), (H,), (H,))

    def run(self, state, inputs, options, keep_from, backend):
        """The G requests folded into the heads (each (request, head) pair is its own recurrence):
        state `[G, H, K, V]`, inputs `[G, s, H, ...]` -> (o `[G, s, H, V]`, kept `[G, n, H, K, V]`)."""
        G = state.shape[0]
        o, kept = gated_delta_rule(*map(self.fold_heads, inputs), state.flatten(0, 1), options.get("scale"),
                                   keep_from=keep_from, backend=backend)
        return self.unfold_heads(o, G), self.unfold_heads(kept, G)
