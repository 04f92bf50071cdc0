"""What a phase-switching `bench serve` point allows: each config's seconds per phase, and the bound.

With `--phases` every config emits the same tokens under each acceptance profile, so its seconds in
phase i compare across configs. A phase's seconds are its steps' wall times; what the host does
between steps (the records, a controller's `observe_step`) and the prompts before the first token
fall outside every phase. So that a config's host time counts against it whether or not a step
launched ahead hides it, each config's duration is shared out over its phases in proportion to
their seconds (`charged`). The fastest config of each phase (target-only included) then gives a
bound no controller passes without a step cheaper than every config measured:

    charged(c, i) = seconds(c, i) x duration(c) / sum over phases of seconds(c, phase)
    bound(point)  = sum over phases i of min over configs c of charged(c, i)
    bound ratio   = best fixed k's duration / bound(point)

  phase_seconds      {concurrency: {config: {"phases": [s ...], "outside": s, "duration": s,
                     "charged": [s ...]}}} from the point's rows (each config's median repeat: `bench
                     serve` keeps that run's record)
  phase_bound        per concurrency: the best fixed k, the per-phase best configs, the bound ratio and
                     k auto's ratio (both over the best fixed k's median-repeat duration)
  phase_bars         stacked bars, one panel per load: every config's seconds in each phase and outside
                     them (as measured), and the bound's charged seconds per phase

Everything is read from the JSON; nothing is measured.
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.perf import _layout, result_subtitle

_PHASE_COLOURS = ["#0072b2", "#e69f00", "#56b4e9", "#cc79a7", "#009e73"]
_OUTSIDE = "#bbbbbb"


def phase_seconds(result: Mapping) -> dict[int, dict[str, dict]]:
    """{concurrency: {config: {"phases": [seconds per phase], "outside": seconds, "duration": seconds}}}
    of the result's phase-switching closed-loop rows."""
    out: dict[int, dict[str, dict]] = {}
    for r in result.get("results", []):
        ph = r.get("phases")
        if r.get("traffic") != "phases" or r.get("mode") != "closed" or not isinstance(ph, Mapping):
            continue
        seconds = [p["seconds"] for p in ph["phases"]]
        share = r["duration_s"] / sum(seconds) if sum(seconds) > 0 else 0.0
        out.setdefault(r["concurrency"], {})[r["config"]] = {
            "phases": seconds, "outside": max(r["duration_s"] - sum(seconds), 0.0), "duration": r["duration_s"],
            "charged": [s * share for s in seconds]}
    if not out:
        raise ValueError("no phase-switching closed-loop rows with per-phase records: run bench serve with --phases")
    return out


def phase_bound(result: Mapping) -> list[dict]:
    """Per concurrency: {"concurrency", "best_fixed", "per_phase_best" [config per phase], "bound_ratio",
    "auto", "auto_ratio", "share_of_bound" (auto's gain over the best fixed k as a share of the bound's)}."""
    rows = []
    for n, configs in sorted(phase_seconds(result).items()):
        fixed = {c: v for c, v in configs.items() if "k=auto" not in c and c != "target-only"}
        auto = next((c for c in configs if "k=auto" in c), None)
        if not fixed:
            continue
        best = min(fixed, key=lambda c: fixed[c]["duration"])
        phases = len(configs[best]["phases"])
        winners = [min(configs, key=lambda c: configs[c]["charged"][i]) for i in range(phases)]
        bound = sum(configs[w]["charged"][i] for i, w in enumerate(winners))
        bound_ratio = configs[best]["duration"] / bound
        auto_ratio = configs[best]["duration"] / configs[auto]["duration"] if auto else None
        rows.append({"concurrency": n, "best_fixed": best, "per_phase_best": winners, "bound_ratio": bound_ratio,
                     "auto": auto, "auto_ratio": auto_ratio,
                     "share_of_bound": (auto_ratio - 1) / (bound_ratio - 1) if auto and bound_ratio > 1 else None})
    return rows


def _short(config: str) -> str:
    return config.replace(" nwor=stage", "").replace(" nwor=cow", " cow").replace(" nwor=off", " off")


def phase_bars(result: Mapping, title: str | None = None) -> go.Figure:
    """Stacked horizontal bars, one panel per load: every config's seconds in each phase and outside
    them, and a last bar for the bound (each phase at its fastest config, charged seconds)."""
    data, bounds = phase_seconds(result), {b["concurrency"]: b for b in phase_bound(result)}
    texts = (result.get("phases") or {}).get("texts") or []
    loads = sorted(data)
    fig = make_subplots(rows=len(loads), cols=1, vertical_spacing=0.16,
                        subplot_titles=[f"{n} clients" for n in loads])
    for row, n in enumerate(loads, start=1):
        configs = data[n]
        names = list(configs)
        b = bounds.get(n)
        labels = [_short(c) for c in names] + (["bound: per-phase best"] if b else [])
        phases = len(next(iter(configs.values()))["phases"])
        for i in range(phases):
            values = [configs[c]["phases"][i] for c in names]
            if b:
                values.append(configs[b["per_phase_best"][i]]["charged"][i])
            name = f"phase {i + 1}" + (f" (acceptance {texts[i]})" if i < len(texts) else "")
            fig.add_trace(go.Bar(y=labels, x=values, orientation="h", name=name, legendgroup=name,
                                 showlegend=row == 1, marker_color=_PHASE_COLOURS[i % len(_PHASE_COLOURS)],
                                 hovertemplate="%{y}: %{x:.3f} s<extra>" + name + "</extra>"), row=row, col=1)
        outside = [configs[c]["outside"] for c in names] + ([0.0] if b else [])      # the bound's is charged
        fig.add_trace(go.Bar(y=labels, x=outside, orientation="h", name="outside the phases (prefills, host)",
                             legendgroup="outside", showlegend=row == 1, marker_color=_OUTSIDE,
                             hovertemplate="%{y}: %{x:.3f} s<extra>outside</extra>"), row=row, col=1)
        fig.update_xaxes(title_text="seconds (each config's median repeat)", row=row, col=1)
        fig.update_yaxes(autorange="reversed", row=row, col=1)
    fig.update_layout(barmode="stack")
    _layout(fig, title or "Seconds per phase: where a fixed k loses, and the bound", result_subtitle(result),
            height=280 * len(loads) + 160, legend_y=-0.12, subplot_titles=True)
    return fig
