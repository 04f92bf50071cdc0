"""`stage`: the window's K/V wait in a staging buffer; only accepted tokens reach the cache.

    staged_key, staged_value  [L, capacity, H, D]  model dtype, one pair per cache (= per device)

Zero-copy: `kv_destination(layer, offset, n)` hands the model views of the buffer rows, the K/V
projections write there, and `write` finds its rows already in place: no per-layer copy is
launched at all. (K/V that arrive from elsewhere, e.g. a test's tensors, are copied in.)
Attention reads the window from `window_kv(layer)` and the prefix from the cache; `commit` writes the accepted rows of every
layer in ONE launch (`ops.commit`), masking rejected rows in data (no host sync). Rejected slots
are never touched. On a tree window (nwor_lab.speculative.tree_window) the nodes wait in the buffer and the commit
writes the accepted path's rows to `window.commit_slots` (positions n + 1 .. n + a): the compaction
IS the commit, no extra launch. The buffer grows when a window needs more rows, before anything is written;
under CUDA-graph capture it cannot grow, so `reserve(max_tokens)` first.
"""
from __future__ import annotations

import torch

from nwor_lab._checks import capturing
from nwor_lab.policies.policy import WritePolicy
from nwor_lab.ops import commit, use_cuda, write_kv


class StagePolicy(WritePolicy):
    window_in_buffer = True           # attention reads the window from window_kv(layer)
    preserves_rejected_slots = True   # rejected rows are never written to the cache
    state_counterpart = "stage"       # window states transient, the accepted one committed

    def __init__(self, *args, initial_capacity: int = 64, **kwargs):
        super().__init__(*args, **kwargs)
        self.staged_key = self.staged_value = None   # [L, capacity, H, D]
        self._row_ids = None        # [capacity] int64: staging rows as slots of a one-block cache
        self._as_cache = []         # per layer: the staging buffers viewed as [1, capacity, H, D]
        self._window_rows = None    # [T] the open window's rows (whole-window writes reuse it)
        self.reserve(initial_capacity)

    @classmethod
    def transient_bytes_per_request(cls, k: int, spec) -> int:
        row = 2 * spec.num_kv_heads * spec.head_size * torch.empty((), dtype=spec.dtype).element_size()
        return (1 + k) * spec.num_layers * row    # the window's K and V, in the model dtype

    @classmethod
    def launches_per_window(cls, num_layers: int) -> int:
        return 1   # the model projects into the buffer (zero-copy); one commit of all layers

    @property
    def capacity(self) -> int:
        return self.staged_key.shape[1]

    def reserve(self, num_tokens: int) -> None:
        """Make room for windows of up to `num_tokens` tokens (rounded up to a power of two)."""
        if self.staged_key is not None and num_tokens <= self.capacity:
            return
        if capturing():
            raise RuntimeError(f"stage: a window of {num_tokens} tokens needs a bigger staging buffer "
                               f"(capacity {self.capacity}) but a CUDA graph is being captured; call "
                               f"policy.reserve(max_tokens) before capture")
        cap = 1 << max(0, int(num_tokens) - 1).bit_length()
        s = self.cache.spec
        shape = (s.num_layers, cap, s.num_kv_heads, s.head_size)
        self.staged_key = torch.zeros(shape, dtype=s.dtype, device=self.cache.device)
        self.staged_value = torch.zeros_like(self.staged_key)
        # On CUDA a layer's staging rows are written by the write_kv kernel, K and V in ONE launch:
        # each layer's buffer is a one-block "cache" [1, capacity, H, D] and the slots are row ids.
        self._row_ids = torch.arange(cap, device=self.cache.device)
        self._as_cache = [(self.staged_key[l][None], self.staged_value[l][None]) for l in range(s.num_layers)]
        # where each layer's row 0 lives, for the zero-copy test in _write (pointer compares only)
        self._row_bytes = s.num_kv_heads * s.head_size * self.staged_key.element_size()
        self._key_ptrs = [self.staged_key[l].data_ptr() for l in range(s.num_layers)]
        self._value_ptrs = [self.staged_value[l].data_ptr() for l in range(s.num_layers)]

    def _begin(self) -> None:
        self.reserve(self.window.num_tokens)
        self._window_rows = self._row_ids[:self.window.num_tokens]  # reused by every whole-window write

    def kv_destination(self, layer: int, token_offset: int, n: int):
        w = self.window
        if w is None or not self.layers.start <= layer < self.layers.stop or token_offset + n > w.num_tokens:
            return None          # write() will say what is wrong
        return self.staged_key[layer, token_offset:token_offset + n], \
            self.staged_value[layer, token_offset:token_offset + n]

    def _in_place(self, layer, key, value, token_offset) -> bool:
        """The rows already sit where they belong (the model projected into kv_destination)."""
        row = self._row_bytes
        return key.data_ptr() == self._key_ptrs[layer] + token_offset * row and \
            value.data_ptr() == self._value_ptrs[layer] + token_offset * row and key.is_contiguous() \
            and value.is_contiguous()

    def _write(self, layer, key, value, token_offset) -> None:
        if self._in_place(layer, key, value, token_offset):
            return
        n = key.shape[0]
        if use_cuda(key, self.config.backend):
            rows = self._window_rows if n == self._window_rows.shape[0] else \
                self._row_ids[token_offset:token_offset + n]
            write_kv(key, value, *self._as_cache[layer], rows, backend=self.config.backend, trusted=True)
        else:
            self.staged_key[layer, token_offset:token_offset + n].copy_(key)
            self.staged_value[layer, token_offset:token_offset + n].copy_(value)

    def window_kv(self, layer: int):
        t = self._need_window("window_kv").num_tokens
        self.cache._check_layer(layer)
        return self.staged_key[layer, :t], self.staged_value[layer, :t]

    def _commit(self, acceptance) -> None:
        # commit_slots: where each row belongs once accepted (a chain: where it would be written; a
        # tree: position n + depth, so the path lands compacted at n + 1 .. n + a in this one launch)
        for a, b in _runs(sorted(self._rows)):
            self._commit_layers(a, b, acceptance.commit_mask, self.window.commit_slots)

    def _cancel(self) -> None:
        # `off` would have written every row that arrived: flush those, layer by layer.
        t, dev = self.window.num_tokens, self.cache.device
        for layer, ranges in self._rows.items():
            written = torch.zeros(t, dtype=torch.bool)
            for a, b in ranges:
                written[a:b] = True
            self._commit_layers(layer, layer + 1, written.to(dev), self.window.slot_mapping)

    def _commit_layers(self, a: int, b: int, mask: torch.Tensor, slots: torch.Tensor) -> None:
        c = self.cache
        native = c.native_writes(a, b)
        if native is not None:
            # the cache owner's own row write (vLLM's C++ op, one per layer): a rejected row is slot -1
            t = self.window.num_tokens
            slots = slots.long().masked_fill(~mask, -1)
            for i, write in enumerate(native):
                write(self.staged_key[a + i, :t], self.staged_value[a + i, :t], slots)
            return
        ks, vs = (c.k_scale[a:b], c.v_scale[a:b]) if c.is_fp8 else (None, None)
        commit(self.staged_key[a:b], self.staged_value[a:b], c.key[a:b], c.value[a:b],
               slots, mask, ks, vs, backend=self.config.backend, trusted=True)

    def _bytes(self, acceptance, kept) -> dict:
        bpt, layers = self.cache.spec.bytes_per_token_layer, self._layers_written()
        valid = self._valid_rows_written()
        written = int(kept.sum()) * layers if acceptance is not None else valid
        return {"bytes_written": written * bpt, "bytes_skipped": (valid - written) * bpt}


def _runs(layers: list[int]):
    """Contiguous runs `[a, b)` of sorted layer ids: each run is one commit launch."""
    start = prev = None
    for layer in layers:
        if start is None:
            start = prev = layer
        elif layer == prev + 1:
            prev = layer
        else:
            yield start, prev + 1
            start = prev = layer
    if start is not None:
        yield start, prev + 1
