"""Benchmark figures (nwor_lab.viz.perf): built from the stored results and from tiny synthetic
results, labelled, live runs drawn beside, and malformed files refused with a clear message."""
import copy
import json
from pathlib import Path

import pytest

from nwor_lab.viz import perf
from nwor_lab.viz.perf import BenchmarkFileError

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def kernels_dict(device="Fake GPU"):
    sweeps = [dict(shape="llama3-8b", op=op, tokens=t, us=7.0 + t / 1000, kernel_us=2.0 + t / 1000, bytes=t * 8192,
                   GBps=t * 4.0, same_size_copy_GBps=t * 6.0)
              for t in (8, 64) for op in ("write_kv", "commit")]
    return dict(device=device, torch="9.9.9", cuda="13.0", copy_bandwidth_GBps=4000.0, empty_op_us=5.0,
                empty_op_in_graph_us=0.5, sweeps=sweeps,
                window_commit=dict(layers=4, tokens=10, accepted=5, commit_one_launch_us=7.0,
                                   write_kv_per_layer_32_launches_us=28.0, commit_kernel_us=2.0,
                                   write_kv_32_launches_in_graph_us=8.0))


def policies_dict(device="Fake GPU", batches=(1, 8)):
    def times(eager, graph):
        return {"eager_us": eager, "graph_us": graph}
    return dict(device=device, torch="9.9.9", cuda="13.0", shape="4 layers x 2 KV heads x 8, bf16, k=4",
                results=[dict(requests=b, tokens=5 * b, index_copy_baseline=times(100, 30), off=times(90, 10 + b),
                              cow=times(110, 14 + b), stage=times(95, 12 + b)) for b in batches])


def engine_dict():
    rows = [dict(batch_size=b, config=c, k=k, nwor=n, scv=s, tokens_per_s=tps, speedup_vs_target_only=sp,
                 mean_acceptance_length=al)
            for b in (1, 8)
            for c, k, n, s, tps, sp, al in (("target-only", 0, "off", "off", 100.0 * b, 1.0, None),
                                            ("eagle k=4 nwor=stage scv=off", 4, "stage", "off", 200.0 * b, 2.0, 3.5),
                                            ("eagle k=4 nwor=stage scv=graph", 4, "stage", "graph", 190.0 * b, 1.9, 3.5))]
    return dict(device="cpu (fake)", torch="9.9.9", dtype="float32", prompts="2 prompts", results=rows)


def assert_labelled(fig, device):
    """A title, the device and torch version in the subtitle, every axis titled."""
    assert fig.layout.title.text
    assert device in fig.layout.title.subtitle.text and "torch" in fig.layout.title.subtitle.text
    for axis in [fig.layout[k] for k in fig.layout if k.startswith(("xaxis", "yaxis"))]:
        assert axis.title.text, f"untitled axis in {fig.layout.title.text!r}"
    json.loads(fig.to_json())


STORED = [
    (perf.policy_window_time, "policies_h200.json", {}),
    (perf.policy_overhead, "policies_h200.json", {"kernels": RESULTS / "kernels_h200.json"}),
    (perf.kernel_time, "kernels_h200.json", {}),
    (perf.kernel_time, "kernels_h200.json", {"op": "commit", "shape": "tiny"}),
    (perf.kernel_bandwidth, "kernels_h200.json", {}),
    (perf.window_commit, "kernels_h200.json", {}),
    (perf.engine_throughput, "engine_gpu.json", {}),
    (perf.engine_throughput, "engine_cpu.json", {}),
    (perf.engine_throughput, "engine_acceptance_gpu.json", {}),
]


@pytest.mark.parametrize("make, name, kwargs", STORED, ids=[f"{m.__name__}-{n}" for m, n, _ in STORED])
def test_figures_build_from_the_stored_results(make, name, kwargs):
    stored = json.loads((RESULTS / name).read_text())
    fig = make(RESULTS / name, **kwargs)
    assert_labelled(fig, stored["device"])
    assert len(fig.data) >= 2


def test_policy_window_time_draws_every_mode_eager_and_graphed():
    fig = perf.policy_window_time(policies_dict())
    names = list(dict.fromkeys(t.name for t in fig.data))
    assert names == ["2× index_copy_ per layer", "off", "cow", "stage"]
    graphed = [t for t in fig.data if t.name == "cow" and t.xaxis == "x2"][0]
    assert list(graphed.y) == [15, 22] and list(graphed.x) == ["1 × 5", "8 × 5"]
    assert fig.layout.yaxis.title.text.startswith("µs") and fig.layout.yaxis2.title.text.startswith("µs")


def test_policy_overhead_counts_the_launches_the_policies_declare():
    fig = perf.policy_overhead(policies_dict(), kernels=kernels_dict())
    bars = {t.name: list(t.y) for t in fig.data if t.type == "bar"}
    assert bars == {"cow − off": [4, 4], "stage − off": [2, 2]}
    lines = {t.name.split(":")[0]: t.y[0] for t in fig.data if t.type == "scatter"}
    floor = perf.launch_floor_us(kernels_dict())
    assert floor == pytest.approx(2.008)
    # cow: log + restore; zero-copy stage: one commit instead of the 4 layers' writes
    assert lines == {"cow": pytest.approx(2 * floor), "stage": pytest.approx(-3 * floor)}


def test_kernel_time_has_the_launch_floors_and_the_copy_time():
    fig = perf.kernel_time(kernels_dict())
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["eager: host launch included"].y) == [7.008, 7.064]
    copy_time = [t for n, t in by_name.items() if n.startswith("its bytes at the copy bandwidth")][0]
    assert list(copy_time.y) == pytest.approx([8 * 8192 / 4e6, 64 * 8192 / 4e6])    # bytes / (GB/s * 1e3) = µs
    assert {n.split(":")[0] for n in by_name} >= {"empty custom op, eager", "empty custom op in a graph"}
    assert fig.layout.yaxis.type == "log" and fig.layout.xaxis.type == "log"


def test_kernel_bandwidth_has_each_op_and_the_copy_line():
    fig = perf.kernel_bandwidth(kernels_dict())
    names = [t.name for t in fig.data]
    assert names[:2] == ["write_kv", "commit"]
    assert any(n.startswith("device copy bandwidth") for n in names)
    assert fig.layout.yaxis.title.text.startswith("achieved GB/s")


def test_window_commit_and_engine_from_synthetic_results():
    fig = perf.window_commit(kernels_dict())
    assert [list(t.y) for t in fig.data] == [[28.0, 8.0], [7.0, 2.0]]
    fig = perf.engine_throughput(engine_dict())
    assert [t.name for t in fig.data] == ["target-only", "EAGLE k=4 · stage", "EAGLE k=4 · stage · SCV graph"]
    assert list(fig.data[1].text) == ["2.00×", "2.00×"] and fig.data[2].marker.pattern.shape == "x"
    assert_labelled(fig, "cpu (fake)")


def test_engine_draws_the_hugging_face_baseline_as_its_own_series():
    """`bench engine` rows of Hugging Face generate (k 0) are not the lab's target-only bars."""
    result = engine_dict()
    result["results"] += [dict(batch_size=b, config="hf-generate greedy", k=0, tokens_per_s=10.0 * b)
                          for b in (1, 8)]
    fig = perf.engine_throughput(result)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["target-only"].y) == [100.0, 800.0]
    assert list(by_name[perf.HF_GENERATE].y) == [10.0, 80.0]
    assert by_name[perf.HF_GENERATE].marker.color != by_name["target-only"].marker.color


def test_live_results_are_drawn_beside_the_stored_ones():
    live_p, live_k = policies_dict("Live GPU", batches=(1,)), kernels_dict("Live GPU")
    fig = perf.policy_window_time(policies_dict(), live=live_p)
    live = [t for t in fig.data if t.name.endswith("live")]
    assert len(live) == 8 and all(t.marker.pattern.shape == perf.LIVE_PATTERN for t in live)
    assert "Live GPU (torch 9.9.9)" in fig.layout.title.subtitle.text
    for make in (perf.kernel_time, perf.kernel_bandwidth):
        fig = make(kernels_dict(), live=live_k)
        assert any(t.name.endswith("live") and t.line.dash == "dash" for t in fig.data)
    assert len(perf.window_commit(kernels_dict(), live=live_k).data) == 4
    assert any(t.name.endswith("live") for t in perf.policy_overhead(policies_dict(), live=live_p).data)


def test_malformed_results_fail_clearly(tmp_path):
    bad = tmp_path / "policies.json"
    broken = policies_dict()
    del broken["results"][1]["off"]["graph_us"]
    bad.write_text(json.dumps(broken))
    with pytest.raises(BenchmarkFileError, match=r"policies\.json: results\[1\]\['off'\]: missing key 'graph_us'.*"
                                                 r"nwor-lab bench policies"):
        perf.policy_window_time(bad)
    (tmp_path / "k.json").write_text("{not json")
    with pytest.raises(BenchmarkFileError, match=r"k\.json: not valid JSON"):
        perf.kernel_time(tmp_path / "k.json")
    with pytest.raises(BenchmarkFileError, match="no such file"):
        perf.kernel_time(tmp_path / "missing.json")
    no_sweeps = kernels_dict()
    del no_sweeps["sweeps"]
    with pytest.raises(BenchmarkFileError, match=r"missing key 'sweeps'.*nwor-lab bench kernels"):
        perf.kernel_bandwidth(no_sweeps)
    with pytest.raises(BenchmarkFileError, match=r"no rows for shape='huge'.*llama3-8b/write_kv"):
        perf.kernel_time(kernels_dict(), shape="huge")
    no_commit = kernels_dict()
    del no_commit["window_commit"]
    with pytest.raises(BenchmarkFileError, match="'window_commit'"):
        perf.window_commit(no_commit)
    empty = engine_dict()
    empty["results"] = []
    with pytest.raises(BenchmarkFileError, match="non-empty list"):
        perf.engine_throughput(empty)
    with pytest.raises(BenchmarkFileError, match="expected a JSON object"):
        perf.engine_throughput(copy.deepcopy({**engine_dict(), "results": [1]}))
