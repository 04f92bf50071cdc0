"""A request dropped while its verify window is open (chapter 15): the window stepped frame by frame
under each write policy, read from the cache's bits by an engine observer.

`drop_frames(pair, prompts, nwor_mode=..., what="abort" | "preempt")` runs a few requests through
the engine; in the first verify window with drafts at or after `step`, once the verify pass has
written its last target layer (between verify and commit), it calls `engine.abort` or
`engine.preempt` on one request. Each frame (begin, the first layer written, the last layer written
and the drop, acceptance, commit, the end of the step) records, for the dropped request, how many of
its draft slots hold K/V the window wrote (compared bit for bit with the cache at `begin`), what
`cow` logged, the accepted length the commit used and its committed length. The run then goes on;
the other requests' tokens are compared with a run without the drop.

A draft slot "changed" when its bits differ from `begin`'s in any layer. Under `off` a slot can
hold, from an earlier window, the same rejected draft's K/V bit for bit, so a write may change
fewer slots than it writes; where the rows go (cache or staging buffer) is what the policy declares.

`drop_frames_figure` draws the frames of several policies as one grid (a policy per row).
"""
from __future__ import annotations

import plotly.graph_objects as go

from nwor_lab.viz.categories import add_category_legend, category_heatmap
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import CELL_FONT, STATE_COLOURS, base_layout

UNTOUCHED, WRITTEN, LEFT, RESTORED, FREED = range(5)
FRAME_STATES = [("draft slots untouched (stage: the rows wait in its buffer)", STATE_COLOURS[SlotState.EMPTY]),
                ("window K/V written in the draft slots", STATE_COLOURS[SlotState.WRITTEN]),
                ("rejected K/V left past the committed length", STATE_COLOURS[SlotState.REJECTED]),
                ("restored from cow's log", STATE_COLOURS[SlotState.RESTORED]),
                ("blocks freed (abort) or given up (preempt)", STATE_COLOURS[SlotState.OLD])]


class _Dropper:
    """The observer: drops request `rid` in its first verify window with drafts at step >= `step`,
    when the verify pass has written layer `last_layer`, and records the frames of that window."""

    def __init__(self, engine, rid: int, what: str, step: int, last_layer: int):
        self.e, self.rid, self.what, self.step, self.last_layer = engine, rid, what, step, last_layer
        self.frames, self.active, self.done = [], False, False
        self.before = self.index = self.slots = None
        self.logged = 0

    def _changed(self) -> int:
        """Draft slots of the dropped request whose bits (any layer) differ from the cache at begin."""
        if self.slots is None or not len(self.slots):
            return 0
        bs = self.e.cache.spec.block_size
        key, value = self.e.cache.snapshot()
        b, o = self.slots // bs, self.slots % bs
        diff = (key[:, b, o] != self.before[0][:, b, o]) | (value[:, b, o] != self.before[1][:, b, o])
        return int(diff.reshape(diff.shape[0], diff.shape[1], -1).any(-1).any(0).sum())

    def _frame(self, label, ev, dropped=False):
        r = self.req
        accepted = None
        if ev.acceptance is not None:
            accepted = int(ev.acceptance.accepted_len[self.index])
        # where the window's rows go is what the policy declares; what the slots hold is read from the bits
        self.frames.append(dict(phase=label, changed=self._changed(), drafts=len(self.slots), logged=self.logged,
                                accepted=accepted, num_computed=r.num_computed, dropped=dropped,
                                blocks=len(r.block_table.blocks), written=ev.phase == "write" or None,
                                in_buffer=ev.policy.window_in_buffer,
                                preserves=ev.policy.preserves_rejected_slots))

    def on_phase(self, ev):
        e = self.e
        if ev.kind != "verify" or self.done:
            return
        if ev.phase == "begin" and not self.active and e.step_index >= self.step:
            stepping = e.lifecycle.stepping()
            j = next((i for i, r in enumerate(stepping) if r.req_id == self.rid), None)
            if j is None or not stepping[j].drafts:
                return
            self.active, self.index, self.req = True, j, stepping[j]
            w = ev.window
            mine = (w.token_req.long() == j) & (w.token_draft_pos > 0) & (w.slot_mapping >= 0)
            self.slots = w.slot_mapping[mine].long()
            self.before = e.cache.snapshot()
            if ev.logged_slots is not None:
                self.logged = int(sum(int(s) in set(self.slots.tolist()) for s in ev.logged_slots.tolist()))
            self._frame("begin", ev)
            return
        if not self.active:
            return
        if ev.phase == "write" and ev.layer == 0:
            self._frame("verify: layer 0 written", ev)
        elif ev.phase == "write" and ev.layer == self.last_layer:
            getattr(e, self.what)(self.rid)
            self._frame(f"verify done: {self.what} here", ev, dropped=True)
        elif ev.phase == "acceptance":
            self._frame("acceptance", ev)
        elif ev.phase == "commit":
            self._frame("commit", ev)
            self.done = True


def drop_frames(pair, prompts, *, nwor_mode: str = "stage", what: str = "abort", rid: int = 1, step: int = 3,
                k: int = 4, new_tokens: int = 16, block_size: int = 8, num_blocks: int = 64,
                preemption: str = "recompute") -> dict:
    """One run with the drop and one without. -> dict(frames, outputs, reference, others_unchanged,
    dropped_output_is_prefix, stats: engine.preemption_stats as a dict)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.preemption import Preemption
    if what not in ("abort", "preempt"):
        raise ValueError(f"what={what!r}: choose 'abort' or 'preempt'")
    target, head, tok = pair
    ids = [tok.encode(p).ids if isinstance(p, str) else list(p) for p in prompts]
    if not 0 <= rid < len(ids):
        raise ValueError(f"rid={rid}: choose a request 0 .. {len(ids) - 1}")

    def engine():
        e = SpecEngine(target, head, LabConfig(nwor_mode=nwor_mode, scv_mode="graph"), k=k, block_size=block_size,
                       num_blocks=num_blocks, max_num_seqs=len(ids), preemption=Preemption(preemption))
        return e, [e.add_request(p, new_tokens) for p in ids]

    ref_engine, ref_reqs = engine()
    ref_engine.run()
    reference = [r.output for r in ref_reqs]
    e, reqs = engine()
    dropper = _Dropper(e, reqs[rid].req_id, what, step, target.config.num_hidden_layers - 1)
    e.observers.append(dropper)
    after = None
    while e.scheduler.has_work:
        e.step()
        if dropper.done and after is None:
            r = reqs[rid]
            after = dict(phase="after the step", changed=None, drafts=len(dropper.slots), logged=dropper.logged,
                         accepted=None, written=None, num_computed=r.num_computed, dropped=False,
                         blocks=len(r.block_table.blocks),
                         aborted=r.aborted, waiting=any(x is r for x in e.scheduler.waiting),
                         swapped=r.swapped is not None)
            dropper.frames.append(after)
    if not dropper.done:
        raise ValueError(f"request {rid} had no verify window with drafts at step >= {step}: lower `step` or "
                         f"raise `new_tokens`")
    outputs = [r.output for r in reqs]
    others = all(o == ref for i, (o, ref) in enumerate(zip(outputs, reference)) if i != rid)
    return dict(frames=dropper.frames, outputs=outputs, reference=reference, others_unchanged=others,
                dropped_output_is_prefix=outputs[rid] == reference[rid][:len(outputs[rid])],
                dropped_equals_reference=outputs[rid] == reference[rid], what=what, nwor_mode=nwor_mode,
                preemption=preemption, stats=e.preemption_stats.as_dict(), rid=rid)


def _cell(f) -> tuple[int, str]:
    """A frame's colour (FRAME_STATES) and text."""
    if f["phase"] == "after the step":
        where = ("aborted" if f.get("aborted") else "swapped to host" if f.get("swapped")
                 else "waiting (recompute)" if f.get("waiting") else "running")
        return FREED, f"{where}<br>{f['blocks']} blocks held<br>committed {f['num_computed']}"
    n, k = f["changed"], f["drafts"]
    bits = f"{n}/{k} draft slots changed"
    if f["phase"] == "begin":
        return UNTOUCHED, (f"cow logged {f['logged']} slots<br>" if f["logged"] else "") + bits
    if f["written"]:
        where = "staging buffer" if f["in_buffer"] else "the cache"
        return (UNTOUCHED if f["in_buffer"] else WRITTEN), f"{k} draft rows →<br>{where}<br>{bits}"
    text = f"accepted {f['accepted']} of {k}<br>{bits}"
    if f["phase"] == "commit":
        state = UNTOUCHED if f["in_buffer"] else RESTORED if f["preserves"] and not n else LEFT
        return state, text + f"<br>committed {f['num_computed']}"
    return (UNTOUCHED if f["in_buffer"] else WRITTEN), text


def drop_frames_figure(runs: list[dict], *, title=None, subtitle=None) -> go.Figure:
    """Rows: one `drop_frames` run per write policy; columns: the frames; cells coloured by what the
    dropped request's draft slots hold."""
    columns = [f["phase"] for f in runs[0]["frames"]]
    z, text = [], []
    for run in runs:
        zr, tr = [], []
        for f in run["frames"]:
            state, t = _cell(f)
            zr.append(state)
            tr.append(t)
        z.append(zr)
        text.append(tr)
    what = runs[0]["what"]
    fig = go.Figure(category_heatmap(z, FRAME_STATES, x=columns, y=[r["nwor_mode"] for r in runs], text=text,
                                     texttemplate="%{text}", textfont=dict(CELL_FONT, size=11), xgap=3, ygap=3,
                                     hovertemplate="%{y} · %{x}<br>%{text}<extra></extra>"))
    add_category_legend(fig, FRAME_STATES)
    fig.update_layout(**base_layout(title or f"A request {what}ed between verify and commit, frame by frame", subtitle),
                      height=260 + 84 * len(runs) + 40, width=1100)
    fig.update_xaxes(type="category", showgrid=False, title_text="the window's phases, left to right")
    fig.update_yaxes(type="category", autorange="reversed", showgrid=False, title_text="write policy")
    return fig
