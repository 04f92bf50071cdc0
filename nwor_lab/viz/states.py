"""Slot states: what one layer's paged cache holds at each phase of a window (no plotting here).

A state is decided per window row from what the bits say (did the row's slot change since the
window began?) and from what the policy declares (`window_in_buffer`: the window's K/V wait in a
staging buffer; `preserves_rejected_slots`: rejected slots end bit-identical to before). The
declaration says what to expect; the bits show whether it happened: a rejected slot that a
preserving policy left changed is drawn REJECTED, not RESTORED.

Shapes: `T` window rows, `NB` blocks, `BS` block size; slot = block * BS + offset.
"""
from __future__ import annotations

from enum import IntEnum

import torch

from nwor_lab.ops.quant import raw


class SlotState(IntEnum):
    """What a cache slot of one layer holds. There is no PADDING state: a padding token has slot
    -1 and no cell (window_timeline draws it)."""

    EMPTY = 0       # no token's K/V
    COMMITTED = 1   # K/V of a kept token
    STAGED = 2      # a window row waiting in the staging buffer (drawn in the buffer's panel; its
                    # cache slot is untouched and shows what it holds)
    WRITTEN = 3     # written this window, fate not decided yet
    REJECTED = 4    # written, then rejected: the rejected K/V stays (garbage until overwritten)
    LOGGED = 5      # old contents saved to the CoW log before the window writes the slot
    RESTORED = 6    # written, rejected, and bit-restored from the log
    OLD = 7         # bits from before: no running request's kept token (a freed block, a stale or
                    # evicted entry, K/V nobody declared committed)


STATE_MEANING = {
    SlotState.EMPTY: "empty",
    SlotState.COMMITTED: "committed: K/V of a kept token",
    SlotState.STAGED: "staged: waits in the staging buffer (cache untouched)",
    SlotState.WRITTEN: "written this window, fate not decided",
    SlotState.REJECTED: "rejected K/V left in the cache",
    SlotState.LOGGED: "old contents saved to the log",
    SlotState.RESTORED: "rejected, bits restored from the log",
    SlotState.OLD: "old contents: bits from before, no kept token",
}

# Short names for legends (the hover keeps STATE_MEANING)
STATE_LEGEND = {
    SlotState.EMPTY: "empty",
    SlotState.OLD: "old contents (no kept token)",
    SlotState.COMMITTED: "committed (kept token)",
    SlotState.STAGED: "staged (in the buffer)",
    SlotState.WRITTEN: "written, fate open",
    SlotState.REJECTED: "rejected K/V left",
    SlotState.LOGGED: "saved to the CoW log",
    SlotState.RESTORED: "restored from the log",
}

# The legend's order: the life of a slot (old contents come before anything a window does)
LEGEND_ORDER = (SlotState.EMPTY, SlotState.OLD, SlotState.COMMITTED, SlotState.STAGED, SlotState.WRITTEN,
                SlotState.REJECTED, SlotState.LOGGED, SlotState.RESTORED)


def occupancy(key_layer: torch.Tensor, value_layer: torch.Tensor, *,
              held: SlotState = SlotState.COMMITTED) -> torch.Tensor:
    """`[NB * BS]` int8 first guess of a layer's states: `held` where any K/V bit is set, else
    EMPTY (caches are allocated zeroed). key/value_layer: `[NB, BS, H, D]`, any layout/dtype.
    `held`: COMMITTED when the caller knows the bits are kept tokens' K/V (a cache it filled), OLD
    when it does not (bits found before a recording: freed blocks, stale entries)."""
    nb, bs = key_layer.shape[:2]
    used = (raw(key_layer) != 0).flatten(2).any(-1) | (raw(value_layer) != 0).flatten(2).any(-1)
    out = torch.full((nb * bs,), int(SlotState.EMPTY), dtype=torch.int8)
    out[used.reshape(-1).cpu()] = int(held)
    return out


def slot_rows(key_layer: torch.Tensor, value_layer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Raw bits of K and V at `slots` (`[T]`, -1 allowed, read as zeros): `[T, 2, H*D]` on the host,
    what a phase compares against the window's start to see which slots changed."""
    bs = key_layer.shape[1]
    s = slots.long().to(key_layer.device).clamp(min=0)
    k, v = raw(key_layer)[s // bs, s % bs], raw(value_layer)[s // bs, s % bs]
    rows = torch.stack([k.flatten(1), v.flatten(1)], dim=1).cpu()
    rows[(slots < 0).cpu()] = 0
    return rows


def row_states(base: torch.Tensor, *, delivered: torch.Tensor, changed: torch.Tensor,
               logged: torch.Tensor, kept: torch.Tensor | None, finished: bool,
               window_in_buffer: bool, preserves_rejected_slots: bool) -> torch.Tensor:
    """State of each window row's slot in one layer. All arguments `[T]`, on the host.

    base:      int8 state of the slot before the window
    delivered: bool, the row's K/V for this layer reached the policy (write phase passed it)
    changed:   bool, the slot's bits differ from the window's start
    logged:    bool, the slot's old contents are in the CoW log (for this layer)
    kept:      bool commit mask (None before the acceptance is known, or for a cancelled window)
    finished:  the window is committed (or cancelled): the cache holds its final state
    """
    s = base.clone()
    s[logged] = SlotState.LOGGED
    s[delivered] = SlotState.WRITTEN
    if window_in_buffer:    # the row waits in the staging buffer (drawn there): the slot shows what it holds
        untouched = delivered & ~changed
        s[untouched] = base[untouched]
    if not finished:
        return s
    if kept is None:                                    # cancelled: rows stay as `off` leaves them
        s = base.clone()
        s[changed] = SlotState.WRITTEN
        return s
    rejected = ~kept
    reached_cache = delivered & (changed | torch.tensor(not window_in_buffer))
    s = base.clone()
    s[kept & delivered] = SlotState.COMMITTED
    s[rejected & reached_cache] = SlotState.RESTORED if preserves_rejected_slots else SlotState.REJECTED
    s[rejected & changed] = SlotState.REJECTED          # bits differ: whatever was declared
    return s                                            # rejected, never reached the cache: base


def staging_rows(delivered: torch.Tensor, kept: torch.Tensor | None, *, finished: bool,
                 cancelled: bool = False) -> torch.Tensor:
    """`[T]` int8: what the staging buffer holds for each window row of one layer (a policy that
    declares `window_in_buffer`). STAGED once the row's K/V arrived; after the commit a kept row is
    COMMITTED (copied into the cache) and a rejected one EMPTY (dropped with the buffer, it never
    reached the cache); a cancelled window flushes what arrived into the cache, as `off` would
    have written it (WRITTEN). delivered / kept: `[T]` bool (kept None before the acceptance)."""
    s = torch.full(delivered.shape, int(SlotState.EMPTY), dtype=torch.int8)
    s[delivered] = SlotState.STAGED
    if finished:
        s[:] = SlotState.EMPTY
        if cancelled or kept is None:
            s[delivered] = SlotState.WRITTEN
        else:
            s[delivered & kept] = SlotState.COMMITTED
    return s


def log_rows(logged: torch.Tensor, kept: torch.Tensor | None, *, finished: bool,
             cancelled: bool = False) -> torch.Tensor:
    """`[T]` int8: what the CoW log holds, by the window row whose slot it saved (one layer).
    LOGGED from begin (the slot's old bits); after the commit a rejected row's entry is RESTORED
    (copied back into the cache) and a kept row's EMPTY (dropped: the new K/V stay); a cancelled
    window drops the whole log. logged / kept: `[T]` bool."""
    s = torch.full(logged.shape, int(SlotState.EMPTY), dtype=torch.int8)
    s[logged] = SlotState.LOGGED
    if finished:
        s[:] = SlotState.EMPTY
        if not cancelled and kept is not None:
            s[logged & ~kept] = SlotState.RESTORED
    return s


def settle(final: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """The states a finished window leaves as the next window's "before" (`[N]` int8 both): a
    restored slot holds its old contents again; an undecided one (cancelled window) is stale
    until rewritten, like rejected K/V."""
    out = final.clone()
    restored = final == SlotState.RESTORED
    out[restored] = before[restored]
    out[final == SlotState.WRITTEN] = SlotState.REJECTED
    return out


def token_labels(window) -> list[tuple[str, str]]:
    """Per window row `(short, long)` names: ("1:d2", "req 1 · d2"), ("1:t", "req 1 · t_last"),
    ("0:p3", "req 0 · token 3") for prefill / plain-decode tokens; ("0:n5", "req 0 · node 5 (depth 2)")
    for the nodes of a tree window."""
    req = window.token_req.tolist()
    pos = window.token_draft_pos.tolist()
    tree = getattr(window, "is_tree", False)
    depth = window.token_depth.tolist() if tree else None
    out, seen = [], {}
    for t, (r, j) in enumerate(zip(req, pos)):
        i = seen[r] = seen.get(r, -1) + 1
        if tree and j > 0:      # a tree window's row j is node j (its depth decides its position)
            out.append((f"{r}:n{j}", f"req {r} · node {j} (depth {depth[t]})"))
        elif j > 0:
            out.append((f"{r}:d{j}", f"req {r} · d{j}"))
        elif window.num_draft_tokens[r] > 0:
            out.append((f"{r}:t", f"req {r} · t_last"))
        else:
            out.append((f"{r}:p{i}", f"req {r} · token {i}"))
    return out


def layer_states(before, after, window, acceptance, *, layer: int, window_in_buffer: bool,
                 preserves_rejected_slots: bool, base: torch.Tensor | None = None) -> torch.Tensor:
    """`[NB, BS]` int8 states of one layer after a committed window, from the bits.

    before, after: stacked `(key, value)` `[L, NB, BS, H, D]` (e.g. `cache.snapshot()` before the
        window, and the cache's `(key, value)` after it; a `PagedKVCache` is accepted for either)
    window:     the `Window` that ran
    acceptance: its `Acceptance` (or None for a window without drafts: everything kept)
    base:       `[NB * BS]` states before the window; default: `occupancy(before, held=OLD)`
                (bits before the window are old contents; pass a base to call some committed)
    The two flags are the policy's declaration (`policy.window_in_buffer`,
    `policy.preserves_rejected_slots`).
    """
    bk, bv = _stacked(before)
    ak, av = _stacked(after)
    nb, bs = bk.shape[1:3]
    if base is None:
        base = occupancy(bk[layer], bv[layer], held=SlotState.OLD)
    slots = window.slot_mapping.cpu()
    valid = slots >= 0
    changed = (slot_rows(bk[layer], bv[layer], slots) != slot_rows(ak[layer], av[layer], slots)).flatten(1).any(1)
    if acceptance is None:
        kept = torch.ones(window.num_tokens, dtype=torch.bool)
    elif getattr(acceptance, "commit_mask", None) is not None:
        kept = acceptance.commit_mask.cpu()
    else:
        kept = window.commit_mask_from(acceptance.accepted_len).cpu()
    rows = row_states(base[slots.clamp(min=0)], delivered=torch.ones_like(valid), changed=changed,
                      logged=torch.zeros_like(valid), kept=kept, finished=True,
                      window_in_buffer=window_in_buffer, preserves_rejected_slots=preserves_rejected_slots)
    out = base.clone()
    out[slots[valid]] = rows[valid]
    return out.view(nb, bs)


def declared(policy) -> tuple[bool, bool]:
    """`(window_in_buffer, preserves_rejected_slots)` as the policy declares them."""
    return bool(policy.window_in_buffer), bool(policy.preserves_rejected_slots)


def _stacked(cache_or_pair):
    if hasattr(cache_or_pair, "key") and hasattr(cache_or_pair, "value"):
        return cache_or_pair.key, cache_or_pair.value
    return cache_or_pair
