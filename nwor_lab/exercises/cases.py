"""Small random pieces the exercises' case generators share."""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from nwor_lab.window import Window


class Dice:
    """A seeded torch.Generator with the few draws the generators need."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def int(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi], both included."""
        return int(torch.randint(lo, hi + 1, (), generator=self.gen))

    def chance(self, p: float) -> bool:
        return bool(torch.rand((), generator=self.gen) < p)

    def choice(self, options):
        return options[self.int(0, len(options) - 1)]

    def perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)


def edge_then_random(fixed: Sequence, seed: int, n: int,
                     random_case: Callable[["Dice", int, int], object]) -> Iterator:
    """The `n` cases of an exercise: its edge cases `fixed` first (as many as `n` allows), then
    `count = n - len(fixed)` random ones, `random_case(d, i, count)` for `i` in `0 .. count - 1`, all
    drawn from one `Dice(seed)`. An edge case may be given as a function of that dice that makes it
    (cow_restore's draw their random bits from it, in order, and only when they are used)."""
    d = Dice(seed)
    for c in fixed[:n]:
        yield c(d) if callable(c) else c
    count = max(0, n - len(fixed))
    for i in range(count):
        yield random_case(d, i, count)


def growing(i: int, n: int, lo: int = 1, hi: int = 6) -> int:
    """A size bound that grows from `lo` to `hi` over the random cases: small counterexamples first."""
    return lo + (hi - lo) * i // max(n - 1, 1)


def window_counts(d: Dice, num_reqs: int, max_k: int) -> tuple[list[int], list[int]]:
    """`(num_scheduled_tokens, num_draft_tokens)` of a mixed batch: speculative requests (t_last +
    k drafts, k >= 1), prefills and plain decodes."""
    sched, drafts = [], []
    for _ in range(num_reqs):
        kind = d.choice(("spec", "spec", "prefill", "decode"))
        k = d.int(1, max_k) if kind == "spec" else 0
        sched.append(k + 1 if kind == "spec" else d.int(2, 5) if kind == "prefill" else 1)
        drafts.append(k)
    return sched, drafts


def random_accepted(d: Dice, drafts: list[int], mode: str = "random") -> list[int]:
    """Accepted lengths per request: "random" (0..k), "all" (k) or "none" (0)."""
    return [k if mode == "all" else 0 if mode == "none" else d.int(0, k) for k in drafts]


def host_window(sched, drafts, slots) -> Window:
    return Window.from_counts(sched, drafts, torch.as_tensor(slots, dtype=torch.int64))


def unique_slots(d: Dice, n: int, num_slots: int, pad_p: float) -> torch.Tensor:
    """`[n]` distinct slots in `[0, num_slots)`, each replaced by -1 with probability `pad_p`."""
    slots = d.perm(num_slots)[:n].long()
    return torch.tensor([-1 if d.chance(pad_p) else int(s) for s in slots], dtype=torch.int64)
