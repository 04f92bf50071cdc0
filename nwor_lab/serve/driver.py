"""The engine stepped in wall-clock time, as a server runs it: requests join when they arrive.

    open loop    request i is sent at arrivals[i] seconds (a Poisson process, `workload`); it
                 joins the engine at the first step boundary after that (a step is not
                 interrupted: the wait counts in its TTFT, as a server's queueing does); with
                 nothing to run the loop sleeps until the next arrival
    closed loop  `concurrency` clients; each sends its next request the moment its last one
                 finished, so the batch never drains until the workload runs out (`steady`: the
                 span before the last request was sent)

Every token is timed when the host has it: after the step that emitted it (the step ends with
its readback). One step's tokens of one request form one chunk, as one streamed message of vLLM's
or SGLang's server: ITL is the gap between chunks, so a chunk of several accepted drafts is one
gap, as those benchmarks count it.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass, field

from nwor_lab.serve.workload import RequestSpec


@dataclass
class RequestTimes:
    """One request's life, in seconds since the run started."""
    prompt_len: int
    output_len: int                     # tokens asked (ignore-eos: every one is generated)
    arrival: float                      # when the client sent it
    chunks: list[tuple[float, int]] = field(default_factory=list)   # (time, tokens) per emitting step
    finish: float | None = None

    @property
    def generated(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass
class StepRecord:
    """One engine step: its span, the verify window's requests, its drafts per speculative request
    (the most any one verified: a step's count is uniform but for budget cuts), whether a prefill
    rode in it, the tokens it emitted, and the queue around it."""
    start: float
    seconds: float
    requests: int
    drafts: int
    prefill: bool
    tokens: int
    running: int                        # after the step
    waiting: int                        # before the step
    prelaunched: bool = False           # launched before the host read the step before (its host work hidden)
    rows: int = 0                       # rows of the requests' tokens (t_last, drafts, prompts)
    padded_rows: int = 0                # rows the step ran (its bucket's, or an eager step's exact buffers')


@dataclass
class ServeRun:
    mode: str                           # "open" or "closed"
    rate: float | None                  # open loop: requests per second
    concurrency: int | None             # closed loop: clients
    max_num_seqs: int
    requests: list[RequestTimes]
    steps: list[StepRecord]
    duration: float                     # first send to last token
    steady: tuple[float, float] | None = None   # closed loop: (0, when the last request was sent)
    gc_pauses: list[tuple[int, float, float]] = field(default_factory=list)   # (generation, start s, seconds)


@contextlib.contextmanager
def gc_pauses():
    """Python's garbage collections while the `with` runs, as (generation, start, seconds) in a list
    (the `with`'s value, filled as they happen): a full collection over a large heap stalls the
    host for tens of ms, which a serving loop sees as one slow step."""
    pauses, started = [], {}

    def callback(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            t = started.pop("t")
            pauses.append((info.get("generation", -1), t, time.perf_counter() - t))
    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


class Progress:
    """A one-line progress bar on stderr (finished requests), redrawn at most every 0.2 s."""

    def __init__(self, total: int, label: str, stream=None, enabled: bool = True):
        self.total, self.label, self.stream, self.enabled = total, label, stream or sys.stderr, enabled
        self.last = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < 0.2):
            return
        self.last = now
        width = 30
        fill = width * done // max(1, self.total)
        self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total}")
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def serve(engine, specs: list[RequestSpec], *, arrivals: list[float] | None = None, concurrency: int | None = None,
          rate: float | None = None, controller=None, progress: Progress | None = None,
          clock=time.perf_counter, sleep=time.sleep, step=None) -> ServeRun:
    """Run `specs` through `engine` in wall-clock time -> ServeRun.

    Exactly one of `arrivals` (open loop: send offsets in seconds, non-decreasing, one per spec;
    `rate` is only recorded) and `concurrency` (closed loop) is given. `controller`: an object with
    `observe_step(entries, seconds)` (an AdaptiveK) told every step's windows and wall time.
    `step`: what runs one engine step (default `engine.step_with_progress`; a profiler's wrapper).
    """
    if (arrivals is None) == (concurrency is None):
        raise ValueError("serve: give arrivals (open loop) or concurrency (closed loop), not both")
    n = len(specs)
    if arrivals is not None and len(arrivals) != n:
        raise ValueError(f"serve: {len(arrivals)} arrivals for {n} requests; give one per request")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency={concurrency}: at least one client")
    sched = engine.scheduler
    if sched.has_work:
        raise ValueError("serve: the engine already has requests; start from an idle engine")
    records: list[RequestTimes] = []
    live: dict[int, tuple[RequestTimes, object]] = {}
    steps: list[StepRecord] = []
    t0 = clock()
    last_sent = 0.0

    def send(i: int, at: float) -> None:
        nonlocal last_sent
        rec = RequestTimes(len(specs[i].prompt), specs[i].output_len, at)
        req = engine.add_request(specs[i].prompt, specs[i].output_len, name=f"request {i}")
        records.append(rec)
        live[req.req_id] = (rec, req)
        last_sent = at

    real0 = time.perf_counter()       # the collections' clock (`clock` may be a test's)
    with gc_pauses() as pauses:
        issued = done = 0
        if concurrency is not None:
            while issued < min(concurrency, n):
                send(issued, 0.0)
                issued += 1
        while done < n:
            now = clock() - t0
            if arrivals is not None:
                while issued < n and arrivals[issued] <= now:
                    send(issued, arrivals[issued])
                    issued += 1
                if not sched.has_work:                  # idle: the next client has not sent yet
                    sleep(max(0.0, arrivals[issued] - (clock() - t0)))
                    continue
            before, waiting = len(engine.trace), len(sched.waiting)
            runner = getattr(engine, "runner", None)
            prelaunched = getattr(runner, "pending", None) is not None      # this step runs on the GPU already
            start = clock()
            (step or engine.step_with_progress)()
            end = clock()
            t = end - t0
            entries = engine.trace[before:]
            rows = getattr(runner, "last_rows", (0, 0))
            steps.append(_step_record(entries, start - t0, end - start, len(sched.running), waiting, prelaunched, rows))
            for entry in entries:
                if entry.kind != "verify":
                    continue
                for rid, out in zip(entry.req_ids, entry.emitted):
                    rec, req = live[rid]
                    if out:
                        rec.chunks.append((t, len(out)))
                    if req.finished and rec.finish is None:
                        rec.finish = t
                        del live[rid]
                        done += 1
                        if concurrency is not None and issued < n:
                            send(issued, t)
                            issued += 1
            if controller is not None:
                controller.observe_step(entries, end - start)
            if progress is not None:
                progress.update(done)
        if progress is not None:
            progress.update(done, force=True)
    duration = max((r.finish for r in records), default=0.0)
    return ServeRun("open" if arrivals is not None else "closed", rate, concurrency, sched.max_num_seqs, records,
                    steps, duration, steady=(0.0, last_sent) if concurrency is not None else None,
                    gc_pauses=[(g, t - real0, sec) for g, t, sec in pauses])


def _step_record(entries, start: float, seconds: float, running: int, waiting: int,
                 prelaunched: bool = False, rows: tuple[int, int] = (0, 0)) -> StepRecord:
    verify = [e for e in entries if e.kind == "verify"]
    reqs = sum(len(e.req_ids) for e in verify)
    drafts = max((d for e in verify for d in e.drafted), default=0)
    prefill = any(k == "prefill" for e in verify for k in e.kinds)
    tokens = sum(len(out) for e in verify for out in e.emitted)
    return StepRecord(start, seconds, reqs, drafts, prefill, tokens, running, waiting, prelaunched, *rows)
