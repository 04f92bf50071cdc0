"""Change only what the target throws away: a drafter that redraws the drafts a greedy target rejects.

The controlled experiment of chapter 01: two runs of the same request with the same k must differ
in their rejected drafts and in nothing else — same accepted drafts, same windows (so the same
numerics: on a CPU a GEMM rounds differently for windows of other sizes, so another k changes
every K/V bit after the prompt), same output. Under greedy decoding the target accepts draft
`d_j` iff it equals the target-only continuation at its position, so with that continuation at
hand (`reference`, generated with `k = 0`) the first draft the target will reject is known
before the window runs: `RedrawRejected` keeps every draft before it and replaces it and every
later draft with random tokens (seeded) that the target rejects as well.

The draft chain itself runs unchanged (the head's K/V of the chain rows is the same in both
runs); only the token ids proposed for verification change.
"""
from __future__ import annotations

import torch

__all__ = ["RedrawRejected"]


class RedrawRejected:
    """An engine observer (`engine.observers.append(RedrawRejected(...))`): once the engine handed
    out each request's drafts for its next window (the draft chain's window end), the drafts the
    target will reject are replaced.

    reference: per request id, the target-only greedy output (at least `max_new_tokens + k + 1`
               tokens, so every draft position has its answer)
    seed:      the redrawn tokens' generator seed
    vocab:     vocabulary size (redrawn ids are drawn from `[0, vocab)`)
    `redrawn` counts the drafts replaced.
    """

    def __init__(self, reference, *, seed: int, vocab: int):
        self.reference = {i: list(r) for i, r in (reference.items() if isinstance(reference, dict)
                                                  else enumerate(reference))}
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.redrawn = 0

    def on_phase(self, event) -> None:
        pass

    def on_window_end(self, engine, trace, window) -> None:
        if trace.kind != "draft":
            return
        running = {r.req_id: r for r in engine.scheduler.running}
        for rid in trace.req_ids:
            r = running.get(rid)
            if r is not None and r.drafts:
                self.redraw(r)

    def redraw(self, r) -> None:
        """Keep `r`'s drafts up to the first one the target rejects; redraw it and every later one."""
        if r.draft_probs is not None:
            raise ValueError("RedrawRejected: greedy decoding only (temperature 0): sampled drafts come "
                             "with their probabilities, and only a greedy target's verdict is known ahead")
        ref = self.reference[r.req_id]
        done = len(r.output)         # d_1 proposes output[done]: the token after t_last
        drafts = list(r.drafts)
        for j, d in enumerate(drafts):
            if done + j >= len(ref):
                break                # no answer known here: leave the rest as drafted
            if d != ref[done + j]:   # the first draft the target rejects: it and all after it redrawn
                for i in range(j, len(drafts)):
                    want = ref[done + i] if done + i < len(ref) else None
                    drafts[i] = self._other_than(want, drafts[i])
                    self.redrawn += 1
                break
        r.drafts = drafts

    def _other_than(self, *avoid) -> int:
        while True:
            t = int(torch.randint(0, self.vocab, (), generator=self.generator))
            if t not in avoid:
                return t
