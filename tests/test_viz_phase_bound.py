"""The phase-switching point's seconds per phase and its bound (`viz.phase_bound`), on a made-up result whose
answer is worked by hand, and on the stored H200 run."""
import json
from pathlib import Path

import pytest

from nwor_lab.viz import phase_bound


def row(config, phases, duration, n=4):
    return {"config": config, "mode": "closed", "concurrency": n, "traffic": "phases", "duration_s": duration,
            "phases": {"phases": [{"seconds": s} for s in phases]}}


MADE_UP = {"device": "test", "torch": "x", "phases": {"texts": ["0.9", "0.1"]}, "results": [
    row("target-only", [3.0, 1.0], 4.2),
    row("eagle k=2", [1.0, 2.0], 3.1),          # best fixed: 3.1 s, 0.1 s outside the phases
    row("eagle k=4", [0.8, 2.5], 3.4),
    row("eagle k=auto", [0.9, 1.1], 2.2),
    {"config": "eagle k=2", "mode": "closed", "concurrency": 4, "traffic": "steady", "duration_s": 1.0}]}


def test_the_bound_takes_each_phase_at_its_fastest_config_each_charged_its_time_outside_the_phases():
    """Charged: target-only 4.2 / 4.0 of its phases (3.15, 1.05), k 2 3.1 / 3.0 (1.033, 2.067), k 4 3.4 / 3.3
    (0.824, 2.576), k auto 2.2 / 2.0 (0.99, 1.21): phase 1 at k 4, phase 2 at target-only."""
    (b,) = phase_bound.phase_bound(MADE_UP)
    assert b["best_fixed"] == "eagle k=2" and b["per_phase_best"] == ["eagle k=4", "target-only"]
    bound = 0.8 * 3.4 / 3.3 + 1.0 * 4.2 / 4.0
    assert b["bound_ratio"] == pytest.approx(3.1 / bound)
    assert b["auto_ratio"] == pytest.approx(3.1 / 2.2)
    assert b["share_of_bound"] == pytest.approx((3.1 / 2.2 - 1) / (3.1 / bound - 1))
    with pytest.raises(ValueError, match="--phases"):
        phase_bound.phase_seconds({"results": MADE_UP["results"][-1:]})


def test_the_bars_stack_every_config_and_the_bound_per_load():
    fig = phase_bound.phase_bars(MADE_UP)
    first = fig.data[0]
    assert first.name == "phase 1 (acceptance 0.9)" and list(first.y)[-1] == "bound: per-phase best"
    assert list(first.x)[:4] == [3.0, 1.0, 0.8, 0.9] and first.x[-1] == pytest.approx(0.8 * 3.4 / 3.3)
    assert fig.data[-1].name.startswith("outside") and list(fig.data[-1].x) == pytest.approx([0.2, 0.1, 0.1, 0.2, 0.0])


def test_the_stored_h200_run_has_a_bound_at_each_load():
    result = json.loads((Path(__file__).parents[1] / "benchmarks/results/serve_kauto_8b_h200.json").read_text())
    bounds = phase_bound.phase_bound(result)
    assert [b["concurrency"] for b in bounds] == [8, 32]
    assert all(1.0 < b["auto_ratio"] <= b["bound_ratio"] for b in bounds)
