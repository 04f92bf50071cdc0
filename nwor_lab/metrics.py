"""Per-window records and prometheus counters on a registry the lab owns.

Each `LabMetrics` has its own `CollectorRegistry`, so re-running a notebook cell (or building
several engines, as the seed's harness did) never raises a duplicate-metric error and never
reads another engine's zeros: the counters live exactly as long as the object that owns them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, generate_latest


@dataclass
class WindowRecord:
    """What one verify window did to the cache. Bytes count K and V over all layers written."""

    mode: str
    index: int
    num_reqs: int
    num_tokens: int
    num_drafts: int                 # drafts proposed (scheduled for verification)
    num_accepted: int               # drafts the sampler accepted
    tokens_committed: int           # tokens whose K/V the cache keeps (non-padding)
    drafts_committed: int           # drafts whose K/V the cache keeps == num_accepted
    per_request_accepted: list[int] = field(default_factory=list)
    drafts_by_position: list[int] = field(default_factory=list)    # [k]: requests with a draft j
    accepted_by_position: list[int] = field(default_factory=list)  # [k]: requests that accepted draft j
    bytes_written: int = 0          # into the paged cache
    bytes_skipped: int = 0          # rejected K/V never written (stage)
    bytes_logged: int = 0           # copied into the CoW log
    bytes_restored: int = 0         # copied back from the CoW log
    bytes_moved: int = 0            # copied inside the cache to compact a tree's accepted path
    cancelled: bool = False

    @property
    def num_rejected(self) -> int:
        return self.num_drafts - self.num_accepted

    def to_dict(self) -> dict:
        # asdict's recursive deep copy, without its cost (every field is flat: ints, bools, int lists);
        # the vLLM plugin builds one of these per window
        d = {k: list(v) if isinstance(v, list) else v for k, v in self.__dict__.items()}
        d["num_rejected"] = self.num_rejected
        return d


class LabMetrics:
    """Counters for one lab object (engine, policy, notebook), plus the window records."""

    def __init__(self, keep_records: bool = True):
        self.registry = CollectorRegistry()
        self.keep_records = keep_records
        self._records: list[WindowRecord] = []
        # called before any read: the engine that owns these metrics counts the windows it deferred
        # (`SpecEngine.flush_records`), so a reader always sees every window that ran
        self.before_read = None
        labels = ["mode"]
        def counter(name, doc):
            return Counter(f"nwor_{name}", doc, labels, registry=self.registry)
        self.windows = counter("windows", "verify windows committed or cancelled")
        self.drafts = counter("draft_tokens", "draft tokens proposed")
        self.accepted = counter("accepted_tokens", "draft tokens accepted")
        self.rejected = counter("rejected_tokens", "draft tokens rejected")
        self.committed = counter("committed_tokens", "tokens whose K/V the cache keeps")
        self.bytes_written = counter("bytes_written", "bytes written into the paged cache")
        self.bytes_skipped = counter("bytes_skipped", "rejected bytes never written")
        self.bytes_logged = counter("bytes_logged", "bytes copied into the CoW log")
        self.bytes_restored = counter("bytes_restored", "bytes restored from the CoW log")

    def observe(self, rec: WindowRecord) -> None:
        m = rec.mode
        self.windows.labels(m).inc()
        self.drafts.labels(m).inc(rec.num_drafts)
        self.accepted.labels(m).inc(rec.num_accepted)
        self.rejected.labels(m).inc(rec.num_rejected)
        self.committed.labels(m).inc(rec.tokens_committed)
        self.bytes_written.labels(m).inc(rec.bytes_written)
        self.bytes_skipped.labels(m).inc(rec.bytes_skipped)
        self.bytes_logged.labels(m).inc(rec.bytes_logged)
        self.bytes_restored.labels(m).inc(rec.bytes_restored)
        if self.keep_records:
            self._records.append(rec)

    @property
    def records(self) -> list[WindowRecord]:
        """Every window's WindowRecord, in the order they ran."""
        self._flush()
        return self._records

    def _flush(self) -> None:
        if self.before_read is not None:
            self.before_read()

    def value(self, name: str, mode: str) -> float:
        """Current value of counter `name` (e.g. 'accepted') for `mode`."""
        self._flush()
        return getattr(self, name).labels(mode)._value.get()

    def summary(self) -> dict:
        """Totals per mode: drafts, accepted, acceptance rate, bytes (for JSON and plots)."""
        out = {}
        for rec in self.records:
            s = out.setdefault(rec.mode, dict(windows=0, drafts=0, accepted=0, committed=0, bytes_written=0,
                                              bytes_skipped=0, bytes_logged=0, bytes_restored=0))
            s["windows"] += 1
            s["drafts"] += rec.num_drafts
            s["accepted"] += rec.num_accepted
            s["committed"] += rec.tokens_committed
            for key in ("bytes_written", "bytes_skipped", "bytes_logged", "bytes_restored"):
                s[key] += getattr(rec, key)
        for s in out.values():
            s["acceptance_rate"] = s["accepted"] / s["drafts"] if s["drafts"] else 0.0
        return out

    def exposition(self) -> str:
        """Prometheus text format of this lab's counters."""
        self._flush()
        return generate_latest(self.registry).decode()
