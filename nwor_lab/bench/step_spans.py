"""Naming the pieces of an engine step's host time, from outside the engine: each piece is one of the
engine's own calls, wrapped (for the duration of a `with`) in a perf_counter span that is also a
torch.profiler `record_function` range of the same name while a profiler records (only then: the range
itself costs host time, which every span would otherwise count as its own).

    with StepSpans(engine) as spans:
        for _ in range(n):
            spans.step()                 # engine.step_with_progress() inside the root span "step"
    spans.table()                        # per piece: ms per step, self and inclusive, share of the step

The pieces (`PIECES`, in the order a step meets them):

    schedule        Scheduler.schedule: admission, block allocation (a host tier's restores and
                    offloads run inside it: `host_tier.restore`, `host_tier.offload` when wrapped)
    kind.schedule   the window kind's look at the scheduled requests
    fill            the window kind's `fill`: the step's inputs laid out on the host ...
    host_rows       ... (StepInputs.host_rows, inside fill; alone on a pre-launched step: what the
                    device fed itself, rebuilt on the host for the bookkeeping)
    upload          ... and copied to the device (StaticInputs.upload)
    launch          StepRunner._launch: the body run eagerly, captured, or its graph replayed
    readback.start  the packed outputs' copy to the host enqueued
    prelaunch.check whether the next step may be launched now (StepRunner._can_prelaunch)
    prelaunch       the next step launched before this one is read (StepRunner._prelaunch)
    readback        Readback.rows: the step's one sync (waits for the device), then the rows
    result          StepResult: the rows split into sampled ids, accepted lengths, next drafts
    advance         SpecEngine._advance: the host's bookkeeping after the readback, holding
    host_window     ... the verify window and its acceptance rebuilt on the host,
    records         ... the write policy's records of the window,
    hand_out        ... the next drafts handed to the requests,
    trace           ... the window's trace entry (each window's: verify and draft),
    draft_record    ... the head's draft window and its record (every row rejected)
    drops           the requests aborted or preempted while the step ran, applied (Lifecycle.apply_drops)
    records.flush   the step before's records, counted once this step is launched (SpecEngine.flush_records:
                    `records` and `draft_record`'s count run inside it when the engine defers them)

Self time is a span's time minus the spans it holds; the root's self time is what no piece names.
Every wrapper is removed on exit (instance attributes deleted, class attributes restored). What is
wrapped is read from the engine as it is: a renamed method is reported as missing (`missing`), not
silently skipped.
"""
from __future__ import annotations

import contextlib
import statistics
import time

# (piece, owner path from the engine or a class, attribute)
PIECES = (
    ("schedule", "scheduler", "schedule"),
    ("kind.schedule", "window_kind", "schedule"),
    ("fill", "window_kind", "fill"),
    ("host_rows", "class:StepInputs", "host_rows"),
    ("upload", "class:StaticInputs", "upload"),
    ("launch", "runner", "_launch"),
    ("readback.start", "class:Readback", "start"),
    ("prelaunch.check", "runner", "_can_prelaunch"),
    ("prelaunch", "runner", "_prelaunch"),
    ("readback", "class:Readback", "rows"),
    ("result", "class:StepResult", "__init__"),
    ("advance", "", "_advance"),
    ("host_window", "window_kind", "host_window"),
    ("records", "runner", "records"),
    ("hand_out", "window_kind", "hand_out"),
    ("trace", "", "_end_window"),
    ("draft_record", "", "_record_draft_window"),
    ("drops", "lifecycle", "apply_drops"),
    ("records.flush", "", "flush_records"),
)
TIER = (("host_tier.offload", "on_evict"), ("host_tier.restore", "extend_hits"))


def _profiler_range(name: str):
    """torch.profiler's `record_function(name)` while a profiler is active, else a no-op context."""
    import torch
    active = getattr(torch.autograd, "_profiler_enabled", None)
    if active is not None and not active():
        return contextlib.nullcontext()
    from torch.profiler import record_function
    return record_function(name)


def _classes() -> dict:
    from nwor_lab.engine.buffers import Readback, StaticInputs
    from nwor_lab.engine.runner import StepResult
    from nwor_lab.engine.step import StepInputs
    return {"StaticInputs": StaticInputs, "Readback": Readback, "StepInputs": StepInputs, "StepResult": StepResult}


class StepSpans:
    """Wraps the engine's pieces (PIECES; with `tier`, the host tier's offload and restore) while
    active. `step()` runs one engine step in the root span; `per_step` keeps each step's
    {piece: (inclusive s, self s)}."""

    def __init__(self, engine, *, tier: bool = False):
        self.engine = engine
        self.tier = tier
        self.per_step: list[dict] = []
        self.missing: list[str] = []
        self._undo: list = []
        self._stack: list[list] = []       # [name, start, child seconds]
        self._current: dict | None = None

    # -- wrapping -------------------------------------------------------------------------------
    def _wrap(self, name: str, fn):
        spans = self

        def wrapped(*args, **kwargs):
            with spans.span(name):
                return fn(*args, **kwargs)
        return wrapped

    def _patch_instance(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr, None)
        if fn is None:
            self.missing.append(name)
            return
        had = attr in vars(obj)
        setattr(obj, attr, self._wrap(name, fn))
        self._undo.append(lambda: setattr(obj, attr, fn) if had else delattr(obj, attr))

    def _patch_class(self, cls, attr: str, name: str) -> None:
        raw = cls.__dict__.get(attr)
        if raw is None:
            self.missing.append(name)
            return
        if isinstance(raw, staticmethod):
            new = staticmethod(self._wrap(name, raw.__func__))
        else:
            new = self._wrap(name, raw)
        setattr(cls, attr, new)
        self._undo.append(lambda: setattr(cls, attr, raw))

    def __enter__(self) -> "StepSpans":
        e, classes = self.engine, _classes()
        for name, owner, attr in PIECES:
            if owner.startswith("class:"):
                self._patch_class(classes[owner[6:]], attr, name)
            else:
                obj = e if not owner else getattr(e, owner, None)
                if obj is None:
                    self.missing.append(name)
                else:
                    self._patch_instance(obj, attr, name)
        if self.tier:
            host = getattr(getattr(e, "prefix", None), "host", None)
            if host is None:
                raise ValueError("StepSpans(tier=True): the engine has no host tier (PrefixCacheConfig(host_blocks=N))")
            for name, attr in TIER:
                self._patch_instance(host, attr, name)
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    # -- timing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def span(self, name: str):
        if self._current is None:          # a wrapped call outside step(): not a step's piece
            yield
            return
        entry = [name, time.perf_counter(), 0.0]
        self._stack.append(entry)
        try:
            # the profiler's range only while a profiler records: entering a record_function costs
            # about 11 µs of host time on a 2-core CPU even with no profiler, which every span's self time would hold
            with _profiler_range(name):
                yield
        finally:
            self._stack.pop()
            took = time.perf_counter() - entry[1]
            inc, own = self._current.get(name, (0.0, 0.0))
            self._current[name] = (inc + took, own + took - entry[2])
            if self._stack:
                self._stack[-1][2] += took

    def step(self) -> float:
        """One engine step in the root span "step" -> its wall seconds."""
        self._current = {}
        try:
            with self.span("step"):
                self.engine.step_with_progress()
            self.per_step.append(self._current)
            return self._current["step"][0]
        finally:
            self._current = None

    # -- the answer -----------------------------------------------------------------------------
    def table(self, steps: list[int] | None = None) -> dict:
        """Per piece over the recorded steps (`steps`: those indices of `per_step` only): mean ms per step
        (inclusive and self), calls per step (the share of steps it ran in), self share of the step's
        wall time; `(unnamed)` the root's self time."""
        per_step = self.per_step if steps is None else [self.per_step[i] for i in steps]
        n = len(per_step)
        if not n:
            raise ValueError("StepSpans.table: no step was recorded (call step())")
        walls = [s["step"][0] for s in per_step]
        wall = sum(walls) / n
        names = [p for p, _, _ in PIECES] + ([t for t, _ in TIER] if self.tier else [])
        pieces = {}
        for name in names:
            hit = [s[name] for s in per_step if name in s]
            if hit:
                inc, own = sum(h[0] for h in hit) / n, sum(h[1] for h in hit) / n
                pieces[name] = {"ms": round(1e3 * own, 4), "inclusive_ms": round(1e3 * inc, 4),
                                "steps_with_it": len(hit), "share": round(own / wall, 4)}
        unnamed = sum(s["step"][1] for s in per_step) / n
        pieces["(unnamed)"] = {"ms": round(1e3 * unnamed, 4), "inclusive_ms": round(1e3 * unnamed, 4),
                               "steps_with_it": n, "share": round(unnamed / wall, 4)}
        readback = pieces.get("readback", {}).get("ms", 0.0)
        return {"steps": n, "step_ms": round(1e3 * wall, 4), "step_ms_median": round(1e3 * statistics.median(walls), 4),
                "step_ms_min": round(1e3 * min(walls), 4), "step_ms_max": round(1e3 * max(walls), 4),
                "host_ms_outside_readback": round(1e3 * wall - readback, 4), "pieces": pieces,
                "missing": list(self.missing),
                "note": "readback holds the wait for the device (the step's one sync); every other piece is host "
                        "work, except launch on an eager step (the body's kernels are launched there)"}

