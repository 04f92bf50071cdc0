"""viz.serving_spread on a small result built with `bench serve`'s own row and ratio functions (the
`--repeats` schema): temperatures side by side with min-max bars, the spread table, the k auto table."""
import pytest

from nwor_lab.bench.serve import crossover, with_spread
from nwor_lab.bench.serve_kauto import verdicts
from nwor_lab.viz.serving_spread import kauto_table, spread_curves, spread_table


def fixture_result(temperature: float, scale: float) -> dict:
    """Closed loop at 8 and 32 clients, three repeats each: target-only, EAGLE-3 k 4 and k auto."""
    def run(config, c, tput):
        return {"config": config, "mode": "closed", "concurrency": c, "output_throughput": tput,
                "p50_tpot_ms": 1e3 / tput, "occupancy": {"mean_batch": float(c)}, "accept_length": 3.3}
    rows = []
    for c, base in ((8, 1000.0), (32, 3000.0)):
        for config, ratio in (("target-only", 1.0), ("eagle3 k=4 nwor=stage", 2.4 * scale),
                              ("eagle3 k=auto nwor=stage", 2.3 * scale)):
            wobble = (1.0, 1.0, 1.0) if config == "target-only" else (1.0, 1.02, 0.97)   # the config's own drift
            rows.append(with_spread([run(config, c, base * ratio * f * w) for f, w in zip((1.0, 0.9, 1.05), wobble)]))
    return {"device": "NVIDIA H200", "torch": "2.11", "model": "8b", "temperature": temperature, "repeats": 3,
            "results": rows, "crossover": crossover(rows), "kauto": verdicts(rows)}


def test_temperatures_side_by_side_with_min_max_bars():
    r0, r08 = fixture_result(0.0, 1.0), fixture_result(0.8, 0.8)
    fig = spread_curves({"T = 0": r0, "T = 0.8": r08}, goal={8: 2.5, 32: 2.2})
    eagle = [t for t in fig.data if t.name == "eagle3 k=4 nwor=stage"]
    assert len(eagle) == 2 and eagle[0].xaxis == "x" and eagle[1].xaxis == "x2"     # one panel per temperature
    assert list(eagle[0].y) == [2.4, 2.4] and eagle[1].y[0] == pytest.approx(1.92)
    # paired repeats: repeat i over target-only's repeat i, so the drift both saw (0.9, 1.05) cancels and
    # the bars hold the config's own: ratios 2.4, 2.448, 2.328
    assert list(eagle[0].error_y.array) == pytest.approx([0.048, 0.048], abs=1e-3)
    assert list(eagle[0].error_y.arrayminus) == pytest.approx([0.072, 0.072], abs=1e-3)
    assert "T = 0.8: temperature 0.8" in fig.layout.title.subtitle.text
    table = spread_table({"T = 0": r0})
    assert "2.40× [2.33–2.45]" in table and "2,400 [2,203–2,444]" in table and "8 clients" in table
    with pytest.raises(ValueError, match="absent"):
        spread_curves({})


def test_a_result_without_repeats_draws_without_bars_and_says_one_run():
    r = fixture_result(0.0, 1.0)
    for c in r["crossover"]:
        for key in ("output_throughput_ratio_min", "output_throughput_ratio_max", "output_throughput_ratio_reps"):
            c.pop(key)
    for x in r["results"]:
        x.pop("output_throughput_min")
        x.pop("output_throughput_max")
    fig = spread_curves({"T = 0": r})
    assert all(t.error_y.array is None for t in fig.data)
    assert "(1 run)" in spread_table({"T = 0": r})


def test_kauto_table_names_each_verdict():
    table = kauto_table(fixture_result(0.0, 1.0))
    assert "over target only met" in table and "over best fixed **missed**" in table     # 2.3 / 2.4 < 0.97
    with pytest.raises(ValueError, match="HEAD:auto"):
        kauto_table({"kauto": None})
