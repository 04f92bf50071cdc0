"""The contract between the model's attention and whoever owns the cache writes.

Attention calls, per layer of a forward pass:
    writer.kv_destination(layer, token_offset, n)   # (key, value) [n, H, D] views the projections
                                                    #   should write into, or None (zero-copy
                                                    #   staging: the stage policy's buffer rows)
    writer.write(layer, key, value, token_offset)   # this pass's K/V rows [n, H, D]
    writer.window_kv(layer)                         # (key, value) [T, H, D] of the open window,
                                                    #   only when writer.window_in_buffer
and reads the rest from the paged cache: positions before the window always, the window's own
positions too unless `window_in_buffer`. The write policies (nwor_lab.policies) implement this
(structurally: they need not import it);
`DirectWriter` is the plain "write into the cache" one, for forward passes without a policy.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from nwor_lab.ops import write_kv


@runtime_checkable
class KVWriter(Protocol):
    window_in_buffer: bool

    def kv_destination(self, layer: int, token_offset: int, n: int) -> tuple[torch.Tensor, torch.Tensor] | None: ...

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, token_offset: int = 0) -> None: ...

    def window_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None: ...


class DirectWriter:
    """Writes each row straight into the cache at `slot_mapping` [T] (-1: nothing); no window."""

    window_in_buffer = False

    def __init__(self, cache, slot_mapping: torch.Tensor):
        self.cache = cache
        self.slot_mapping = slot_mapping

    def kv_destination(self, layer: int, token_offset: int, n: int):
        return None

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, token_offset: int = 0) -> None:
        slots = self.slot_mapping[token_offset:token_offset + key.shape[0]]
        write_kv(key, value, *self.cache.layer(layer), slots, *self.cache.layer_scales(layer))

    def window_kv(self, layer: int):
        return None
