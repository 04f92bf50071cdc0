"""`off`: vLLM today. Every scheduled token's K/V goes straight into the paged cache; rejected
drafts stay there as garbage until later tokens overwrite their slots.

On a tree window (nwor_lab.speculative.tree_window) this is write-all + move (SGLang at page size > 1, TensorRT-LLM):
every node is written at position n + row, and commit copies the accepted path to n + 1 .. n + a
(`_move`: gather every accepted row first, then scatter, since one move's destination can be a
later move's source). Rejected rows stay behind the path, in its last block and beyond."""
from __future__ import annotations

from nwor_lab.policies.policy import WritePolicy
from nwor_lab.ops import log_slots, restore_slots, use_cuda, write_kv
from nwor_lab.ops.write_kv import slot_destination, write_rows


class OffPolicy(WritePolicy):
    """Declares the defaults: the window is read from the cache, rejected slots keep garbage."""

    state_counterpart = "off"   # the recurrent state advanced through every row, rejected ones too

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

    def _stacked(self):
        a, b = self.layers.start, self.layers.stop
        return self.cache.key[a:b], self.cache.value[a:b]

    def _commit(self, acceptance) -> None:
        moves = self.window.path_moves(acceptance.draft_mask)
        if moves is not None:
            self._move(*moves)

    def _move(self, src, dst) -> None:
        """Copy cache rows `src` -> `dst` `[n]` slots (-1: none) of the window's layers, raw bytes:
        two launches for all layers (gather into a log, restore from it)."""
        if self.cache.native_writes(self.layers.start, self.layers.stop) is not None:
            raise NotImplementedError("a tree window's compaction on a cache owned by vLLM: not built; use "
                                      "the lab's own cache")
        rows = log_slots(*self._stacked(), src, backend=self.config.backend, trusted=True)
        restore_slots(*self._stacked(), dst, *rows, backend=self.config.backend, trusted=True)
        self._moved = int((dst >= 0).sum()) if self.records else 0

    def _bytes(self, acceptance, kept) -> dict:
        bpt = self.cache.spec.bytes_per_token_layer
        moved = getattr(self, "_moved", 0) * len(self.layers) * bpt
        self._moved = 0
        out = {"bytes_written": self._valid_rows_written() * bpt}
        if moved:
            out["bytes_moved"] = moved
        return out
