"""Figures of a sweep: one per numeric metric, plotted against the parameters that vary.

Layout of a metric's figure, from the varying parameters in grid order:
1st -> x axis (lines when it is numeric with 3+ values, grouped bars otherwise),
2nd -> colour (legend), the rest -> one panel each (shared y axis, so panels compare).
Only "ok" runs are plotted; failures are listed by the report instead. A metric with one value
in every ok run gets no figure (`constant_metrics`; the report lists it in a table).

A timing recorded with its range (`nwor_lab.sweep.spread`: `name`, `name_min`, `name_max`) is
drawn as its median with a min-max error bar, one point per run, never as a bar from zero: a bar's
height invites a ranking that the range may not support. `sweep_figures` returns what the runs
changed first and what a clock measured last.

Every figure of a report shows a value the same way: one colour per value of the colour
parameter (`color_map`, made once from all rows), and values in one order (`value_order`): the
lab's declared order for its named choices (write policies off, cow, stage, then registered
ones; SCV modes; backends), numbers ascending, other values as text.
"""
from __future__ import annotations

import math
from typing import Any

from nwor_lab.config import ATTENTION_BACKENDS, BACKENDS, CACHE_DTYPE_NAMES, SCV_MODES, nwor_modes, state_modes
from nwor_lab.sweep import spread as _spread

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


def unit_of(name: str) -> str | None:
    """The unit a metric is measured in: `"step_ms"` -> `"ms"`, `"tok_s"` (the unit itself) -> `"tokens/s"`."""
    text, unit = metric_label(name)
    return unit or next((u for suffix, u in UNIT_SUFFIXES if "_" + name == suffix), None)


def axis_title(name: str) -> str:
    text, unit = metric_label(name)
    return f"{text} ({unit})" if unit else text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sort_key(value: Any) -> tuple:
    """Numbers in numeric order, then everything else by its text."""
    return (0, value, "") if _is_number(value) else (1, 0, str(value))


def declared_orders() -> dict[str, tuple]:
    """Parameter name -> the lab's own order of its values (where the lab declares one)."""
    return {"nwor_mode": nwor_modes(), "nwor": nwor_modes(), "mode": nwor_modes(), "scv_mode": SCV_MODES,
            "scv": SCV_MODES, "state_mode": state_modes(), "backend": BACKENDS, "attention": ATTENTION_BACKENDS, "cache_dtype": CACHE_DTYPE_NAMES}


def param_sort_key(name: str | None):
    """A key ordering the values of parameter `name`: declared order first, then `sort_key`."""
    order = declared_orders().get(name or "", ())

    def key(value: Any) -> tuple:
        if isinstance(value, str) and value in order:
            return (0, order.index(value), "")
        return (1,) + sort_key(value)
    return key


def value_order(rows: list[dict], name: str | None) -> list:
    """The distinct values of parameter `name` over `rows`, in display order."""
    seen: dict[str, Any] = {}
    for r in rows:
        v = r["params"].get(name) if name else None
        seen.setdefault(repr(v), v)
    return sorted(seen.values(), key=param_sort_key(name))


def color_map(rows: list[dict], name: str | None) -> dict[str, str]:
    """Label -> colour for every value of the colour parameter `name`, fixed for the whole report."""
    from plotly.colors import qualitative
    palette = qualitative.Plotly
    return {_label(v): palette[i % len(palette)] for i, v in enumerate(value_order(rows, name))}


def constant_metrics(rows: list[dict]) -> dict[str, Any]:
    """Numeric metrics with the same value in every ok run that recorded them -> that value."""
    out = {}
    for name in numeric_metrics(rows):
        values = {(r.get("metrics") or {}).get(name) for r in rows if r.get("status") == "ok"}
        values.discard(None)
        if len(values) == 1:
            out[name] = values.pop()
    return out


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


def metric_figure(rows: list[dict], metric: str, params: list[str], colors: dict[str, str] | None = None,
                  with_range: bool | None = None):
    """The figure of one metric over `rows` (ok runs), keyed by `params` (see module docstring).
    `colors`: label -> colour of the colour parameter's values (default: made from `rows`);
    `with_range`: draw `metric_min`..`metric_max` as error bars (default: when every ok run
    records them, `nwor_lab.sweep.spread.families`)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    points = [r for r in rows if r.get("status") == "ok" and _is_number((r.get("metrics") or {}).get(metric))]
    if with_range is None:
        with_range = metric in _spread.families(rows)
    low_key, high_key = _spread.members(metric)
    x_name = params[0] if params else None
    color_name = params[1] if len(params) > 1 else None
    panel_names = params[2:]

    def value(row, name):
        return row["params"][name] if name else None

    def panel_of(row):
        return ", ".join(f"{n}={_label(row['params'][n])}" for n in panel_names)

    panel_order: dict[str, list] = {}
    for r in points:
        panel_order.setdefault(panel_of(r), [param_sort_key(n)(r["params"][n]) for n in panel_names])
    panels = sorted(panel_order, key=panel_order.get)
    colour_of = colors if colors is not None else color_map(rows, color_name)
    legend = value_order(points, color_name)          # the colour parameter's values, declared order
    xs = value_order(points, x_name)
    as_lines = x_name is not None and len(xs) >= 3 and all(_is_number(x) for x in xs)
    ncols = max(1, min(len(panels), MAX_PANEL_COLUMNS))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = make_subplots(rows=nrows, cols=ncols, shared_yaxes=True, subplot_titles=panels if panel_names else None,
                        horizontal_spacing=0.06, vertical_spacing=0.18 if nrows > 1 else 0.1)
    x_key = param_sort_key(x_name)
    in_legend: set[str] = set()  # one legend entry per colour, whichever panel shows it first
    for p_index, panel in enumerate(panels or [""]):
        prow, pcol = divmod(p_index, ncols)
        for color in legend:
            label = _label(color)
            series = sorted((r for r in points if panel_of(r) == panel and value(r, color_name) == color),
                            key=lambda r: x_key(value(r, x_name)))
            if not series:
                continue
            x = [value(r, x_name) if as_lines else _label(value(r, x_name)) for r in series] if x_name else ["run"] * len(series)
            common = dict(x=x, y=[r["metrics"][metric] for r in series], customdata=[r["run_id"] for r in series],
                          name=label if color_name else metric, legendgroup=label,
                          showlegend=bool(color_name) and label not in in_legend,
                          marker_color=colour_of.get(label, "#636efa"),
                          hovertemplate="%{customdata}<br>%{y}<extra></extra>")
            in_legend.add(label)
            if with_range:
                ys = common["y"]
                common["error_y"] = dict(type="data", symmetric=False, thickness=2, width=8,
                                         array=[r["metrics"][high_key] - y for r, y in zip(series, ys)],
                                         arrayminus=[y - r["metrics"][low_key] for r, y in zip(series, ys)])
                common["hovertemplate"] = ("%{customdata}<br>median %{y}<br>min-max of the repeats: "
                                           "%{y} -%{error_y.arrayminus} / +%{error_y.array}<extra></extra>")
                trace = go.Scatter(mode="lines+markers" if as_lines else "markers",
                                   marker=dict(size=11, symbol="diamond"), **common)
            else:
                trace = go.Scatter(mode="lines+markers", **common) if as_lines else go.Bar(**common)
            fig.add_trace(trace, row=prow + 1, col=pcol + 1)
    title = axis_title(metric)
    heading = title
    if with_range:
        title = f"{title}, median"
        heading = f"{axis_title(metric)}: median of each run's repeats, bar from their min to max"
    fig.update_layout(title=dict(text=heading), barmode="group", scattermode="group", legend_title_text=color_name or "",
                      legend=dict(traceorder="normal"),
                      height=140 + 300 * nrows, margin=dict(l=70, r=20, t=90, b=60), template="plotly_white")
    if x_name and not as_lines:
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=[_label(x) for x in xs])
    fig.update_xaxes(title_text=x_name or "")
    fig.update_yaxes(title_text=title, col=1)
    return fig


def plotted_metrics(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(metrics the runs changed, timings): the numeric metrics of `rows` that vary, a timing's
    `_min` / `_max` folded into it; what changed first, in recorded order, then the timings."""
    constant = constant_metrics(rows)
    ranged = _spread.families(rows)
    hidden = {m for f in ranged for m in _spread.members(f)}
    names = [m for m in numeric_metrics(rows) if m not in constant and m not in hidden]
    timings = [m for m in names if _spread.is_timing(m, unit_of(m), ranged)]
    return [m for m in names if m not in timings], timings


def sweep_figures(rows: list[dict]) -> list[tuple[str, Any]]:
    """`(metric, figure)` for every numeric metric of `rows` (the newest row per run) that varies:
    the metrics the runs changed, then the timings; one colour map for all of them."""
    params = varying_params(rows)
    colors = color_map(rows, params[1] if len(params) > 1 else None)
    changed, timings = plotted_metrics(rows)
    return [(metric, metric_figure(rows, metric, params, colors)) for metric in changed + timings]
