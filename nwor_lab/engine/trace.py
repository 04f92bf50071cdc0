"""What each window did, for notebooks and tests."""
from __future__ import annotations

from dataclasses import dataclass, field

from nwor_lab.metrics import WindowRecord


@dataclass
class WindowTrace:
    """One policy window.

    kind: `verify` (target layers + the head's first pass, one window) or `draft` (the head's
    chain of drafts d_2..d_n, all speculative: never committed).
    Per request of the window: `drafted` drafts verified, `accepted` of them, `emitted` tokens
    appended to its output, `kinds` prefill / decode / spec. `record` is the policy's WindowRecord
    (tokens committed, bytes written / skipped / logged / restored).
    """

    step: int
    kind: str
    req_ids: list[int]
    kinds: list[str] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    emitted: list[list[int]] = field(default_factory=list)
    record: WindowRecord | None = None
    path_ranks: list | None = None      # a tree window: per request, the sibling rank of each accepted node

    # The engine may count a window's record after the next step is launched (`SpecEngine.flush_records`:
    # the host's bookkeeping behind the GPU's work); `_resolve` is then the engine's flush, and reading
    # `record` runs it first, so a reader never sees a window's record missing.
    _resolve = None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("step", "kind", "req_ids", "kinds", "drafted", "accepted", "emitted")}
        d["record"] = None if self.record is None else self.record.to_dict()
        if self.path_ranks is not None:
            d["path_ranks"] = self.path_ranks
        return d


def _get_record(self) -> WindowRecord | None:
    if self._resolve is not None:
        self._resolve()
    return self._record


def _set_record(self, record: WindowRecord | None) -> None:
    self._record = record
    self._resolve = None


WindowTrace.record = property(_get_record, _set_record, doc="the policy's WindowRecord (counted on first read "
                                                            "when the engine deferred it)")


@dataclass(frozen=True)
class Divergence:
    """Where a run's generated tokens first differ from a reference run's: prompt `prompt`, generated
    token `token`; `got` / `want` the tokens there (None: that run had stopped); `window` the step
    whose verify window emitted it (when `first_divergence` was given the run's trace)."""

    prompt: int
    token: int
    got: int | None
    want: int | None
    window: int | None = None

    def where(self) -> dict:
        return {"prompt": self.prompt, "token": self.token}


def first_divergence(got: list[list[int]], want: list[list[int]], *, earliest: bool = False,
                     trace: list[WindowTrace] | None = None, req_ids: list[int] | None = None) -> Divergence | None:
    """Where `got` (one token list per prompt) first differs from `want` (the reference), or None when
    every prompt's tokens are equal. A run that stops early differs at the shorter length. First by
    prompt, then by token; `earliest`: the smallest token index over all prompts instead (ties: the
    first prompt). With `trace` and `req_ids` (the run's request ids, in the prompts' order): the
    step whose verify window emitted that token, as `window`."""
    best = None
    for i, (g, w) in enumerate(zip(got, want)):
        n = min(len(g), len(w))
        j = next((t for t in range(n) if g[t] != w[t]), n if len(g) != len(w) else None)
        if j is not None and (best is None or j < best[1]):
            best = (i, j)
            if not earliest:
                break
    if best is None:
        return None
    i, j = best
    window = emitted_in(trace, req_ids[i], j) if trace is not None and req_ids is not None else None
    return Divergence(i, j, got[i][j] if j < len(got[i]) else None, want[i][j] if j < len(want[i]) else None, window)


def emitted_in(trace: list[WindowTrace], req_id: int, token: int) -> int | None:
    """The step whose verify window emitted output token `token` of request `req_id` (None: none did)."""
    seen = 0
    for w in trace:
        if w.kind != "verify" or req_id not in w.req_ids:
            continue
        seen += len(w.emitted[w.req_ids.index(req_id)])
        if seen > token:
            return w.step
    return None
