"""The stepper as a workshop projects it: every label at least 14 px, and a begin frame (a new
window, nothing written yet) shows the window's first layer, not the layer the previous window
wrote last, in the static pictures and in the live widget alike."""
import pytest

from nwor_lab.viz import Stepper, demo_frames, show_frames
from nwor_lab.viz.stepper import LABEL_PX, frame_figure


@pytest.fixture(scope="module")
def frames():
    return demo_frames("stage", seed=0, windows=2)


def label_sizes(fig):
    sizes = [t.textfont.size for t in fig.data if t.type == "heatmap"]
    sizes += [a.font.size for a in fig.layout.annotations]
    for axis in ("xaxis", "yaxis"):
        ax = fig.layout[axis]
        sizes += [ax.title.font.size, ax.tickfont.size]
    sizes += [fig.layout.font.size, fig.layout.legend.font.size]
    return sizes


def test_every_label_is_at_least_14_px(frames):
    assert LABEL_PX >= 14
    for f in frames[:6]:
        sizes = label_sizes(frame_figure(f))
        assert None not in sizes and min(sizes) >= 14, sizes


def test_a_begin_frame_shows_the_new_windows_first_layer(frames):
    begins = [i for i, f in enumerate(frames) if f.phase == "begin"]
    assert len(begins) == 2 and begins[1] > 0
    before = frames[begins[1] - 1]
    last_write = [f.layer for f in frames[:begins[1]] if f.phase == "write"][-1]
    assert last_write != frames[begins[1]].layers[0], "the first window's last write is on another layer"
    figs = show_frames(frames)
    second = frames[begins[1]]
    assert figs[begins[1]].layout.title.text.endswith(f"layer {second.layers[0]}"), figs[begins[1]].layout.title.text
    assert before.phase != "begin"

    stepper = Stepper(frames)
    for _ in range(begins[1]):
        stepper.step(1)
    assert stepper.frame.phase == "begin" and stepper.layer_dropdown.value == second.layers[0]
