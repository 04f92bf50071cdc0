"""Figures that render with no network: plotly's notebook renderers without MathJax from a CDN.

plotly's `notebook` renderer (what the chapters select) always writes
`<script src="https://cdnjs.cloudflare.com/.../mathjax/.../tex-svg.min.js">` beside each figure,
whether the figure has LaTeX or not. Offline — at many venues, and in the browser test, whose
Chromium reaches only 127.0.0.1 — that script fails to load and the page logs a console error for
every figure. The lab's figures use no LaTeX, so the script is dropped: importing `nwor_lab.viz`
wraps `NotebookRenderer.to_mimebundle` (once) to remove it. plotly.js itself is embedded by the
renderer's activation, not fetched.
"""
from __future__ import annotations

import re

from plotly.io._base_renderers import NotebookRenderer

__all__ = ["install", "strip_cdn_mathjax"]

_MATHJAX = re.compile(r'<script src="https://cdnjs\.cloudflare\.com/ajax/libs/mathjax/[^"]*"></script>')


def strip_cdn_mathjax(html: str) -> str:
    """`html` without the `<script>` that loads MathJax from cdnjs."""
    return _MATHJAX.sub("", html)


def install() -> None:
    """Make every `NotebookRenderer` (notebook, notebook_connected, ...) leave MathJax out. Idempotent."""
    original = NotebookRenderer.to_mimebundle
    if getattr(original, "_nwor_offline", False):
        return

    def to_mimebundle(self, fig_dict):
        bundle = original(self, fig_dict)
        if "text/html" in bundle:
            bundle["text/html"] = strip_cdn_mathjax(bundle["text/html"])
        return bundle

    to_mimebundle._nwor_offline = True
    NotebookRenderer.to_mimebundle = to_mimebundle
