"""How padding the steps with prefills changes serving (`serve_buckets_8b_h200.json`: `bench serve
--row-steps`), read from the stored file; nothing is measured here.

  ratio_by_rule   EAGLE-3 k 4 over target-only (output tokens/s, median and min–max of the paired
                  repeats) for each token-bucket rule, one colour per machine: each device call ran on
                  a fresh machine, and a ratio compares only with the same machine's
  rule_table      the same runs as a Markdown table, with the EAGLE engine's steps with a prefill,
                  graphs and device memory
  rule_napkin     one paragraph: powers of two against eight buckets a doubling on each machine that ran
                  both, and the EAGLE engine's device memory under each rule
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from nwor_lab.viz.perf import _layout, result_subtitle
from nwor_lab.viz.tables import markdown_table, spread_text

_COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9")


def rule_name(steps: int) -> str:
    return "powers of two" if steps == 1 else f"{steps} a doubling"


def _label(run: Mapping) -> str:
    return rule_name(run["row_steps"]) + (" + shared pool" if run["prefill_pool"] == "shared" else "")


def _eagle_engine(run: Mapping) -> Mapping:
    """The run's EAGLE engine row (`engines`: target-only's and EAGLE's start costs)."""
    return next(e for e in run["engines"] if e["config"] != "target-only")


def ratio_by_rule(result: Mapping, *, goal: float | None = 2.2):
    """Dots with min–max bars: EAGLE-3 k 4 over target-only per rule, a trace per machine."""
    runs = result["summary"]
    order = list(dict.fromkeys(_label(r) for r in sorted(runs, key=lambda r: (r["prefill_pool"] == "shared",
                                                                               r["row_steps"]))))
    fig = go.Figure()
    for i, machine in enumerate(dict.fromkeys(r["machine"] for r in runs)):
        mine = sorted((r for r in runs if r["machine"] == machine), key=lambda r: order.index(_label(r)))
        med = [r["eagle3_k4_over_target"]["median"] for r in mine]
        fig.add_trace(go.Scatter(
            x=[_label(r) for r in mine], y=med, mode="lines+markers", name=f"machine {machine}",
            line={"color": _COLOURS[i % len(_COLOURS)], "width": 1.5}, marker={"size": 9},
            error_y={"type": "data", "symmetric": False,
                     "array": [r["eagle3_k4_over_target"]["max"] - m for r, m in zip(mine, med)],
                     "arrayminus": [m - r["eagle3_k4_over_target"]["min"] for r, m in zip(mine, med)]},
            hovertemplate="%{x}: %{y:.3f}×<extra>machine " + machine + "</extra>"))
    if goal is not None:
        fig.add_trace(go.Scatter(x=[order[0], order[-1]], y=[goal, goal], mode="lines", name=f"goal {goal}×",
                                 line={"color": "#999999", "dash": "dash"}, hoverinfo="skip"))
    fig.update_xaxes(categoryorder="array", categoryarray=order, title_text="rows of a step with prefills padded to")
    fig.update_yaxes(title_text="EAGLE-3 k 4 / target-only (tok/s)")
    _layout(fig, "32 clients: padding the steps with prefills less",
            result_subtitle(result, "Medians of 3 paired repeats, bars min–max; a line joins one machine's runs"),
            height=460, legend_y=-0.3, bottom=130)
    return fig


def rule_table(result: Mapping) -> str:
    """Per run: machine, rule, the ratio, the EAGLE engine's steps with a prefill (mean ms), and its
    graphs at start, their capture seconds and the device memory the engine added."""
    body = []
    for r in result["summary"]:
        eagle = _eagle_engine(r)
        q = r["eagle3_k4_over_target"]
        body.append([r["machine"], _label(r), spread_text(q["median"], q["min"], q["max"], ".3f", "×"),
                     f"{r['eagle_prefill_step_ms']['mean']:.1f} ms", str(eagle["graphs_at_start"]),
                     f"{eagle['capture_seconds']:.0f} s", f"{eagle['device_memory_added_gib']:.1f} GiB"])
    return markdown_table(["machine", "rows padded to", "EAGLE-3 k 4 / target-only", "EAGLE step with a prefill",
                           "graphs", "captured in", "engine's device memory"], body)


def rule_napkin(result: Mapping, goal: float = 2.2) -> str:
    """Markdown: the change from powers of two to 8 a doubling on every machine that ran both (same
    pool rule), the EAGLE engine's device memory under each rule, and whether `goal` was reached."""
    by = {(r["machine"], r["row_steps"], r["prefill_pool"]): r for r in result["summary"]}
    ratio = lambda key: by[key]["eagle3_k4_over_target"]["median"]             # noqa: E731
    gains = [(m, ratio((m, 1, p)), ratio((m, 8, p))) for m, s, p in by if s == 1 and (m, 8, p) in by]
    memory = {}
    for r in result["summary"]:
        memory.setdefault(_label(r), _eagle_engine(r)["device_memory_added_gib"])
    best = max(ratio(key) for key in by)
    return ("**Napkin math** (`serve_buckets_8b_h200.json`). Powers of two → eight buckets a doubling, on the "
            "same machine: " + "; ".join(f"machine {m}: {a:.3f}× → {b:.3f}× ({b / a - 1:+.1%})" for m, a, b in gains)
            + ". The EAGLE engine's device memory (its cache and graphs): "
            + ", ".join(f"{v:.1f} GiB with {k}" for k, v in memory.items())
            + f". Best ratio measured: {best:.3f}×; the goal at 32 clients, {goal}×, is "
            + ("reached." if best >= goal else "not reached."))
