"""The token-bucket figure and table read the stored serve runs (`serve_buckets_8b_h200.json`)."""
import json
from pathlib import Path

from nwor_lab.viz import token_buckets

RESULT = json.loads((Path(__file__).parents[1] / "benchmarks/results/serve_buckets_8b_h200.json").read_text())


def test_one_trace_a_machine_with_its_runs_in_rule_order():
    fig = token_buckets.ratio_by_rule(RESULT)
    machines = {r["machine"] for r in RESULT["summary"]}
    traces = [t for t in fig.data if t.name.startswith("machine")]
    assert len(traces) == len(machines) and fig.data[-1].name == "goal 2.2×"
    c = next(t for t in traces if t.name == "machine C (call 3)")
    assert list(c.x) == ["powers of two", "4 a doubling", "8 a doubling"]
    assert list(c.y) == [r["eagle3_k4_over_target"]["median"] for r in RESULT["summary"] if r["machine"].startswith("C")]


def test_the_table_has_a_row_a_run():
    table = token_buckets.rule_table(RESULT).splitlines()
    assert len(table) == 2 + len(RESULT["summary"])
    assert "8 a doubling + shared pool" in table[-2] and "GiB" in table[-1]


def test_the_napkin_compares_within_a_machine_and_judges_the_goal():
    text = token_buckets.rule_napkin(RESULT)
    assert "machine A (call 1): 2.086× → 2.125×" in text and "machine C (call 3): 2.134× → 2.169×" in text
    assert "machine B" not in text and text.endswith("not reached.")
    assert token_buckets.rule_napkin(RESULT, goal=2.1).endswith("is reached.")
