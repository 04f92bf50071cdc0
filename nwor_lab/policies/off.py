"""`off`: vLLM today. Every scheduled token's K/V goes straight into the paged cache; rejected
drafts stay there as garbage until later tokens overwrite their slots."""
from __future__ import annotations

from nwor_lab.policies.policy import WritePolicy
from nwor_lab.ops import use_cuda, write_kv
from nwor_lab.ops.write_kv import slot_destination, write_rows


class OffPolicy(WritePolicy):
    """Declares the defaults: the window is read from the cache, rejected slots keep garbage."""

    _dest = None            # torch path: (slots, their version, (rows, block, offset)), made once for all the
                            # window's layers; kept with the slot tensor itself and its version (a static
                            # window of a graphed step is refilled in place between steps)

    def _write(self, layer, key, value, token_offset) -> None:
        n = key.shape[0]
        c = self.cache          # write() checked the layer: the cache's own view lists, no re-check
        k_cache, v_cache = c._layers[layer]
        k_scale, v_scale = c._scales[layer] if c.is_fp8 else (None, None)
        slots = self.window.slot_mapping
        whole = not token_offset and n == slots.shape[0]
        native = c.native_writes(layer, layer + 1)
        if native is not None:                      # the cache owner's op (vLLM's), same bytes; skips slot -1
            native[0](key, value, slots if whole else slots[token_offset:token_offset + n])
            return
        if whole and not use_cuda(key, self.config.backend):   # the reference, its index work shared by layers
            if self._dest is None or self._dest[0] is not slots or self._dest[1] != slots._version:
                self._dest = (slots, slots._version, slot_destination(slots, c.num_slots, c.spec.block_size))
            write_rows(key, value, k_cache, v_cache, self._dest[2], k_scale, v_scale)
            return
        if not whole:                             # a chunk; a whole window needs no slicing op
            slots = slots[token_offset:token_offset + n]
        # begin() checked the slots and write() the tensors: skip the op's own checks (host time)
        write_kv(key, value, k_cache, v_cache, slots, k_scale, v_scale, backend=self.config.backend, trusted=True)

    def _bytes(self, acceptance, kept) -> dict:
        return {"bytes_written": self._valid_rows_written() * self.cache.spec.bytes_per_token_layer}
