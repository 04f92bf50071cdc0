"""viz.serving_steps: serving's step time by kind of step, read from bench serve's `steps_by_kind`."""
import pytest

from nwor_lab.viz.serving_steps import KINDS, step_kinds_table, step_time_by_kind


def result(host_ms: float, pre_ms: float) -> dict:
    def row(config, n):
        kinds = {"prefill": {"steps": 2, "mean_ms": 10.0}, "decode, host": {"steps": 4, "mean_ms": host_ms},
                 "decode, pre-launched": {"steps": 6, "mean_ms": pre_ms}}
        return {"config": config, "mode": "closed", "concurrency": n, "total_output_tokens": 500,
                "output_throughput": 1000.0, "steps_by_kind": kinds}
    return {"device": "test GPU", "torch": "2", "results": [row("target-only", 8), row("eagle3 k=4 nwor=stage", 8),
                                                            row("eagle3 k=auto nwor=stage", 32)]}


def test_bars_are_ms_per_thousand_tokens_by_kind_and_only_shared_configs_are_drawn():
    fig = step_time_by_kind({"before": result(9.0, 8.0), "after": result(8.0, 8.0)})
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 2 * len(KINDS)        # a panel per load (8 and 32 clients), a trace per kind in each
    host = next(t for t in bars if t.name.startswith("decode, laid out"))
    # 4 steps x 9 ms over 500 tokens = 72 ms per 1,000 tokens before, 64 after; each config in each run
    assert list(host.y) == pytest.approx([72.0, 64.0, 72.0, 64.0])
    assert list(host.x) == ["target-only<br>before", "target-only<br>after", "eagle3 k=4<br>before", "eagle3 k=4<br>after"]
    table = step_kinds_table({"before": result(9.0, 8.0)})
    assert "4 × 9.00 ms" in table and "target-only" in table and "rows" not in table
    later = result(9.0, 8.0)
    later["results"][0]["steps_by_kind"]["prefill"] |= {"mean_rows": 231.0, "mean_padded_rows": 240.0}
    assert "2 × 10.00 ms, rows 231 → 240" in step_kinds_table({"after": later})
    with pytest.raises(ValueError, match="steps_by_kind"):
        step_time_by_kind({"old": {"results": [{"config": "x", "mode": "closed", "concurrency": 8}]}})
