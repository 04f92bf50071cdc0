"""`off`: vLLM today. Every scheduled token's K/V goes straight into the paged cache; rejected
drafts stay there as garbage until later tokens overwrite their slots."""
from __future__ import annotations

from nwor_lab.policies.policy import WritePolicy
from nwor_lab.ops import write_kv


class OffPolicy(WritePolicy):
    """Declares the defaults: the window is read from the cache, rejected slots keep garbage."""

    def _write(self, layer, key, value, token_offset) -> None:
        n = key.shape[0]
        c = self.cache          # write() checked the layer: the cache's own view lists, no re-check
        k_cache, v_cache = c._layers[layer]
        k_scale, v_scale = c._scales[layer] if c.is_fp8 else (None, None)
        slots = self.window.slot_mapping
        if token_offset or n != slots.shape[0]:   # a chunk; a whole window needs no slicing op
            slots = slots[token_offset:token_offset + n]
        # begin() checked the slots and write() the tensors: skip the op's own checks (host time)
        write_kv(key, value, k_cache, v_cache, slots, k_scale, v_scale, backend=self.config.backend, trusted=True)

    def _bytes(self, acceptance, kept) -> dict:
        return {"bytes_written": self._valid_rows_written() * self.cache.spec.bytes_per_token_layer}
