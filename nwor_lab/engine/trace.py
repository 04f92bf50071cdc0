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

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("step", "kind", "req_ids", "kinds", "drafted", "accepted", "emitted")}
        d["record"] = None if self.record is None else self.record.to_dict()
        if self.path_ranks is not None:
            d["path_ranks"] = self.path_ranks
        return d
