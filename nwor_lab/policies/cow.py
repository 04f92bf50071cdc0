"""`cow` (copy-on-write, the seed's PR #8): log the draft slots' old contents, write every token
like `off`, then restore the rejected drafts' slots from the log.

Logging happens once at `begin` for all the window's layers (one launch over the stacked cache,
`cache.key[layers]` is a view) and restoring once at `commit` (one launch), instead of the seed's
extra kernels per layer. After commit every rejected slot is bit-identical to its content
before the window.

On a ring cache (sliding windows) a draft's slot held an older position that the window's earlier
queries still need; the log holds exactly those rows, so attention reads them from `log_kv(layer)`
(`evicted_in_log`), and the restore puts them back for the next window.

On a tree window (nwor_lab.speculative.tree_window) the log covers the N node slots; commit gathers the accepted
path, restores every slot the path does not move into, then writes the path to n + 1 .. n + a
(three launches for all layers): every slot past the path holds what it held before the window.
"""
from __future__ import annotations

from nwor_lab.policies.off import OffPolicy
from nwor_lab.ops import log_slots, restore_slots


class CowPolicy(OffPolicy):
    preserves_rejected_slots = True   # restored from the log at commit
    evicted_in_log = True             # attention reads what the drafts' writes evicted from the log
    state_counterpart = "cow"         # checkpoint the state, restore and re-advance on reject

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._draft_slots = None   # [Dtot] slots of the open window's drafts
        self._log = None           # (key rows, value rows) saved at begin

    @classmethod
    def transient_bytes_per_request(cls, k: int, spec) -> int:
        return k * spec.num_layers * spec.bytes_per_token_layer   # the drafts' old rows, as stored

    @classmethod
    def launches_per_window(cls, num_layers: int) -> int:
        return num_layers + 2   # the writes, one log at begin, one restore at commit (all layers each)

    def _begin(self) -> None:
        self._draft_slots = self.window.draft_slots  # one gather per window, reused at commit
        self._log = log_slots(*self._stacked(), self._draft_slots, backend=self.config.backend,
                              trusted=True)

    def _logged_slots(self):
        return self._draft_slots

    def log_kv(self, layer: int):
        self._need_window("log_kv")
        if layer not in self.layers:
            raise ValueError(f"layer={layer}: this window was opened for layers {self.layers.start}.."
                             f"{self.layers.stop - 1}; its log holds only those")
        i = layer - self.layers.start
        return self._log[0][i], self._log[1][i]

    def _commit(self, acceptance) -> None:
        w = self.window
        moves = w.path_moves(acceptance.draft_mask)
        if moves is not None:
            # a tree: the log covers all N node slots; restore those the path does not move into,
            # then move the path (its rows gathered first: the restore may overwrite them)
            moved = log_slots(*self._stacked(), moves[0], backend=self.config.backend, trusted=True)
            restore_slots(*self._stacked(), w.restore_slots(acceptance), *self._log,
                          backend=self.config.backend, trusted=True)
            restore_slots(*self._stacked(), moves[1], *moved, backend=self.config.backend, trusted=True)
            self._moved = int((moves[1] >= 0).sum()) if self.records else 0
            self._log = None
            return
        rejected = self._draft_slots.masked_fill(acceptance.draft_mask, -1)  # accepted: nothing to restore
        c = self.cache
        native = c.native_writes(self.layers.start, self.layers.stop)
        if native is not None:
            # the cache owner's own row write (vLLM's C++ op), one per layer; slot -1 is skipped
            log_k, log_v = self._log
            slots = rejected.long()
            for i, write in enumerate(native):
                write(log_k[i], log_v[i], slots)
        else:
            restore_slots(*self._stacked(), rejected, *self._log, backend=self.config.backend, trusted=True)
        self._log = None

    def _cancel(self) -> None:
        self._log = None  # every written row stays, exactly as `off` leaves it

    def _bytes(self, acceptance, kept) -> dict:
        bpt, layers = self.cache.spec.bytes_per_token_layer, len(self.layers)
        real_drafts = (self.window.draft_slots >= 0)   # the window's (a CPU mirror after a replay)
        logged = int(real_drafts.sum()) * layers * bpt
        restored = 0 if acceptance is None else \
            int((self.window.restore_slots(acceptance) >= 0).sum()) * layers * bpt
        out = super()._bytes(acceptance, kept)
        out.update(bytes_logged=logged, bytes_restored=restored)
        return out
