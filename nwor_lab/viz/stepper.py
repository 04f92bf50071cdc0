"""Step through recorded frames: the cache grid beside the staging buffer and the CoW log, redrawn
phase by phase, with the phase's caption.

The recording is package code (`Recorder`, `demo_frames`); this module only draws it.
`Stepper(frames)` is an ipywidgets control for a live notebook; `show_frames(frames)` gives the
same pictures as a list of static figures for non-interactive runs (papermill, nbval, HTML export).
Each picture has three panels: the cache (one layer), the staging buffer and the CoW log of that
layer (a policy that keeps no such buffer says so in its panel). A write phase shows the layer it
wrote; a begin phase opens a new window, which has written no layer yet, and shows the window's
first recorded layer (not the layer the previous window wrote last).

Every label is at least `LABEL_PX` (14 px): the stepper is projected in a workshop, where the
10 px of a notebook figure's cell text reads as a smudge. Cell marks are shortened to what a cell
holds at that size (`fit_marks`).

For a browser test, every control carries a stable CSS class (`nwor-next`, `nwor-prev`,
`nwor-next-window`, `nwor-reset`, `nwor-mode`, `nwor-layer`, `nwor-position`, `nwor-caption`,
`nwor-figure`) and the buttons a tooltip (the `title` attribute).
"""
from __future__ import annotations

import html
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.buffers import BUFFER_TITLES, BUFFERS, buffer_cells, buffer_note
from nwor_lab.viz.cache import NARROW_PX, add_state_legend, fit_marks, grid_cells, grid_height, heatmap_style
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import base_layout

__all__ = ["Stepper", "frame_figure", "frame_panels", "show_frames", "used_blocks"]

LABEL_PX = 14                 # every label: cell text, axis titles and ticks, panel notes, legend
TITLE_PX = 16                 # the panel titles
CHAR_PX = 0.62 * LABEL_PX     # a monospace character of the cell text


SPACING = 0.07                # between the three panels, a share of the figure's width


def _mark_chars(columns: int) -> int:
    """How many characters of cell text a cell holds at `LABEL_PX` when `columns` cells share the
    narrow (sidebar open) notebook width, less the spacing between panels and the gap between cells."""
    cell_px = (NARROW_PX - 100) * (1 - 2 * SPACING) / max(columns, 1) - 2
    return max(1, int(cell_px / CHAR_PX))


def followed_layer(frame, shown: int | None) -> int:
    """The layer to show for `frame` after `shown` was shown: a write shows the layer it wrote, a
    begin the new window's first layer; any other phase keeps `shown` (if the frame records it)."""
    if frame.phase in ("write", "begin") or shown not in frame.layers:
        return frame.shown_layer
    return shown

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


def frame_panels(frame, layer: int | None = None, *, blocks: Sequence[int] | None = None) -> dict:
    """What one frame's picture holds, ready for a figure or a live update:
    `cells` (three heatmap dicts: cache, staging buffer, CoW log; None for a buffer the policy does
    not keep), `titles` (the panels' titles), `notes` (why a panel is empty), `widths` (relative
    column widths), `rows` (block rows drawn), `layer` (the layer shown)."""
    layer = frame.shown_layer if layer is None else layer
    grid = frame.grid(layer)
    rows = list(range(grid.shape[0])) if blocks is None else [int(b) for b in blocks]
    bufs = {b: buffer_cells(frame, b, layer) for b in BUFFERS}
    width = max(frame.window.num_scheduled_tokens, default=1)
    # a buffer panel gets room for its tokens, and at least ~a fifth of the figure at big block sizes
    widths = [frame.block_size] + [max(width, 3, 0.3 * frame.block_size)] * len(BUFFERS)
    share = frame.block_size / sum(widths)
    cache = grid_cells(grid, rows, frame.block_size, frame.labels,
                       fit_marks(frame.marks, _mark_chars(int(frame.block_size / share))))
    cache["x"] = list(range(frame.block_size))
    chars = _mark_chars(int(width * sum(widths) / widths[1]))
    for b, cells in bufs.items():
        if cells is not None:
            cells["text"] = [[_fit(t, chars) for t in row] for row in cells["text"]]
    titles = ["cache"] + [BUFFER_TITLES[b] for b in BUFFERS]
    return dict(cells=[cache, bufs["staging"], bufs["log"]], titles=titles,
                notes=[None] + [buffer_note(frame, b) for b in BUFFERS], widths=widths, rows=rows, layer=layer,
                buffer_rows=max(len(frame.window.num_scheduled_tokens), 1))


def _fit(text: str, chars: int) -> str:
    return fit_marks({0: text}, chars)[0] if text else text


def frame_figure(frame, layer: int | None = None, *, blocks: Sequence[int] | None = None,
                 with_caption: bool = True) -> go.Figure:
    """The picture of `frame`: the cache grid of `layer` (default: the layer a write phase wrote,
    else the first recorded) beside that layer's staging buffer and CoW log, titled with mode,
    window and phase, the caption as subtitle."""
    panels = frame_panels(frame, layer, blocks=blocks)
    fig = make_subplots(rows=1, cols=3, column_widths=panels["widths"], horizontal_spacing=SPACING,
                        subplot_titles=panels["titles"])
    for col, cells in enumerate(panels["cells"], start=1):
        fig.add_trace(go.Heatmap(**(cells or _blank()), **heatmap_style(col > 1)), row=1, col=col)
    fig.update_traces(textfont_size=LABEL_PX, selector=dict(type="heatmap"))
    add_state_legend(fig)
    subtitle = frame.caption if with_caption else None
    fig.update_layout(**base_layout(frame.title_for(panels["layer"]), subtitle))
    fig.update_layout(font_size=LABEL_PX, legend_font_size=LABEL_PX)
    fig.layout.margin.t += 22   # room for the panel titles
    _place(fig, frame, panels, subtitle)
    return fig


def _blank() -> dict:
    return dict(z=[[None]], x=[0], y=[""], text=[[""]], customdata=[[["", None, None, ""]]])


def _place(fig, frame, panels, subtitle=None) -> None:
    """Height, axes, panel titles and notes of a frame picture (also after a live update)."""
    n_rows, b_rows = len(panels["rows"]), panels["buffer_rows"]
    tall = max(n_rows, b_rows)
    fig.layout.height = grid_height(tall, subtitle) + 30
    width = max(frame.window.num_scheduled_tokens, default=1)
    for col, axis in enumerate(("", "2", "3"), start=1):
        x, y = fig.layout[f"xaxis{axis}"], fig.layout[f"yaxis{axis}"]
        x.showgrid = y.showgrid = x.zeroline = y.zeroline = False
        y.autorange, y.type = "reversed", "category"
        if col == 1:
            x.update(title_text="offset in block", title_font_size=LABEL_PX, tickfont_size=LABEL_PX, range=[-0.5, frame.block_size - 0.5],
                     dtick=1 if frame.block_size <= 16 else 4, tickmode="linear")
            y.update(title_text="block", title_font_size=LABEL_PX, tickfont_size=LABEL_PX, domain=[1 - n_rows / tall, 1])
        else:
            # columns are the request's window tokens (t, d1, d2, ...): the cells name them
            x.update(range=[-0.5, max(width, 3) - 0.5], showticklabels=False, ticks="")
            y.update(domain=[1 - b_rows / tall, 1])
    # panel titles sit over each panel; a note stands in the middle of a panel with no buffer
    annotations = []
    for col, (title, note) in enumerate(zip(panels["titles"], panels["notes"]), start=1):
        x0, x1 = fig.layout[f"xaxis{'' if col == 1 else col}"].domain
        annotations.append(dict(text=f"<b>{title}</b>", x=(x0 + x1) / 2, y=1.0, xref="paper", yref="paper",
                                xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=TITLE_PX)))
        if note:
            annotations.append(dict(text=note, x=(x0 + x1) / 2, y=1 - b_rows / tall / 2, xref="paper", yref="paper",
                                    xanchor="center", yanchor="middle", showarrow=False,
                                    font=dict(size=LABEL_PX, color="#666666")))
    fig.layout.annotations = annotations


def show_frames(frames: Sequence, layer: int | None = None, *, blocks="used", legend: str = "first") -> list[go.Figure]:
    """Every phase of `frames` as a static figure (what the Stepper shows, one after another):
    with `layer` None the layer follows the writes (a write shows the layer it wrote, later phases
    keep it, as the Stepper's dropdown does); a given `layer` is drawn in every frame.
    legend: "first" (the colours never change: the first figure carries the legend, the others
    drop it and its room) or "all"."""
    rows = used_blocks(frames) if blocks == "used" else blocks
    figs, shown = [], layer
    for i, f in enumerate(frames):
        if layer is None:
            shown = followed_layer(f, shown)
        fig = frame_figure(f, shown, blocks=rows)
        if i and legend == "first":
            fig.update_layout(showlegend=False, height=fig.layout.height - fig.layout.margin.b + 50, margin_b=50)
        figs.append(fig)
    return figs


class Stepper:
    """A notebook control over recorded frames: next phase / previous / next window / reset,
    a mode and a layer dropdown, the caption, and a live `go.FigureWidget` of the cache grid beside
    the staging buffer and the CoW log.

    frames: `{mode: [Frame]}`, a list of frames (one mode), or a callable `mode -> [Frame]` with
            `modes` (frames recorded lazily, e.g. `lambda m: demo_frames(m, seed=3)`).
    mode:   the mode shown first (a chapter's own `nwor_mode`); default the first of `modes`.
    Switching mode keeps the position, so the same phase of the same window compares across modes.
    A write phase shows the layer it wrote, a begin phase the new window's first layer (the layer
    dropdown follows both).
    """

    def __init__(self, frames: Mapping[str, Sequence] | Sequence | Callable[[str], Sequence], *,
                 modes: Sequence[str] | None = None, mode: str | None = None, layer: int | None = None,
                 blocks="used"):
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
        modes = list(modes)
        if mode is not None:
            if mode not in modes:
                raise ValueError(f"mode={mode!r}: not among the modes shown ({', '.join(modes)})")
            modes = [mode] + [m for m in modes if m != mode]   # the chapter's own mode first
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
        follow = followed_layer(f, self.layer_dropdown.value)
        if follow != self.layer_dropdown.value:
            self._quiet = True      # follow the write (the layer it wrote) or the new window (its first layer)
            self.layer_dropdown.value = follow
            self._quiet = False
        layer = self.layer_dropdown.value
        panels = frame_panels(f, layer, blocks=self._blocks)
        if not self.figure.data:       # first draw: the full figure once (layout, legend)
            new = frame_figure(f, layer, blocks=self._blocks, with_caption=False)
            self.figure.add_traces(new.data)
            self.figure.layout = new.layout
        # every draw touches only what a frame changes: the cells, titles, notes, axes, height
        # (validating a whole layout per click costs seconds)
        with self.figure.batch_update():
            for trace, cells in zip(self.figure.data[:3], panels["cells"]):
                trace.update(cells or _blank())
            self.figure.layout.title.text = f.title_for(layer)
            _place(self.figure, f, panels)
        self.position.value = (f"window {f.window_index} · <b>{f.phase}</b> · frame {self.index + 1} of {n}")
        self.caption.value = f"<p style='margin:4px 0'>{html.escape(f.caption)}</p>"
        last, first = self.index >= n - 1, self.index == 0
        self.next_button.disabled = last
        self.next_window_button.disabled = not any(g.window_index != f.window_index for g in self.frames[self.index:])
        self.prev_button.disabled = self.reset_button.disabled = first

    @staticmethod
    def static(frames: Sequence, layer: int | None = None, *, blocks="used") -> list[go.Figure]:
        """The same phases as static figures (for `interactive=False` runs)."""
        return show_frames(frames, layer, blocks=blocks)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
