"""Chapter 13's stored GPU results, read for display: `nwor-lab bench state` documents (one row per
(batch, strategy) under `results`), the issue's "done when" comparison of `stage` with `snapshots`,
and `nwor-lab audit --json` lines (one line per store, then a summary line per run).

Every number the chapter shows comes from these files; nothing here holds a result."""
from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.audit.report import STORES
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.tables import records_table as markdown_table     # rows of dicts, as the chapter calls it
from nwor_lab.viz.categories import add_category_legend
from nwor_lab.viz.theme import HIGHLIGHT, LEGEND_PX, STATE_COLOURS, TOKEN_COLOURS, base_layout

MIB = 2 ** 20
BF16_EPS = 2.0 ** -7      # bf16's relative spacing (7 stored mantissa bits): a gap this much above the
                          # tolerance, relatively, is one rounding step of the arithmetic itself
VERDICTS = ("exact", "within noise", "wrong")
TICKS = (0.1, 0.2, 0.5, 1, 2, 5, 10)      # the logit-gap axis (log)


def results_dir() -> Path:
    """benchmarks/results/ of the tree this package is imported from."""
    return Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def load(path) -> dict:
    """A `bench state` JSON document, checked to hold rows (`results`)."""
    doc = json.loads(Path(path).read_text())
    if not doc.get("results"):
        raise ValueError(f"{path}: no 'results' rows: not a `nwor-lab bench state --json` document")
    return doc


def noise_band(doc: dict) -> float:
    """How far target-only decoding's own largest logit gap moves in this document, in standard
    deviations: the spread of `target_only_max_logit_gap` over the document's batches (bf16 rounds a
    batch-32 and a batch-64 pass differently, with no drafts at all), and at least one bf16 rounding
    step of the largest of them (`BF16_EPS`, so a one-batch document still has a band)."""
    own = [r["target_only_max_logit_gap"] for r in doc["results"] if r.get("target_only_max_logit_gap") is not None]
    if not own:
        return 0.0
    return max(max(own) - min(own), BF16_EPS * max(own))


def verdict(doc: dict, r: dict) -> str:
    """One row's verdict, one of `VERDICTS`: "exact" when the check passes (no target-emitted token
    further from the target's own choice than target-only decoding's worst at that batch); "within
    noise" when it misses the tolerance by no more than the target's own bf16 noise (`noise_band`);
    "wrong" beyond that. A row without a logit gap (no forced acceptance) has only the greedy check:
    "exact" or "wrong"."""
    if r["correct"]:
        return "exact"
    gap, tol = r.get("max_logit_gap"), r.get("tolerance")
    if gap is None or tol is None:
        return "wrong"
    return "within noise" if gap - tol <= noise_band(doc) else "wrong"


def engine_rows(doc: dict) -> list[dict]:
    """Display rows of a `bench state` document, one per (batch, strategy), in the file's order.
    The logit-gap columns are empty for a run without forced acceptance (they are in units of the
    row's logit standard deviation)."""
    out = []
    for r in doc["results"]:
        div = "none" if r["first_divergence"] is None else \
            f"token {r['first_divergence']} (prompt {r['first_divergence_prompt']})"
        gap = r.get("max_logit_gap")
        out.append({
            "batch": r["batch"], "strategy": r["strategy"], "verdict": verdict(doc, r),
            "first divergence": div,
            "largest logit gap": "—" if gap is None else f"{gap:.4f}",
            "tolerance": "—" if r.get("tolerance") is None else f"{r['tolerance']:.4f}",
            "tokens over it": "—" if r.get("target_tokens_over_tolerance") is None else
            f"{r['target_tokens_over_tolerance']} of {r['target_tokens_checked']}",
            "tok/s": f"{r['tokens_per_s']:,.0f}", "step ms": f"{r['step_ms']:.1f}",
            "steady MiB / request": f"{r['state_bytes_steady'] / MIB:,.1f}",
            "window MiB / request": f"{r['state_bytes_window'] / MIB:,.1f}",
            "accepted length": f"{r['mean_acceptance_length']:.2f}"})
    return out


def row(doc: dict, strategy: str, batch: int) -> dict:
    for r in doc["results"]:
        if r["strategy"] == strategy and r["batch"] == batch:
            return r
    raise KeyError(f"strategy={strategy!r}, batch={batch}: not in this document "
                   f"(batches {sorted({r['batch'] for r in doc['results']})})")


def done_when(doc: dict, batch: int = 32) -> dict:
    """The issue's bar at `batch`: `stage` no slower than `snapshots` (tokens/s) and holding at most
    1/(k+1) of snapshots' steady state bytes per request. -> both sides, the bound and the verdicts."""
    stage, snaps = row(doc, "stage", batch), row(doc, "snapshots", batch)
    k = doc["k"]
    bound = snaps["state_bytes_steady"] / (k + 1)
    return {"batch": batch, "k": k, "stage_tokens_per_s": stage["tokens_per_s"],
            "snapshots_tokens_per_s": snaps["tokens_per_s"], "speedup": stage["tokens_per_s"] / snaps["tokens_per_s"],
            "stage_steady": stage["state_bytes_steady"], "snapshots_steady": snaps["state_bytes_steady"],
            "memory_ratio": stage["state_bytes_steady"] / snaps["state_bytes_steady"], "bound": bound,
            "no_slower": stage["tokens_per_s"] >= snaps["tokens_per_s"],
            "memory_ok": stage["state_bytes_steady"] <= bound}


def check_text(doc: dict, batch: int, exact: list[str]) -> str:
    """One markdown paragraph on the correctness check at `batch` of a forced-acceptance document:
    how far `off` is, whether the `exact` strategies (those that commit only accepted state) agree
    with one another, and whether they pass; when they fail, by how much, against `off`'s margin."""
    off, rows = row(doc, "off", batch), [row(doc, n, batch) for n in exact]
    ex = rows[0]
    same = len({(r["max_logit_gap"], r["target_tokens_over_tolerance"], r["first_divergence"]) for r in rows}) == 1
    text = (f"**Batch {batch}:** `off` is {off['max_logit_gap']:.1f} standard deviations off at worst, over the "
            f"tolerance on {off['target_tokens_over_tolerance']} of {off['target_tokens_checked']} target-emitted "
            f"tokens, from token {off['first_divergence']} of prompt {off['first_divergence_prompt']}. The "
            f"{_count(len(rows))} strategies that commit only accepted state {'give the same check, to the last digit' if same else 'differ'}: "
            f"largest gap {ex['max_logit_gap']:.4f} against a tolerance of {ex['tolerance']:.4f} (target-only's "
            f"own largest gap {ex['target_only_max_logit_gap']:.4f}). ")
    if all(r["correct"] for r in rows):
        return text + ("Their worst token is no worse than target-only decoding's own worst at this batch: "
                       "they pass." if ex["max_logit_gap"] <= ex["target_only_max_logit_gap"] else "They pass.")
    if not same:
        return text + "Not all of them pass: see the table."
    band = noise_band(doc)
    miss = ex["max_logit_gap"] - ex["tolerance"]
    within = verdict(doc, ex) == "within noise"
    return text + (f"They miss it on {ex['target_tokens_over_tolerance']} of {ex['target_tokens_checked']} tokens "
                   f"(token {ex['first_divergence']} of prompt {ex['first_divergence_prompt']}), by "
                   f"{miss:.4f} standard deviations (`off`: {off['max_logit_gap'] - off['tolerance']:.1f}), and all of "
                   f"them identically. Target-only decoding's own largest gap moves by {band:.4f} in this file "
                   f"(across its batches, or one bf16 rounding step): "
                   + (f"the miss is inside that, so the verdict is **within noise** — the verify window's bf16 "
                      f"arithmetic, which they share, not the state (one file, one run per batch)."
                      if within else "the miss is larger than that, so the verdict is **wrong**."))


def _count(n: int) -> str:
    return ("one", "two", "three", "four", "five")[n - 1] if 1 <= n <= 5 else str(n)


def calibration_text(doc: dict, exact: list[str]) -> str:
    """One markdown paragraph on a first run with a fixed tolerance (`doc`): where its first batch
    flagged the `exact` strategies, and at which other batches they all passed."""
    b0 = doc["batches"][0]
    rows = [row(doc, n, b0) for n in exact]
    flagged = [r for r in rows if not r["correct"]]
    done = [b for b in doc["batches"][1:] if any(r["batch"] == b for r in doc["results"])]
    ok = [b for b in done if all(row(doc, n, b)["correct"] for n in exact) and not row(doc, "off", b)["correct"]]
    text = f"With a fixed tolerance of {rows[0]['tolerance']}, at batch {b0} "
    if not flagged:
        text += "every exact strategy passed."
    else:
        where = {(r["first_divergence"], r["first_divergence_prompt"]) for r in flagged}
        text += (f"{'all ' + _count(len(rows)) if len(flagged) == len(rows) else _count(len(flagged))} exact "
                 f"strateg{'ies were' if len(flagged) > 1 else 'y was'} flagged")
        if len(where) == 1:
            tok, prompt = where.pop()
            text += f" at token {tok} of prompt {prompt}"
            if tok == 0:
                text += (" — the token the prefill emits, before any draft exists, so no state strategy could "
                         "have touched it")
        text += f" (largest gap {max(r['max_logit_gap'] for r in flagged):.4f})."
    if ok:
        text += (f" At batch{'es' if len(ok) > 1 else ''} {' and '.join(map(str, ok))} every exact strategy was "
                 f"within that tolerance and `off` was not.")
    missing = [b for b in doc["batches"] if b not in done and b != b0]
    if missing:
        text += f" The run stopped before batch {' and '.join(map(str, missing))}."
    return text


def _panels(doc: dict):
    batches = sorted({r["batch"] for r in doc["results"]})
    fig = make_subplots(rows=1, cols=len(batches), horizontal_spacing=0.1,
                        subplot_titles=[f"batch {b}" for b in batches])
    return batches, fig


def throughput_figure(doc: dict, *, title: str, subtitle: str | None = None) -> go.Figure:
    """Tokens/s per strategy, one panel per batch (the median of the document's timed runs)."""
    batches, fig = _panels(doc)
    for c, b in enumerate(batches, start=1):
        mine = [r for r in doc["results"] if r["batch"] == b]
        fig.add_trace(go.Bar(x=[r["strategy"] for r in mine], y=[r["tokens_per_s"] for r in mine],
                             marker_color=STATE_COLOURS[SlotState.COMMITTED], showlegend=False,
                             text=[f"{r['tokens_per_s']:,.0f}" for r in mine], textposition="outside",
                             cliponaxis=False, hovertemplate="%{x}: %{y:,.0f} tok/s<extra></extra>"), row=1, col=c)
        fig.update_yaxes(title_text="output tokens/s" if c == 1 else None, rangemode="tozero", row=1, col=c)
        fig.update_xaxes(title_text="state strategy", row=1, col=c)
    fig.update_layout(**base_layout(title, subtitle), height=420, width=1000, margin_b=60)
    fig.update_layout(margin_t=fig.layout.margin.t + 24)
    return fig


VERDICT_COLOURS = {"exact": TOKEN_COLOURS["kept"], "within noise": TOKEN_COLOURS["pending"],
                   "wrong": TOKEN_COLOURS["rejected"]}


def logit_gap_figure(doc: dict, *, title: str, subtitle: str | None = None) -> go.Figure:
    """The correctness check of a forced-acceptance run: per strategy the largest gap between the
    emitted token's logit and the best one (log scale, in logit standard deviations), one panel per
    batch, the tolerance of that batch as a dashed line (its value in the panel's title); each bar
    coloured by its `verdict`: exact, within the target's own bf16 noise, or wrong."""
    batches, fig = _panels(doc)
    for c, b in enumerate(batches, start=1):
        mine = [r for r in doc["results"] if r["batch"] == b]
        fig.add_trace(go.Bar(x=[r["strategy"] for r in mine], y=[r["max_logit_gap"] for r in mine],
                             marker_color=[VERDICT_COLOURS[verdict(doc, r)] for r in mine],
                             showlegend=False, text=[f"{r['max_logit_gap']:.4f}" for r in mine], textposition="outside",
                             cliponaxis=False, hovertemplate="%{x}: %{y:.4f}<extra></extra>"), row=1, col=c)
        tol = mine[0]["tolerance"]
        fig.add_hline(y=tol, line=dict(color=HIGHLIGHT, dash="dash", width=2), row=1, col=c)
        fig.layout.annotations[c - 1].text = f"batch {b} · tolerance (dashed) {tol:.4f}"   # the panel's title
        fig.update_yaxes(type="log", title_text="largest gap (std devs)" if c == 1 else None, range=[-1, 1.3],
                         tickvals=TICKS, ticktext=[f"{t:g}" for t in TICKS], row=1, col=c)
        fig.update_xaxes(title_text="state strategy", row=1, col=c)
    add_category_legend(fig, list(VERDICT_COLOURS.items()), outline=False)
    fig.update_layout(**base_layout(title, subtitle), height=440 + LEGEND_PX, width=1000)
    fig.update_layout(margin_t=fig.layout.margin.t + 24)
    return fig


# -- the auditor's stored runs ------------------------------------------------------------------
def audit_runs(lines) -> list[dict]:
    """`nwor-lab audit --json` output (lines, possibly several runs one after another) -> one dict per
    run: {"summary": its summary line, "stores": {store name: its line}}. A store line belongs to the
    summary line that follows it."""
    runs, stores = [], {}
    for line in lines:
        if not line.strip():
            continue
        obj = json.loads(line)
        if obj.get("summary"):
            runs.append({"summary": obj, "stores": stores})
            stores = {}
        else:
            stores[obj["store"]] = obj
    if stores:
        raise ValueError(f"store lines {sorted(stores)} after the last summary line: a run was cut off")
    return runs


def audit_table(runs: list[dict]) -> list[dict]:
    """One display row per stored audit run: model, the K/V strategy (with its ring), the state
    strategy, per store its first window ("1 (verify)") or its status, and the first token that
    differs from target-only."""
    out = []
    for run in runs:
        s = run["summary"]
        kv = s["nwor_mode"] + (f" + ring of {s['ring_slots']}" if s.get("ring_slots") else "")
        row = {"model": s["model"], "K/V": kv, "state": s.get("state_mode") or "—"}
        for name in STORES:
            f = run["stores"].get(name)
            row[name] = "—" if f is None else (f"{f['first_window']} ({f['window_kind']})"
                                               if f["status"] == "reached" else f["status"])
        d = s["first_divergence"]
        row["first divergence"] = "none" if d is None else f"request {d['request']}, token {d['token']} (window {d['window']})"
        out.append(row)
    return out
