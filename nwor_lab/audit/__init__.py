"""The store-by-store auditor: which store a rejected draft's bytes reached, and in which window.

    from nwor_lab.audit import audit, load_pair, prompts_for, table_rows
    pair = load_pair("tiny")
    report = audit(LabConfig(nwor_mode="off"), prompts_for(pair, 2), 24, target=pair.target, head=pair.head)
    report.reached                 # ["kv", "kv_digests", "draft_kv"]
    table_rows(report)             # one dict per store, for a chapter's table
    strategies_table({"off": r1, "stage": r2})   # one row per run, one column per store

Stores (docs/audit.md): `kv` (the target's paged attention K/V), `kv_digests` (content digests of the
blocks requests hold), `ring` (a sliding-window ring's entries), `recurrent_state` and `conv_state` (a
hybrid target's gated DeltaNet layers), `draft_kv` (the EAGLE head's own K/V layer). `nwor-lab audit
--json` is the command line (nwor_lab.cli.audit).
"""
from nwor_lab.audit.models import MODELS, Pair, load_pair, prompts_for, toy_hybrid_pair
from nwor_lab.audit.report import (STATUSES, STORES, AuditReport, StoreFinding, divergence_text, strategies_table,
                                   table_rows)
from nwor_lab.audit.run import Audit, audit, prepare_audit

__all__ = ["audit", "AuditReport", "StoreFinding", "STORES", "STATUSES", "table_rows", "strategies_table", "divergence_text",
           "prepare_audit", "Audit", "load_pair", "prompts_for", "toy_hybrid_pair", "Pair", "MODELS"]
