"""What the auditor reports: one `StoreFinding` per store, the first token that differs from
target-only, and the run's counts; as JSON lines (one per store, then a summary) or as table rows.

A store's `status`:
    absent         the model has no such store (a Llama has no recurrent state; no ring configured)
    reached        a rejected draft's bytes are in the store after a window (`first_window` says which);
                   for the stores that outlive a window (`prefix_cache`, `head_cache`, `swap`:
                   nwor_lab.audit.prefix; `host_tier`, `handoff`: nwor_lab.audit.moved), the store
                   holds what target-only would not
    clean          rejected rows were checked (`rows_checked` > 0) and none left a byte behind
    not exercised  the store exists but no rejected row could have reached it (nothing to check)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

# the stores, in the order they are reported (docs/audit.md says what each one is)
STORES = ("kv", "kv_digests", "ring", "recurrent_state", "conv_state", "draft_kv", "prefix_cache", "head_cache", "swap",
          "host_tier", "handoff")
STATUSES = ("absent", "reached", "clean", "not exercised")


@dataclass
class StoreFinding:
    """One store of one run. `first_window`: the engine step (= verify window index; a step's draft
    chain counts as the same step) after which a rejected draft's bytes were first found in the store,
    None when never; `window_kind` "verify" or "draft" (the EAGLE draft chain's window) for that first
    finding; `detail`: where (request id, layer, slot, position, draft index, ...); `windows_reached`:
    steps whose rejected rows reached it; `rows_checked`: rejected rows (or request states) checked."""

    store: str
    present: bool
    first_window: int | None = None
    window_kind: str | None = None
    detail: dict | None = None
    windows_reached: int = 0
    rows_checked: int = 0
    _steps: set = field(default_factory=set, repr=False, compare=False)

    @property
    def status(self) -> str:
        if not self.present:
            return "absent"
        if self.first_window is not None:
            return "reached"
        return "clean" if self.rows_checked else "not exercised"

    def reach(self, step: int, kind: str, detail: dict) -> None:
        """A rejected draft's bytes were found in the store after `step`'s `kind` window."""
        if self.first_window is None:
            self.first_window, self.window_kind, self.detail = step, kind, detail
        if step not in self._steps:
            self._steps.add(step)
            self.windows_reached += 1

    def as_dict(self) -> dict:
        return {"store": self.store, "status": self.status, "first_window": self.first_window,
                "window_kind": self.window_kind, "detail": self.detail, "windows_reached": self.windows_reached,
                "rows_checked": self.rows_checked}


@dataclass
class AuditReport:
    """stores: one finding per name of STORES, in that order. first_divergence: the first token where
    the run's output differs from target-only (`request` index in the prompts, `token` index in its
    output, `expected`, `got`, `window`: the step that emitted it), None when every token agrees.
    run: the strategy, model and counts (what the summary line carries)."""

    stores: list[StoreFinding]
    first_divergence: dict | None
    run: dict

    def store(self, name: str) -> StoreFinding:
        for s in self.stores:
            if s.store == name:
                return s
        raise KeyError(f"store={name!r}: the stores are {', '.join(STORES)}")

    @property
    def reached(self) -> list[str]:
        """The stores a rejected draft's bytes reached, in report order."""
        return [s.store for s in self.stores if s.status == "reached"]

    def summary(self) -> dict:
        return {"summary": True, **self.run, "first_divergence": self.first_divergence, "stores_reached": self.reached}

    def json_lines(self) -> list[str]:
        """One JSON object per store, then the summary: what `nwor-lab audit --json` prints."""
        return [json.dumps(s.as_dict()) for s in self.stores] + [json.dumps(self.summary())]


def table_rows(report: AuditReport) -> list[dict]:
    """The report as table rows for a chapter (one dict per store, display-ready strings):
    `store`, `status`, `first window` (e.g. "3 (verify)" or "—"), `where` (the detail, short),
    `windows reached`, `rows checked`."""
    rows = []
    for s in report.stores:
        where = "—"
        if s.detail:
            where = ", ".join(f"{k} {v}" for k, v in s.detail.items() if v is not None)
        first = "—" if s.first_window is None else f"{s.first_window} ({s.window_kind})"
        rows.append({"store": s.store, "status": s.status, "first window": first, "where": where,
                     "windows reached": s.windows_reached, "rows checked": s.rows_checked})
    return rows


def divergence_text(report: AuditReport) -> str:
    """One line for the table's caption: the first token that differs from target-only, or that none does."""
    d = report.first_divergence
    if d is None:
        return "every token equals target-only"
    return (f"first token that differs from target-only: request {d['request']}, token {d['token']} "
            f"(target-only {d['expected']}, got {d['got']}), emitted in window {d['window']}")


def strategies_table(reports: dict) -> list[dict]:
    """Several runs side by side, for a chapter: `reports` maps a label (e.g. the state strategy) to
    its AuditReport -> one dict per run: `strategy`, then per store its first window ("1 (verify)"),
    "clean", "absent" or "not exercised", then `first divergence` ("request 0, token 2 (window 2)" or
    "none")."""
    rows = []
    for label, report in reports.items():
        row = {"strategy": label}
        for s in report.stores:
            row[s.store] = f"{s.first_window} ({s.window_kind})" if s.status == "reached" else s.status
        d = report.first_divergence
        row["first divergence"] = "none" if d is None else f"request {d['request']}, token {d['token']} (window {d['window']})"
        rows.append(row)
    return rows
