"""The write-policy interface shared by every mode (`off`, `cow`, `stage`, and any registered one).

Lifecycle of one window (per cache, i.e. per device):

    policy.begin(window, kind="verify")           # slots known, nothing written yet
    for layer in layers:                          # target layers and draft-head layers alike
        policy.write(layer, k, v, token_offset)   # [n, H, D] rows, in chunks if you like
        policy.window_kv(layer)                   # attention reads the window here when
                                                  #   policy.window_in_buffer, else from the cache
    record = policy.commit(acceptance)            # an Acceptance (nwor_lab.window); None: no drafts
    # on failure instead: policy.cancel()         # cache as `off` would have left it

A policy declares its behaviour in class attributes, so nothing outside the policies compares
mode names:
    window_in_buffer          the window's K/V wait in a buffer until commit: attention reads the
                              prefix from the cache and the window from `window_kv(layer)`
    preserves_rejected_slots  after commit every rejected slot is bit-identical to before the window
    evicted_in_log            the old contents of the window's draft slots wait in a log until commit:
                              on a ring cache (sliding windows), attention reads the positions those
                              writes evicted from `log_kv(layer)` instead of the overwritten slots
    state_counterpart         the state strategy (nwor_lab.state, by its registered name) that keeps a
                              hybrid model's recurrent state the way this policy keeps K/V: what
                              `LabConfig(state_mode="auto")` runs beside it (None: none; a hybrid
                              target then needs an explicit state_mode)
`keeps_ring_exact()` follows from these: whether a ring of exactly W slots stays correct under the
policy (nwor_lab.kv.ring says why a write-all window is not).
Every argument is checked before anything is written; slot checks run once, at `begin`.
Observers (`policy.observers`) see every phase (nwor_lab.policies.observer).
"""
from __future__ import annotations

import logging
from typing import ClassVar

import torch

from nwor_lab._checks import (FLOAT_DTYPES, INDEX_DTYPES, capturing, check_index, check_slots, check_tensor,
                              check_whole, same_device)
from nwor_lab.config import LabConfig, check_config
from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.metrics import LabMetrics, WindowRecord
from nwor_lab.policies.observer import PhaseEvent, check_observers
from nwor_lab.window import Acceptance, Window

log = logging.getLogger("nwor_lab.policies")


class WindowStateError(RuntimeError):
    """A lifecycle call in the wrong order (commit without begin, double commit, ...)."""


class WritePolicy:
    """Base class: window bookkeeping, argument checks, acceptance checks, records, events."""

    name: ClassVar[str] = "?"                       # the registry key (set by register_policy)
    window_in_buffer: ClassVar[bool] = False
    preserves_rejected_slots: ClassVar[bool] = False
    evicted_in_log: ClassVar[bool] = False
    state_counterpart: ClassVar[str | None] = None

    def __init__(self, cache: PagedKVCache, config: LabConfig | None = None,
                 metrics: LabMetrics | None = None, records: bool = True, observers: list | None = None):
        self.cache = cache
        self.config = LabConfig(nwor_mode=self.name) if config is None else check_config("config", config)
        self.metrics = metrics if metrics is not None else LabMetrics()
        self.records = records
        self.observers = observers if observers is not None else []   # WindowObserver objects
        self.window: Window | None = None
        self.kind = ""                           # what the open window is ("verify", "draft", ...)
        self.layers = range(cache.num_layers)   # layers the open window may write
        self.windows_done = 0
        # True while the engine's step body runs: the host makes the window's record after the
        # step's readback (`account`), so commit neither counts it in the metrics nor syncs for it
        self.deferred = False
        self._rows: dict[int, list[tuple[int, int]]] = {}   # layer -> written (start, end) ranges
        self._kv_shape = torch.Size((cache.spec.num_kv_heads, cache.spec.head_size))

    @classmethod
    def keeps_ring_exact(cls) -> bool:
        """Whether a ring of exactly W slots (no slack) stays exact under this policy: the window's
        queries never read a slot its own writes overwrote (the window waits in a buffer, or the
        evicted rows are read from a log), and after commit every rejected slot holds what it held
        before (the positions the next window still needs)."""
        return cls.preserves_rejected_slots and (cls.window_in_buffer or cls.evicted_in_log)

    @classmethod
    def transient_bytes_per_request(cls, k: int, spec) -> int:
        """Bytes the policy holds per speculative request (t_last + k drafts) only while a window
        is open, over all `spec.num_layers` layers (a staging buffer, a log). Default: none."""
        return 0

    @classmethod
    def launches_per_window(cls, num_layers: int) -> int:
        """Kernel launches the policy issues for a window over `num_layers` layers on the CUDA
        backend (what decides its cost at decode sizes: the write path is launch-bound).
        Default: one K+V write per layer."""
        return num_layers

    def reserve(self, num_tokens: int) -> None:
        """Make room for windows of up to `num_tokens` tokens now (before a CUDA graph capture,
        where nothing may be allocated). Policies without buffers have nothing to do."""

    # -- lifecycle ---------------------------------------------------------------------------
    def begin(self, window: Window, layers: range | None = None, *, kind: str = "") -> None:
        """Open a window. `layers`: the contiguous cache layers it will write (default: all), e.g.
        `range(N, N + 1)` for an EAGLE draft chain that only runs the head; CoW logs and restores
        just those, and a write to any other layer is an error. `kind` labels the window for
        observers and logs ("verify", "draft")."""
        if self.window is not None:
            raise WindowStateError("begin: a window is already open; commit() or cancel() it first")
        if not isinstance(window, Window):
            raise TypeError(f"window: expected nwor_lab.policies.Window, got {type(window).__name__}")
        if self.observers:
            check_observers("observers", self.observers)
        if not same_device(window.slot_mapping.device, self.cache.device):
            raise ValueError(f"window: slot_mapping is on {window.slot_mapping.device}, the cache on "
                             f"{self.cache.device}; build the window on the cache's device")
        check_slots("window.slot_mapping", window.slot_mapping, self.cache.num_slots,
                    self.config.validate, unique=True)
        n = self.cache.num_layers
        layers = range(n) if layers is None else layers
        if not isinstance(layers, range) or layers.step != 1 or len(layers) == 0 or layers.start < 0 \
                or layers.stop > n:
            raise ValueError(f"layers={layers!r}: give a non-empty range(start, stop) within the cache's "
                             f"{n} layers (contiguous, so one launch covers them)")
        self.window = window
        self.layers = layers
        self.kind = kind
        self._rows = {}
        self._begin()
        if self.config.debug:
            log.info("NWOR[%s] %s window %d begin: %d tokens, %d drafts over %d requests (drafts per "
                     "request %s)", self.name, kind or "a", self.windows_done, window.num_tokens,
                     window.num_drafts, window.num_reqs, window.num_draft_tokens)
        if self.observers:
            self._emit("begin", logged_slots=self._logged_slots())

    def kv_destination(self, layer: int, token_offset: int, n: int):
        """`(key, value)` `[n, H, D]` views where the model should project this pass's K/V rows so
        that `write` has nothing to copy (zero-copy staging), or None: project anywhere."""
        return None

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, token_offset: int = 0) -> None:
        """Rows `token_offset .. token_offset + n - 1` of the window's K/V `[n, H, D]` for `layer`."""
        w = self.window
        n = key.shape[0]
        # The hot path (every write of every layer: whole windows, and an EAGLE chain's one-row
        # chunks): a few attribute compares; any surprise takes the full checks, which name the
        # argument and the fix.
        if w is not None and type(layer) is int and self.layers.start <= layer < self.layers.stop \
                and type(token_offset) is int and 0 <= token_offset and 0 < n <= w.num_tokens - token_offset \
                and key.dtype is self.cache.spec.dtype and value.dtype is key.dtype \
                and key.shape[1:] == self._kv_shape and value.shape == key.shape \
                and key.device == self.cache.device and value.device == self.cache.device:
            ranges = self._rows.setdefault(layer, [])
            if not any(a < token_offset + n and token_offset < b for a, b in ranges):
                self._record_write(ranges, layer, key, value, token_offset)
                return
        self._write_checked(layer, key, value, token_offset)

    def _write_checked(self, layer, key, value, token_offset) -> None:
        w = self._need_window("write")
        self.cache._check_layer(layer)
        if layer not in self.layers:
            raise ValueError(f"layer={layer}: this window was opened for layers {self.layers.start}.."
                             f"{self.layers.stop - 1} (begin(window, layers=...))")
        spec = self.cache.spec
        shape = (None, spec.num_kv_heads, spec.head_size)
        check_tensor("key", key, shape=shape, dtypes=FLOAT_DTYPES, device=self.cache.device,
                     what="[num_tokens_in_chunk, num_kv_heads, head_size]")
        check_tensor("value", value, shape=tuple(key.shape), dtypes=(key.dtype,), device=self.cache.device,
                     what="(same shape and dtype as key)")
        if key.dtype != spec.dtype:
            raise TypeError(f"key: dtype {key.dtype} but the cache was built for {spec.dtype} (KVCacheSpec.dtype)")
        n = key.shape[0]
        token_offset = check_index("token_offset", token_offset, 0, w.num_tokens + 1, "a row of the window")
        if token_offset + n > w.num_tokens:
            raise ValueError(f"token_offset={token_offset!r} with {n} rows does not fit the window's "
                             f"{w.num_tokens} tokens")
        ranges = self._rows.setdefault(layer, [])
        if any(a < token_offset + n and token_offset < b for a, b in ranges):
            raise ValueError(f"layer {layer}: rows {token_offset}..{token_offset + n - 1} were already "
                             f"written in this window; each row is written once")
        self._record_write(ranges, layer, key, value, token_offset)

    def _record_write(self, ranges: list, layer: int, key, value, token_offset: int) -> None:
        """Rows checked: note them in `ranges` (the layer's written rows), write, tell observers."""
        end = token_offset + key.shape[0]
        ranges.append((token_offset, end))
        self._write(layer, key, value, token_offset)
        if self.observers:
            self._emit("write", layer=layer, rows=range(token_offset, end))

    def written_rows(self, layer: int) -> list[tuple[int, int]]:
        """The open window's rows written so far for `layer`, as sorted `[start, end)` ranges
        (empty: not written yet). What attention over a buffered window may read."""
        return sorted(self._rows.get(layer, ()))

    def window_kv(self, layer: int):
        """`(key, value)` `[T, H, D]` of the window for attention when `window_in_buffer`, else None
        (attention reads the window from the cache, where `write` put it)."""
        return None

    def log_kv(self, layer: int):
        """`(key, value)` `[Dtot, H, D]` in the cache's storage dtype (raw bytes): what each draft
        slot of `window.draft_slots` held before the window, when `evicted_in_log`; else None."""
        return None

    def commit(self, acceptance: Acceptance | None = None) -> WindowRecord | None:
        """Keep every non-draft token and the accepted drafts; drop the rejected ones.

        acceptance: the window's `Acceptance` (from SCV, `Acceptance.from_draft_mask`, ...);
        None only for a window without drafts. Checked for consistency (draft mask prefix-closed,
        accepted lengths and commit mask agreeing with it) before anything is written.
        """
        w = self._need_window("commit")
        acceptance = self._check_acceptance(w, acceptance)
        partial = [l for l, r in self._rows.items() if sum(b - a for a, b in r) != w.num_tokens]
        if partial:
            raise WindowStateError(f"commit: layers {partial} received only part of the window's "
                                   f"{w.num_tokens} rows; write the rest or cancel()")
        if self.observers:
            self._emit("acceptance", acceptance=acceptance)
        self._commit(acceptance)
        rec = self._finish(acceptance, cancelled=False)
        return rec

    def cancel(self) -> WindowRecord | None:
        """Abandon the window; the cache ends as `off` would have left it (every written row kept)."""
        w = self._need_window("cancel")
        self._cancel()
        if self.config.debug:
            log.info("NWOR[%s] window %d cancelled (layers written: %s)", self.name, self.windows_done,
                     sorted(self._rows))
        return self._finish(None, cancelled=True)

    def account(self, window: Window, acceptance: Acceptance, layers: range, *,
                opened: range | None = None) -> WindowRecord | None:
        """The host's record of a window the engine's step body ran (eagerly or replayed from a CUDA
        graph, nwor_lab.engine.runner): the record `commit` would have made (every row of `layers`
        written), counted in the metrics and in `windows_done`; None when records are off.
        `window` and `acceptance` are CPU mirrors of the step's real requests (no padding, no
        sync). `opened`: the layers `begin` opened, when more than those written (default: the same)."""
        # (what a window open now holds is put back after: the engine may count a deferred record
        # while the policy has a window of its own open, `SpecEngine.flush_records`)
        held = self.window, self.layers, self._rows
        self.window, self.layers = window, (opened or layers)
        self._rows = {layer: [(0, window.num_tokens)] for layer in layers}
        try:
            rec = self._record(window, acceptance) if (self.records or self.config.debug) else None
            if rec is not None:
                self.metrics.observe(rec)
        finally:
            self.window, self.layers, self._rows = held
            self.windows_done += 1
        return rec

    # -- hooks for the modes -----------------------------------------------------------------
    def _begin(self) -> None: ...
    def _write(self, layer, key, value, token_offset) -> None: raise NotImplementedError
    def _commit(self, acceptance: Acceptance) -> None: ...
    def _cancel(self) -> None: ...

    def _logged_slots(self) -> torch.Tensor | None:
        """Slots whose old contents this policy saved at begin (for observers); None: no log."""
        return None

    def _bytes(self, acceptance: Acceptance | None, kept: torch.Tensor) -> dict:
        """Bytes moved this window; modes override. Host counts (one sync). `acceptance` is None
        for a cancelled window; `kept` [T] marks the non-padding tokens the cache keeps."""
        return {}

    def _emit(self, phase: str, **fields) -> None:
        event = PhaseEvent(phase, self.kind, self, self.window, self.layers, **fields)
        for observer in self.observers:
            observer.on_phase(event)

    # -- helpers -----------------------------------------------------------------------------
    def _need_window(self, what: str) -> Window:
        if self.window is None:
            raise WindowStateError(f"{what}: no window is open; call begin(window) first "
                                   f"(a window is committed or cancelled once)")
        return self.window

    def _check_acceptance(self, w: Window, acceptance: Acceptance | None) -> Acceptance:
        """Shapes always; on the host under `validate` (one sync, skipped while capturing) that
        the three masks tell one story: prefix-closed drafts, lengths within each request's
        drafts, and the commit mask keeping exactly non-drafts and accepted drafts."""
        dev = self.cache.device
        if acceptance is None:
            if w.num_drafts:
                raise ValueError(f"commit: the window has {w.num_drafts} drafts; pass their Acceptance "
                                 f"(from SCV, or Acceptance.from_draft_mask(window, mask))")
            return Acceptance.from_accepted_len(w, [0] * w.num_reqs)
        if not isinstance(acceptance, Acceptance):
            raise TypeError(f"acceptance: expected nwor_lab.window.Acceptance, got {type(acceptance).__name__}"
                            f"; wrap a draft mask with Acceptance.from_draft_mask(window, mask)")
        check_tensor("acceptance.draft_mask", acceptance.draft_mask, shape=(w.num_drafts,),
                     dtypes=(torch.bool,), device=dev, what="[num_drafts] bool, one per draft token")
        check_whole("acceptance.accepted_len", acceptance.accepted_len)
        check_tensor("acceptance.accepted_len", acceptance.accepted_len, shape=(w.num_reqs,), device=dev,
                     dtypes=INDEX_DTYPES, what="[num_reqs]")
        if acceptance.commit_mask is None:
            acceptance = Acceptance(acceptance.draft_mask, acceptance.accepted_len,
                                    w.commit_mask_for(acceptance.draft_mask, acceptance.accepted_len))
        check_tensor("acceptance.commit_mask", acceptance.commit_mask, shape=(w.num_tokens,),
                     dtypes=(torch.bool,), device=dev, what="[num_tokens] bool")
        if self.config.validate and not capturing():
            acc = acceptance.accepted_len.long()
            n_drafts = torch.tensor(w.num_draft_tokens, device=dev)
            if bool(((acc < 0) | (acc > n_drafts)).any()):
                raise ValueError(f"acceptance.accepted_len={acc.tolist()}: each must lie in 0..num_draft_tokens "
                                 f"{w.num_draft_tokens}")
            error = w.acceptance_error(acceptance.draft_mask, acc)
            if error:
                raise ValueError(f"acceptance.draft_mask: {error}")
            if not bool((acceptance.commit_mask == w.commit_mask_for(acceptance.draft_mask, acc)).all()):
                raise ValueError("acceptance.commit_mask: does not keep exactly the non-draft tokens and "
                                 "the accepted drafts; build it with Window.commit_mask_from(accepted_len) "
                                 "(a tree: Acceptance.from_draft_mask)")
        return acceptance

    def _finish(self, acceptance: Acceptance | None, cancelled: bool) -> WindowRecord | None:
        rec = None
        if self.records or self.config.debug or self.observers:
            rec = self._record(self.window, acceptance)
            if self.config.debug and not cancelled:
                if rec.drafts_committed != rec.num_accepted:
                    raise AssertionError(f"NWOR debug: committed {rec.drafts_committed} drafts but the "
                                         f"acceptance says {rec.num_accepted}")
                log.info("NWOR[%s] window %d commit: %d/%d drafts accepted (per request %s), %d tokens kept, "
                         "bytes written %d skipped %d logged %d restored %d", self.name, rec.index,
                         rec.num_accepted, rec.num_drafts, rec.per_request_accepted, rec.tokens_committed,
                         rec.bytes_written, rec.bytes_skipped, rec.bytes_logged, rec.bytes_restored)
            if (self.records or self.config.debug) and not self.deferred:
                self.metrics.observe(rec)
        if self.observers:
            self._emit("cancel" if cancelled else "commit", acceptance=acceptance, record=rec)
        self.window = None
        self.kind = ""
        self._rows = {}
        self.windows_done += 1
        return rec if (self.records or self.config.debug) else None

    def _record(self, w: Window, acceptance: Acceptance | None) -> WindowRecord:
        """What the window did, as host numbers. A cancelled window (`acceptance` None) keeps every
        row it wrote, as `off` would."""
        real = (w.slot_mapping >= 0)
        commit_mask = torch.ones_like(real) if acceptance is None else acceptance.commit_mask
        kept = commit_mask & real
        k = w.max_spec_len
        acc = [0] * w.num_reqs if acceptance is None else acceptance.accepted_per_request()
        drafts_committed = int(kept[w.draft_rows].sum()) if w.num_drafts else 0
        if acceptance is not None and w.num_drafts:
            drafts_committed = int(commit_mask[w.draft_rows].sum())
        drafts_by_pos = [sum(1 for n in w.num_draft_tokens if n >= j) for j in range(1, k + 1)]
        acc_by_pos = [sum(1 for a in acc if a >= j) for j in range(1, k + 1)]
        return WindowRecord(mode=self.name, index=self.windows_done, num_reqs=w.num_reqs,
                            num_tokens=w.num_tokens, num_drafts=w.num_drafts, num_accepted=sum(acc),
                            tokens_committed=int(kept.sum()), drafts_committed=drafts_committed,
                            per_request_accepted=acc, drafts_by_position=drafts_by_pos,
                            accepted_by_position=acc_by_pos, cancelled=acceptance is None,
                            **self._bytes(acceptance, kept))

    def _layers_written(self) -> int:
        return len(self._rows)

    def _valid_rows_written(self) -> int:
        """Non-padding rows written so far, summed over layers (host count)."""
        real = (self.window.slot_mapping >= 0).cpu()
        return sum(int(real[a:b].sum()) for ranges in self._rows.values() for a, b in ranges)
