"""The state-policy interface: how a verify window's recurrent and conv state reach the store.

It mirrors the K/V write policies (nwor_lab.policies) window by window:

    policy.begin(window, slots)                   # slots [R]: each request's state slot
    for layer in linear-attention layers:
        y = policy.conv(layer, x, weight)         # x [T, C] the conv's inputs, y [T, C] (pre-SiLU)
        o = policy.recur(layer, *inputs)          # the recurrence's per-row inputs [T, ...] -> o [T, H, V]
    policy.commit(acceptance)                     # an Acceptance (nwor_lab.window); None: no drafts
    # on failure instead: policy.cancel()         # store as `off` would have left it

What the state is and how rows advance it belong to the store's recurrence (`spec.recurrence`,
recurrence.py: gated DeltaNet's inputs are q, k, v, g, beta; a Mamba2 scan's x, dt, B, C): the
base and the strategies only move its states and inputs around, so any recurrence runs under every
strategy.

Each request's rows run from its committed state; which states the policy keeps, where and for how
long is what distinguishes the strategies. It declares that in class attributes (nothing outside
compares names):
    advances_live          the committed row is advanced through every window row during the window
    keeps_window_states    the states after t_last, d_1 .. d_k are kept until commit
    keeps_window_inputs    the window's layer inputs are kept until commit (to recompute from them)
    checkpoints            the committed state is copied before the window (to restore on reject)
    commits_accepted_only  after commit the store holds the state of exactly the committed tokens
    capture_off            why its steps cannot be captured in a CUDA graph ("" when they can)
and `rows_per_slot(k)`, `steady_bytes_per_request(k, spec)`, `transient_bytes_per_request(k, spec)`.

Rows per request (vLLM order, as `Window`): a request schedules `s` rows, its drafts are the last
`d`; its candidate end rows are `s-d-1 .. s-1` (t_last, d_1 .. d_d), and with `a` accepted the
state to commit is the one after row `s-d-1+a`. A request without drafts commits all its rows.

Requests run in **groups**: maximal runs of consecutive requests with the same `s` and `d` (a verify
step of R requests with k drafts each is one group). A group's rows are one contiguous slice of the
window, viewed `[G, s, ...]`; its recurrences run as one, the G requests folded into the heads
(each (request, head) pair is its own recurrence), and the hooks see `[G, ...]` tensors. A group of
one and a group of G give the same bits (tests/test_state.py).

No host sync after `begin`: the rows of each request are host facts of the window, the acceptance
stays on the device (commit picks rows with `index_select`, recomputes with the rejected rows masked
to the recurrence's identity input, which leaves the state bit for bit as it was: g = 0, beta = 0
for gated DeltaNet), so a step body can run the policy eagerly or inside a CUDA-graph capture. Only
the checks under `validate` read the acceptance on the host, and never while capturing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from nwor_lab._checks import capturing
from nwor_lab.ops.gated_delta import causal_conv_reference
from nwor_lab.state.recurrence import Recurrence
from nwor_lab.state.store import RecurrentSpec, RecurrentStateStore
from nwor_lab.window import Acceptance, Window


class StateWindowError(RuntimeError):
    """A lifecycle call in the wrong order (commit without begin, a layer advanced twice, ...)."""


@dataclass(frozen=True, eq=False)
class Group:
    """Requests `first .. first+count-1`, each with `rows` rows of which the last `drafts` are drafts;
    their rows are window rows `start .. start + count*rows - 1`, request-major.

    The device layout (`begin(..., query_start_loc=...)`, what a captured step has) is one group of
    every request: `rows` is the bucket's bound Q, the rows are `index [G, Q]` (a scratch row T where
    a request has fewer), `valid [G, Q]`, and `drafts`, `cand` (t_last's local row) and `last` are
    `[G]` device tensors; a padding request has no rows (cand = last = -1: its state passes unchanged,
    its rows run as the recurrence's identity)."""

    first: int
    count: int
    start: int
    rows: int
    drafts: object                      # int, or [G] tensor (device layout)
    index: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    cand: torch.Tensor | None = None
    last: torch.Tensor | None = None
    num_candidates: int = 0             # device layout: k + 1

    @property
    def reqs(self) -> slice:
        return slice(self.first, self.first + self.count)

    @property
    def window_rows(self) -> slice:
        return slice(self.start, self.start + self.count * self.rows)

    @property
    def first_candidate(self):
        """Local row of t_last: the state after it commits when no draft is accepted (int, or [G])."""
        return self.rows - self.drafts - 1 if self.index is None else self.cand

    @property
    def last_row(self):
        return self.rows - 1 if self.index is None else self.last

    @property
    def keep_from(self) -> int:
        """First local row whose state the recurrence keeps (the device layout keeps all Q)."""
        return self.first_candidate if self.index is None else 0

    @property
    def speculative(self) -> bool:
        """Whether any request of the group may reject (the device layout: assume so)."""
        return self.index is not None or self.drafts > 0

    def candidates(self) -> int:
        return self.drafts + 1 if self.index is None else self.num_candidates


def groups_of(num_rows: list[int], num_drafts: list[int]) -> list[Group]:
    """Host counts per request -> runs of consecutive requests with equal (rows, drafts)."""
    out, start = [], 0
    for r, (rows, drafts) in enumerate(zip(num_rows, num_drafts)):
        last = out[-1] if out else None
        if last is not None and (last.rows, last.drafts) == (rows, drafts):
            out[-1] = Group(last.first, last.count + 1, last.start, rows, drafts)
        else:
            out.append(Group(r, 1, start, rows, drafts))
        start += rows
    return out


def device_group(window: Window, query_start_loc, num_drafts, max_query_len, dev, max_rows: int) -> Group:
    """The device layout as one group (see Group); max_rows: the recurrence's `max_token_rows`."""
    R, T = window.num_reqs, window.num_tokens
    if num_drafts is None or max_query_len is None:
        raise ValueError("query_start_loc: give num_drafts [R] and max_query_len with it")
    if not 1 <= int(max_query_len) <= max_rows:
        raise ValueError(f"max_query_len={max_query_len}: the device layout runs the token-by-token form, "
                         f"1..{max_rows} rows per request; run longer (prefill) windows with the "
                         f"window's host counts")
    qsl = query_start_loc.to(dev).long()
    drafts = num_drafts.to(dev).long()
    if qsl.shape != (R + 1,) or drafts.shape != (R,):
        raise ValueError(f"query_start_loc {tuple(qsl.shape)} / num_drafts {tuple(drafts.shape)}: expected "
                         f"[R+1={R + 1}] and [R={R}]")
    Q = int(max_query_len)
    q = qsl[1:] - qsl[:-1]
    j = torch.arange(Q, device=dev)
    valid = j[None] < q[:, None]
    index = torch.where(valid, qsl[:-1, None] + j, T)                  # T: the scratch row
    return Group(0, R, 0, Q, drafts, index=index, valid=valid, cand=q - drafts - 1, last=q - 1,
                 num_candidates=window.max_spec_len + 1)


class StatePolicy:
    """Base class: window bookkeeping and checks; runs the conv and the store's recurrence per group
    from the state `_state_in` / `_conv_in` gives, and hands the results to the strategy's hooks."""

    name: ClassVar[str] = "?"
    advances_live: ClassVar[bool] = False
    keeps_window_states: ClassVar[bool] = False
    keeps_window_inputs: ClassVar[bool] = False
    checkpoints: ClassVar[bool] = False
    commits_accepted_only: ClassVar[bool] = True
    # why a step with this strategy cannot be captured in a CUDA graph ("": it can; the engine's
    # runner then replays decode buckets, the rows given as device data, see `begin`)
    capture_off: ClassVar[str] = ""

    def __init__(self, store: RecurrentStateStore, backend: str = "auto", validate: bool = True):
        if not isinstance(store, RecurrentStateStore):
            raise TypeError(f"store: expected a nwor_lab.state.RecurrentStateStore, got {type(store).__name__}")
        self.store = store
        self.spec: RecurrentSpec = store.spec
        self.recurrence: Recurrence = store.spec.recurrence
        self.backend = backend
        self.validate = validate                 # host checks (one sync each; never while capturing)
        self.window: Window | None = None
        self.groups: list[Group] = []
        self.slots: torch.Tensor | None = None   # [R] int64 on the store's device
        self.layers = range(self.spec.num_layers)
        self._conv_done: set[int] = set()
        self._recur_done: set[int] = set()
        self.windows_done = 0
        # prefix caching on a hybrid target: the states at committed block ends are kept beside the
        # blocks (a state.checkpoints.BlockStates, set by the engine; None: no checkpoints)
        self.block_states = None
        # host counters: what the strategy cost (rows recomputed at commit, bytes copied, peak kept)
        self.stats = {"rows_recomputed": 0, "bytes_copied": 0, "bytes_kept_peak": 0}

    # -- what it keeps ------------------------------------------------------------------------
    @classmethod
    def rows_per_slot(cls, k: int) -> int:
        """Rows of the store each request holds for windows of up to k drafts."""
        return 1

    @classmethod
    def steady_bytes_per_request(cls, k: int, spec: RecurrentSpec) -> int:
        """Bytes a request holds in the store for as long as it lives."""
        return cls.rows_per_slot(k) * spec.row_bytes

    @classmethod
    def transient_bytes_per_request(cls, k: int, spec: RecurrentSpec) -> int:
        """Bytes held per speculative request (t_last + k drafts) only while a window is open."""
        return 0

    def fits_device_layout(self, max_query_len: int) -> bool:
        """Whether windows of up to `max_query_len` rows per request can run in the device layout
        (`begin(..., query_start_loc=<tensor>)`: the token-by-token form, no host counts)."""
        return 1 <= max_query_len <= self.recurrence.max_token_rows

    # -- lifecycle ----------------------------------------------------------------------------
    def begin(self, window: Window, slots, layers: range | None = None, *, query_start_loc=None,
              num_drafts=None, max_query_len: int | None = None) -> None:
        """Open a window. slots: `[R]` state slot of each request: a device tensor (what a captured
        step passes: no copy, checked on the host only under `validate` outside a capture) or a list.
        layers: the linear-attention layers it advances (default all).

        Rows per request come from the window's host counts; or from `query_start_loc` `[R+1]` and
        `num_drafts` `[R]` given as host lists (an eager step's true counts; rows past the last
        request are padding); or, as device tensors with `max_query_len` Q (a host bound, at most 16),
        from the device: the layout a captured step keeps as data (padding rows in no request's
        range, padding requests with none; give those a scratch slot)."""
        if self.window is not None:
            raise StateWindowError("begin: a window is already open; commit() or cancel() it first")
        if not isinstance(window, Window):
            raise TypeError(f"window: expected nwor_lab.window.Window, got {type(window).__name__}")
        dev = self.store.device
        host = None if torch.is_tensor(slots) else [int(s) for s in slots]
        slots = torch.tensor(host, dtype=torch.long, device=dev) if host is not None else slots.to(dev).long()
        if slots.shape != (window.num_reqs,):
            raise ValueError(f"slots: {tuple(slots.shape)} for a window of {window.num_reqs} requests; give each "
                             f"request's state slot, [R]")
        if host is None and self.validate and not capturing():
            host = slots.tolist()
        owned = None if host is None else [s for s in host if s != self.store.scratch_slot]
        if host is not None and (len(set(owned)) != len(owned) or any(not 0 <= s < self.store.num_slots for s in host)):
            raise ValueError(f"slots={host}: each must be a distinct slot in 0..{self.store.num_slots - 1} "
                             f"(only the store's scratch slot, {self.store.scratch_slot}, may repeat)")
        k = window.max_spec_len
        if self.rows_per_slot(k) > self.store.rows_per_slot:
            raise ValueError(f"window: {k} drafts need {self.rows_per_slot(k)} rows per slot under '{self.name}', "
                             f"the store has {self.store.rows_per_slot}; build it with make_state_store(..., k={k})")
        layers = self.layers if layers is None else layers
        if not isinstance(layers, range) or not layers or layers.start < 0 or layers.stop > self.spec.num_layers:
            raise ValueError(f"layers={layers!r}: a non-empty range within the {self.spec.num_layers} "
                             f"linear-attention layers")
        self.window, self.layers, self.slots = window, layers, slots
        if query_start_loc is None:
            self.groups = groups_of(window.num_scheduled_tokens, window.num_draft_tokens)
        elif not torch.is_tensor(query_start_loc):        # host lists: an eager step's true counts
            qsl, drafts = [int(v) for v in query_start_loc], [int(v) for v in num_drafts]
            rows = [b - a for a, b in zip(qsl[:-1], qsl[1:])]
            if len(rows) != window.num_reqs or len(drafts) != window.num_reqs or qsl[0] != 0 \
                    or qsl[-1] > window.num_tokens or any(n < 0 or d < 0 or (d and n < d + 1)
                                                          for n, d in zip(rows, drafts)):
                raise ValueError(f"query_start_loc={qsl}, num_drafts={drafts}: R+1 offsets from 0 within the "
                                 f"window's {window.num_tokens} rows and R draft counts, each request holding "
                                 f"t_last and its drafts")
            self.groups = [grp for grp in groups_of(rows, drafts) if grp.rows]   # padding requests: no rows
        else:
            self.groups = [device_group(window, query_start_loc, num_drafts, max_query_len, dev,
                                        self.recurrence.max_token_rows)]
        self._conv_done, self._recur_done = set(), set()
        self._begin()

    def conv(self, layer: int, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The short causal conv of the window's rows: x `[T, C]`, weight `[C, W]` -> `[T, C]`
        (before the activation), each request's rows continuing from its conv state."""
        self._check_layer("conv", layer, self._conv_done, x, (self.spec.conv_dim,))
        y = self._out_rows(x.shape[1:], x.dtype, x.device)
        for grp in self.groups:
            yg, history = causal_conv_reference(self._rows(grp, x), weight, self._conv_in(layer, grp))
            self._put_rows(grp, y, yg)
            if self.block_states is not None:
                self.block_states.tap_conv(self, layer, grp, history)
            self._conv_out(layer, grp, history)
        return y[:x.shape[0]]

    def recur(self, layer: int, *inputs: torch.Tensor, **options) -> torch.Tensor:
        """The recurrence over the window's rows: its per-row inputs `[T, ...]` in its order (gated
        DeltaNet: q, k `[T, H, K]`, v `[T, H, V]`, g, beta `[T, H]`; option `scale`) -> o
        `[T, *output_tail]` (`[T, H, V]`) float32, each request's rows continuing from its state."""
        rec = self.recurrence
        w = self._need_window("recur")
        rec.check(self.spec, inputs, options, w.num_tokens)
        self._check_layer("recur", layer, self._recur_done, inputs[0], rec.input_tails(self.spec)[0])
        o = self._out_rows(rec.output_tail(self.spec), torch.float32, inputs[0].device)
        for grp in self.groups:
            rows = tuple(self._rows(grp, t) for t in inputs)
            if grp.valid is not None:            # rows a request does not have pass its state unchanged
                rows = rec.masked(rows, grp.valid)
            if self.block_states is None:
                og, kept = self._run(self._state_in(layer, grp), rows, options, keep_from=grp.keep_from)
            else:                                # block ends staged, a prefill in segments (checkpoints.py)
                og, kept = self.block_states.tap_recur(self, layer, grp, self._state_in(layer, grp), rows, options)
            self._put_rows(grp, o, og)
            self._state_out(layer, grp, kept, rows, options)
        return o[:w.num_tokens]

    def commit(self, acceptance: Acceptance | None = None) -> None:
        """Keep the state after each request's last committed row. acceptance: the window's
        `Acceptance` (its `accepted_len` [R] stays on the device); None only for a window without
        drafts."""
        w = self._need_window("commit")
        missing = [l for l in self.layers if l not in self._conv_done or l not in self._recur_done]
        if missing:
            raise StateWindowError(f"commit: layers {missing} were not advanced over the window (conv and "
                                   f"recur); advance them or cancel()")
        accepted = self._accepted(w, acceptance)
        if self.block_states is not None:
            self.block_states.commit(accepted)
        self._commit(accepted)
        self._finish()

    def cancel(self) -> None:
        """Abandon the window: the store ends as `off` would have left it (every row advanced)."""
        w = self._need_window("cancel")
        if self.block_states is not None:
            self.block_states.cancel()
        self._cancel(torch.tensor(w.num_draft_tokens, dtype=torch.long, device=self.store.device))
        self._finish()

    def committed(self, slot: int):
        """(recurrent `[L, *state_shape]`, conv `[L, W-1, C]`) committed for the slot (host read)."""
        return self.store.committed(slot)

    # -- the strategies' hooks ----------------------------------------------------------------
    def _begin(self) -> None: ...

    def _state_out(self, layer: int, grp: Group, kept: torch.Tensor, inputs: tuple, options: dict) -> None:
        """kept `[G, d+1, *state_shape]`: the states after the candidate rows s-d-1 .. s-1; inputs:
        the group's per-row inputs `[G, s, ...]` (gated DeltaNet: q, k, v, g, beta); options: the
        recur call's (what a recompute from the inputs passes again)."""
        raise NotImplementedError

    def _conv_out(self, layer: int, grp: Group, history: torch.Tensor) -> None:
        """history `[G, W-1+s, C]`: the conv state before the rows, then the rows' inputs."""
        raise NotImplementedError

    def _commit(self, accepted: torch.Tensor) -> None:
        """accepted: `[R]` int64 on the store's device."""

    def _cancel(self, drafts: torch.Tensor) -> None:
        """drafts: `[R]` int64, each request's draft count (cancel commits every row, as off)."""
        self._commit(drafts)

    # -- helpers for the strategies -------------------------------------------------------------
    def _out_rows(self, tail: tuple, dtype, device) -> torch.Tensor:
        """The pass's output rows `[T, *tail]` (plus a scratch row T in the device layout; zeros:
        padding rows belong to no request)."""
        T = self.window.num_tokens
        if any(grp.index is not None for grp in self.groups):
            return torch.zeros(T + 1, *tail, dtype=dtype, device=device)
        covered = sum(grp.count * grp.rows for grp in self.groups)
        return (torch.empty if covered == T else torch.zeros)(T, *tail, dtype=dtype, device=device)

    def _rows(self, grp: Group, t: torch.Tensor) -> torch.Tensor:
        """The group's rows of `t` `[T, ...]` as `[G, Q, ...]` (a view for host groups)."""
        if grp.index is None:
            return t[grp.window_rows].reshape(grp.count, grp.rows, *t.shape[1:])
        return t[grp.index.clamp(max=t.shape[0] - 1)]

    def _put_rows(self, grp: Group, out: torch.Tensor, vals: torch.Tensor) -> None:
        if grp.index is None:
            out[grp.window_rows] = vals.reshape(-1, *vals.shape[2:])
        else:
            out.index_copy_(0, grp.index.reshape(-1), vals.reshape(-1, *vals.shape[2:]).to(out.dtype))

    def _candidate_states(self, grp: Group, kept: torch.Tensor, offset=0) -> torch.Tensor:
        """kept `[G, n, ...]` (the recurrence's states from `grp.keep_from` on) -> the states after
        candidate j = 0 .. candidates-1 `[G, candidates, ...]`; `offset` (an int or [G]) picks
        one candidate per request instead -> `[G, ...]`."""
        if grp.index is None and isinstance(offset, int) and offset == 0:
            return kept
        G, n = kept.shape[:2]
        base = grp.first_candidate - grp.keep_from
        if isinstance(offset, int) and offset == 0:
            idx = torch.as_tensor(base, device=kept.device).reshape(-1, 1) + torch.arange(grp.candidates(), device=kept.device)
            return kept[torch.arange(G, device=kept.device)[:, None], idx.expand(G, -1).clamp(0, n - 1)]
        idx = (base + offset).clamp(0, n - 1)
        return kept[torch.arange(G, device=kept.device), idx]

    def _run(self, state: torch.Tensor, inputs: tuple, options: dict, keep_from: int):
        """The recurrence of a group: state `[G, *state_shape]`, inputs `[G, s, ...]` -> (o
        `[G, s, *output_tail]`, kept `[G, s-keep_from, *state_shape]`)."""
        return self.recurrence.run(state, inputs, options, keep_from, self.backend)

    def _rows_of(self, table: torch.Tensor, layer: int, grp: Group) -> torch.Tensor:
        """The group's committed rows of `table` (store.recurrent or store.conv), `[G, ...]`, a copy,
        found on the device (the slots and, with several rows per slot, `current`)."""
        slots = self.slots[grp.reqs]
        if self.store.rows_per_slot == 1:
            return table[layer, :, 0].index_select(0, slots)
        return table[layer][slots, self.store.current[slots]]

    def _state_in(self, layer: int, grp: Group) -> torch.Tensor:
        return self._rows_of(self.store.recurrent, layer, grp)

    def _conv_in(self, layer: int, grp: Group) -> torch.Tensor:
        return self._rows_of(self.store.conv, layer, grp)

    def _write_live(self, layer: int, grp: Group, state: torch.Tensor | None = None,
                    conv: torch.Tensor | None = None) -> None:
        """Overwrite the group's committed rows: state `[G, *state_shape]`, conv `[G, W-1, C]`."""
        slots = self.slots[grp.reqs]
        for table, value in ((self.store.recurrent, state), (self.store.conv, conv)):
            if value is None:
                continue
            value = value.to(table.dtype)
            if self.store.rows_per_slot == 1:
                table[layer, :, 0].index_copy_(0, slots, value)
            else:
                table[layer].index_put_((slots, self.store.current[slots]), value)
            self.stats["bytes_copied"] += value.nbytes

    def _conv_after(self, history: torch.Tensor, end_rows) -> torch.Tensor:
        """The conv state after local row e of each request: history `[G, W-1+s, C]`, end_rows an int
        or `[G]` device tensor -> `history[g, e+1 : e+W]` `[G, W-1, C]`."""
        W = self.spec.conv_width
        if isinstance(end_rows, int):
            return history[:, end_rows + 1: end_rows + W]
        idx = (end_rows[:, None] + 1 + torch.arange(W - 1, device=history.device)).clamp(0, history.shape[1] - 1)
        return torch.gather(history, 1, idx[:, :, None].expand(-1, -1, history.shape[-1]))

    def _readvance(self, state, conv, inputs: tuple, x: torch.Tensor, end_rows: torch.Tensor, options: dict):
        """The state `[G, *state_shape]` and conv state `[G, W-1, C]` after local row end_rows[g]
        (`[G]`, device), recomputed from `state` / `conv` over the kept inputs `[G, s, ...]` and conv
        inputs x `[G, s, C]` (cow after a restore; replay). Rows after end_rows run as the
        recurrence's identity (gated DeltaNet: g = 0, beta = 0): the state passes them unchanged, bit
        for bit, so one fixed-shape run serves every acceptance (no host sync)."""
        G, s = inputs[0].shape[:2]
        keep = torch.arange(s, device=inputs[0].device)[None] <= end_rows[:, None]             # [G, s]
        _, kept = self._run(state, self.recurrence.masked(inputs, keep), options, keep_from=s - 1)
        self.stats["rows_recomputed"] += G * s
        return kept[:, -1], self._conv_after(torch.cat([conv.to(x.dtype), x], 1), end_rows)

    def _note_kept(self, nbytes: int) -> None:
        self.stats["bytes_kept_peak"] = max(self.stats["bytes_kept_peak"], nbytes)

    # -- checks --------------------------------------------------------------------------------
    def _need_window(self, what: str) -> Window:
        if self.window is None:
            raise StateWindowError(f"{what}: no window is open; call begin(window, slots) first")
        return self.window

    def _check_layer(self, what, layer, done: set, x: torch.Tensor, tail: tuple) -> None:
        w = self._need_window(what)
        if layer not in self.layers:
            raise ValueError(f"layer={layer!r}: this window was opened for linear-attention layers "
                             f"{self.layers.start}..{self.layers.stop - 1}")
        if layer in done:
            raise StateWindowError(f"{what}: layer {layer} was already advanced over this window; each "
                                   f"layer advances once per window")
        if x.shape[0] != w.num_tokens or tuple(x.shape[1:]) != tail:
            raise ValueError(f"{what}: expected [T={w.num_tokens}, {', '.join(map(str, tail))}] rows, got "
                             f"{tuple(x.shape)}")
        done.add(layer)

    def _accepted(self, w: Window, acceptance: Acceptance | None) -> torch.Tensor:
        """-> accepted drafts per request `[R]` int64 on the store's device."""
        dev = self.store.device
        if acceptance is None:
            if w.num_drafts:
                raise ValueError(f"commit: the window has {w.num_drafts} drafts; pass their Acceptance")
            return torch.zeros(w.num_reqs, dtype=torch.long, device=dev)
        if not isinstance(acceptance, Acceptance):
            raise TypeError(f"acceptance: expected nwor_lab.window.Acceptance, got {type(acceptance).__name__}")
        acc = acceptance.accepted_len
        if acc.shape != (w.num_reqs,) or acc.is_floating_point():
            raise ValueError(f"acceptance.accepted_len: expected [R={w.num_reqs}] integers, got {tuple(acc.shape)} "
                             f"{acc.dtype}")
        if self.validate and not capturing():
            host = [int(a) for a in acc.tolist()]
            if any(not 0 <= a <= d for a, d in zip(host, w.num_draft_tokens)):
                raise ValueError(f"acceptance.accepted_len={host}: each in 0..its request's drafts "
                                 f"{w.num_draft_tokens}")
        return acc.to(device=dev, dtype=torch.long)

    def _finish(self) -> None:
        self.window, self.groups, self.slots = None, [], None
        self._conv_done, self._recur_done = set(), set()
        self.windows_done += 1
