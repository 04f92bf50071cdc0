"""`--k auto` offline: AdaptiveK fed by a step-cost model and an acceptance profile, no engine.

A GPU run of `bench serve` takes minutes and its repeats spread by several percent; the
controller's own losses (exploration, probes, lost pre-launches) are one or two percent each. This
module replays the decision loop against a cost model instead, so a change to the controller can
be judged in a second, on any machine, against every fixed k.

The cost model (`StepCosts`, milliseconds):

    decode_ms[n]       target-only's decode step of n requests (an engine without a head)
    bucket_ms[n][d]    a step of n requests in the bucket of draft count d (verify of d drafts a
                       request, the head's pass, the chain's d - 1 passes), launched ahead of the
                       host (its host work hidden behind the step before)
    host_ms            what a step costs on top when it was not launched ahead (the host lays it
                       out while the device waits)

The engine's rules (`nwor_lab.engine.runner`, `_can_prelaunch` and `_hook_keeps_k`), with k_s the
drafts step s verifies:

    step s runs the bucket d_s = max(k_s, k_{s+1})   (it verifies k_s and drafts k_{s+1})
    step s was launched ahead iff k_{s-1} == k_s == k_{s+1}
    the hook is asked for k_{s+2} while step s runs  (the controller has seen steps up to s - 1)

so an isolated step at another count costs three steps their overlap, and a count below the
last one still pays the larger bucket once. Acceptance: every request's drafts are accepted with
the profile's conditional rates (`speculative.synthetic`), the profile switching where a
`phases.Phases` schedule says (a share of the run's output tokens). One batch size n for the whole
run, no prefills, no admissions: the steady middle of a closed-loop `bench serve` point.

What it cannot show: the real engine's layout of the steps (only the rules above are modelled;
when the runner's pre-launch changes, `prelaunch` here must follow it), stalls, and the spread of
a GPU's step times. The GPU run (`bench serve`) stays the verdict.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from nwor_lab.engine.trace import WindowTrace
from nwor_lab.serve.adaptive import AdaptiveK
from nwor_lab.serve.phases import Phases
from nwor_lab.speculative.synthetic import conditional_rates


@dataclass(frozen=True)
class StepCosts:
    """Step times in milliseconds (module docstring). `bucket_ms[n]` lists d = 0 .. k_max."""

    decode_ms: dict[int, float]
    bucket_ms: dict[int, tuple[float, ...]]
    host_ms: float
    source: str = ""

    def __post_init__(self):
        for n, row in self.bucket_ms.items():
            if n not in self.decode_ms:
                raise ValueError(f"StepCosts: bucket_ms has batch {n} but decode_ms does not; give both")
            if any(t <= 0 for t in row) or not row:
                raise ValueError(f"StepCosts: bucket_ms[{n}]={row}: one positive time per draft count 0..k_max")
        if self.host_ms < 0:
            raise ValueError(f"StepCosts: host_ms={self.host_ms} must be >= 0")

    def k_max(self, n: int) -> int:
        return len(self.bucket_ms[n]) - 1

    def step_ms(self, n: int, d: int, launched_ahead: bool) -> float:
        return self.bucket_ms[n][d] + (0.0 if launched_ahead else self.host_ms)


def _line(lo: float, hi: float, k_lo: int, k_hi: int) -> list[float]:
    return [lo + (hi - lo) * (k - k_lo) / (k_hi - k_lo) for k in range(k_lo, k_hi + 1)]


# The 8B shape on an H200, EAGLE-3, `stage`, T = 0 (p50 step times of the batch's own rows):
# target-only and k 4 from serve_8b_t0_h200.json (8 and 32 clients), k 1 from serve_kauto_8b_h200.json
# (8 clients). d = 0 (a decode step whose head pass keeps the head's cache) was never measured alone:
# set between the decode step and d = 1 at batch 8, a quarter of a millisecond over decode at 32;
# counts between two anchors on the line between them. host_ms: "about 1 ms of a 8-10 ms step"
# (issue 39: 1.28 ms outside the components at 32 clients, 0.40 of it target-only's too).
H200_8B = StepCosts(
    decode_ms={8: 5.87, 32: 6.23},
    bucket_ms={8: (6.10, *_line(6.31, 7.51, 1, 4)), 32: tuple(_line(6.48, 9.20, 0, 4))},
    host_ms=1.0,
    source="serve_8b_t0_h200.json + serve_kauto_8b_h200.json p50 step times (module comment)")


class _Run:
    """One simulated run: tokens, seconds, steps by count, steps launched ahead."""

    def __init__(self, n: int, phases: Phases, total_tokens: int, k_max: int, seed: int):
        self.n, self.phases, self.k_max = n, phases, k_max
        self.rng = np.random.default_rng(seed)
        phases.start(total_tokens, [])
        self.tokens, self.seconds, self.ahead = 0, 0.0, 0
        self.counts: list[int] = []
        self.total = total_tokens

    def step(self, k: int, ms: float, launched_ahead: bool):
        """A step verifying k drafts a request -> its trace entries (to observe) and seconds."""
        c = conditional_rates(self.phases.profiles[self.phases.phase][:self.k_max])[:k]
        accepted = np.cumprod(self.rng.random((self.n, k)) < np.asarray(c), axis=1).sum(1).tolist() if k else \
            [0] * self.n
        w = WindowTrace(0, "verify", list(range(self.n)), ["spec" if k else "decode"] * self.n, [k] * self.n,
                        accepted, [[0] * (a + 1) for a in accepted])
        seconds = ms / 1e3
        self.phases.observe_step([w], seconds)
        self.tokens += sum(accepted) + self.n
        self.seconds += seconds
        self.ahead += bool(launched_ahead)
        self.counts.append(k)
        return [w], seconds

    @property
    def done(self) -> bool:
        return self.tokens >= self.total

    def record(self) -> dict:
        by = {str(k): self.counts.count(k) for k in sorted(set(self.counts))}
        switches = sum(a != b for a, b in zip(self.counts, self.counts[1:]))
        rec = {"tokens_per_s": round(self.tokens / self.seconds, 2), "steps": len(self.counts),
               "steps_by_drafts": by, "count_changes": switches,
               "launched_ahead_fraction": round(self.ahead / max(len(self.counts), 1), 4)}
        if len(self.phases.profiles) > 1:
            rec["phases"] = [{"tokens_per_s": p["tokens_per_s"], "steps_by_drafts": p["steps_by_drafts"]}
                             for p in self.phases.run_record()["phases"]]
        return rec


def run_fixed(costs: StepCosts, n: int, k: int | None, texts, total_tokens: int, seed: int = 0) -> dict:
    """A fixed-k engine (k None: target-only) at batch n: every step launched ahead."""
    k_max = costs.k_max(n)
    run = _Run(n, Phases(texts, k_max), total_tokens, k_max, seed)
    while not run.done:
        ms = costs.decode_ms[n] if k is None else costs.bucket_ms[n][k]
        run.step(k or 0, ms, True)
    return run.record()


def run_auto(costs: StepCosts, n: int, texts, total_tokens: int, seed: int = 0, controller: AdaptiveK | None = None,
             lag: int = 2, ahead_below_k_max: bool = True, warmup_tokens: int = 0) -> dict:
    """AdaptiveK (default settings unless `controller` is given) at batch n under the engine's rules
    (module docstring); also its decisions' host time (`choose` + `observe_step`, µs a step, this machine).
    ahead_below_k_max False: only steps at k_max are launched ahead (a stricter runner). warmup_tokens:
    an untimed run of the steady `shipped` profile first, as `bench serve` warms its engines up with
    the controller attached (its anchors are measured there, not in the timed run)."""
    k_max = costs.k_max(n)
    ctl = controller if controller is not None else AdaptiveK(k_max)
    if ctl.k_max != k_max:
        raise ValueError(f"controller k_max={ctl.k_max}, but the cost model's buckets go to {k_max}")
    if warmup_tokens:
        _drive(ctl, costs, _Run(n, Phases(("shipped",), k_max), warmup_tokens, k_max, seed + 1), lag,
               ahead_below_k_max)
    seen = len(ctl.history)
    run = _Run(n, Phases(texts, k_max), total_tokens, k_max, seed)
    host = _drive(ctl, costs, run, lag, ahead_below_k_max)
    rec = run.record()
    rec["decisions_host_us_per_step"] = round(1e6 * host / max(rec["steps"], 1), 1)
    rec["explored"] = sum(1 for h in ctl.history[seen:] if h[2] != "model")
    rec["jumps"] = ctl.jumps
    return rec


def _drive(ctl, costs: StepCosts, run: _Run, lag: int, ahead_below_k_max: bool) -> float:
    """Step `run` to its end with `ctl` deciding -> the decisions' host seconds."""
    n, k_max = run.n, run.k_max
    host = 0.0
    ahead = [k_max] * lag        # counts already decided: k_s, k_{s+1}, ... (the engine starts at k_max)
    prev = None
    while not run.done:
        t0 = time.perf_counter()
        ahead.append(ctl.choose(n))                  # k_{s+lag}, asked while step s runs
        host += time.perf_counter() - t0
        k, nxt = ahead[0], ahead[1]
        launched = prev == k == nxt and (ahead_below_k_max or k == k_max)
        entries, seconds = run.step(k, costs.step_ms(n, max(k, nxt), launched), launched)
        t0 = time.perf_counter()
        ctl.observe_step(entries, seconds)
        host += time.perf_counter() - t0
        prev = ahead.pop(0)
    return host


def compare(costs: StepCosts, n: int, texts=("shipped",), total_tokens: int | None = None, seed: int = 0,
            controller: AdaptiveK | None = None, ahead_below_k_max: bool = True, warmup_tokens: int = 0) -> dict:
    """k auto against target-only and every fixed k at batch n -> {"auto", "fixed": {k: record},
    "target_only", "best_fixed", "over_best_fixed", "over_target_only"} (tokens/s ratios).
    total_tokens: the run's output tokens (default: 256 a request x 4 requests a client, as a
    closed-loop `bench serve` point with 256-token outputs)."""
    total = total_tokens or 256 * 4 * n
    auto = run_auto(costs, n, texts, total, seed, controller, ahead_below_k_max=ahead_below_k_max,
                    warmup_tokens=warmup_tokens)
    fixed = {k: run_fixed(costs, n, k, texts, total, seed) for k in range(1, costs.k_max(n) + 1)}
    target = run_fixed(costs, n, None, texts, total, seed)
    best = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
    return {"n": n, "texts": list(texts), "auto": auto, "fixed": fixed, "target_only": target, "best_fixed": best,
            "oracle_tokens_per_s": oracle(costs, n, texts),
            "over_best_fixed": round(auto["tokens_per_s"] / fixed[best]["tokens_per_s"], 4),
            "over_target_only": round(auto["tokens_per_s"] / target["tokens_per_s"], 4)}


def oracle(costs: StepCosts, n: int, texts) -> float:
    """Expected tokens/s of a controller that knows each phase's profile and the costs, and switches
    for free: per phase the count with the most n L(k) / T(n, k), each phase an equal share of the
    tokens (the bound no controller reaches; L(k) = 1 + the profile's first k rates)."""
    k_max = costs.k_max(n)
    seconds_per_token = 0.0
    for profile in Phases(texts, k_max).profiles:
        lengths = 1.0 + np.concatenate([[0.0], np.cumsum(profile[:k_max])])
        best = max(n * lengths[k] / (costs.bucket_ms[n][k] / 1e3) for k in range(k_max + 1))
        seconds_per_token += 1.0 / best / len(texts)
    return round(1.0 / seconds_per_token, 2)
