"""Which slides of a deck do not fit: each deck opened in headless Chromium at its own size
(1280 x 720), every slide shown in turn, and a slide reported when anything on it reaches past the
slide's bottom or right edge (printed output cut off, prose running under the slide number, a table
wider than the slide) or scrolls inside itself.

The deck's own numbering is used (reveal's `c/t` slide number, 1-based, sub-slides counted), so a
report reads as the room sees it: "13_state.slides.html: slide 8 overflows by 212 px".

    python -m nwor_lab.workshop.fit runs/kit/*.slides.html

Needs Playwright (the `dev` extra) and a Chromium (`apt-get install -y chromium`; or set
NWOR_LAB_CHROMIUM to its path). `open_browser` launches one browser for any number of decks.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from nwor_lab.workshop import figures

SLACK_PX = 2          # sub-pixel rounding of reveal's scaled layout
INSTALL = "apt-get install -y chromium (or set NWOR_LAB_CHROMIUM to a Chromium binary)"

# In the page: for every slide, show it, let plotly redraw, and measure its visible content against
# the slide's box (reveal scales the 1280 x 720 slide into the window; numbers are scaled back).
_MEASURE = """
async () => {
  const deck = document.querySelector('.reveal .slides');
  const out = [];
  const slides = Reveal.getSlides();
  for (let n = 0; n < slides.length; n++) {
    const s = slides[n];
    const at = Reveal.getIndices(s);
    Reveal.slide(at.h, at.v, 1e6);     // every fragment shown: they take their room in the end
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    const box = deck.getBoundingClientRect();
    const scale = box.width / %(width)d;
    let bottom = 0, right = 0, scrolls = [];
    for (const el of s.querySelectorAll('*')) {
      if (el.closest('aside.notes') || el.ownerSVGElement) continue;   // a figure's parts: clipped by its svg
      const style = getComputedStyle(el);
      if (style.display === 'none' || style.visibility === 'hidden') continue;
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.height === 0) continue;
      bottom = Math.max(bottom, (r.bottom - box.top) / scale);
      right = Math.max(right, (r.right - box.left) / scale);
      const ov = style.overflowY + style.overflowX;
      if (/auto|scroll/.test(ov) && (el.scrollHeight > el.clientHeight + %(slack)d ||
                                     el.scrollWidth > el.clientWidth + %(slack)d)) {
        scrolls.push(el.tagName.toLowerCase() + '.' + (el.className || '').toString().split(' ')[0]);
      }
    }
    const heading = s.querySelector('h1, h2, h3');
    out.push({slide: n + 1, bottom: Math.round(bottom), right: Math.round(right), scrolls: scrolls,
              heading: heading ? heading.textContent.replace('¶', '').trim() : ''});
  }
  return out;
}
"""


@dataclass(frozen=True)
class Overflow:
    deck: str
    slide: int            # reveal's slide number, 1-based, sub-slides counted
    heading: str
    past_bottom: int      # px of content below the slide's bottom edge (0: none)
    past_right: int
    scrolls: tuple = ()   # elements that scroll inside the slide

    def __str__(self):
        what = [f"{self.past_bottom} px past the bottom"] * bool(self.past_bottom) + \
            [f"{self.past_right} px past the right edge"] * bool(self.past_right) + \
            [f"scrolls inside ({', '.join(self.scrolls)})"] * bool(self.scrolls)
        return f"{self.deck}: slide {self.slide} ({self.heading or 'no heading'}) overflows: {'; '.join(what)}"


def chromium() -> str | None:
    """The Chromium binary to drive, or None."""
    return os.environ.get("NWOR_LAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def open_browser(executable: str | None = None):
    """One headless Chromium (Playwright), network cut off: a deck that fetched anything would fail."""
    from playwright.sync_api import sync_playwright
    executable = executable or chromium()
    if not executable:
        raise RuntimeError(f"no Chromium found: {INSTALL}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND"])
        try:
            yield browser
        finally:
            browser.close()


def measure(browser, deck: Path, size=figures.SLIDE, screenshots: Path | None = None) -> list[dict]:
    """Every slide of the deck file `deck`: {slide, heading, bottom, right, scrolls} in slide px.
    `screenshots`: a folder to write `<deck>-<n>.png` of every slide into (None: none)."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    try:
        page.goto(Path(deck).resolve().as_uri())
        page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=30_000)
        rows = page.evaluate(_MEASURE % {"width": size[0], "slack": SLACK_PX})
        if screenshots is not None:
            Path(screenshots).mkdir(parents=True, exist_ok=True)
            for row in rows:
                at = page.evaluate(f"Reveal.getIndices(Reveal.getSlides()[{row['slide'] - 1}])")
                page.evaluate(f"Reveal.slide({at['h']}, {at.get('v') or 0}, 1e6)")
                page.wait_for_timeout(100)
                page.screenshot(path=str(Path(screenshots) / f"{Path(deck).name.split('.')[0]}-{row['slide']}.png"))
        return rows
    finally:
        page.close()


def overflows(browser, deck: Path, size=figures.SLIDE) -> list[Overflow]:
    """The slides of `deck` whose content does not fit the slide ([] when every slide fits)."""
    out = []
    for row in measure(browser, deck, size):
        below = max(0, row["bottom"] - size[1] - SLACK_PX)
        beyond = max(0, row["right"] - size[0] - SLACK_PX)
        if below or beyond or row["scrolls"]:
            out.append(Overflow(Path(deck).name, row["slide"], row["heading"], below, beyond, tuple(row["scrolls"])))
    return out


def main(argv=None) -> int:
    decks = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    if not decks:
        print(__doc__)
        return 2
    found = []
    with open_browser() as browser:
        for deck in decks:
            found += overflows(browser, deck)
    print("\n".join(map(str, found)) or f"every slide of {len(decks)} deck(s) fits {figures.SLIDE[0]} x {figures.SLIDE[1]}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
