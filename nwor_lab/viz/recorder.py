"""Record every phase of every window as plain `Frame`s (the stepper and the chapters draw them).

A `Recorder` is a window observer (`nwor_lab.policies.observer.WindowObserver`): attach it to a
write policy or an engine (`Recorder(layers=[0]).attach(policy)`) and it receives a `PhaseEvent`
at each phase of each window:

    begin       after the policy saved its log (the cache is "before")
    write       after a layer's rows were written (into the cache, or the staging buffer)
    acceptance  after the acceptance is known, before anything is committed or restored
    commit      after the cache holds its final state   (or: cancel)

Per frame it keeps, for each recorded layer, the `[NB, BS]` int8 slot states (see states.py), the
two buffers NWOR holds besides the cache — the staging buffer (a policy that declares
`window_in_buffer`) and the CoW log (a policy whose begin saved `logged_slots`), each as `[T]` int8
states by window row — plus per-slot labels and a one-line caption. To stay cheap it reads only
the window's slots of the recorded layers (`[T, 2, H*D]` raw bits per layer and phase), never a
whole cache. The policy's declared behaviour (`window_in_buffer`, `preserves_rejected_slots`) and
the bits decide the cache's states; the phases and the declaration decide the buffers'; the
policy's name only appears in captions.

Bits found in the cache before the recording are OLD (old contents) unless the caller names them
`committed` (e.g. the demo's requests' prefixes): a freed block of a finished request is not a
kept token of anyone running.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from nwor_lab.viz.states import (SlotState, declared, log_rows, occupancy, row_states, settle, slot_rows, staging_rows,
                                 token_labels)

__all__ = ["Frame", "Recorder"]


@dataclass(frozen=True)
class Frame:
    """One phase of one window, ready to draw.

    states:  recorded layer -> `[NB, BS]` int8 SlotState of that layer after this phase
    staging: recorded layer -> `[T]` int8 state of each window row in the staging buffer; empty
             when the policy keeps no staging buffer
    log:     recorded layer -> `[T]` int8 state of the CoW log entry saved for each window row's
             slot (EMPTY where none was); empty when the policy keeps no log
    labels: slot -> hover label ("req 1 · d2 · rejected"); marks: slot -> cell text ("1:d2✗")
    window, acceptance: host copies (acceptance from the "acceptance" phase on)
    """

    index: int                 # position in the recording
    window_index: int          # which window (counted by the recorder, both kinds)
    phase: str                 # begin | write | acceptance | commit | cancel
    kind: str                  # verify | draft | "" (what begin() was told)
    mode: str                  # the policy's registry name (for titles)
    caption: str
    block_size: int
    window: object             # nwor_lab.window.Window on the host
    window_layers: range       # layers the window may write
    states: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    marks: dict = field(default_factory=dict)
    layer: int | None = None   # phase "write": the layer just written
    rows: range | None = None  # phase "write": the window rows written
    acceptance: object = None
    record: object = None
    staging: dict = field(default_factory=dict)
    log: dict = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        return list(self.states)

    @property
    def shown_layer(self) -> int:
        """The layer a picture of this frame shows by default: the one just written (write
        phase, if recorded), else the first recorded layer."""
        return self.layer if self.phase == "write" and self.layer in self.states else self.layers[0]

    def grid(self, layer: int | None = None) -> torch.Tensor:
        """`[NB, BS]` states of `layer` (default: the first recorded layer)."""
        return self.states[self.layers[0] if layer is None else layer]

    @property
    def title(self) -> str:
        kind = f"{self.kind} " if self.kind else ""
        return f"{self.mode} · {kind}window {self.window_index} · {self.phase}"

    def title_for(self, layer: int) -> str:
        """The title of a picture of `layer`: "... · write · layer 1", or, when a write phase is
        shown on another layer than the one it wrote, "... · write of layer 3 · layer 0 shown"."""
        if self.phase == "write" and self.layer is not None and self.layer != layer:
            return f"{self.title} of layer {self.layer} · layer {layer} shown"
        return f"{self.title} · layer {layer}"


class _Open:
    """What the recorder keeps while one window is open (host tensors)."""

    def __init__(self, event, layers, window_index, base, base_labels):
        w = event.window
        self.window = _host_window(w)
        self.slots = self.window.slot_mapping
        self.valid = self.slots >= 0
        self.index = window_index
        self.kind = getattr(event, "kind", "") or ""
        self.layers = layers
        self.window_layers = event.layers
        self.flags = declared(event.policy)
        self.base = base                                  # layer -> [N] int8, before the window
        self.base_labels = base_labels
        self.names = token_labels(self.window)
        cache = event.policy.cache
        self.start = {l: slot_rows(*cache.layer(l), self.slots) for l in layers}
        t = self.window.num_tokens
        self.delivered = {l: torch.zeros(t, dtype=torch.bool) for l in layers}
        logged_slots = getattr(event, "logged_slots", None)
        logged = torch.zeros(t, dtype=torch.bool)
        if logged_slots is not None and logged_slots.numel():
            logged = torch.isin(self.slots, logged_slots.cpu().long()) & self.valid
        self.num_logged = 0 if logged_slots is None else int((logged_slots >= 0).sum())
        self.uses_log = logged_slots is not None
        self.logged = {l: logged if l in event.layers else torch.zeros_like(logged) for l in layers}
        self.acceptance = None
        self.kept = None


class Recorder:
    """Snapshots each phase of each window into `self.frames` (a list of `Frame`).

    layers:      cache layers whose slot states are kept per frame (default: all); a
                 `[NB, BS]` int8 grid per layer per frame.
    kinds:       window kinds to record (e.g. ("verify",)); default all.
    max_windows: stop recording after this many windows (long runs).
    committed:   slots whose bits at the start are kept tokens' K/V (e.g. the requests' prefixes).
    Slots the recording has not seen a window write start as COMMITTED if `committed` names them
    and they hold a non-zero bit, as OLD (old contents) if they hold one and it does not, else EMPTY.
    """

    def __init__(self, layers: Sequence[int] | None = None, *, kinds: Sequence[str] | None = None,
                 max_windows: int | None = None, committed: Sequence[int] | None = None):
        self.layers = None if layers is None else [int(l) for l in layers]
        self.kinds = None if kinds is None else set(kinds)
        self.max_windows = max_windows
        self.committed = None if committed is None else torch.as_tensor(list(committed), dtype=torch.long)
        self.frames: list[Frame] = []
        self.windows_seen = 0
        self._open: dict[int, _Open | None] = {}           # id(policy) -> open window (None: skipped)
        self._base: dict[int, dict[int, torch.Tensor]] = {}  # id(cache) -> layer -> [N] int8
        self._labels: dict[int, dict[int, str]] = {}       # id(cache) -> slot -> label of its token

    # -- wiring ----------------------------------------------------------------------------
    def attach(self, target) -> "Recorder":
        """Observe a write policy or an engine (anything with an `observers` list)."""
        if self not in target.observers:
            target.observers.append(self)
        return self

    def detach(self, target) -> None:
        if self in target.observers:
            target.observers.remove(self)

    # -- the observer ----------------------------------------------------------------------
    def on_phase(self, event) -> None:
        key = id(event.policy)
        if event.phase == "begin":
            self._open[key] = self._begin(event)
            state = self._open[key]
        else:
            state = self._open.get(key)
        if state is None:
            return
        acceptance = getattr(event, "acceptance", None)
        if event.phase == "write" and event.layer in state.delivered:
            state.delivered[event.layer][event.rows.start:event.rows.stop] = True
        elif event.phase in ("acceptance", "commit") and acceptance is not None:
            state.acceptance = acceptance.to("cpu")
            state.kept = _kept(state.window, state.acceptance)
        elif event.phase == "commit" and state.kept is None:   # a window without drafts: all kept
            state.kept = torch.ones(state.window.num_tokens, dtype=torch.bool)
        finished = event.phase in ("commit", "cancel")
        if event.phase == "cancel":
            state.kept = None
        frame = self._frame(event, state, finished, cancelled=event.phase == "cancel")
        self.frames.append(frame)
        if finished:
            cache_key = id(event.policy.cache)
            for l in state.layers:
                self._base[cache_key][l] = settle(frame.states[l].reshape(-1), state.base[l])
            for s, (short, long) in zip(state.slots.tolist(), state.names):
                if s >= 0 and frame.states[state.layers[0]].reshape(-1)[s] != SlotState.EMPTY:
                    self._labels[cache_key][s] = f"{long} (window {state.index})"
            self._open[key] = None

    # -- helpers ---------------------------------------------------------------------------
    def _begin(self, event) -> _Open | None:
        kind = getattr(event, "kind", "") or ""
        if (self.kinds is not None and kind not in self.kinds) or \
                (self.max_windows is not None and self.windows_seen >= self.max_windows):
            return None
        cache = event.policy.cache
        layers = list(range(cache.num_layers)) if self.layers is None else self.layers
        base = self._base.setdefault(id(cache), {})
        for l in layers:
            if l not in base:
                base[l] = occupancy(*cache.layer(l), held=SlotState.OLD)
                if self.committed is not None and self.committed.numel():
                    held = base[l][self.committed] == SlotState.OLD
                    base[l][self.committed[held]] = SlotState.COMMITTED
        labels = self._labels.setdefault(id(cache), {})
        state = _Open(event, layers, self.windows_seen, {l: base[l] for l in layers}, labels)
        self.windows_seen += 1
        return state

    def _frame(self, event, st: _Open, finished: bool, cancelled: bool = False) -> Frame:
        cache = event.policy.cache
        in_buffer, preserves = st.flags
        states, staging, log = {}, {}, {}
        for l in st.layers:
            if in_buffer:
                staging[l] = staging_rows(st.delivered[l], st.kept, finished=finished, cancelled=cancelled)
            if st.uses_log:
                log[l] = log_rows(st.logged[l], st.kept, finished=finished, cancelled=cancelled)
            now = slot_rows(*cache.layer(l), st.slots)
            changed = (now != st.start[l]).flatten(1).any(1) & st.valid
            rows = row_states(st.base[l][st.slots.clamp(min=0)], delivered=st.delivered[l], changed=changed,
                              logged=st.logged[l], kept=st.kept, finished=finished,
                              window_in_buffer=in_buffer, preserves_rejected_slots=preserves)
            grid = st.base[l].clone()
            grid[st.slots[st.valid]] = rows[st.valid]
            states[l] = grid.view(-1, cache.spec.block_size)
        labels, marks = dict(st.base_labels), {}
        is_draft = (st.window.token_draft_pos > 0).tolist()
        for t, (s, (short, long)) in enumerate(zip(st.slots.tolist(), st.names)):
            if s < 0:
                continue
            fate = ""
            if st.kept is not None and is_draft[t]:
                fate = "✓" if bool(st.kept[t]) else "✗"
            labels[s] = long + {"✓": " · accepted", "✗": " · rejected", "": ""}[fate]
            marks[s] = short + fate
        return Frame(index=len(self.frames), window_index=st.index, phase=event.phase, kind=st.kind,
                     mode=str(event.policy.name), caption=_caption(event, st, states), states=states,
                     labels=labels, marks=marks, block_size=cache.spec.block_size, window=st.window,
                     window_layers=st.window_layers, layer=getattr(event, "layer", None),
                     rows=getattr(event, "rows", None), acceptance=st.acceptance,
                     record=getattr(event, "record", None), staging=staging, log=log)


def _host_window(w):
    """A host copy of a Window (its tensors on the CPU; counts are host lists already)."""
    return dataclasses.replace(w, **{f.name: getattr(w, f.name).cpu() for f in dataclasses.fields(w)
                                     if isinstance(getattr(w, f.name), torch.Tensor)})


def _kept(window, acceptance) -> torch.Tensor:
    """`[T]` bool commit mask of the window's rows."""
    if acceptance.commit_mask is not None:
        return acceptance.commit_mask.cpu().bool()
    return window.commit_mask_from(acceptance.accepted_len.cpu())


def _span(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}..{r.stop - 1}"


def _layers(r: range) -> str:
    return f"layer {r.start}" if len(r) == 1 else f"layers {_span(r)}"


def _caption(event, st: _Open, states) -> str:
    """One line in plain words: what this phase did to the cache."""
    name, w = event.policy.name, st.window
    in_buffer, preserves = st.flags
    kind = f"{st.kind} " if st.kind else ""
    head = f"{name}: "
    if event.phase == "begin":
        text = (f"{kind}window {st.index} begins: {w.num_reqs} requests, {w.num_tokens} tokens, "
                f"{w.num_drafts} of them drafts")
        if st.num_logged:
            text += (f"; the old contents of {st.num_logged} draft slots are saved to the log "
                     f"({_layers(st.window_layers)})")
        elif in_buffer:
            text += "; the window's K/V will wait in the staging buffer, the cache is not touched"
        else:
            text += "; nothing is saved, every row goes straight into the cache"
        return head + text
    valid = st.valid
    if event.phase == "write":
        where = ("to the staging buffer, cache untouched" if in_buffer else
                 f"into the cache ({int(valid[event.rows.start:event.rows.stop].sum())} slots)")
        return head + f"layer {event.layer} rows {_span(event.rows)} written {where}"
    if event.phase == "cancel":
        return head + "window cancelled: the rows written so far stay in the cache, as off leaves them"
    is_draft = w.token_draft_pos > 0
    kept = st.kept
    rejected = int((valid & is_draft & ~kept).sum())
    if event.phase == "acceptance" and not w.num_drafts:
        return head + "acceptance: no drafts in this window, every row is kept"
    if event.phase == "acceptance":
        acc = st.acceptance
        per = ", ".join(str(a) for a, k in zip(acc.accepted_len.tolist(), w.num_draft_tokens) if k)
        nxt = ("next, only the kept rows are copied into the cache" if in_buffer else
               "next, the rejected slots are restored from the log" if preserves else
               "next, nothing: the rejected K/V stay in the cache")
        return head + (f"acceptance: {int(acc.accepted_len.sum())} of {w.num_drafts} drafts accepted "
                       f"(per speculative request: {per or '-'}), {rejected} rejected rows; {nxt}")
    kept_rows = int((valid & kept).sum())
    if in_buffer:
        text = (f"commit: {kept_rows} kept rows copied into the cache ({_layers(st.window_layers)}); "
                f"{rejected} rejected rows never reached it")
    elif preserves:
        text = f"commit: {rejected} rejected slots restored bit-exactly from the log; {kept_rows} kept rows stay"
    else:
        text = (f"commit: {kept_rows} kept rows stay; {rejected} rejected slots keep rejected K/V "
                f"(garbage until a later token overwrites them)")
    shown = [l for l in st.layers if l in st.window_layers]
    if preserves and shown:
        left = int((states[shown[0]].reshape(-1)[st.slots[valid]] == SlotState.REJECTED).sum())
        if left:
            text += f". WARNING: {left} rejected slots of layer {shown[0]} differ from before the window"
    return head + text
