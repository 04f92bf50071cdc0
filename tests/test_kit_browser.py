"""The workshop kit in a real browser with the network cut off: headless Chromium (Playwright) opens
the built kit's index, every chapter page and every slide deck from `file://`, records every request
that would leave the machine (none may), and measures what is drawn:

- every slide of every deck fits the 1280 x 720 viewport (each visible element's box inside it);
- every figure is drawn, inside its slide on a deck, and no wider than its cell on a page;
- every deck has speaker notes, and the index shows the agenda and each chapter's exercises.

Screenshots of the index and of two slides go to runs/browser/ (kit-index.png, slide-*.png).

By default the test builds a one-chapter kit (05_stage: figures, the stepper's frames as sub-slides,
an exercise slide, its notes; the other chapters keep their agenda slots as estimates). `NWOR_LAB_KIT_DIR=runs/workshop` tests an existing full build
instead (`nwor-lab workshop build`); `NWOR_LAB_KIT_CHAPTERS` picks the chapters to build.
"""
import json
import os
from pathlib import Path

import pytest

from nwor_lab.workshop import kit, offline
from test_browser import CHROMIUM, CHROMIUM_FLAGS

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "runs" / "browser"
VIEWPORT = {"width": 1280, "height": 720}
CHAPTERS = os.environ.get("NWOR_LAB_KIT_CHAPTERS", "notebooks/05_stage.ipynb")
TIMEOUT_MS = 60_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM, reason="chromium not found: apt-get install -y chromium (or set NWOR_LAB_CHROMIUM)"),
]


@pytest.fixture(scope="module")
def kit_dir(tmp_path_factory):
    given = os.environ.get("NWOR_LAB_KIT_DIR")
    if given:
        path = (ROOT / given).resolve()
        assert (path / "index.json").exists(), f"NWOR_LAB_KIT_DIR={given}: no kit there (nwor-lab workshop build)"
        return path
    out = tmp_path_factory.mktemp("kit")
    chapters = [ROOT / c.strip() for c in CHAPTERS.split(",") if c.strip()]
    built = kit.build(chapters, out, timeout=300, log=lambda *_: None)
    assert all(b.status == "ok" for b in built), [(b.name, b.error) for b in built]
    return out


@pytest.fixture(scope="module")
def index(kit_dir):
    return json.loads((kit_dir / "index.json").read_text())


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Chromium offline: the context is offline, names resolve nowhere, and every request that is not
    a file:// (or data:/blob:) URL is recorded and aborted."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright missing: pip install playwright (dev extra)")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS + ["--host-resolver-rules=MAP * ~NOTFOUND"], viewport=VIEWPORT, offline=True)
        context.set_default_timeout(TIMEOUT_MS)
        context.external = []

        def gate(route):
            url = route.request.url
            if url.startswith(("file:", "data:", "blob:", "about:")):
                route.continue_()
            else:
                context.external.append(url)
                route.abort()
        context.route("**/*", gate)
        yield context
        context.close()


def open_page(browser, path: Path):
    page = browser.new_page()
    page.errors = []
    page.on("pageerror", lambda err: page.errors.append(str(err)))
    page.on("console", lambda msg: page.errors.append(msg.text) if msg.type == "error" else None)
    page.goto(path.as_uri())
    return page


def test_no_external_url_in_any_generated_html(kit_dir):
    pages = sorted(p for p in kit_dir.glob("*.html"))
    assert pages
    found = {p.name: offline.external_urls(p.read_text()) for p in pages}
    assert not any(found.values()), {k: v[:3] for k, v in found.items() if v}


def test_index_offline_lists_agenda_and_exercises(kit_dir, index, browser):
    page = open_page(browser, kit_dir / "index.html")
    try:
        agenda = page.locator('table.agenda[data-agenda="three-hour"] tbody tr')
        assert agenda.count() == len(index["agenda"])
        day = index["agendas"]["full-day"]
        assert page.locator('table.agenda[data-agenda="full-day"] tbody tr').count() == len(day["slots"])
        total = sum(s["minutes"] for s in index["agenda"])
        assert total == 180 and index["agenda"][-1]["clock"].endswith("3:00")
        for chapter in index["chapters"]:
            row = page.locator("table.chapters tr", has_text=chapter["title"])
            for ex in chapter["exercises"]:
                assert row.locator("li", has_text=ex["title"].replace("`", "")).count() == 1, ex["title"]
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "kit-index.png"), full_page=True)
        assert not page.errors, page.errors
    finally:
        page.close()
    assert not browser.external, browser.external


# Every visible element of the current slide, as boxes in viewport pixels, and the slide area.
_SLIDE_BOXES = """() => {
  const slide = Reveal.getCurrentSlide();
  const area = document.querySelector('.reveal .slides').getBoundingClientRect();
  const out = [];
  for (const el of slide.querySelectorAll('*')) {
    if (el.closest('aside.notes')) continue;
    // an SVG clips what it draws: its own box counts, not the (clipped) geometry inside it
    if (el.ownerSVGElement) continue;
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden') continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    out.push({tag: el.tagName, cls: String(el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className).slice(0, 40),
              left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  }
  const figures = Array.from(slide.querySelectorAll('.plotly-graph-div')).map(f => ({
      drawn: f.querySelector('svg.main-svg') !== null, right: f.getBoundingClientRect().right,
      bottom: f.getBoundingClientRect().bottom}));
  return {area: {left: area.left, top: area.top, right: area.right, bottom: area.bottom}, boxes: out, figures,
          indices: Reveal.getIndices(), notes: slide.querySelectorAll('aside.notes').length};
}"""


def deck_slides(page):
    page.wait_for_function("() => window.Reveal && Reveal.isReady()")
    return page.evaluate("() => Reveal.getSlides().map(s => Reveal.getIndices(s))")


def test_every_slide_fits_1280x720_and_every_figure_is_drawn(kit_dir, index, browser):
    overflow, undrawn, notes, total = [], [], {}, 0
    figure_slides, exercise_slides = [], []
    for chapter in index["chapters"]:
        if not chapter.get("slides"):
            continue
        page = open_page(browser, kit_dir / chapter["slides"])
        try:
            slides = deck_slides(page)
            assert slides, f"{chapter['slides']}: no slides"
            notes[chapter["name"]] = 0
            for at in slides:
                where = [at["h"], at.get("v", 0)]
                # every fragment shown: a slide must fit with all of it on screen
                page.evaluate("([h, v]) => { Reveal.slide(h, v); while (Reveal.nextFragment()) {} }", where)
                page.wait_for_timeout(60)
                state = page.evaluate(_SLIDE_BOXES)
                total += 1
                notes[chapter["name"]] += state["notes"]
                tol = 1.0
                out = [b for b in state["boxes"] if b["right"] > VIEWPORT["width"] + tol or b["bottom"] > VIEWPORT["height"] + tol
                       or b["left"] < -tol or b["top"] < -tol]
                if out:
                    overflow.append((chapter["slides"], at, out[0]))
                undrawn += [(chapter["slides"], at) for f in state["figures"] if not f["drawn"]]
                if state["figures"] and state["figures"][0]["bottom"] < 640:
                    figure_slides.append((chapter["slides"], where))
                if page.locator("section.present h2", has_text="Exercise").count():
                    exercise_slides.append((chapter["slides"], where))
            assert not page.errors, (chapter["slides"], page.errors)
        finally:
            page.close()
    print(f"{total} slides measured in {len(notes)} decks")
    assert not overflow, f"{len(overflow)} slides do not fit 1280 x 720, e.g. {overflow[:3]}"
    assert not undrawn, f"figures not drawn: {undrawn[:5]}"
    assert all(n > 0 for n in notes.values()), f"decks without speaker notes: {notes}"
    assert figure_slides and exercise_slides
    # two slides as an attendee sees them: a stage figure if the kit has one, and an exercise with its question
    figure = next((f for f in figure_slides if f[0].startswith("05_stage")), figure_slides[0])
    SHOTS.mkdir(parents=True, exist_ok=True)
    for deck, where in (figure, exercise_slides[0]):
        page = open_page(browser, kit_dir / deck)
        try:
            deck_slides(page)
            page.evaluate("([h, v]) => { Reveal.slide(h, v); while (Reveal.nextFragment()) {} }", where)
            page.wait_for_timeout(600)                     # the fragments' fade-in ends
            shot = SHOTS / f"slide-{deck.split('.')[0]}-{where[0]}-{where[1]}.png"
            page.screenshot(path=str(shot))
            print(f"screenshot: {shot}")
        finally:
            page.close()
    assert not browser.external, browser.external


# Each figure of a chapter page against the cell (output area) that holds it.
_PAGE_FIGURES = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(f => {
  const cell = f.closest('.jp-OutputArea-output') || f.parentElement;
  const svg = f.querySelector('svg.main-svg');
  return {cell: cell.getBoundingClientRect().width, figure: f.getBoundingClientRect().width,
          svg: svg ? svg.getBoundingClientRect().width : null, scroll: cell.scrollWidth, client: cell.clientWidth};
})"""


@pytest.mark.parametrize("width", [900])   # narrower than a slide: a laptop window with a sidebar
def test_every_figure_fits_its_cell_on_the_pages(kit_dir, index, browser, width):
    bad, count = [], 0
    for chapter in index["chapters"]:
        if not chapter.get("html"):
            continue
        page = open_page(browser, kit_dir / chapter["html"])
        try:
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(300)          # plotly's responsive resize settles
            for f in page.evaluate(_PAGE_FIGURES):
                count += 1
                if f["svg"] is None or f["figure"] > f["cell"] + 1 or f["svg"] > f["cell"] + 1 or f["scroll"] > f["client"] + 1:
                    bad.append((chapter["html"], f))
            assert not page.errors, (chapter["html"], page.errors)
        finally:
            page.close()
    assert count, "no figures on the pages"
    assert not bad, f"{len(bad)} figures wider than their cell (or not drawn), e.g. {bad[:3]}"
    assert not browser.external, browser.external
