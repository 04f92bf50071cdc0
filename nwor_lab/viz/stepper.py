"""Step through recorded frames: a cache grid that redraws phase by phase, with its caption.

The recording is package code (`Recorder`, `demo_frames`); this module only draws it.
`Stepper(frames)` is an ipywidgets control for a live notebook; `show_frames(frames)` gives the
same pictures as a list of static figures for non-interactive runs (papermill, nbval, HTML export).

For a browser test, every control carries a stable CSS class (`nwor-next`, `nwor-prev`,
`nwor-next-window`, `nwor-reset`, `nwor-mode`, `nwor-layer`, `nwor-position`, `nwor-caption`,
`nwor-figure`) and the buttons a tooltip (the `title` attribute).
"""
from __future__ import annotations

import html
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go

from nwor_lab.viz.cache import cache_grid, grid_cells, grid_height
from nwor_lab.viz.states import SlotState

__all__ = ["Stepper", "frame_figure", "show_frames", "used_blocks"]


def used_blocks(frames: Sequence) -> list[int]:
    """Blocks that hold anything (non-EMPTY in any layer) in any of `frames`: the rows worth
    drawing, the same for every frame so the grid does not jump. All blocks if none is used."""
    used = set()
    for f in frames:
        for grid in f.states.values():
            used.update((grid != SlotState.EMPTY).any(1).nonzero().flatten().tolist())
    if not used and frames:
        return list(range(frames[0].grid().shape[0]))
    return sorted(used)


def frame_figure(frame, layer: int | None = None, *, blocks: Sequence[int] | None = None,
                 with_caption: bool = True) -> go.Figure:
    """The cache grid of `frame` for `layer` (default: its first recorded layer), titled with
    mode, window and phase, the caption as subtitle."""
    layer = frame.layers[0] if layer is None else layer
    return cache_grid(frame.grid(layer), title=f"{frame.title} · layer {layer}", block_size=frame.block_size,
                      annotations=frame.labels, cell_text=frame.marks, blocks=blocks,
                      subtitle=frame.caption if with_caption else None)


def show_frames(frames: Sequence, layer: int | None = None, *, blocks="used") -> list[go.Figure]:
    """Every phase of `frames` as a static figure (what the Stepper shows, one after another)."""
    rows = used_blocks(frames) if blocks == "used" else blocks
    return [frame_figure(f, layer, blocks=rows) for f in frames]


class Stepper:
    """A notebook control over recorded frames: next phase / previous / next window / reset,
    a mode and a layer dropdown, the caption, and a live `go.FigureWidget` of the cache grid.

    frames: `{mode: [Frame]}`, a list of frames (one mode), or a callable `mode -> [Frame]` with
            `modes` (frames recorded lazily, e.g. `lambda m: demo_frames(m, seed=3)`).
    Switching mode keeps the position, so the same phase of the same window compares across modes.
    """

    def __init__(self, frames: Mapping[str, Sequence] | Sequence | Callable[[str], Sequence], *,
                 modes: Sequence[str] | None = None, layer: int | None = None, blocks="used"):
        import ipywidgets as w

        if callable(frames) and not isinstance(frames, Mapping):
            if not modes:
                raise ValueError("modes: give the modes to record when frames is a callable mode -> frames")
            self._source, self._frames = frames, {}
        elif isinstance(frames, Mapping):
            self._source, self._frames = None, {m: list(f) for m, f in frames.items()}
            modes = modes or list(self._frames)
        else:
            frames = list(frames)
            mode = frames[0].mode if frames else "?"
            self._source, self._frames, modes = None, {mode: frames}, [mode]
        self._blocks_arg = blocks
        self.index = 0

        def button(description, css, tooltip, icon):
            b = w.Button(description=description, tooltip=tooltip, icon=icon)
            b.add_class(css)
            return b
        self.prev_button = button("previous phase", "nwor-prev", "show the previous phase", "step-backward")
        self.next_button = button("next phase", "nwor-next", "show the next phase of this window", "step-forward")
        self.next_window_button = button("next window", "nwor-next-window", "jump to the next window's begin",
                                         "fast-forward")
        self.reset_button = button("reset", "nwor-reset", "back to the first phase", "undo")
        self.mode_dropdown = w.Dropdown(options=list(modes), value=list(modes)[0], description="mode")
        self.mode_dropdown.add_class("nwor-mode")
        self.layer_dropdown = w.Dropdown(options=[0], value=0, description="layer")
        self.layer_dropdown.add_class("nwor-layer")
        self.position = w.HTML()
        self.position.add_class("nwor-position")
        self.caption = w.HTML()
        self.caption.add_class("nwor-caption")
        self.figure = go.FigureWidget()
        self.figure.add_class("nwor-figure")

        self.prev_button.on_click(lambda _: self.step(-1))
        self.next_button.on_click(lambda _: self.step(+1))
        self.next_window_button.on_click(lambda _: self.next_window())
        self.reset_button.on_click(lambda _: self.reset())
        self.mode_dropdown.observe(lambda _: self._load_mode(), names="value")
        self.layer_dropdown.observe(lambda _: self._quiet or self._draw(), names="value")
        self._quiet = False
        self._wanted_layer = layer
        self._load_mode()
        self.widget = w.VBox([w.HBox([self.prev_button, self.next_button, self.next_window_button,
                                      self.reset_button]),
                              w.HBox([self.mode_dropdown, self.layer_dropdown, self.position]),
                              self.caption, self.figure])

    # -- what is shown -----------------------------------------------------------------------
    @property
    def frames(self) -> list:
        mode = self.mode_dropdown.value
        if mode not in self._frames:
            self._frames[mode] = list(self._source(mode))
        return self._frames[mode]

    @property
    def frame(self):
        return self.frames[self.index]

    # -- actions (the buttons call these) ------------------------------------------------------
    def step(self, delta: int) -> None:
        self.index = max(0, min(len(self.frames) - 1, self.index + delta))
        self._draw()

    def next_window(self) -> None:
        now = self.frame.window_index
        later = [i for i, f in enumerate(self.frames) if i > self.index and f.window_index != now]
        self.index = later[0] if later else len(self.frames) - 1
        self._draw()

    def reset(self) -> None:
        self.index = 0
        self._draw()

    # -- drawing -------------------------------------------------------------------------------
    def _load_mode(self) -> None:
        frames = self.frames
        if not frames:
            raise ValueError(f"mode {self.mode_dropdown.value!r}: no frames were recorded")
        self._blocks = used_blocks(frames) if self._blocks_arg == "used" else self._blocks_arg
        layers = frames[0].layers
        keep = self._wanted_layer if self._wanted_layer in layers else self.layer_dropdown.value
        self._quiet = True          # setting the options fires the layer observer: draw once, below
        self.layer_dropdown.options = layers
        self.layer_dropdown.value = keep if keep in layers else layers[0]
        self._quiet = False
        self.index = min(self.index, len(frames) - 1)
        self._draw()

    def _draw(self) -> None:
        f, n = self.frame, len(self.frames)
        layer = self.layer_dropdown.value
        title = f"{f.title} · layer {layer}"
        if not self.figure.data:       # first draw: the full figure once (layout, legend)
            new = frame_figure(f, layer, blocks=self._blocks, with_caption=False)
            self.figure.add_traces(new.data)
            self.figure.layout = new.layout
        # every draw touches only what a frame changes: the cells, the title, the height
        # (validating a whole layout per click costs seconds)
        rows = self._blocks if self._blocks is not None else range(f.grid(layer).shape[0])
        cells = grid_cells(f.grid(layer), rows, f.block_size, f.labels, f.marks)
        with self.figure.batch_update():
            self.figure.data[0].update(cells, x=list(range(f.block_size)))
            self.figure.layout.xaxis.range = [-0.5, f.block_size - 0.5]   # modes may differ in block size
            self.figure.layout.title.text = title
            self.figure.layout.height = grid_height(len(rows))
        self.position.value = (f"window {f.window_index} · <b>{f.phase}</b> · frame {self.index + 1} of {n}")
        self.caption.value = f"<p style='margin:4px 0'>{html.escape(f.caption)}</p>"
        last, first = self.index >= n - 1, self.index == 0
        self.next_button.disabled = self.next_window_button.disabled = last
        self.prev_button.disabled = self.reset_button.disabled = first

    @staticmethod
    def static(frames: Sequence, layer: int | None = None, *, blocks="used") -> list[go.Figure]:
        """The same phases as static figures (for `interactive=False` runs)."""
        return show_frames(frames, layer, blocks=blocks)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
