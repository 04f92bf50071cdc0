"""Pictures of the write policies at work (plotly) and a notebook stepper (ipywidgets).

  cache_grid / cache_grids   one layer's paged cache, a cell per slot, coloured by SlotState
  window_timeline            a verify window's tokens per request: kept / rejected / padding
  acceptance_by_position     acceptance rate per draft position, from WindowRecords
  costs_by_mode              bytes written / skipped / logged / restored and launches per mode
  Recorder, Frame            a window observer that snapshots every phase of every window
  demo_frames                one random mixed window through a fresh policy, recorded
  record_generate            a whole engine run (generate) with a Recorder attached
  Stepper, show_frames       step through frames live (widgets) or as static figures
  ring_figure, ring_cells    a sliding-window ring cache after a window's writes, per policy
  strategies_figure          the sliding-window strategies side by side (bench ring rows)

Importing this package imports plotly (and keeps plotly's notebook renderer from fetching MathJax
from a CDN: `offline.py`); `import nwor_lab` does not.
"""
from nwor_lab.viz.offline import install as _offline

_offline()
from nwor_lab.viz.states import STATE_MEANING, SlotState, layer_states, occupancy, token_labels
from nwor_lab.viz.cache import cache_grid, cache_grids
from nwor_lab.viz.window import window_timeline, window_timelines
from nwor_lab.viz.costs import acceptance_by_position, costs_by_mode, position_counts
from nwor_lab.viz.recorder import Frame, Recorder
from nwor_lab.viz.demo import demo_cache, demo_frames, demo_frames_by_mode, demo_window, record_generate
from nwor_lab.viz.stepper import Stepper, frame_figure, show_frames, used_blocks
from nwor_lab.viz.ring import ring_cells, ring_figure, strategies_figure

__all__ = ["SlotState", "STATE_MEANING", "layer_states", "occupancy", "token_labels", "used_blocks", "cache_grid", "cache_grids",
           "window_timeline", "window_timelines", "acceptance_by_position", "costs_by_mode",
           "position_counts", "Frame", "Recorder", "demo_cache", "demo_window", "demo_frames",
           "demo_frames_by_mode", "record_generate", "Stepper", "frame_figure", "show_frames", "ring_cells",
           "ring_figure", "strategies_figure"]
