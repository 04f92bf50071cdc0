"""Chapter 13's pictures and its data: what each state strategy keeps is read from the policies'
declarations, the conv ring keeps the inputs ending with the last kept token, the walk through one
window finds the state each store ends with, and the hybrid pair is the shipped one when this build
has it, else the toy."""
import plotly.graph_objects as go
import pytest
import torch

from nwor_lab.state import STATE_POLICIES, RecurrentSpec
from nwor_lab.viz import state_costs, state_demo, state_window

SPEC = RecurrentSpec(num_layers=1, num_heads=2, head_k_dim=4, head_v_dim=3, conv_dim=6, conv_width=4)


@pytest.mark.parametrize("k, accepted", [(1, 0), (4, 1), (4, 4), (6, 3)])
def test_the_window_figures_draw_every_acceptance(k, accepted):
    for fig in (state_window.recurrent_window_figure(k, accepted),
                state_window.strategy_keeps_figure(STATE_POLICIES, k, accepted),
                state_window.conv_ring_figure(4, k, accepted)):
        assert isinstance(fig, go.Figure) and fig.layout.title.text
        fig.to_json()
    with pytest.raises(ValueError, match="accepted"):
        state_window.recurrent_window_figure(k, k + 1)


def test_what_a_strategy_keeps_follows_its_declarations():
    k = 4
    keeps = {name: state_window.keeps_during_window(cls, k) for name, cls in STATE_POLICIES.items()}
    # snapshots: k + 1 store rows (held for life), one per window position; nothing transient
    assert {key for key, (cat, _) in keeps["snapshots"].items() if cat == 1} == {("S", j) for j in range(1, k + 2)}
    # stage: the committed row in the store, the window's states transient
    assert keeps["stage"][("S", 0)][0] == 1 and all(keeps["stage"][("S", j)][0] == 2 for j in range(1, k + 2))
    # cow: a checkpoint and the inputs transient, the live state advanced to S_{k+1}
    assert keeps["cow"][("S", 0)] == (2, "checkpoint") and keeps["cow"][("S", k + 1)][1] == "live"
    assert all(keeps[n].get(("x", 0), (0,))[0] == 2 for n in ("cow", "replay"))
    assert not any(key[0] == "x" for key in keeps["off"])
    fig = state_window.strategy_keeps_figure(STATE_POLICIES, k, 1)
    after = {name: row[-1] for name, row in zip(fig.data[0].y, fig.data[0].text)}
    assert after["off"] == "S₅ ✗" and all(after[n] == "S₂" for n in ("snapshots", "cow", "replay", "stage"))


def test_the_conv_ring_keeps_the_inputs_ending_with_the_last_kept_token():
    fig = state_window.conv_ring_figure(4, 4, 1)
    z = fig.data[0].z
    kept = [[i for i, v in enumerate(row) if v is not None] for row in z]
    # columns: x(n-3) x(n-2) x(n-1) t_last d1 d2 d3 d4
    assert kept == [[0, 1, 2], [5, 6, 7], [2, 3, 4]]
    assert z[1][5:] == (2, 2, 2) or list(z[1][5:]) == [2, 2, 2]     # off keeps rejected drafts' inputs


@pytest.mark.parametrize("accepted", [0, 2, 3])
def test_the_walk_finds_each_strategys_committed_state(accepted):
    walk = state_demo.window_walk(SPEC, 3, accepted)
    by = {r["strategy"]: r for r in walk["rows"]}
    assert by["off"]["commits"] == 3
    assert all(by[n]["commits"] == accepted for n in ("snapshots", "cow", "replay", "stage"))
    assert by["snapshots"]["store_rows"] == 4 and by["replay"]["rows_recomputed"] == 4


def test_the_cost_figures_draw_memory_rows_and_a_bench_document():
    from nwor_lab.state import memory_rows, qwen3_next_spec
    tiny = RecurrentSpec(num_layers=3, num_heads=4, head_k_dim=8, head_v_dim=8, conv_dim=64, conv_width=4)
    fig = state_costs.state_memory_figure([("tiny", memory_rows(tiny, 4)), ("qwen", memory_rows(qwen3_next_spec(), 4))])
    assert fig.layout.yaxis.title.text == "KiB per request" and fig.layout.yaxis2.title.text == "MiB per request"
    doc = {"shape": "tiny", "device": "cpu", "backend": "torch",
           "rows": [{"strategy": s, "batch": b, "k": 4, "window_ms": 2.0, "commit_ms": 0.5}
                    for b in (1, 8) for s in STATE_POLICIES]}
    assert len(state_costs.state_time_figure(doc).data) == 6
    fig = state_costs.divergence_figure([1, 2, 3, 4], [("off", [1, 2, 9, 9]), ("stage", [1, 2, 3, 4])], title="t")
    assert [(s.x0 + 0.5, s.y0 + 0.5) for s in fig.layout.shapes] == [(2, 1)]


def test_the_pair_is_the_toy_until_a_hybrid_is_shipped(monkeypatch):
    from nwor_lab.model import shipped
    monkeypatch.delattr(shipped, "HYBRID_DIR", raising=False)
    pair = state_demo.hybrid_pair("auto")
    assert pair.tokenizer is None and "toy hybrid" in pair.source and hasattr(pair.target, "state_spec")
    assert pair.encode([1, 2]) == [1, 2] and pair.show(7) == "7"
    with pytest.raises(FileNotFoundError, match="ships no hybrid checkpoint"):
        state_demo.hybrid_pair("shipped")
    with pytest.raises(ValueError, match="choose one of"):
        state_demo.hybrid_pair("llama")


def test_a_shipped_hybrid_is_loaded_like_the_tiny_pair(monkeypatch, tmp_path):
    from nwor_lab.model import shipped
    toy = state_demo.toy_hybrid_pair(2)
    calls = []

    def load_tiny(device="cpu", directory=None, **kw):
        calls.append(directory)
        return toy.target, toy.head, "tok"
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(shipped, "HYBRID_DIR", tmp_path, raising=False)
    monkeypatch.setattr(shipped, "load_tiny", load_tiny)
    pair = state_demo.hybrid_pair("auto")
    assert calls == [tmp_path] and pair.target is toy.target and pair.head is toy.head and pair.tokenizer == "tok"
    assert "shipped" in pair.source
    assert "toy" in state_demo.hybrid_pair("toy").source
