"""Exercise (p): a sweep's rows read into the figure the report draws: one median per write policy and k,
repeats pooled, failed runs left out (chapter 10).

Write `sweep_medians(rows, metric, policies, ks) -> [P, K] float64`; the spec is the docstring of
`nwor_lab.exercises.solutions.sweep_medians`. Check it with `exercises.check_sweep_medians(fn)`.

Cases: no rows, a failed run (its metrics must not count), an even number of repeats (the mean of the two
middle values), a configuration with no row (NaN, not 0), a row without the metric, one noisy repeat that a
mean would follow and a median does not, random sweeps.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from nwor_lab.exercises.cases import Dice, edge_then_random, growing
from nwor_lab.exercises.check import Case, Exercise, Prediction, tensor_problem
from nwor_lab.viz.theme import HIGHLIGHT, LEGEND_PX, base_layout

POLICIES = ["off", "cow", "stage"]


def row(policy, k, value, status="ok", metric="tok_s", n=0) -> dict:
    return {"run_id": f"nwor_mode={policy},k={k},repeat={n}", "params": {"nwor_mode": policy, "k": k, "repeat": n},
            "metrics": {} if value is None else {metric: value}, "status": status,
            "error": None if status == "ok" else "RuntimeError: the kernel died"}


def _case(rows, ks=(2, 4), policies=POLICIES, note="random", metric="tok_s") -> Case:
    return Case(dict(rows=rows, metric=metric, policies=list(policies), ks=list(ks)), note)


def cases(seed: int, n: int):
    fixed = [
        _case([], note="edge: no rows: every cell NaN"),
        _case([row("off", 2, 300.0), row("off", 2, 9999.0, "failed")], note="edge: a failed run does not count"),
        _case([row("cow", 4, v, n=i) for i, v in enumerate((310.0, 330.0, 320.0, 400.0))],
              note="edge: four repeats: the mean of the two middle values"),
        _case([row("stage", 2, 300.0), row("stage", 2, None)], note="edge: a row without the metric"),
        _case([row("off", 2, v, n=i) for i, v in enumerate((300.0, 302.0, 30.0))],
              note="edge: one disturbed repeat: the median does not follow it"),
    ]
    return edge_then_random(fixed, seed, n, _random_case)


def _random_case(d: Dice, i: int, count: int) -> Case:
    """Random case i of `count` (its sizes may grow with it)."""
    ks = sorted({d.choice((1, 2, 3, 4, 6, 8)) for _ in range(d.int(1, 3))})
    rows = []
    for _ in range(growing(i, count, 1, 18)):
        p, k = d.choice(POLICIES), d.choice(ks + [5])          # k 5: a run the figure does not draw
        status = "failed" if d.chance(0.1) else "ok"
        value = None if d.chance(0.05) else float(d.int(100, 900))
        rows.append(row(p, k, value, status, n=len(rows)))
    return _case(rows, ks=ks)


def _as_tensor(got):
    """The spec asks for [P, K] float64 values, not a library: a numpy array (its own dtype kept, so a
    float32 answer is still named) or nested lists of numbers answer as well as a torch tensor."""
    if isinstance(got, torch.Tensor):
        return got
    if type(got).__module__ == "numpy" and hasattr(got, "dtype") and hasattr(got, "shape"):
        return torch.from_numpy(got) if got.dtype.kind in "fiub" else got
    if isinstance(got, (list, tuple)):
        try:
            return torch.tensor(got, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return got
    return got


def compare(expected, got, case) -> str | None:
    got = _as_tensor(got)
    problem = tensor_problem(expected, got, "medians")
    if problem:
        return problem
    same = (got == expected) | (torch.isnan(got) & torch.isnan(expected))
    close = same | torch.isclose(got, expected, rtol=1e-12, atol=1e-12)
    if not bool(close.all()):
        p, k = (int(x) for x in (~close).nonzero()[0])
        return (f"medians: first difference at {case.inputs['policies'][p]}, k {case.inputs['ks'][k]}: "
                f"expected {float(expected[p, k]):.6g}, got {float(got[p, k]):.6g}")
    return None


def draw(case, expected, got):
    i = case.inputs
    fig = go.Figure()
    for p in i["policies"]:
        pts = [(r["params"]["k"], r["metrics"].get(i["metric"]), r["status"]) for r in i["rows"]
               if r["params"]["nwor_mode"] == p and r["params"]["k"] in i["ks"]]
        fig.add_scatter(x=[f"{p} · k {k}" for k, v, s in pts if v is not None], y=[v for k, v, s in pts if v is not None],
                        mode="markers", name=f"{p}: runs (× failed)", marker=dict(
                            color="#888888", size=9, symbol=["x" if s != "ok" else "circle" for k, v, s in pts if v is not None]))
    x = [f"{p} · k {k}" for p in i["policies"] for k in i["ks"]]
    fig.add_scatter(x=x, y=expected.reshape(-1).tolist(), mode="markers", name="expected median",
                    marker=dict(symbol="line-ew-open", size=28, line=dict(width=3, color="#222222")))
    try:
        fig.add_scatter(x=x, y=torch.as_tensor(got).double().reshape(-1).tolist(), mode="markers", name="yours",
                        marker=dict(symbol="diamond-open", size=14, line=dict(width=2, color=HIGHLIGHT)))
    except Exception:  # noqa: BLE001 - an unreadable answer is reported in the text
        pass
    fig.update_layout(**base_layout(f"sweep_medians: {i['metric']} per write policy and k",
                                    f"{case.note}; {len(i['rows'])} rows; a missing median is not drawn"),
                      height=420 + LEGEND_PX, width=860)
    fig.update_xaxes(type="category")
    return fig


PREDICT = Prediction(
    question="Three repeats of off at k 2 measured 300, 302 and 30 tok/s (the third while another job ran). What "
             "does the figure draw for off, k 2? (a number)",
    inputs=lambda: _case([row("off", 2, v, n=i) for i, v in enumerate((300.0, 302.0, 30.0))], ks=(2,),
                         policies=("off",)).inputs,
    answer=lambda out: float(out[0, 0]),
    explain=lambda m: (f"{m}: the median of the repeats. Their mean, about 211, would show a slowdown that no policy "
                       f"caused; one run each would have shown whichever repeat came first."))

HINTS = (
    "For each (policy, k) cell collect the metric of the rows with status \"ok\" whose params match and whose "
    "metrics hold a value; the cell is NaN when that list is empty.",
    "Sort the values; the median is the middle one, or the mean of the two middle ones for an even count. "
    "Fill a torch.full((len(policies), len(ks)), float('nan'), dtype=torch.float64) (a numpy float64 array "
    "answers as well).",
)

EXERCISE = Exercise("sweep_medians", cases, compare, draw, hints=HINTS, predict=PREDICT)
