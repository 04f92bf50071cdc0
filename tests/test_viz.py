"""Figures and the stepper, headless: build, check data and labels, serialise; click buttons."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nwor_lab.metrics import WindowRecord
from nwor_lab.viz import (STATE_MEANING, Recorder, SlotState, Stepper, acceptance_by_position, cache_grid,
                          cache_grids, costs_by_mode, show_frames, window_timeline)
from nwor_lab.viz.states import LEGEND_ORDER, STATE_LEGEND
from nwor_lab.viz.theme import STATE_COLOURS
from nwor_lab.window import Acceptance, Window
from test_recorder import drive_by_hand

ROOT = Path(__file__).resolve().parents[1]


def test_import_nwor_lab_does_not_import_plotly():
    code = ("import sys, nwor_lab, nwor_lab.policies, nwor_lab.kv, nwor_lab.metrics; "
            "bad = [m for m in ('plotly', 'ipywidgets', 'nwor_lab.viz', 'nwor_lab.exercises') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cache_grid_cells_hover_and_legend():
    states = torch.zeros(3, 4, dtype=torch.int8)
    states[1, 2] = SlotState.REJECTED
    states[2, 0] = SlotState.RESTORED
    fig = cache_grid(states, title="after the window", block_size=4, annotations={6: "req 1 · d2"},
                     cell_text={6: "1:d2"}, highlight=[8])
    heat = fig.data[0]
    assert [list(r) for r in heat.z] == states.tolist()
    assert heat.text[1][2] == "1:d2"
    assert list(heat.customdata[1][2]) == [6, STATE_MEANING[SlotState.REJECTED], "req 1 · d2"]
    legend = [t.name for t in fig.data[1:] if t.showlegend is not False]
    assert legend[:len(SlotState)] == [STATE_LEGEND[s] for s in LEGEND_ORDER]
    assert sorted(LEGEND_ORDER) == list(SlotState)                              # every state, once
    assert "differs from expected" in legend
    assert len(fig.layout.shapes) == 1 and fig.layout.shapes[0].x0 == -0.5   # slot 8: block 2, offset 0
    assert fig.layout.xaxis.title.text == "offset in block" and fig.layout.yaxis.title.text == "block"
    assert fig.layout.title.text == "after the window"
    json.loads(fig.to_json()) and fig.to_html(include_plotlyjs=False)


def test_one_colour_per_state_everywhere():
    """z = state value maps to the same colour in every grid: fixed zmin/zmax and colour scale."""
    a = cache_grid([0, 1, 2, 3], title="a", block_size=2)
    b = cache_grid([6, 6, 5, 4, 0, 0], title="b", block_size=3)
    for fig in (a, b):
        heat = fig.data[0]
        assert (heat.zmin, heat.zmax) == (-0.5, len(SlotState) - 0.5)
        scale = [c for _, c in heat.colorscale]
        assert scale[0::2] == [STATE_COLOURS[s] for s in SlotState]


def test_cache_grid_rejects_a_wrong_shape_and_crops_blocks():
    with pytest.raises(ValueError, match="block_size"):
        cache_grid(torch.zeros(2, 5), title="x", block_size=4)
    fig = cache_grid(torch.arange(12) % 7, title="x", block_size=4, blocks=[2, 0])
    assert list(fig.data[0].y) == ["2", "0"] and list(fig.data[0].z[0]) == [1, 2, 3, 4]
    two = cache_grids([dict(states=[0, 1], title="expected"), dict(states=[1, 1], title="got")],
                      title="t", block_size=2)
    assert [a.text for a in two.layout.annotations] == ["expected", "got"]


def test_window_timeline_fates_and_accepted_length():
    # req 0: t_last + 3 drafts (a=1), one padded; req 1: a 3-token prefill; req 2: a decode
    w = Window.from_counts([4, 3, 1], [3, 0, 0], torch.tensor([0, 1, 2, -1, 5, 6, 7, 8]))
    acc = Acceptance(torch.tensor([True, False, False]), torch.tensor([1, 0, 0], dtype=torch.int32))
    fig = window_timeline(w, acc)
    heat, bars = fig.data[0], fig.data[1]
    kept, rejected, pending, padding = 0, 1, 2, 3
    assert list(heat.z[0]) == [kept, kept, rejected, padding]
    assert list(heat.z[1]) == [kept, kept, kept, None]
    assert list(heat.text[0]) == ["t", "d1", "d2", "d3"]
    assert list(heat.y) == ["req 0 · a=1/3", "req 1 · no drafts", "req 2 · no drafts"]
    assert list(bars.x) == [1.5] and bars.name.startswith("accepted length")
    assert list(window_timeline(w).data[0].z[0]) == [kept, pending, pending, padding]
    fig.to_json()


def records():
    return [WindowRecord("off", 0, 2, 10, 6, 3, 7, 3, [2, 1], [2, 2, 2], [2, 1, 0], bytes_written=1000),
            WindowRecord("off", 1, 1, 5, 4, 4, 5, 4, [4], [1, 1, 1, 1], [1, 1, 1, 1], bytes_written=3000)]


def test_acceptance_by_position():
    fig = acceptance_by_position(records())
    bar = fig.data[0]
    assert list(bar.x) == ["d1", "d2", "d3", "d4"]
    assert list(bar.y) == [1.0, 2 / 3, 1 / 3, 1.0]
    assert list(bar.text) == ["3/3", "2/3", "1/3", "1/1"]
    assert fig.layout.yaxis.title.text == "accepted / drafted"
    two = acceptance_by_position({"k=3": ([4, 4, 4], [3, 2, 1]), "k=4": records()})
    assert [t.name for t in two.data] == ["k=3", "k=4"] and list(two.data[0].y) == [0.75, 0.5, 0.25]


def test_costs_by_mode():
    stage = [WindowRecord("stage", 0, 1, 4, 3, 1, 2, 1, bytes_written=2048, bytes_skipped=2048)]
    fig = costs_by_mode({"off": records(), "stage": stage}, launches={"off": 2, "stage": 3})
    by_name = {t.name.split(":")[0]: t for t in fig.data}
    assert fig.layout.yaxis.title.text == "KiB per window"
    assert list(by_name["written"].y) == [2000 / 1024, 2.0] and list(by_name["skipped"].y) == [0.0, 2.0]
    assert list(by_name["kernel launches"].y) == [2, 3]
    no_launches = costs_by_mode({"off": records()})
    assert "kernel launches" not in [t.name for t in no_launches.data]
    assert "launches unknown" in no_launches.layout.title.subtitle.text
    fig.to_json()
    declared = costs_by_mode({"off": records(), "cow": records(), "stage": stage}, num_layers=4)
    assert list(declared.data[-1].y) == [4, 6, 1]     # the policies' launches_per_window(4)


@pytest.fixture(scope="module")
def frames_by_mode():
    out = {}
    for mode in ("off", "cow", "stage"):
        rec = Recorder()
        drive_by_hand(mode, rec, seed=1)
        out[mode] = rec.frames
    return out


def test_stepper_next_reset_and_mode(frames_by_mode):
    s = Stepper(frames_by_mode)
    assert "nwor-next" in s.next_button._dom_classes and s.next_button.description == "next phase"
    assert s.next_button.tooltip and s.prev_button.disabled and not s.next_button.disabled
    z0, caption0 = [list(r) for r in s.figure.data[0].z], s.caption.value
    assert "begins" in caption0 and "frame 1 of 5" in s.position.value
    s.next_button.click()                                    # begin -> write layer 0
    assert s.index == 1 and "layer 0 rows" in s.caption.value and "frame 2 of 5" in s.position.value
    assert [list(r) for r in s.figure.data[0].z] != z0
    assert s.figure.layout.title.text == "off · verify window 0 · write · layer 0"
    s.mode_dropdown.value = "stage"                          # same phase, other mode
    assert s.index == 1 and s.caption.value.count("staging buffer")
    s.reset_button.click()
    assert s.index == 0 and s.caption.value.startswith("<p") and "begins" in s.caption.value
    s.next_window_button.click()                             # one window only: jumps to the end
    assert s.index == 4 and s.next_button.disabled and "commit" in s.caption.value
    s.layer_dropdown.value = 1
    assert s.figure.layout.title.text.endswith("layer 1")
    assert s._repr_mimebundle_()  # renders as the VBox


def test_stepper_from_a_source_and_static(frames_by_mode):
    asked = []
    def source(mode):
        asked.append(mode)
        return frames_by_mode[mode]
    s = Stepper(source, modes=["cow", "off"])
    assert asked == ["cow"]
    s.mode_dropdown.value = "off"
    assert asked == ["cow", "off"]
    figs = Stepper.static(frames_by_mode["cow"])
    # the layer follows the writes: write 1 shows layer 1, and the phases after it stay there
    assert len(figs) == 5 and [f.layout.title.text for f in figs] == \
        [f"cow · verify window 0 · {p} · layer {l}" for p, l in
         (("begin", 0), ("write", 0), ("write", 1), ("acceptance", 1), ("commit", 1))]
    assert "restored bit-exactly" in figs[-1].layout.title.subtitle.text.replace("<br>", " ")
    assert show_frames(frames_by_mode["off"], layer=1)[0].layout.title.text.endswith("layer 1")


def test_stepper_draws_the_buffers_the_written_layer_and_the_chapters_mode_first():
    from nwor_lab.viz import demo_frames
    frames = {m: demo_frames(m, seed=0) for m in ("off", "cow", "stage")}
    s = Stepper(frames, mode="stage")
    assert s.mode_dropdown.value == "stage" and s.mode_dropdown.options == ("stage", "off", "cow")
    cache, staging, log = s.figure.data[:3]
    notes = [a.text for a in s.figure.layout.annotations]
    assert [a.text for a in s.figure.layout.annotations[:3:]][0] == "<b>cache</b>"
    assert any("stage: none" in n for n in notes)                        # stage keeps no CoW log
    s.step(2)                                                          # begin, write 0, write 1
    assert s.frame.phase == "write" and s.frame.layer == 1 and s.layer_dropdown.value == 1
    assert s.figure.layout.title.text == "stage · verify window 0 · write · layer 1"
    assert {v for row in s.figure.data[1].z for v in row if v is not None} == {SlotState.STAGED}
    assert not s.next_window_button.disabled
    s.next_window_button.click()                                       # into the second window
    assert s.frame.window_index == 1 and s.frame.phase == "begin" and s.next_window_button.disabled
    s.mode_dropdown.value = "cow"                                      # same frame, the log drawn
    assert {v for row in s.figure.data[2].z for v in row if v is not None} == {SlotState.LOGGED}
    assert any("cow: none" in a.text for a in s.figure.layout.annotations)
    s.mode_dropdown.value = "off"
    assert [list(r) for r in s.figure.data[1].z] == [[None]] == [list(r) for r in s.figure.data[2].z]
    with pytest.raises(ValueError, match="mode='ring'"):
        Stepper(frames, mode="ring")


def test_cell_text_fits_at_any_block_size():
    """vLLM's CPU blocks hold 32 slots: marks shrink ("1:d2✗" -> "d2✗" -> "✗"), the hover keeps it all."""
    from nwor_lab.viz import demo_frames
    from nwor_lab.viz.cache import CHAR_PX, NARROW_PX, fit_marks
    assert fit_marks({1: "1:d2✗", 2: "0:t"}, 3) == {1: "d2✗", 2: "t"}
    assert fit_marks({1: "1:d2✗", 2: "1:d3"}, 1) == {1: "✗", 2: "d"}
    for bs in (8, 16, 32, 64):
        frames = demo_frames("stage", seed=1, num_reqs=2, k=4, block_size=bs, num_blocks=max(4, 96 // bs))
        fig = show_frames(frames)[3]
        heat = fig.data[0]
        longest = max(len(t) for row in heat.text for t in row)
        assert longest <= max(1, (NARROW_PX - 100) / bs / CHAR_PX), (bs, longest)   # fits a narrow notebook
        assert any("· d" in c[2] for row in heat.customdata for c in row), "hover keeps the whole label"
    grid = cache_grid(torch.zeros(2, 32, dtype=torch.int8), title="t", block_size=32, cell_text={5: "1:d2✗"})
    assert grid.data[0].text[0][5] == "✗" and grid.layout.width is None        # responsive: no fixed width


@pytest.mark.parametrize("chapter", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_a_chapters_stepper_starts_on_the_chapters_mode(chapter):
    """A Stepper over several modes is told the chapter's `nwor_mode` first (`mode=nwor_mode`, or
    `modes=[nwor_mode, ...]`); one over a single run's frames shows that run's mode."""
    import nbformat
    for cell in nbformat.read(str(chapter), as_version=4).cells:
        for line in cell.source.splitlines():
            if cell.cell_type == "code" and "Stepper(" in line and not line.lstrip().startswith(("#", "from", "import")):
                several = "lambda m" in line or "frames," in line or line.rstrip().endswith("Stepper(frames)")
                if several:
                    assert "mode=nwor_mode" in line or "modes=[nwor_mode]" in line, f"{chapter.name}: {line.strip()}"


def test_ring_cells_follow_what_each_policy_declares():
    from nwor_lab.policies import POLICIES
    from nwor_lab.viz import ring_cells, ring_figure, strategies_figure

    def of(name):
        cls = POLICIES[name]
        return ring_cells(8, 8, 20, 4, window_in_buffer=cls.window_in_buffer, evicted_in_log=cls.evicted_in_log)
    off, _ = of("off")
    # t_last at 20 evicts 12 (no query needs it); drafts 21..23 evict 13..15, which the query at 20 needs
    assert [(c.position, c.lost) for c in off if c.state == "evicted"] == [(21, 13), (22, 14), (23, 15)]
    assert [c.state for c in off].count("window") == 1
    cow, _ = of("cow")
    assert [c.index for c in cow if c.state == "logged"] == [c.index for c in off if c.state == "evicted"]
    stage, staged = of("stage")
    assert staged == [20, 21, 22, 23] and {c.state for c in stage} == {"live", "outside"}
    fig = ring_figure([("off", POLICIES["off"]), ("stage", POLICIES["stage"])], ring_slots=8, sliding_window=8,
                      start=20, num_tokens=4, title="ring")
    json.loads(fig.to_json())
    assert fig.layout.polar2 is not None and any("was 13" in (t.text or [""])[0] for t in fig.data
                                                  if t.type == "scatterpolar" and t.text)
    from pathlib import Path
    rows = json.loads((Path(__file__).parents[1] / "benchmarks/results/ring_cpu.json").read_text())["results"]
    bars = strategies_figure(rows)
    assert list(bars.data[0].x) == [r["strategy"] for r in rows if r["k"]]
    assert "✗" in list(bars.data[0].text) and bars.data[0].marker.color[0] != bars.data[0].marker.color[1]
