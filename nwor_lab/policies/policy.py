"""The write-policy interface shared by `off`, `cow` and `stage`.

Lifecycle of one verify window (per cache, i.e. per device):

    policy.begin(window)                      # slots known, nothing written yet
    for layer in layers:                      # target layers and draft-head layers alike
        policy.write(layer, k, v, token_offset)   # [n, H, D] rows, in chunks if you like
        k_win, v_win = policy.window_kv(layer) or (None, None)   # stage: attention reads here
    record = policy.commit(acceptance)        # or commit(draft_mask) / commit(sampled_token_ids=...)
    # on failure instead: policy.cancel()     # cache as `off` would have left it

Every argument is checked before anything is written; slot checks run once, at `begin`.
"""
from __future__ import annotations

import logging

import torch

from nwor_lab._checks import FLOAT_DTYPES, capturing, check_slots, check_tensor, same_device
from nwor_lab.config import LabConfig
from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.metrics import LabMetrics, WindowRecord
from nwor_lab.window import Window

log = logging.getLogger("nwor_lab.policies")


class WindowStateError(RuntimeError):
    """A lifecycle call in the wrong order (commit without begin, double commit, ...)."""


class WritePolicy:
    """Base class: window bookkeeping, argument checks, acceptance handling, records."""

    mode = "?"

    def __init__(self, cache: PagedKVCache, config: LabConfig | None = None,
                 metrics: LabMetrics | None = None, records: bool = True):
        self.cache = cache
        self.config = config or LabConfig(nwor_mode=self.mode)
        self.metrics = metrics if metrics is not None else LabMetrics()
        self.records = records
        self.window: Window | None = None
        self.layers = range(cache.num_layers)   # layers the open window may write
        self.windows_done = 0
        self._rows: dict[int, list[tuple[int, int]]] = {}   # layer -> written (start, end) ranges
        self._scv = None

    # -- lifecycle ---------------------------------------------------------------------------
    def begin(self, window: Window, layers: range | None = None) -> None:
        """Open a window. `layers`: the contiguous cache layers it will write (default: all), e.g.
        `range(N, N + 1)` for an EAGLE draft chain that only runs the head; CoW logs and restores
        just those, and a write to any other layer is an error."""
        if self.window is not None:
            raise WindowStateError("begin: a window is already open; commit() or cancel() it first")
        if not isinstance(window, Window):
            raise TypeError(f"window: expected nwor_lab.policies.Window, got {type(window).__name__}")
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
        self._rows = {}
        self._begin()
        if self.config.debug:
            log.info("NWOR[%s] window %d begin: %d tokens, %d drafts over %d requests (drafts per request %s)",
                     self.mode, self.windows_done, window.num_tokens, window.num_drafts, window.num_reqs,
                     window.num_draft_tokens)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, token_offset: int = 0) -> None:
        """Rows `token_offset .. token_offset + n - 1` of the window's K/V `[n, H, D]` for `layer`."""
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
        if not isinstance(token_offset, int) or token_offset < 0 or token_offset + n > w.num_tokens:
            raise ValueError(f"token_offset={token_offset!r} with {n} rows does not fit the window's "
                             f"{w.num_tokens} tokens")
        ranges = self._rows.setdefault(layer, [])
        if any(a < token_offset + n and token_offset < b for a, b in ranges):
            raise ValueError(f"layer {layer}: rows {token_offset}..{token_offset + n - 1} were already "
                             f"written in this window; each row is written once")
        ranges.append((token_offset, token_offset + n))
        self._write(layer, key, value, token_offset)

    def window_kv(self, layer: int):
        """`(key, value)` `[T, H, D]` of the window for attention, or None: read the cache."""
        return None

    def commit(self, acceptance=None, *, sampled_token_ids: torch.Tensor | None = None) -> WindowRecord | None:
        """Keep the accepted drafts (and every non-draft token); drop the rejected ones.

        acceptance: an `Acceptance` (from SCV), or a prefix-closed draft mask `[Dtot]` bool;
        or pass `sampled_token_ids` `[R, max_spec_len+1]` and SCV runs with `config.scv_mode`.
        Given both, `acceptance` is used and, in debug mode, checked against the sampler's output
        with the plain host loop (committed == accepted by the sampler, every window).
        A window without drafts may be committed with no argument.
        """
        w = self._need_window("commit")
        draft_mask, accepted_len, commit_mask = self._acceptance(w, acceptance, sampled_token_ids)
        partial = [l for l, r in self._rows.items() if sum(b - a for a, b in r) != w.num_tokens]
        if partial:
            raise WindowStateError(f"commit: layers {partial} received only part of the window's "
                                   f"{w.num_tokens} rows; write the rest or cancel()")
        self._commit(draft_mask, accepted_len, commit_mask)
        rec = self._finish(draft_mask, accepted_len, commit_mask, cancelled=False)
        return rec

    def cancel(self) -> WindowRecord | None:
        """Abandon the window; the cache ends as `off` would have left it (every written row kept)."""
        w = self._need_window("cancel")
        self._cancel()
        if self.config.debug:
            log.info("NWOR[%s] window %d cancelled (layers written: %s)", self.mode, self.windows_done,
                     sorted(self._rows))
        all_kept = torch.ones(w.num_tokens, dtype=torch.bool, device=self.cache.device)
        return self._finish(None, None, all_kept, cancelled=True)

    # -- hooks for the modes -----------------------------------------------------------------
    def _begin(self) -> None: ...
    def _write(self, layer, key, value, token_offset) -> None: raise NotImplementedError
    def _commit(self, draft_mask, accepted_len, commit_mask) -> None: ...
    def _cancel(self) -> None: ...

    def _bytes(self, draft_mask, commit_mask) -> dict:
        """Bytes moved this window; modes override. Host counts (one sync)."""
        return {}

    # -- helpers -----------------------------------------------------------------------------
    def _need_window(self, what: str) -> Window:
        if self.window is None:
            raise WindowStateError(f"{what}: no window is open; call begin(window) first "
                                   f"(a window is committed or cancelled once)")
        return self.window

    def _scale_args(self):
        return (self.cache.k_scale, self.cache.v_scale) if self.cache.is_fp8 else (None, None)

    def _acceptance(self, w: Window, acceptance, sampled_token_ids):
        dev = self.cache.device
        if sampled_token_ids is not None and acceptance is not None:
            # both: the caller already ran SCV; the sampler's output only serves the debug check
            if self.config.debug:
                self._debug_check_sampler(w, acceptance, sampled_token_ids)
        elif sampled_token_ids is not None:
            if w.draft_token_ids is None:
                raise ValueError("sampled_token_ids: the window has no draft_token_ids; build it with "
                                 "Window.from_metadata or pass draft_token_ids to Window.from_counts")
            acceptance = self._scv_runner()(w.draft_token_ids, w.cu_num_draft_tokens, sampled_token_ids,
                                                    token_req=w.token_req, token_draft_pos=w.token_draft_pos)
            if self.config.debug:
                self._debug_check_sampler(w, acceptance, sampled_token_ids)
        if acceptance is None:
            if w.num_drafts:
                raise ValueError(f"commit: the window has {w.num_drafts} drafts; pass their acceptance "
                                 f"(Acceptance, draft mask or sampled_token_ids)")
            draft_mask = torch.zeros(0, dtype=torch.bool, device=dev)
        elif isinstance(acceptance, torch.Tensor):
            draft_mask = acceptance
        elif hasattr(acceptance, "draft_mask"):
            draft_mask = acceptance.draft_mask
        else:
            raise TypeError(f"acceptance: expected an Acceptance or a [num_drafts] bool tensor, "
                            f"got {type(acceptance).__name__}")
        check_tensor("acceptance.draft_mask", draft_mask, dtypes=(torch.bool,), device=dev)
        if draft_mask.dim() != 1 or draft_mask.numel() != w.num_drafts:
            raise ValueError(f"acceptance.draft_mask: shape {tuple(draft_mask.shape)} but the window has "
                             f"{w.num_drafts} drafts; the mask must be [num_drafts] (one per draft token)")
        accepted_len = w.accepted_len_from(draft_mask)
        if self.config.validate and not capturing() and w.num_drafts:
            # prefix-closed: draft j accepted => drafts 1..j-1 accepted, i.e. pos <= accepted_len
            draft_pos = w.token_draft_pos[w.draft_rows]
            if not bool((draft_mask == (draft_pos <= accepted_len[w.draft_req.long()])).all()):
                raise ValueError("acceptance.draft_mask: not prefix-closed; a draft can only be accepted "
                                 "if every earlier draft of its request was (the prefix rule)")
        commit_mask = getattr(acceptance, "commit_mask", None) if acceptance is not None else None
        if commit_mask is None:
            commit_mask = w.commit_mask_from(accepted_len)
        check_tensor("acceptance.commit_mask", commit_mask, shape=(w.num_tokens,), dtypes=(torch.bool,), device=dev)
        return draft_mask, accepted_len, commit_mask

    def _scv_runner(self):
        if self._scv is None:
            from nwor_lab.speculative.scv import ScvRunner
            self._scv = ScvRunner(self.config.scv_mode)
        return self._scv

    def _debug_check_sampler(self, w, acceptance, sampled_token_ids) -> None:
        """Debug: the acceptance must equal the plain host loop over the sampler's output."""
        from nwor_lab.speculative.scv import compute_acceptance
        if w.draft_token_ids is None:
            raise ValueError("sampled_token_ids: the window has no draft_token_ids to check them against; "
                             "build it with Window.from_metadata")
        ref = compute_acceptance(w.draft_token_ids.cpu(), w.cu_num_draft_tokens.cpu(), sampled_token_ids.cpu(),
                                 mode="off")
        mask = acceptance if isinstance(acceptance, torch.Tensor) else acceptance.draft_mask
        got = w.accepted_len_from(mask).cpu().to(torch.int32)
        if not torch.equal(got, ref.accepted_len.to(torch.int32)):
            raise AssertionError(f"NWOR debug: the acceptance ({self.config.scv_mode}) says {got.tolist()} "
                                 f"accepted but the sampler's output says {ref.accepted_len.tolist()}")

    def _finish(self, draft_mask, accepted_len, commit_mask, cancelled: bool) -> WindowRecord | None:
        w = self.window
        rec = None
        if self.records or self.config.debug:
            rec = self._record(w, draft_mask, accepted_len, commit_mask, cancelled)
            if self.config.debug and not cancelled:
                if rec.drafts_committed != rec.num_accepted:
                    raise AssertionError(f"NWOR debug: committed {rec.drafts_committed} drafts but the "
                                         f"sampler accepted {rec.num_accepted}")
                log.info("NWOR[%s] window %d commit: %d/%d drafts accepted (per request %s), %d tokens kept, "
                         "bytes written %d skipped %d logged %d restored %d", self.mode, rec.index,
                         rec.num_accepted, rec.num_drafts, rec.per_request_accepted, rec.tokens_committed,
                         rec.bytes_written, rec.bytes_skipped, rec.bytes_logged, rec.bytes_restored)
            self.metrics.observe(rec)
        self.window = None
        self._rows = {}
        self.windows_done += 1
        return rec

    def _record(self, w, draft_mask, accepted_len, commit_mask, cancelled) -> WindowRecord:
        real = (w.slot_mapping >= 0)
        kept = commit_mask & real
        k = w.max_spec_len
        if cancelled or draft_mask is None:
            acc = [0] * w.num_reqs
            drafts_committed = int(kept[w.draft_rows].sum()) if w.num_drafts else 0
        else:
            acc = accepted_len.cpu().tolist()
            drafts_committed = int(commit_mask[w.draft_rows].sum()) if w.num_drafts else 0
        drafts_by_pos = [sum(1 for n in w.num_draft_tokens if n >= j) for j in range(1, k + 1)]
        acc_by_pos = [sum(1 for a in acc if a >= j) for j in range(1, k + 1)]
        return WindowRecord(mode=self.mode, index=self.windows_done, num_reqs=w.num_reqs,
                            num_tokens=w.num_tokens, num_drafts=w.num_drafts, num_accepted=sum(acc),
                            tokens_committed=int(kept.sum()), drafts_committed=drafts_committed,
                            per_request_accepted=acc, drafts_by_position=drafts_by_pos,
                            accepted_by_position=acc_by_pos, cancelled=cancelled,
                            **self._bytes(draft_mask, kept))

    def _layers_written(self) -> int:
        return len(self._rows)

    def _valid_rows_written(self) -> int:
        """Non-padding rows written so far, summed over layers (host count)."""
        real = (self.window.slot_mapping >= 0).cpu()
        return sum(int(real[a:b].sum()) for ranges in self._rows.values() for a, b in ranges)
