"""Watching a window's lifecycle: one event per phase, for pictures, steppers and logs.

A policy calls `observer.on_phase(event)` for each phase of each window:

    begin       the window is open; CoW has saved its log (`logged_slots`): the cache is "before"
    write       one layer's rows `rows` were written (to the cache, or to the window buffer)
    acceptance  the acceptance was checked; nothing committed or restored yet
    commit      the cache holds its final state for the window (`record` says what moved)
    cancel      the window was abandoned; the cache is as `off` would have left it

Observers only read. With no observer attached a policy builds no event (one list check).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.metrics import WindowRecord
from nwor_lab.window import Acceptance, Window

PHASES = ("begin", "write", "acceptance", "commit", "cancel")


class ObservedPolicy(Protocol):
    """What an observer may read of the `WritePolicy` that sent an event: what it declares. (Named by
    these attributes rather than by the class: `policies.policy` imports this module.)"""

    name: str                                # the registry name (for captions and logs)
    cache: PagedKVCache                      # the cache the window writes
    window_in_buffer: bool                   # attention reads the window from the policy's buffer
    preserves_rejected_slots: bool           # every rejected slot is left as it was


@dataclass(frozen=True)
class PhaseEvent:
    phase: str                               # one of PHASES
    kind: str                                # what begin() was told: "verify", "draft", or ""
    policy: ObservedPolicy                   # the WritePolicy that sent the event
    window: Window
    layers: range                            # the layers the window may write
    layer: int | None = None                 # write: the layer written
    rows: range | None = None                # write: window rows written
    acceptance: Acceptance | None = None     # acceptance, commit
    record: WindowRecord | None = None       # commit, cancel
    logged_slots: torch.Tensor | None = None  # begin: slots whose old contents were saved (CoW)


class WindowObserver(Protocol):
    def on_phase(self, event: PhaseEvent) -> None: ...


def check_observers(name: str, observers) -> None:
    """Every observer has a callable `on_phase` (checked when a window opens, before anything is
    written, so a wrong object is named instead of failing half-way through a window)."""
    for i, o in enumerate(observers):
        if not callable(getattr(o, "on_phase", None)):
            raise TypeError(f"{name}[{i}]: {type(o).__name__} object has no on_phase(event) method; an observer "
                            f"defines on_phase (see nwor_lab.policies.observer), e.g. LogObserver()")


class LogObserver:
    """Collects one line per phase (`lines`); handy in a notebook or a test."""

    def __init__(self):
        self.lines: list[str] = []

    def on_phase(self, e: PhaseEvent) -> None:
        what = {"write": f" layer {e.layer} rows {e.rows.start}..{e.rows.stop - 1}" if e.rows else "",
                "acceptance": f" accepted {e.acceptance.accepted_per_request()}" if e.acceptance else "",
                "commit": f" {e.record.tokens_committed} tokens kept" if e.record else ""}.get(e.phase, "")
        self.lines.append(f"{e.policy.name} {e.kind or 'window'} {e.phase}{what}")
