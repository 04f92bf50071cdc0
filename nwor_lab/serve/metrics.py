"""A ServeRun -> the serving benchmark's numbers, with vLLM's names and definitions.

As vLLM's `benchmarks/benchmark_serving.py` (`calculate_metrics`) and SGLang's `bench_serving`:

    TTFT   first chunk's time - the request's send time (queueing and prefill included)
    TPOT   (E2EL - TTFT) / (output tokens - 1), per request (0 for a one-token output, which
           counts as meeting a TPOT SLO); its percentiles are over requests with 2+ tokens
    ITL    every gap between two consecutive chunks of a request, pooled over requests (a step
           that emits 4 tokens of a request is one chunk: one gap, not four)
    E2EL   last token's time - send time
    request_throughput / output_throughput / total_token_throughput: completed requests, output
           tokens, prompt + output tokens per second of `duration` (first send to last token)
    request_goodput: completed requests meeting every SLO given (`--goodput ttft:MS tpot:MS
           e2el:MS` in vLLM) per second of `duration`
    accept_length: SGLang's name for the mean acceptance length: tokens emitted per verify of a
           speculative request (drafts accepted + 1)

Percentiles are numpy's linear-interpolation percentiles, in ms: `p50_ttft_ms`, `p90_...`,
`p99_...`, with `mean_..._ms` (vLLM's JSON keys; its `median_` is our p50).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nwor_lab.engine.generate import acceptance_stats
from nwor_lab.serve.driver import ServeRun

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    """Per-request service-level objectives in ms (None: not checked), as vLLM's `--goodput`."""
    ttft_ms: float | None = None
    tpot_ms: float | None = 50.0
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Slo":
        """`tpot:50` or `ttft:200,tpot:50` (vLLM writes them space-separated: `ttft:200 tpot:50`)."""
        values = {"ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
        for item in text.replace(" ", ",").split(","):
            if not item:
                continue
            name, _, ms = item.partition(":")
            key = f"{name.strip()}_ms"
            if key not in values:
                raise ValueError(f"SLO {item!r}: names are ttft, tpot and e2el (e.g. tpot:50)")
            try:
                values[key] = float(ms)
            except ValueError:
                raise ValueError(f"SLO {item!r}: expected NAME:MILLISECONDS, e.g. tpot:50") from None
            if not values[key] > 0:
                raise ValueError(f"SLO {item!r}: the bound must be > 0 ms")
        if not any(v is not None for v in values.values()):
            raise ValueError(f"SLO {text!r}: give at least one of ttft:MS, tpot:MS, e2el:MS")
        return cls(**values)

    def describe(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}

    def met(self, ttft: float, tpot: float, e2el: float) -> bool:
        """Seconds in; bounds in ms."""
        return all(bound is None or 1e3 * value <= bound
                   for bound, value in ((self.ttft_ms, ttft), (self.tpot_ms, tpot), (self.e2el_ms, e2el)))


def request_latencies(run: ServeRun) -> list[dict]:
    """Per completed request: ttft, tpot (0 for one token), e2el in seconds, its ITL gaps, tokens."""
    out = []
    for r in run.requests:
        if r.finish is None or not r.chunks:
            continue
        ttft, e2el, n = r.chunks[0][0] - r.arrival, r.finish - r.arrival, r.generated
        tpot = (e2el - ttft) / (n - 1) if n > 1 else 0.0
        itl = [b[0] - a[0] for a, b in zip(r.chunks, r.chunks[1:])]
        out.append({"ttft": ttft, "tpot": tpot, "e2el": e2el, "itl": itl, "tokens": n, "prompt": r.prompt_len})
    return out


def _dist(name: str, seconds: list[float]) -> dict:
    ms = 1e3 * np.asarray(seconds, dtype=float)
    out = {f"mean_{name}_ms": round(float(ms.mean()), 3) if ms.size else None}
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = round(float(np.percentile(ms, p)), 3) if ms.size else None
    return out


def summarize(run: ServeRun, slo: Slo, trace=None, k: int = 0, timeline_points: int = 100) -> dict:
    """The run's metrics (module docstring), its occupancy, its steps by batch size and, from the
    engine's `trace` (the verify windows of this run), the acceptance."""
    lat = request_latencies(run)
    dur = max(run.duration, 1e-9)
    n_out = sum(x["tokens"] for x in lat)
    n_in = sum(x["prompt"] for x in lat)
    good = sum(slo.met(x["ttft"], x["tpot"], x["e2el"]) for x in lat)
    out = {"completed": len(lat), "total_input_tokens": n_in, "total_output_tokens": n_out,
           "duration_s": round(run.duration, 4),
           "request_throughput": round(len(lat) / dur, 4), "output_throughput": round(n_out / dur, 2),
           "total_token_throughput": round((n_in + n_out) / dur, 2),
           "request_goodput": round(good / dur, 4), "goodput_slo_ms": slo.describe(),
           "goodput_fraction": round(good / max(1, len(lat)), 4)}
    out |= _dist("ttft", [x["ttft"] for x in lat])
    out |= _dist("tpot", [x["tpot"] for x in lat if x["tokens"] > 1])
    out |= _dist("itl", [g for x in lat for g in x["itl"]])
    out |= _dist("e2el", [x["e2el"] for x in lat])
    if run.steady is not None:
        out["steady_output_throughput"] = steady_throughput(run)
    out["occupancy"] = occupancy(run, timeline_points)
    out["steps_by_batch"] = steps_by_batch(run)
    out["steps_by_kind"] = steps_by_kind(run)
    out["slowest_steps"] = slowest_steps(run)
    out["gc_pauses"] = gc_summary(run)
    if trace is not None and k:
        out |= acceptance(trace, k)
    return out


def steady_throughput(run: ServeRun) -> float | None:
    """Closed loop: output tokens/s while every client had a request out (before the last request
    was sent; the drain after it is left out)."""
    lo, hi = run.steady
    if hi <= lo:
        return None
    toks = sum(n for r in run.requests for t, n in r.chunks if lo < t <= hi)
    return round(toks / (hi - lo), 2)


def occupancy(run: ServeRun, points: int = 100) -> dict:
    """Requests in the batch over time: the time-weighted mean of the verify windows' sizes (idle
    time counts as 0) over `duration`, as a fraction of max_num_seqs, and a timeline of at most
    `points` (t, requests in the window, waiting) samples."""
    busy = sum(s.seconds * s.requests for s in run.steps)
    mean = busy / max(run.duration, 1e-9)
    stride = max(1, -(-len(run.steps) // points))
    timeline = [[round(s.start, 4), s.requests, s.waiting] for s in run.steps[::stride]]
    return {"mean_batch": round(mean, 3), "mean_fraction": round(mean / run.max_num_seqs, 4),
            "busy_fraction": round(sum(s.seconds for s in run.steps) / max(run.duration, 1e-9), 4),
            "timeline": timeline, "timeline_columns": ["t_s", "requests", "waiting"]}


def steps_by_batch(run: ServeRun) -> list[dict]:
    """Decode steps (no prefill in them) grouped by (requests, drafts): count, mean and p50 ms,
    tokens per step. The crossover's components: a target-only decode step against an EAGLE step
    (verify + head pass + chain) at the same batch."""
    groups: dict[tuple[int, int], list] = {}
    for s in run.steps:
        if not s.prefill and s.requests:
            groups.setdefault((s.requests, s.drafts), []).append(s)
    rows = []
    for (n, d), ss in sorted(groups.items()):
        ms = [1e3 * s.seconds for s in ss]
        rows.append({"requests": n, "drafts": d, "steps": len(ss), "mean_ms": round(float(np.mean(ms)), 3),
                     "p50_ms": round(float(np.median(ms)), 3),
                     "tokens_per_step": round(sum(s.tokens for s in ss) / len(ss), 3)})
    return rows


def steps_by_kind(run: ServeRun) -> dict:
    """Where the run's step time went, by kind of step: `prefill` (a prefill rode in it), `decode,
    pre-launched` (launched before the host read the step before: its host work overlapped the GPU's)
    and `decode, host` (laid out by the host after the readback: its host work in the step's time)
    -> {kind: steps, share of steps, share of the steps' time, mean and p50 ms, mean rows of the
    requests' tokens and of the buffers the steps ran (their buckets': the gap is padding; None when the
    engine did not say)}."""
    kinds = {"prefill": [], "decode, pre-launched": [], "decode, host": []}
    for s in run.steps:
        if s.requests:
            kinds[step_kind(s)].append(s)

    def row(steps: list) -> dict:
        ms = [1e3 * s.seconds for s in steps]
        rows = lambda name: [getattr(s, name) for s in steps]     # noqa: E731
        mean_rows = lambda x: round(float(np.mean(x)), 1) if x and all(x) else None    # noqa: E731
        return {"steps": len(steps), "step_share": round(len(steps) / n, 4), "time_share": round(sum(ms) / total, 4),
                "mean_ms": round(float(np.mean(ms)), 3) if ms else None,
                "p50_ms": round(float(np.median(ms)), 3) if ms else None,
                "mean_rows": mean_rows(rows("rows")), "mean_padded_rows": mean_rows(rows("padded_rows"))}
    n = max(1, sum(len(v) for v in kinds.values()))
    total = max(1e-9, sum(1e3 * s.seconds for v in kinds.values() for s in v))
    return {kind: row(v) for kind, v in kinds.items()}


def step_kind(s) -> str:
    """A StepRecord's kind: `prefill` (a prefill rode in it), `decode, pre-launched` or `decode, host`."""
    return "prefill" if s.prefill else "decode, pre-launched" if s.prelaunched else "decode, host"


def slowest_steps(run: ServeRun, n: int = 5) -> list[dict]:
    """The `n` slowest steps (a stall shows here, not in a median): when, how long, their kind and
    requests, and the garbage collections that ran inside them (ms)."""
    rows = []
    for s in sorted(run.steps, key=lambda s: -s.seconds)[:n]:
        gc_ms = sum(sec for _, t, sec in run.gc_pauses if s.start <= t < s.start + s.seconds)
        rows.append({"t_s": round(s.start, 4), "ms": round(1e3 * s.seconds, 3), "kind": step_kind(s),
                     "requests": s.requests, "gc_ms": round(1e3 * gc_ms, 3)})
    return rows


def gc_summary(run: ServeRun) -> dict:
    """Python's garbage collections during the run, by generation: count, total and longest ms."""
    out = {}
    for g in sorted({g for g, _, _ in run.gc_pauses}):
        ms = [1e3 * sec for gg, _, sec in run.gc_pauses if gg == g]
        out[f"gen{g}"] = {"count": len(ms), "total_ms": round(sum(ms), 3), "max_ms": round(max(ms), 3)}
    return out


def acceptance(trace, k: int) -> dict:
    """accept_length (SGLang's name; vLLM's mean acceptance length): tokens emitted per verify of a
    request that had drafts, and the share of steps with drafts."""
    mean, by_pos = acceptance_stats(trace, k)
    verify = [w for w in trace if w.kind == "verify" and "prefill" not in w.kinds]
    spec = sum(1 for w in verify if any(w.drafted))
    return {"accept_length": round(mean, 3), "acceptance_by_position": [round(a, 3) for a in by_pos],
            "steps_with_drafts_fraction": round(spec / max(1, len(verify)), 4)}
