"""A workload whose acceptance changes mid-run: phases of forced acceptance (high, low, high...).

A fixed draft count is tuned for one acceptance; real traffic moves between kinds of requests (code
completion drafts well, open chat less), and SGLang's adaptive speculation is measured on such a
phase-switching workload (SGLang #24054). Here the drafts are accepted by a forced profile
(`speculative.synthetic`), and the profile changes at stated points of the run:

    Phases(["0.9", "0.1", "0.9"])    three phases, each a `--acceptance` text (a constant
                                     conditional rate, `shipped`, or per-position rates), each
                                     covering an equal share of the run's output tokens

A phase ends when the tokens emitted since the run started reach its share (phase i of P ends at
i / P of the run's output tokens): every config, fast or slow, emits the same tokens under each
profile, so their throughputs compare. The whole batch switches at once (a traffic shift, not a
per-request property).

How the engine sees it: `SwitchableAcceptance` is a `ForcedAcceptance` that keeps the device table of
conditional rates it hands the engine (`conditional(k, device)`, read by the sampler in every step,
eager or replayed from a CUDA graph, which holds the tensor, not its values) and rewrites it in place
on `set_profile`. A step already launched when the host switches (the runner launches the next step
before it reads the last) runs under the old profile: a switch lands within one step. Chains only: a
tree engine builds its own tables from the profile (`speculative.tree_forced`), so `attach` refuses
an engine that never asked for the chain's table.
"""
from __future__ import annotations

import torch

from nwor_lab.speculative.synthetic import ForcedAcceptance, check_profile, conditional_rates, mean_acceptance_length


class SwitchableAcceptance(ForcedAcceptance):
    """A ForcedAcceptance whose profile can be switched while an engine runs (module docstring).
    `profile` stays the one it was built with (its identity: hashing, `describe`); `current` is the
    profile the engine's tables hold now."""

    def __init__(self, profile, seed: int = 0):
        super().__init__(tuple(profile), seed)
        object.__setattr__(self, "_tables", [])            # [(k, [k] float64 table the engine reads)]
        object.__setattr__(self, "current", self.profile)

    def conditional(self, k: int, device) -> torch.Tensor:
        table = torch.tensor(conditional_rates(check_profile(self.current, k)), dtype=torch.float64, device=device)
        self._tables.append((k, table))
        return table

    @property
    def attached(self) -> bool:
        """Whether an engine took a table from it (a chain engine with forced acceptance does at build)."""
        return bool(self._tables)

    def set_profile(self, profile) -> None:
        """Rewrite every handed-out table with `profile`'s conditional rates (unconditional per-position
        rates, at least each table's k of them), in place."""
        profile = check_profile(profile)
        for k, table in self._tables:
            table.copy_(torch.tensor(conditional_rates(check_profile(profile, k)), dtype=torch.float64))
        object.__setattr__(self, "current", profile)


class Phases:
    """A schedule of forced-acceptance profiles over a run's output tokens (module docstring).

    texts: one `--acceptance` text per phase (one phase: a steady workload); k: the drafts the
    profiles must cover. Use: `start(total_tokens, acceptances)` before a run, then `observe_step(entries, seconds)` after
    every step (the driver's controller hook); `switches` holds each switch's token count."""

    def __init__(self, texts, k: int, seed: int = 0):
        texts = [t.strip() for t in texts]
        if not texts:
            raise ValueError("phases: empty; give one forced-acceptance profile per phase, e.g. 0.9:0.1:0.9")
        self.texts = texts
        self.profiles = []
        for t in texts:
            try:
                self.profiles.append(ForcedAcceptance.parse(t, k, seed).for_k(k))
            except ValueError as err:
                raise ValueError(f"phases: profile {t!r}: {err}") from None
        self.k = k
        self.acceptances: list[SwitchableAcceptance] = []
        self.total = 0
        self.emitted = 0
        self.phase = 0
        self.switched_at: list[int] = []                # tokens emitted when each switch happened
        self.by_phase: list[dict] = []                  # per phase: steps by drafts, tokens, seconds

    @property
    def switches(self) -> list[int]:
        """Token counts at which phase i + 1 begins, `[len(profiles) - 1]` (for the current run)."""
        n = len(self.profiles)
        return [self.total * i // n for i in range(1, n)]

    def start(self, total_tokens: int, acceptances) -> None:
        """A new run of `total_tokens` output tokens on engines holding `acceptances` (each a
        SwitchableAcceptance an engine took its table from; none for a target-only engine)."""
        for a in acceptances:
            if not a.attached:
                raise ValueError("phases: the engine never took forced acceptance's conditional table (a tree "
                                 "window or no forced acceptance): a phase switch could not reach its sampler")
        self.acceptances = list(acceptances)
        self.total, self.emitted, self.phase, self.switched_at = total_tokens, 0, 0, []
        self.by_phase = [{"steps_by_drafts": {}, "tokens": 0, "seconds": 0.0} for _ in self.profiles]
        self._enter(0)

    def _enter(self, phase: int) -> None:
        self.phase = phase
        for a in self.acceptances:
            a.set_profile(self.profiles[phase])

    def observe_step(self, entries, seconds: float) -> None:
        """Count the step's emitted tokens (and tally the step in its phase); past a switch point, the
        next phase's profile."""
        verify = [e for e in entries if e.kind == "verify"]
        tokens = sum(len(out) for e in verify for out in e.emitted)
        drafts = str(max((d for e in verify for d in e.drafted), default=0))
        tally = self.by_phase[self.phase]
        tally["steps_by_drafts"][drafts] = tally["steps_by_drafts"].get(drafts, 0) + 1
        tally["tokens"] += tokens
        tally["seconds"] += seconds
        self.emitted += tokens
        while self.phase < len(self.switches) and self.emitted >= self.switches[self.phase]:
            self.switched_at.append(self.emitted)
            self._enter(self.phase + 1)

    def run_record(self) -> dict:
        """The last run's switch points (planned and where they landed: a step emits several tokens) and
        per phase its steps by draft count, tokens, seconds and tokens/s."""
        phases = [{**t, "seconds": round(t["seconds"], 4),
                   "tokens_per_s": round(t["tokens"] / t["seconds"], 2) if t["seconds"] else None}
                  for t in self.by_phase]
        return {"total_tokens": self.total, "switch_tokens": self.switches, "switched_at": self.switched_at,
                "phases": phases}

    def describe(self) -> dict:
        """The schedule for a benchmark's JSON."""
        return {"profiles": [[round(x, 4) for x in p] for p in self.profiles], "texts": self.texts,
                "expected_mean_acceptance_length": [round(mean_acceptance_length(p), 4) for p in self.profiles],
                "switch_rule": "phase i of P runs from (i / P) to ((i + 1) / P) of the point's output tokens",
                "switch_fractions": [round(i / len(self.profiles), 4) for i in range(1, len(self.profiles))]}


class Observers:
    """Several step observers (an AdaptiveK, a Phases schedule) behind the driver's one `controller`."""

    def __init__(self, *observers):
        self.observers = [o for o in observers if o is not None]

    def observe_step(self, entries, seconds: float) -> None:
        for o in self.observers:
            o.observe_step(entries, seconds)
