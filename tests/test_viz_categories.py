"""viz.categories: a categorical heatmap draws z = i in category i's colour, its legend one square each."""
import plotly.graph_objects as go

from nwor_lab.viz.categories import OUTLINE, add_category_legend, category_heatmap
from nwor_lab.viz.theme import discrete_colorscale

KEY = [("kept", "#0000ff"), ("rejected", "#ff0000"), ("empty", "#ffffff")]


def test_heatmap_bands_are_the_categories_colours_without_a_colour_bar():
    h = category_heatmap([[0, 2], [1, 0]], KEY, x=[0, 1], xgap=2)
    assert (h.zmin, h.zmax, h.showscale, h.xgap) == (-0.5, 2.5, False, 2)
    assert [list(stop) for stop in h.colorscale] == [[float(a), c] for a, c in discrete_colorscale([c for _, c in KEY])]


def test_legend_has_one_data_free_square_per_category_in_order():
    fig = go.Figure()
    add_category_legend(fig, KEY)
    add_category_legend(fig, KEY[:1], outline=False)
    assert [t.name for t in fig.data] == ["kept", "rejected", "empty", "kept"]
    assert all(t.x == (None,) and t.marker.symbol == "square" for t in fig.data)
    assert fig.data[2].marker.line.color == OUTLINE["color"] and fig.data[3].marker.line.color is None
