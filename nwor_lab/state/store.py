"""The recurrent and conv state of a hybrid model's linear-attention layers: a store of the cache.

Per request, one **state slot** (as a request holds block-table rows for its K/V): in every
linear-attention layer `l` the slot holds

    recurrent[l, slot, row]   [H, K, V] float32   the recurrence's state after the committed tokens
                                                  (its shape is the spec's recurrence's: recurrence.py)
    conv[l, slot, row]        [W-1, C]            the last W-1 inputs of the short causal conv,
                                                  oldest first (model dtype)

`row` is one of `rows_per_slot` rows; `current[slot]` says which holds the committed state. Every
strategy but `snapshots` keeps one row per slot; `snapshots` keeps k+1 (one per window position)
and commits by moving `current` (vLLM's "block-table column num_accepted - 1"). A store may keep
one `scratch_slot` for the padding requests of a captured step (a bucket padded to more requests
than run): they have no rows, so their state passes unchanged, and no request reads it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nwor_lab.state.gated_delta import GatedDeltaRecurrence
from nwor_lab.state.recurrence import Recurrence


@dataclass(frozen=True)
class RecurrentSpec:
    """The shape of one request's state in every linear-attention layer.

    num_layers   L   linear-attention layers
    num_heads    H   heads (the state has one [K, V] matrix per head)
    head_k_dim   K, head_v_dim V   gated DeltaNet: key and value size; Mamba2: state size N, head dim P
    conv_dim     C   channels of the short conv (gated DeltaNet: 2 * key heads * K + H * V, q, k, v mixed)
    conv_width   W   the conv's kernel width (its state keeps W - 1 inputs)
    dtype            the conv state's (and the layer inputs') dtype; the recurrent state is float32
    recurrence       what advances the state (nwor_lab.state.recurrence; default gated DeltaNet)
    """

    num_layers: int
    num_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_dim: int
    conv_width: int
    dtype: torch.dtype = torch.float32
    recurrence: Recurrence = GatedDeltaRecurrence()

    def __post_init__(self) -> None:
        if not isinstance(self.recurrence, Recurrence):
            raise TypeError(f"RecurrentSpec.recurrence: expected a nwor_lab.state.Recurrence, got "
                            f"{type(self.recurrence).__name__}")
        for name in ("num_layers", "num_heads", "head_k_dim", "head_v_dim", "conv_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"RecurrentSpec.{name}={v!r}: expected an integer >= 1")
        if isinstance(self.conv_width, bool) or not isinstance(self.conv_width, int) or self.conv_width < 2:
            raise ValueError(f"RecurrentSpec.conv_width={self.conv_width!r}: expected an integer >= 2 "
                             f"(a width-1 conv keeps no state)")

    @property
    def state_shape(self) -> tuple[int, ...]:
        """One request's recurrent state in one layer (float32), as the recurrence shapes it."""
        return tuple(self.recurrence.state_shape(self))

    @property
    def state_bytes_layer(self) -> int:
        """One recurrent state (`state_shape`) float32."""
        return math.prod(self.state_shape) * 4

    @property
    def conv_bytes_layer(self) -> int:
        """One conv state [W-1, C]."""
        return (self.conv_width - 1) * self.conv_dim * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """One row (recurrent + conv state) over all L layers: what a request holds per row."""
        return self.num_layers * (self.state_bytes_layer + self.conv_bytes_layer)

    @property
    def token_input_bytes(self) -> int:
        """What one window row feeds the layers, over all L layers: the conv's input [C] and the
        recurrence's inputs (gated DeltaNet: q, k [H, K], v [H, V], g, beta [H], float32): what
        replay and cow keep."""
        return self.num_layers * (self.conv_dim * self.dtype.itemsize + self.recurrence.row_input_bytes(self))


class RecurrentStateStore:
    """`recurrent [L, S, P, *state_shape]` float32 (`[H, K, V]`), `conv [L, S, P, W-1, C]`, `current [S]`
    int64: S slots of P rows each (P = `rows_per_slot`). A fresh or `clear`ed slot holds zeros (an
    empty prefix)."""

    def __init__(self, spec: RecurrentSpec, num_slots: int, rows_per_slot: int = 1, device="cpu",
                 scratch_slot: int | None = None):
        if not isinstance(spec, RecurrentSpec):
            raise TypeError(f"spec: expected a nwor_lab.state.RecurrentSpec, got {type(spec).__name__}")
        for name, v in (("num_slots", num_slots), ("rows_per_slot", rows_per_slot)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: expected an integer >= 1")
        if scratch_slot is not None and not (isinstance(scratch_slot, int) and 0 <= scratch_slot < num_slots):
            raise ValueError(f"scratch_slot={scratch_slot!r}: a slot in 0..{num_slots - 1}, or None")
        self.spec = spec
        self.num_slots, self.rows_per_slot = num_slots, rows_per_slot
        # a slot no request owns: a padded (captured) step's padding requests all use it, so it may
        # appear several times in one window; what it holds is never read for a request
        self.scratch_slot = scratch_slot
        s = spec
        lead = (s.num_layers, num_slots, rows_per_slot)
        self.recurrent = torch.zeros(*lead, *s.state_shape, device=device)
        self.conv = torch.zeros(*lead, s.conv_width - 1, s.conv_dim, dtype=s.dtype, device=device)
        self.current = torch.zeros(num_slots, dtype=torch.long, device=device)

    @property
    def device(self) -> torch.device:
        return self.recurrent.device

    @property
    def nbytes(self) -> int:
        return self.recurrent.nbytes + self.conv.nbytes

    def clear(self, slot: int) -> None:
        """Empty the slot for a new request (the state of an empty prefix is zeros)."""
        self.recurrent[:, slot].zero_()
        self.conv[:, slot].zero_()
        self.current[slot] = 0

    def committed(self, slot: int, layer: int | None = None):
        """(recurrent, conv) of the slot's committed row: `[L, *state_shape]`, `[L, W-1, C]` (views), or
        one layer's `[*state_shape]`, `[W-1, C]`."""
        row = int(self.current[slot])
        if layer is None:
            return self.recurrent[:, slot, row], self.conv[:, slot, row]
        return self.recurrent[layer, slot, row], self.conv[layer, slot, row]
