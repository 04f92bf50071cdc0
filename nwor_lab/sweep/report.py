"""`nwor-lab report runs/NAME`: one self-contained HTML page of a sweep.

The page holds a table of every run (newest row per run id: parameters, status, duration,
metrics, links to the executed notebook and log; a metric that repeats a parameter, as a chapter
recording its own `nwor_mode`, is shown once; a timing recorded with its range in one column,
"median (min-max)"), the failures with their errors, the lines of `results.jsonl` left out
(`file:line: what is wrong`), a table of the metrics that have one value in every run, then one
figure per numeric metric that varies (`nwor_lab.sweep.figures`: one colour per value and one order
of values in every figure): first what the runs changed, then the timings, each with its range and
a sentence saying whether the configs it compares differ by more than their noise
(`nwor_lab.sweep.spread.verdicts`).
plotly.js is embedded once, inline, so the file opens offline and can be mailed or attached to
a CI run as is. The page is replaced atomically (`nwor_lab.atomic`).
"""
from __future__ import annotations

import datetime as _dt
import html
import os
import sys
from pathlib import Path
from typing import Any

from nwor_lab import atomic
from nwor_lab.sweep.grid import SweepInputError
from nwor_lab.sweep import spread as _spread
from nwor_lab.sweep.results import DAMAGED_SUFFIX, RESULTS_FILE, BadLine, read_results

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem; color: #222; }
h1 { margin-bottom: .2rem; } .meta { color: #555; margin-top: 0; }
.table-wrap { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; position: sticky; top: 0; }
td.text, th.text { text-align: left; }
tr.failed td { background: #fff0f0; }
.status-failed { color: #b00020; font-weight: 600; } .status-ok { color: #1b5e20; }
li.failure code, li.left-out code { white-space: pre-wrap; }
p.noise { max-width: 60rem; margin: .2rem 0 1.5rem 1rem; padding: .4rem .8rem; border-left: 4px solid #888;
          background: #f7f7f7; }
p.noise.apart { border-left-color: #e08a00; }
p.lead { max-width: 60rem; }
"""


def _cell(value: Any) -> tuple[str, bool]:
    """(escaped text, is_text) of a table cell; floats to 4 significant digits."""
    if value is None:
        return "–", False
    if isinstance(value, bool):
        return str(value).lower(), True
    if isinstance(value, float):
        return f"{value:.4g}", False
    if isinstance(value, int):
        return str(value), False
    return html.escape(str(value)), True


def _link(target: Path, page: Path, text: str) -> str:
    rel = os.path.relpath(target, page.parent)
    return f'<a href="{html.escape(Path(rel).as_posix())}">{html.escape(text)}</a>'


def table_columns(rows: list[dict]) -> tuple[list[str], list[tuple[str, str]]]:
    """(parameter columns, metric columns as (key, heading)): each fact once. A metric named like a
    parameter is left out where it repeats the parameter's value in every run; where it does not,
    it is kept as `<name> (recorded)`, so a disagreement stays visible."""
    params = list(dict.fromkeys(k for r in rows for k in r["params"]))
    ranged = _spread.families(rows)
    hidden = {m for f in ranged for m in _spread.members(f)}
    metrics = []
    for key in dict.fromkeys(k for r in rows for k in (r.get("metrics") or {})):
        if key in hidden or key == _spread.REFERENCE:      # folded into its timing / named above the timings
            continue
        if key in ranged:
            metrics.append((key, f"{key} (median, min–max)"))
        elif key in params:
            recorded = [r for r in rows if key in (r.get("metrics") or {})]
            if all(r["metrics"][key] == r["params"].get(key) for r in recorded):
                continue
            metrics.append((key, f"{key} (recorded)"))
        else:
            metrics.append((key, key))
    return params, metrics


def _ranged_cell(metrics: dict, name: str) -> tuple[str, bool]:
    low, high = (metrics.get(m) for m in _spread.members(name))
    if not all(isinstance(v, (int, float)) for v in (metrics.get(name), low, high)):
        return _cell(metrics.get(name))
    return f"{_cell(metrics[name])[0]} ({_cell(low)[0]}–{_cell(high)[0]})", False


def _table(rows: list[dict], run_dir: Path, page: Path) -> str:
    ranged = set(_spread.families(rows))
    params, metric_cols = table_columns(rows)
    metrics = [key for key, _ in metric_cols]
    head = (["run", *params, "status", "duration (s)", *(h for _, h in metric_cols), "notebook", "log"])
    text_cols = {0, len(params) + 1, len(head) - 2, len(head) - 1}
    out = ['<div class="table-wrap"><table><thead><tr>']
    out += [f'<th class="{"text" if i in text_cols else ""}">{html.escape(h)}</th>' for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for r in rows:
        status = r.get("status", "?")
        cells = [(html.escape(r["run_id"]), True)]
        cells += [_cell(r["params"].get(p)) for p in params]
        cells.append((f'<span class="status-{html.escape(status)}">{html.escape(status)}</span>', True))
        cells.append(_cell(r.get("duration_s")))
        cells += [_ranged_cell(r.get("metrics") or {}, m) if m in ranged else _cell((r.get("metrics") or {}).get(m))
                  for m in metrics]
        cells.append((_link(run_dir / r.get("notebook", f"notebooks/{r['run_id']}.ipynb"), page, "ipynb"), True))
        cells.append((_link(run_dir / "logs" / f"{r['run_id']}.log", page, "log"), True))
        out.append(f'<tr class="{html.escape(status)}" data-run-id="{html.escape(r["run_id"], quote=True)}">')
        out += [f'<td class="{"text" if is_text else ""}">{text}</td>' for text, is_text in cells]
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _failures(rows: list[dict]) -> str:
    failed = [r for r in rows if r.get("status") != "ok"]
    if not failed:
        return "<p>No failed runs.</p>"
    items = [f'<li class="failure"><b>{html.escape(r["run_id"])}</b>: <code>{html.escape(str(r.get("error")))}</code></li>'
             for r in failed]
    return "<ul>" + "\n".join(items) + "</ul>"


def _left_out(bad: list[BadLine], run_dir: Path) -> str:
    """The lines of results.jsonl that are not well-formed rows, and damaged files kept earlier."""
    kept = sorted(p.name for p in run_dir.glob(f"{RESULTS_FILE}{DAMAGED_SUFFIX}*"))
    if not bad and not kept:
        return ""
    out = []
    if bad:
        n, verb = (f"{len(bad)} lines", "are") if len(bad) != 1 else ("1 line", "is")
        out.append(f"<h2>Lines left out</h2><p>{n} of {RESULTS_FILE} {verb} not a well-formed row and left out "
                   "of this report; the runs they recorded count as not done. Running the same sweep again keeps "
                   f"this file whole as <code>{RESULTS_FILE}{DAMAGED_SUFFIX}&lt;time&gt;</code> and redoes "
                   "them.</p><ul>")
        out += [f'<li class="left-out"><code>{html.escape(str(b))}</code></li>' for b in bad]
        out.append("</ul>")
    if kept:
        out.append(f"<p>Damaged files an earlier sweep kept whole beside {RESULTS_FILE}: "
                   + ", ".join(f"<code>{html.escape(n)}</code>" for n in kept) + ".</p>")
    return "\n".join(out)


def _left_out_note(bad: list[BadLine]) -> str:
    if not bad:
        return ""
    n = f"{len(bad)} lines" if len(bad) != 1 else "1 line"
    return f'<b class="status-failed">{n} of {RESULTS_FILE} left out</b> (see "Lines left out"). '


def _constant_facts(rows: list[dict]) -> dict:
    """Metrics that are true/false or text with one value in every ok run (an invariant such as
    `same_tokens_as_target_only`), a parameter's echo and the timing reference left out."""
    ok = [r.get("metrics") or {} for r in rows if r.get("status") == "ok"]
    params = {k for r in rows for k in r["params"]}
    out = {}
    for key in dict.fromkeys(k for m in ok for k in m):
        values = {repr(m.get(key)) for m in ok}
        value = ok[0].get(key)
        if (len(values) == 1 and isinstance(value, (bool, str)) and key not in params
                and key != _spread.REFERENCE):
            out[key] = value
    return out


def _constants(constant: dict) -> str:
    """The metrics with one value in every run: a table instead of flat charts."""
    from nwor_lab.sweep.figures import metric_label

    if not constant:
        return ""
    body = []
    for name, value in constant.items():
        text, unit = metric_label(name)
        body.append(f'<tr><td class="text">{html.escape(name)}</td><td>{_cell(value)[0]}</td>'
                    f'<td class="text">{html.escape(unit or "")}</td></tr>')
    return ("<h2>Metrics with one value in every run</h2>"
            '<div class="table-wrap"><table class="constant-metrics"><thead><tr><th class="text">metric</th>'
            '<th>value</th><th class="text">unit</th></tr></thead><tbody>' + "".join(body) + "</tbody></table></div>")


def _environment(rows: list[dict]) -> str:
    facts = []
    for key in ("torch", "device", "python", "host"):
        values = sorted({str(v) for r in rows if (v := (r.get("env") or {}).get(key)) is not None})
        if values:
            facts.append(f"{key}: {', '.join(values)}")
    return html.escape("; ".join(facts) + ".") if facts else ""


def _div(fig) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, default_height=f"{fig.layout.height}px")


def _overlay_reference(fig, ref_fig, reference: str) -> None:
    """Draw the reference timing (the same work in every run) in grey on a timing of the same unit:
    where both move together between runs, the machine moved, not the configs."""
    if fig.data and not any(t.showlegend for t in fig.data):      # one series: name it beside the reference
        fig.data[0].update(showlegend=True, name=fig.layout.yaxis.title.text or fig.data[0].name)
    for i, trace in enumerate(ref_fig.data):
        trace.update(marker=dict(color="#9e9e9e", symbol="circle-open", size=10), legendgroup="reference",
                     name=f"{reference} (the same work in every run)", showlegend=i == 0,
                     error_y=dict(color="#9e9e9e"))
        fig.add_trace(trace)
    fig.update_layout(showlegend=True)


def _figures(rows: list[dict], varying: list[str]) -> tuple[list[str], list[str]]:
    """HTML of the two figure sections: what the runs changed, then the timings with their noise."""
    from nwor_lab.sweep.figures import color_map, metric_figure, plotted_metrics, unit_of

    changed, timings = plotted_metrics(rows)
    colors = color_map(rows, varying[1] if len(varying) > 1 else None)
    ranged = _spread.families(rows)
    first = []
    if changed:
        first = ["<h2>What the runs changed</h2>",
                 '<p class="lead">Counts, bytes and rates that the parameters decide; they do not depend on how '
                 "busy the machine was.</p>",
                 *(_div(metric_figure(rows, m, varying, colors)) for m in changed)]
    second = []
    if timings:
        second = ["<h2>Timings, with their noise</h2>",
                  '<p class="lead">Measured with a clock, so they carry the machine\'s noise. A timing recorded '
                  "with its repeats is drawn as their median with a bar from their minimum to their maximum.</p>"]
        reference = _spread.reference_of(rows)
        if reference:
            second.append(f'<p class="lead">The chapter times the same work in every run: <code>{reference}</code>. '
                          "How far it moves between runs is the machine's noise between processes.</p>")
        for m in timings:
            fig = metric_figure(rows, m, varying, colors)
            if reference and m != reference and unit_of(m) == unit_of(reference):
                _overlay_reference(fig, metric_figure(rows, reference, varying, colors), reference)
            found = _spread.verdicts(rows, m, varying, unit_of(m), has_range=m in ranged, reference=reference)
            if found:
                mark = ("the differences lie within the noise: no ranking" if all(v.within for v in found)
                        else "some differences exceed the repeats' noise: read the note below")
                fig.update_layout(title_text=f"{fig.layout.title.text}<br><sup>{mark}</sup>")
            second.append(_div(fig))
            second += [f'<p class="noise{"" if v.within else " apart"}">{html.escape(v.text)}</p>' for v in found]
    return first, second


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the sweep's HTML page (default `<run_dir>/report.html`) and return its path."""
    from plotly.offline import get_plotlyjs

    from nwor_lab.sweep.figures import constant_metrics, param_sort_key, varying_params

    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_FILE).is_file():
        raise SweepInputError(f"RUN_DIR {run_dir}: no {RESULTS_FILE} there; give the --out folder of a sweep")
    page = Path(out) if out is not None else run_dir / "report.html"
    if page.is_dir():
        raise SweepInputError(f"--out {page}: is a folder; give an .html file path")
    reading = read_results(run_dir)
    for bad in reading.bad:
        print(f"warning: {bad}; left out of the report", file=sys.stderr)
    rows = list(reading.latest.values())
    varying = varying_params(rows)
    rows.sort(key=lambda r: [param_sort_key(p)(r["params"].get(p)) for p in varying] + [r["run_id"]])
    n_ok = sum(r.get("status") == "ok" for r in rows)
    constant = {**constant_metrics(rows), **_constant_facts(rows)}
    changed, timings = _figures(rows, varying)
    title = f"Sweep {run_dir.resolve().name}"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>',  # inline: the page must open offline
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{len(rows)} runs: {n_ok} ok, {len(rows) - n_ok} failed; swept: '
        f'{html.escape(", ".join(varying) or "nothing")}. {_left_out_note(reading.bad)}{_environment(rows)} '
        f'Report written {_dt.datetime.now().astimezone().isoformat(timespec="seconds")} from '
        f"{html.escape(str(run_dir / RESULTS_FILE))}.</p>",
        "<h2>Runs</h2>", _table(rows, run_dir, page),
        "<h2>Failures</h2>", _failures(rows),
        _left_out(reading.bad, run_dir),
        _constants(constant),
        *changed, *timings,
        *([] if changed or timings else ["<h2>Metrics</h2>", "<p>No numeric metric that varies across the ok "
                                         "runs.</p>" if constant else "<p>No numeric metrics recorded by an ok run.</p>"]),
        "</body></html>",
    ]
    try:
        page.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise atomic.OutputError(page, err) from None
    atomic.write_text(page, "\n".join(parts))
    return page
