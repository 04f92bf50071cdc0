"""Figures of a sweep: one per numeric metric, plotted against the parameters that vary.

Layout of a metric's figure, from the varying parameters in grid order:
1st -> x axis (lines when it is numeric with 3+ values, grouped bars otherwise),
2nd -> colour (legend), the rest -> one panel each (shared y axis, so panels compare).
Only "ok" runs are plotted; failures are listed by the report instead.
"""
from __future__ import annotations

import math
from typing import Any

# metric-name suffix -> unit; longest first, so `_tok_s` wins over `_s`
UNIT_SUFFIXES = [
    ("_tokens_per_s", "tokens/s"), ("_tok_s", "tokens/s"), ("_gb_s", "GB/s"), ("_tb_s", "TB/s"),
    ("_gbps", "GB/s"), ("_tbps", "TB/s"), ("_percent", "%"), ("_bytes", "bytes"), ("_pct", "%"),
    ("_gib", "GiB"), ("_mib", "MiB"), ("_ms", "ms"), ("_us", "µs"), ("_ns", "ns"), ("_gb", "GB"),
    ("_mb", "MB"), ("_s", "s"),
]
MAX_PANEL_COLUMNS = 3


def metric_label(name: str) -> tuple[str, str | None]:
    """`"step_ms"` -> `("step", "ms")`; `"acceptance_length"` -> `("acceptance length", None)`."""
    for suffix, unit in sorted(UNIT_SUFFIXES, key=lambda su: -len(su[0])):
        if "_" + name == suffix:          # the name is the unit itself, e.g. "tok_s"
            return unit, None
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)].replace("_", " "), unit
    return name.replace("_", " "), None


def axis_title(name: str) -> str:
    text, unit = metric_label(name)
    return f"{text} ({unit})" if unit else text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sort_key(value: Any) -> tuple:
    """Numbers in numeric order, then everything else by its text."""
    return (0, value, "") if _is_number(value) else (1, 0, str(value))


def numeric_metrics(rows: list[dict]) -> list[str]:
    """Metric names whose recorded values (ok runs) are all numbers; first-seen order."""
    names: dict[str, bool] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        for key, value in (row.get("metrics") or {}).items():
            if value is None:
                names.setdefault(key, True)
            else:
                names[key] = names.get(key, True) and _is_number(value)
    return [k for k, numeric in names.items() if numeric and any(
        _is_number((r.get("metrics") or {}).get(k)) for r in rows if r.get("status") == "ok")]


def varying_params(rows: list[dict]) -> list[str]:
    """Parameter names that take more than one value across `rows`, in the rows' key order."""
    order: dict[str, set] = {}
    for row in rows:
        for key, value in row["params"].items():
            order.setdefault(key, set()).add(repr(value))
    return [k for k, values in order.items() if len(values) > 1]


def _label(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def metric_figure(rows: list[dict], metric: str, params: list[str]):
    """The figure of one metric over `rows` (ok runs), keyed by `params` (see module docstring)."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    points = [r for r in rows if r.get("status") == "ok" and _is_number((r.get("metrics") or {}).get(metric))]
    x_name = params[0] if params else None
    color_name = params[1] if len(params) > 1 else None
    panel_names = params[2:]

    def value(row, name):
        return row["params"][name] if name else None

    def panel_of(row):
        return ", ".join(f"{n}={_label(row['params'][n])}" for n in panel_names)

    panel_order: dict[str, list] = {}
    for r in points:
        panel_order.setdefault(panel_of(r), [sort_key(r["params"][n]) for n in panel_names])
    panels = sorted(panel_order, key=panel_order.get)
    colors = sorted({value(r, color_name) for r in points}, key=sort_key)
    xs = sorted({value(r, x_name) for r in points}, key=sort_key)
    as_lines = x_name is not None and len(xs) >= 3 and all(_is_number(x) for x in xs)
    ncols = max(1, min(len(panels), MAX_PANEL_COLUMNS))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = make_subplots(rows=nrows, cols=ncols, shared_yaxes=True, subplot_titles=panels if panel_names else None,
                        horizontal_spacing=0.06, vertical_spacing=0.18 if nrows > 1 else 0.1)
    palette = qualitative.Plotly
    in_legend: set[int] = set()  # one legend entry per colour, whichever panel shows it first
    for p_index, panel in enumerate(panels or [""]):
        prow, pcol = divmod(p_index, ncols)
        for c_index, color in enumerate(colors):
            series = sorted((r for r in points if panel_of(r) == panel and value(r, color_name) == color),
                            key=lambda r: sort_key(value(r, x_name)))
            if not series:
                continue
            x = [value(r, x_name) if as_lines else _label(value(r, x_name)) for r in series] if x_name else ["run"] * len(series)
            common = dict(x=x, y=[r["metrics"][metric] for r in series], customdata=[r["run_id"] for r in series],
                          name=_label(color) if color_name else metric, legendgroup=str(c_index),
                          showlegend=bool(color_name) and c_index not in in_legend, marker_color=palette[c_index % len(palette)],
                          hovertemplate="%{customdata}<br>%{y}<extra></extra>")
            in_legend.add(c_index)
            trace = go.Scatter(mode="lines+markers", **common) if as_lines else go.Bar(**common)
            fig.add_trace(trace, row=prow + 1, col=pcol + 1)
    title = axis_title(metric)
    fig.update_layout(title=dict(text=title), barmode="group", legend_title_text=color_name or "",
                      height=140 + 300 * nrows, margin=dict(l=70, r=20, t=90, b=60), template="plotly_white")
    if x_name and not as_lines:
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=[_label(x) for x in xs])
    fig.update_xaxes(title_text=x_name or "")
    fig.update_yaxes(title_text=title, col=1)
    return fig


def sweep_figures(rows: list[dict]) -> list[tuple[str, Any]]:
    """`(metric, figure)` for every numeric metric of `rows` (the newest row per run)."""
    params = varying_params(rows)
    return [(metric, metric_figure(rows, metric, params)) for metric in numeric_metrics(rows)]
