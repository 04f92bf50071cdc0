"""The graphed step's paired ratios (`viz.step_pairs`) read the stored step_pairs runs."""
import json
from pathlib import Path

import pytest

from nwor_lab.viz import step_pairs

B = Path(__file__).parents[1] / "benchmarks/results"
RESULTS = {name: json.loads((B / f"{name}.json").read_text())
           for name in ("step_pairs_8b_all_h200", "step_pairs_8b_softmax_h200")}


def test_a_trace_a_run_in_batch_order_and_the_goal_line():
    fig = step_pairs.temperature_figure(RESULTS)
    assert [t.name for t in fig.data] == [*RESULTS, "goal ≤ 1.10×"]
    run = RESULTS["step_pairs_8b_softmax_h200"]["results"]
    by_batch = {r["batch"]: r["over_T0"]["T0.8 off"]["median"] for r in run}
    assert list(fig.data[1].x) == ["1", "16", "64"] and list(fig.data[1].y) == [by_batch[b] for b in (1, 16, 64)]
    with pytest.raises(ValueError, match="T0.8 stage"):
        step_pairs.temperature_figure({"cow only": json.loads((B / "step_pairs_cow64_abba_h200.json").read_text())},
                                      mode="stage")


def test_the_table_has_a_row_a_run_and_batch():
    table = step_pairs.ratio_table(RESULTS).splitlines()
    assert len(table) == 2 + sum(len(r["results"]) for r in RESULTS.values())
    assert "off 1.100 [1.039–1.157]" in table[4]
