"""The two buffers NWOR holds beside the cache, as cells to draw: the staging buffer and the CoW log.

A `Frame` keeps, per recorded layer, one state per window row for each buffer the policy keeps
(`frame.staging`, `frame.log`; see states.py). Here they become heatmap cells laid out like the
verify window: one row per request, one column per token of its window (`t_last, d1 … dk`, or a
prefill's tokens). The staging buffer is dense `[T]` rows per layer in memory; the log holds one
entry per draft slot; the per-request layout only makes them easy to read against the cache grid.

Shapes: `T` window rows, `R` requests; a cell's customdata is `[request label, window row, slot,
what the buffer holds there]`.
"""
from __future__ import annotations

from nwor_lab.viz.states import SlotState, token_labels

__all__ = ["BUFFERS", "BUFFER_TITLES", "buffer_cells", "buffer_note"]

BUFFERS = ("staging", "log")
BUFFER_TITLES = {"staging": "staging buffer", "log": "CoW log"}

# What a buffer's cell means, per state (the cache legend's colours, read in the buffer's terms).
_MEANING = {
    "staging": {SlotState.STAGED: "in the staging buffer; the cache has not moved",
                SlotState.COMMITTED: "kept: copied into the cache by the commit",
                SlotState.WRITTEN: "window cancelled: flushed into the cache as off would",
                SlotState.EMPTY: "nothing here (not written yet, or dropped unread)"},
    "log": {SlotState.LOGGED: "the slot's old bits, saved before the window writes it",
            SlotState.RESTORED: "rejected: these bits were copied back into the slot",
            SlotState.EMPTY: "dropped: the draft was kept, nothing to restore"},
}


def buffer_note(frame, which: str) -> str | None:
    """Why a frame's policy keeps no such buffer (None when it keeps one)."""
    held = frame.staging if which == "staging" else frame.log
    if held:
        return None
    if which == "staging":
        return f"{frame.mode}: none<br>(rows go straight<br>into the cache)"
    return f"{frame.mode}: none<br>" + ("(rejected rows never<br>reach the cache)" if frame.staging else
                                       "(nothing is restored)" if frame.mode == "off" or not frame.log else "")


def buffer_cells(frame, which: str, layer: int | None = None) -> dict | None:
    """Heatmap cells (`z`, `x`, `y`, `text`, `customdata`) of `which` ("staging" | "log") for
    `layer` of `frame`, one row per request; None when the frame's policy keeps no such buffer.
    Cells outside a request's window are None (blank); in the log, so are rows that are not drafts
    (only draft slots are logged)."""
    held = frame.staging if which == "staging" else frame.log
    if not held:
        return None
    layer = frame.shown_layer if layer is None else layer
    states = held[layer].tolist()
    w = frame.window
    names = token_labels(w)
    kept = _kept(frame)
    slots = w.slot_mapping.tolist()
    is_draft = (w.token_draft_pos > 0).tolist()
    width = max(w.num_scheduled_tokens, default=1)
    z, text, custom, y = [], [], [], []
    t = 0
    for r, n in enumerate(w.num_scheduled_tokens):
        padding = n and all(s < 0 for s in slots[t:t + n])
        label = f"req {r}" + (" (padding)" if padding else "")
        y.append(label)
        row_z, row_text, row_custom = [], [], []
        for j in range(width):
            if j >= n or (which == "log" and not is_draft[t + j]):
                row_z.append(None), row_text.append(""), row_custom.append([label, None, None, ""])
                continue
            i = t + j
            state = SlotState(states[i])
            fate = "" if kept is None or not is_draft[i] else ("✓" if kept[i] else "✗")
            row_z.append(int(state))
            row_text.append(names[i][0].split(":", 1)[1] + fate)
            meaning = _MEANING[which].get(state, "")
            if state == SlotState.EMPTY and which == "staging" and kept is not None and frame.phase == "commit":
                meaning = "rejected: dropped with the buffer, it never reached the cache" if fate == "✗" else \
                    "not used" if slots[i] < 0 else meaning
            row_custom.append([names[i][1], i, slots[i], meaning])
        z.append(row_z), text.append(row_text), custom.append(row_custom)
        t += n
    return dict(z=z, x=list(range(width)), y=y, text=text, customdata=custom)


def _kept(frame):
    """`[T]` bool list of kept rows once the acceptance is known, else None."""
    if frame.acceptance is None:
        return None
    w, acc = frame.window, frame.acceptance
    mask = acc.commit_mask if getattr(acc, "commit_mask", None) is not None else w.commit_mask_from(acc.accepted_len)
    return mask.cpu().bool().tolist()
