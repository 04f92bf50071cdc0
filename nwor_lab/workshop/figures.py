"""Plotly figures in the kit: recorded as data while a chapter runs, drawn at export for where they
are shown.

While the kit executes a chapter, its kernel starts with a small IPython startup file
(`kernel_environment`): plotly's "notebook" renderer — the one every chapter selects — is replaced
by the `plotly_mimetype` renderer, so each figure is stored as its JSON spec
(`application/vnd.plotly.v1+json`, what JupyterLab draws natively) instead of HTML that carries
plotly.js and a MathJax script from a CDN. The export then renders each spec (`render`):

- **page** (the chapter's HTML): the figure's fixed width is dropped and it is drawn responsive, as
  wide as its cell — it can never be cut off by the cell — at its own height;
- **slide** (a reveal.js deck): drawn at its own size and zoomed as a whole to fit the slide's figure
  box (`SLIDE_FIGURE`, inside the 1280 x 720 slide, below its heading).

Both load plotly.js once, from the kit's own `assets/plotly.min.js` (`nwor_lab.workshop.vendor`).
"""
from __future__ import annotations

import copy
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
SLIDE = (1280, 720)                    # the deck's slide, px (reveal.js width/height)
SLIDE_FIGURE = (1180, 560)             # the largest figure under a slide's heading
MAX_SLIDE_ZOOM = 1.4                   # small figures grow on a slide, up to this factor
SLIDE_MIN_WIDTH = 960                  # px a figure is laid out at, at least, on a slide
PAGE_CONFIG = {"responsive": True, "displaylogo": False}
SLIDE_CONFIG = {"displaylogo": False, "displayModeBar": False}

STARTUP = '''\
# nwor_lab workshop kit: figures are stored as plotly JSON, drawn by the kit's export
# (nwor_lab.workshop.figures). Chapters select the "notebook" renderer; here it stores data only.
try:
    import plotly.io as _pio
    _pio.renderers["notebook"] = _pio.renderers["plotly_mimetype"]
    _pio.renderers["notebook_connected"] = _pio.renderers["plotly_mimetype"]
    _pio.renderers.default = "plotly_mimetype"
except Exception:  # no plotly in this kernel: nothing to change
    pass
'''


def kernel_environment(folder: Path) -> dict:
    """Environment variables for the kit's kernels: an IPYTHONDIR under `folder` whose startup file
    stores figures as data. Returns {"IPYTHONDIR": ...}."""
    folder = Path(folder).resolve()         # the kernel runs in the chapter's folder: an absolute path
    startup = folder / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-nwor-kit-figures.py").write_text(STARTUP)
    return {"IPYTHONDIR": str(folder / "ipython")}


def _figure(spec: dict):
    import plotly.graph_objects as go
    return go.Figure(spec)


def figure_html(spec: dict, target: str, box: tuple[int, int] = SLIDE_FIGURE) -> str:
    """One figure spec as an HTML fragment (plotly.js is loaded by the page, not here).

    On a page the figure is responsive (its fixed width dropped). On a slide it keeps its height and
    its width (widened to `SLIDE_MIN_WIDTH` if narrower, so legend and subtitle stay on few lines) and
    is zoomed as a whole (CSS `zoom`, fonts included) to the largest size inside `box`, at most
    `MAX_SLIDE_ZOOM` times its own: laying it out at a smaller height would crowd its titles."""
    import plotly.io as pio

    fig = _figure(copy.deepcopy(spec))
    width = fig.layout.width or 900
    height = fig.layout.height or 450
    if target == "page":
        fig.update_layout(width=None, autosize=True)
        return pio.to_html(fig, include_plotlyjs=False, full_html=False, config=PAGE_CONFIG,
                           default_width="100%", default_height=f"{int(height)}px")
    width = max(width, SLIDE_MIN_WIDTH)     # narrow figures wrap their legend and subtitle: widen them
    fig.update_layout(width=width, height=height)
    zoom = min(MAX_SLIDE_ZOOM, box[0] / width, box[1] / height)
    inner = pio.to_html(fig, include_plotlyjs=False, full_html=False, config=SLIDE_CONFIG,
                        default_width=f"{int(width)}px", default_height=f"{int(height)}px")
    return f'<div class="nwor-slide-figure" style="zoom: {zoom:.3f}; width: {int(width)}px">{inner}</div>'


def render(nb, target: str, box: tuple[int, int] = SLIDE_FIGURE) -> int:
    """Replace every plotly JSON output of `nb` (in place) by its HTML for `target` ("page" or
    "slide"); returns how many figures were drawn."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME in data:
                output["data"] = {"text/html": figure_html(data[PLOTLY_MIME], target, box)}
                count += 1
    return count


def is_figure(output) -> bool:
    return PLOTLY_MIME in output.get("data", {})
