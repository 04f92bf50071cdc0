"""Adaptive k: each step's draft count (0..k) from the batch size, the measured acceptance and a
step-time model measured online.

A step of n requests verifying k drafts each emits n x L(k) tokens in T(n, k) seconds, with

    L(k) = 1 + sum_{j=1..k} prod_{i<=j} c_i      c_i: the conditional acceptance rate of draft i
                                                 (drafts 1..i-1 accepted), counted from the trace,
                                                 older steps' counts halved every `half_life` steps
    T(n, k)                                      the step's wall time (verify of n (1 + k) tokens,
                                                 the head's pass, the chain's k - 1 passes),
                                                 a model fitted to the measured steps

and, n being fixed for the step, the k that maximises L(k) / T(n, k) maximises both the batch's
tokens per second and each request's (its TPOT). The count in use is kept unless another is
predicted at least `margin` better: the engine launches a step ahead of the host only between two
steps of one count (`StepRunner._can_prelaunch`), so every change costs the steps around it their
overlap (and the step before a larger count its bucket). k = 0 (decode; the head still runs its
pass so that its cache and features stay current for later drafts) is chosen only when it is
`margin` better than the best count that drafts: a decoding step sees no acceptance at all.

T(n, k) is read from the measured (n, k) cells (each the median of its last `window` steps' times,
a step timed only between two steps of its own shape: what the count costs while it holds, not
the change into or out of it; a shape's first timed step, its capture, skipped) where k was
measured near n, else a locally weighted least-squares fit of `a + b k + c n + d n k` to every
cell, weighted by how many steps a cell holds and by closeness in log2(n): a batch size never
measured borrows from its neighbours, and the fit follows the hardware's own curve (flat in n
where a step is weight-bound, linear where it is compute-bound). The model is only as good as its anchors, so
while the cells near n hold too few steps at k = 0 or k = k_max the controller measures them
first (exploration), and it re-measures the anchor it is not using in a run of `explore_run`
steps (a lone step would never be timed) at least `explore_every` decisions apart, further apart
the worse that anchor is predicted, so that refreshes cost about `refresh_budget` of the steps
(on an H200 at 8 requests k = 0 is predicted at 0.37x of k = 4's tokens/s: re-measured every
~600 decisions, not every 50). What a step next to a change costs over its shape's steady time is
measured too (`switch_cost`) and charged to every refresh and probe.

Traffic changes (a chat phase after a code phase: acceptance falls or rises mid-run), so the
acceptance follows it three ways:
  fading     every step multiplies the counts (and the prior's weight) by 2^(-1/half_life) before
             adding its own: new steps outweigh old ones, and the estimate itself holds still while
             nothing is verified (it does not drift back to the prior while the controller decodes)
  a jump     when the first drafts verified since a window opened (up to 16 of them, over one step
             or several, the window closed after `half_life` steps) are accepted far from the
             estimate held when it opened (more than 3
             standard deviations of a binomial: 4 of 4 accepted against 0.1, or 2 rejected in a row
             against 0.9), the counts restart from the step that showed it, over a prior of one
             draft's weight (the starting prior's four would outweigh the few drafts the jump rests on)
  probes     a count below k_max verifies no draft beyond it (k = 0: none at all), so what it knew
             of those positions holds still; every few steps it verifies k_max drafts to measure
             them afresh. The interval keeps the probes' extra time near `probe_budget` of the run:
             (T(n, k_max) - T(n, c) + 3 switch_cost) / T(n, c) / probe_budget steps at count c,
             between 4 and `explore_every`, counted from the decision (the engine asks a step or two
             ahead). A probe comes at once after a jump (the rates beyond the count in use restart
             from the prior) and, while decoding, after a probe whose first drafts were accepted
             1.5 standard deviations above the estimate (at batch 1 a probe shows one first draft;
             the jump needs a second). A phase of high acceptance after a low one is noticed within
             one interval (at once while a count >= 1 verifies first drafts); a phase that stays
             low pays about `probe_budget`.
             What a probe can find is bounded: the positions up to the count in use are measured
             every step, and a deeper draft adds at most the chance of reaching it (`probe_upside`:
             k_max's tokens/s over the count's were every deeper draft accepted). The budget is
             scaled by that upside over `upside_full` (the interval up to 4 x `explore_every`): with
             first drafts accepted 1 in 10 at 32 requests no deeper count can win, and the H200
             simulator's 0.9:0.1:0.9 phases gain 1.5 % (1.115 -> 1.130 of the best fixed k; 1.072
             -> 1.090 at 8), a steady 0.5 acceptance 1 % (0.973 -> 0.989), and a switch of only the
             deeper rates (0.9 first drafts throughout) loses nothing.

`nwor_lab.serve.simulate` replays these decisions against a step-cost model of the H200 runs and
an acceptance profile or phase schedule, against every fixed k, in a second and without a GPU.

Use it as the engine's `draft_counts` hook and feed it every step:

    k_auto = AdaptiveK(k_max=engine.k)
    engine.draft_counts = k_auto              # (engine, requests) -> [k_step] * len(requests)
    ... engine.step(); k_auto.observe_step(new trace entries, step seconds)

Unlike vLLM's `speculative_disable_by_batch_size` (a fixed threshold on the running batch, set by
the operator, all-or-nothing) and SGLang's `--speculative-num-steps / --speculative-num-draft-tokens`
(fixed at launch; `bench_speculative.py` sweeps them offline per batch size), the count is chosen
per step from what this engine measured on this hardware and this traffic, and can be any of
0..k_max, not only on or off.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np


class AdaptiveK:
    """Per step draft count for an engine built with k = k_max (module docstring)."""

    def __init__(self, k_max: int, *, candidates=None, prior_rate: float = 0.6, prior_weight: float = 4.0,
                 margin: float = 0.05, bandwidth: float = 1.0, min_weight: float = 2.0,
                 explore_every: int = 50, window: int = 32, half_life: float | None = 16.0,
                 probe_budget: float = 0.03, refresh_budget: float = 0.005, explore_run: int = 4,
                 upside_full: float = 0.5):
        if k_max < 1:
            raise ValueError(f"k_max={k_max}: adaptive k needs an engine that drafts (k >= 1)")
        self.k_max = k_max
        cands = sorted(set(range(k_max + 1) if candidates is None else candidates) | {0, k_max})
        if any(not 0 <= c <= k_max for c in cands):
            raise ValueError(f"candidates={list(cands)}: every draft count must be in 0..{k_max}")
        self.candidates = cands
        self.prior_rate, self.prior_weight = prior_rate, prior_weight
        self.margin, self.bandwidth = margin, bandwidth
        self.min_weight, self.explore_every = min_weight, explore_every
        if half_life is not None and not half_life > 0:
            raise ValueError(f"half_life={half_life}: steps over which the acceptance counts halve must be > 0 "
                             f"(None: never forget)")
        if not 0 < probe_budget < 1:
            raise ValueError(f"probe_budget={probe_budget}: the share of time probes may cost must be in (0, 1)")
        self.half_life, self.probe_budget = half_life, probe_budget
        if not 0 < refresh_budget <= 1:
            raise ValueError(f"refresh_budget={refresh_budget}: the share of time refreshes may cost must be in (0, 1]")
        if explore_run < 1:
            raise ValueError(f"explore_run={explore_run}: a refresh runs at least one step at the other anchor")
        self.refresh_budget, self.explore_run = refresh_budget, explore_run
        if not upside_full > 0:
            raise ValueError(f"upside_full={upside_full}: the probe upside that earns the whole probe budget "
                             f"must be > 0")
        self.upside_full = upside_full
        self.prior = np.full(k_max, float(prior_weight))    # [k_max] the prior's weight, fading with the counts
        self.since_full = 0                   # steps since one verified k_max drafts (probes below k_max)
        self.pending: list[bool] = []         # first drafts' verdicts since the jump window opened
        self.pending_rate = 0.0               # the estimate when it opened
        self.pending_rests = False            # whether that estimate rested on drafts more than on the prior
        self.pending_opened = 0               # the step (of `steps_seen`) that opened it
        self.steps_seen = 0                   # steps observed
        self.jumps = 0                        # restarts of the acceptance counts on a jump
        self.tried = np.zeros(k_max)          # [k_max] drafts at position i verified after i - 1 accepted
        self.accepted = np.zeros(k_max)       # [k_max] of which accepted
        self.cells: dict[tuple[int, int], list[float]] = {}   # (n, k) -> [mean seconds, steps]
        self.first_seen: set[tuple[int, int]] = set()         # (n, k) whose first step went by untimed
        self.window = window
        self.recent: dict[tuple[int, int], deque] = {}        # (n, k) -> its last `window` step times
        self.prev_shape: tuple[int, int] | None = None      # the last step's (n, k); None after a prefill
        self.held: tuple[tuple[int, int], float] | None = None   # a step timed once the next shows its shape
        self.current = 0                      # the count in use: kept unless another is `margin` better
        self.since_refresh = 0                # model decisions since the last refresh
        self.switch_cost = 0.0                # seconds a step next to a change of count costs over steady
        self.suspect = False                  # first drafts accepted above the estimate, not yet a jump
        self.relearn = False                  # a jump: probe at once below k_max (deeper rates unknown)
        self.run: tuple[int, int] | None = None   # (count, decisions left) of a refresh run under way
        self.version = 0                      # changes of the cells (the weights' cache key)
        self._weights_for: tuple = (None, None)
        self.decisions = 0
        self.history: list[tuple[int, int, str]] = []          # (n, k chosen, why) per decision

    # -- what was measured ----------------------------------------------------------------------
    def observe_step(self, entries, seconds: float) -> None:
        """One engine step: its windows (`WindowTrace`, verify and draft) and its wall time. The
        acceptance counts every verify; the time model only steps without a prefill (a prefill's
        cost is not the draft count's), from the second step of each (n, k) on."""
        verify = [e for e in entries if e.kind == "verify"]
        if not verify:
            return
        if self.half_life is not None:              # older acceptance fades (module docstring)
            fade = 0.5 ** (1.0 / self.half_life)
            self.tried *= fade
            self.accepted *= fade
            self.prior = np.maximum(self.prior * fade, 1e-6)
        first = [a >= 1 for e in verify for d, a in zip(e.drafted, e.accepted) if d >= 1]   # first drafts' verdicts
        full = any(d >= self.k_max for e in verify for d in e.drafted)
        self.since_full = 0 if full else self.since_full + 1
        self.steps_seen += 1
        if self.pending and self.steps_seen - self.pending_opened > (self.half_life or 16.0):
            self.pending = []                 # opened long ago: judge new drafts against what is held now
        if first:
            if not self.pending:
                self.pending_opened = self.steps_seen
                self.pending_rate = float(self.rates()[0])
                self.pending_rests = bool(self.tried[0] >= self.prior[0])   # more drafts than prior behind it
            self.pending += first
            p, m = self.pending_rate, len(self.pending)
            off, spread = sum(self.pending) - m * p, math.sqrt(m * p * (1.0 - p))
            # a jump (start afresh) only from an estimate that rests on drafts, not on the prior alone
            if self.pending_rests and abs(off) > 3.0 * spread + 0.5:
                self.tried[:], self.accepted[:], self.prior[:] = 0.0, 0.0, min(1.0, self.prior_weight)
                self.jumps += 1
                self.relearn = True           # the positions beyond the count in use are unknown now
                self.pending = []
            elif m >= 16:
                self.pending = []
            # more accepted than the estimate holds, not yet a jump: while decoding (no first drafts but
            # the probes'), the next probe comes at once (at batch 1 a probe shows one first draft, and
            # its second witness would otherwise wait an interval)
            self.suspect = not self.current and bool(self.pending) and self.pending_rests and off > 1.5 * spread
        # draft i of a window is verified when i < its drafts and the i before it were accepted (a >= i)
        drafted = np.minimum(np.fromiter((d for e in verify for d in e.drafted), dtype=np.int64), self.k_max)
        got = np.fromiter((a for e in verify for a in e.accepted), dtype=np.int64)
        pos = np.arange(self.k_max)
        seen = (drafted[:, None] > pos) & (got[:, None] >= pos)
        self.tried += seen.sum(0)
        self.accepted += (seen & (got[:, None] > pos)).sum(0)
        if any(k == "prefill" for e in verify for k in e.kinds):
            self.prev_shape = self.held = None
            return
        shape = (sum(len(e.req_ids) for e in verify), max((d for e in verify for d in e.drafted), default=0))
        # a step is timed only between two steps of its own shape: only there does the engine launch
        # it ahead of the host (`StepRunner._can_prelaunch`) and run its own bucket (a step before a
        # larger count drafts for it); the steps around a change pay that change, whichever count wins
        before, held = self.prev_shape, self.held
        steady = before == shape
        self.held = (shape, seconds) if steady else None
        self.prev_shape = shape
        if held is not None and held[0] == shape:
            self._time(*held)
        # what a step next to a change of count costs over its shape's steady time (a larger bucket,
        # the overlap lost): a probe pays it on about three steps (a prefill or a request leaving is
        # not the controller's change)
        if held is not None and held[0] != shape and held[0][0] == shape[0]:
            self._switch(*held)
        if before is not None and not steady and before[0] == shape[0]:
            self._switch(shape, seconds)

    def _switch(self, shape: tuple[int, int], seconds: float) -> None:
        cell = self.cells.get(shape)
        if cell is not None:
            self.switch_cost += 0.1 * (max(seconds - cell[0], 0.0) - self.switch_cost)

    def _time(self, shape: tuple[int, int], seconds: float) -> None:
        n, k = shape
        if (n, k) not in self.first_seen:
            # a shape's first step pays its one-off costs (a CUDA graph's capture, a kernel's
            # compile: 40 ms against 11 for an 8B step at batch 32): counted, not timed
            self.first_seen.add((n, k))
            return
        cell = self.cells.get((n, k))
        if cell is None:
            cell = self.cells[(n, k)] = [seconds, 0]
        recent = self.recent.setdefault((n, k), deque(maxlen=self.window))
        recent.append(seconds)
        ordered, m = sorted(recent), len(recent)    # the median (np.median costs 10x on 32 values)
        # a stall (GC, a neighbour) moves a median, not a mean
        cell[0] = ordered[m // 2] if m % 2 else 0.5 * (ordered[m // 2 - 1] + ordered[m // 2])
        cell[1] += 1
        self.version += 1

    def rates(self) -> np.ndarray:
        """Conditional acceptance rate per draft position `[k_max]` (prior-smoothed)."""
        return (self.accepted + self.prior_rate * self.prior) / (self.tried + self.prior)

    def accept_lengths(self) -> np.ndarray:
        """L(0) .. L(k_max) `[k_max + 1]`: expected tokens a request emits in a step verifying k drafts."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.rates()))])

    def accept_length(self, k: int) -> float:
        """L(k) (`accept_lengths`)."""
        return float(self.accept_lengths()[k])

    def _weights(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every cell's n, k and weight near batch n (built once per batch size and state of the cells:
        a decision asks it twice)."""
        if self._weights_for[0] == (n, self.version):
            return self._weights_for[1]
        keys = list(self.cells)
        ns = np.array([c[0] for c in keys], dtype=float)
        ks = np.array([c[1] for c in keys], dtype=float)
        steps = np.array([self.cells[c][1] for c in keys], dtype=float)
        w = np.minimum(steps, 8.0) * np.exp(-0.5 * ((np.log2(ns) - math.log2(n)) / self.bandwidth) ** 2)
        self._weights_for = ((n, self.version), (ns, ks, w))
        return ns, ks, w

    def anchor_weight(self, n: int, k: int) -> float:
        """How many steps' worth of measurements near batch n at draft count k the model has."""
        return self.anchor_weights(n, (k,))[k]

    def anchor_weights(self, n: int, counts) -> dict[int, float]:
        """`anchor_weight` of every k of `counts`, from one weighting of the cells."""
        if not self.cells:
            return {k: 0.0 for k in counts}
        _, ks, w = self._weights(n)
        return {k: float(w[ks == k].sum()) for k in counts}

    def step_time(self, n: int, k: int) -> float | None:
        """T(n, k) in seconds, or None before any measurement (`step_times`)."""
        times = self.step_times(n, (k,))
        return None if times is None else times[k]

    def step_times(self, n: int, counts) -> dict[int, float] | None:
        """T(n, k) in seconds for every k of `counts` (one pass over the cells for all of them), or None
        before any measurement. A count measured near n (weight >= `min_weight`) is read from its own
        cells (a weighted mean of their medians): the cost need not be linear in k (a pre-launched
        k_max step hides the host, a cut one does not); a count between two measured ones, on the line
        between them; any other from the locally weighted fit over every cell."""
        if not self.cells:
            return None
        ns, ks, w = self._weights(n)
        means = np.array([v[0] for v in self.cells.values()])
        measured = {}                                         # count -> its own cells' weighted mean
        for c in set(ks.astype(int).tolist()):
            own = ks == c
            if w[own].sum() >= self.min_weight:
                measured[c] = float((w[own] * means[own]).sum() / w[own].sum())
        coef = None
        out = {}
        for k in counts:
            if k in measured:
                out[k] = max(measured[k], 1e-9)
                continue
            lo = max((c for c in measured if c < k), default=None)
            hi = min((c for c in measured if c > k), default=None)
            if lo is not None and hi is not None:             # between two measured counts: a line
                out[k] = max(measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo), 1e-9)
                continue
            if coef is None:                                  # the fit, once for every count that needs it
                x = np.stack([np.ones_like(ns), ks, ns - n, (ns - n) * ks], 1)   # centred at n: coef 0 + 1
                sw = np.sqrt(w)[:, None]
                ridge = 1e-3 * np.diag([0.0, 0.0, 1.0, 1.0]) * max(float(w.sum()), 1.0)
                coef = np.linalg.solve((x * sw).T @ (x * sw) + ridge + 1e-12 * np.eye(4),
                                       (x * sw).T @ (means * sw[:, 0]))
            out[k] = float(max(coef[0] + coef[1] * k, 1e-9))
        return out

    # -- the decision --------------------------------------------------------------------------
    def choose(self, n: int) -> int:
        """The draft count for a step of n requests."""
        self.decisions += 1
        if self.run is not None:                              # a refresh run under way
            k, left = self.run
            self.run = (k, left - 1) if left > 1 else None
            self.history.append((n, k, "refresh"))
            return k
        anchors = self.anchor_weights(n, (self.k_max, 0))     # measure the anchors before trusting the fit
        for k in (self.k_max, 0):
            if anchors[k] < self.min_weight:
                self.history.append((n, k, "explore"))
                return k
        times = self.step_times(n, self.candidates)         # one pass over the cells for every count
        lengths = self.accept_lengths()
        gain = {k: float(lengths[k]) / times[k] for k in self.candidates}
        best = max(gain, key=gain.get)
        keep = self.current if self.current in gain else 0
        if gain[best] < (1.0 + self.margin) * gain[keep]:    # a change costs the steps around it their overlap
            best = keep
        drafting = max(self.candidates[1:], key=gain.get)
        if not best and gain[0] < (1.0 + self.margin) * gain[drafting]:
            best = drafting     # decoding is blind to acceptance (probes only): only when clearly better
        self.current = best
        if best < self.k_max and (self.relearn or (self.suspect and not best)
                                  or self.since_full >= self._probe_interval(times, best, lengths)):
            self.suspect = self.relearn = False
            # counted from the decision: the probe's step is seen a step or two later (the engine asks
            # ahead), and the decisions in between must not probe again
            self.since_full = 0
            self.history.append((n, self.k_max, "probe"))      # measure every position's acceptance afresh
            return self.k_max
        self.since_refresh += 1
        other = 0 if best else self.k_max                     # keep the unused anchor's time current
        if self.explore_every and \
                self.since_refresh >= self._refresh_interval(gain[other] / gain[best], times[best]):
            self.since_refresh = 0
            self.run = (other, self.explore_run - 1) if self.explore_run > 1 else None
            self.history.append((n, other, "refresh"))
            return other
        self.history.append((n, best, "model"))
        return best

    def _refresh_interval(self, relative_gain: float, step_seconds: float) -> int:
        """Decisions between refreshes: a run of `explore_run` steps at the unused anchor forgoes
        (1 - its gain / the best's) of each, and the steps around the run lose their overlap
        (`switch_cost`); spread so that refreshes cost about `refresh_budget` of the steps, and never
        closer than `explore_every` (an anchor three times worse is seldom worth a look)."""
        loss = self.explore_run * max(1.0 - relative_gain, 0.0) + 3.0 * self.switch_cost / step_seconds
        return max(self.explore_every, math.ceil(loss / self.refresh_budget))

    def probe_interval(self, n: int, count: int = 0) -> int:
        """Steps between probes while drafting `count` (0: decoding) at batch n: a probe's extra time
        over a step at that count (its larger bucket, and the overlap lost on the three steps
        around it, `switch_cost`), spread so that probes cost about `probe_budget` (clipped to
        4 .. explore_every, or 4 .. 50)."""
        return self._probe_interval(self.step_times(n, self.candidates), count, self.accept_lengths())

    def _probe_interval(self, times: dict[int, float], count: int, lengths: np.ndarray) -> int:
        """`times`: T(n, k) of every candidate (`step_times`); `lengths`: L(0) .. L(k_max)."""
        extra = (max(times[self.k_max] - times[count], 0.0) + 3.0 * self.switch_cost) / times[count]
        share = min(1.0, self.probe_upside(times, count, lengths) / self.upside_full)
        most = (self.explore_every or 50) * min(4.0, 1.0 / share if share > 0 else 4.0)
        if share <= 0:
            return int(most)
        return int(min(most, max(4, math.ceil(extra / (self.probe_budget * share)))))

    def probe_upside(self, times: dict[int, float], count: int, lengths: np.ndarray | None = None) -> float:
        """The most a count above `count` could gain over it: its tokens per second over `count`'s, less
        one, were every draft beyond `count` accepted. The positions up to `count` are verified every
        step, so their rates are current; a request reaches position `count` with the product of them,
        and each deeper draft adds at most that. When the first drafts are seldom accepted (0.1), no
        deeper count can win whatever its rates, and a probe would measure what cannot change the
        choice. While decoding (count 0) nothing is verified: the upside is that of k_max drafts all
        accepted, and the probes keep their whole budget. `lengths`: L(0) .. L(k_max), when the caller
        has them (the chance of reaching `count` is L(count) - L(count - 1))."""
        if count >= self.k_max:
            return 0.0
        lengths = self.accept_lengths() if lengths is None else lengths
        reach = float(lengths[count] - lengths[count - 1]) if count else 1.0
        now = lengths[count] / times[count]
        return max((lengths[count] + reach * (k - count)) / times[k] for k in self.candidates if k > count) / now - 1.0

    def __call__(self, engine, requests) -> list[int]:
        """The engine's `draft_counts` hook: one count for every request of the next window, sized
        by the requests running now."""
        k = self.choose(max(1, len(engine.scheduler.running)))
        return [k] * len(requests)

    def describe(self, since: int = 0) -> dict:
        """The controller's state for a benchmark's JSON: the acceptance it measured, its step-time
        cells, and how often it chose each count (`chosen`, `explored`: over every decision;
        `chosen_since`, `explored_since`: over the decisions from number `since` on, e.g. one load
        point's, given `len(history)` before it ran)."""
        def counts(decisions) -> tuple[dict, int]:
            chosen: dict[int, int] = {}
            for _, k, _ in decisions:
                chosen[k] = chosen.get(k, 0) + 1
            return {str(k): c for k, c in sorted(chosen.items())}, sum(1 for h in decisions if h[2] != "model")
        chosen, explored = counts(self.history)
        chosen_since, explored_since = counts(self.history[since:])
        return {"k_max": self.k_max, "margin": self.margin, "half_life_steps": self.half_life,
                "probe_budget": self.probe_budget, "refresh_budget": self.refresh_budget,
                "explore_run": self.explore_run, "switch_cost_ms": round(1e3 * self.switch_cost, 3),
                "jumps": self.jumps,
                "acceptance_rates": [round(float(r), 3) for r in self.rates()],
                "accept_length_k_max": round(self.accept_length(self.k_max), 3),
                "chosen": chosen, "explored": explored,
                "chosen_since": chosen_since, "explored_since": explored_since, "since": since,
                "cells_ms": [{"requests": n, "drafts": k, "ms": round(1e3 * v[0], 3), "steps": int(v[1])}
                             for (n, k), v in sorted(self.cells.items())]}
