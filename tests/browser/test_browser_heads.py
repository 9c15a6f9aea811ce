"""The Heads tab's first screen and layout in a real browser (Debian's Chromium, headless, Playwright).

At 1400 × 1000 the primary button lies above the fold and no figure box is shown empty; once the atlas has run,
the score map is at least 600 px wide with a label on every layer and head. At 390 × 844 no two figure boxes
overlap once every section has drawn. Screenshots: tests/screenshots/heads-wide.png and heads-narrow.png.
"""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import WIDE, drawn, runs_done, screenshot, settled, wait_for_run  # noqa: E402

TIMEOUT_MS = 60_000
NARROW = {"width": 390, "height": 844}
FOLD_PX = 1000
# every figure of the tab, as the page's own config lists its plot components (elem_id, visible)
PLOTS_JS = """() => window.gradio_config.components
  .filter((c) => c.type === "plot" && String(c.props.elem_id || "").startsWith("heads-"))
  .map((c) => c.props.elem_id)"""
BOX_JS = """(e) => { const r = e.getBoundingClientRect();
  return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}; }"""


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py); a link opens the tab
    return f"{tiny_llama_app[0]}?tab=heads"


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py): the first screen, the atlas run, then
    the window narrowed to a phone's width."""
    expect(shared_page.locator("#heads-run")).to_be_visible(timeout=TIMEOUT_MS)
    # the tab opens on the atlas of its default text: wait for that result, drawn
    expect(shared_page.locator("#heads-map .js-plotly-plot .hm image").first).to_be_attached(timeout=TIMEOUT_MS)
    drawn(shared_page)
    return shared_page


def box(page: Page, selector: str) -> dict:
    """The element's box in page coordinates (not the window's, which move as the page scrolls)."""
    return page.locator(selector).first.evaluate(BOX_JS)


def shown_plots(page: Page) -> list[str]:
    """The elem_ids of the tab's figure boxes that are on screen (display, size), whatever they hold."""
    return [elem_id for elem_id in page.evaluate(PLOTS_JS) if page.locator(f"#{elem_id}").first.is_visible()]


def expect_no_empty_plot(page: Page) -> None:
    """Every figure box shown holds a drawn figure (or comes to, while its result is on the way)."""
    for elem_id in shown_plots(page):
        expect(page.locator(f"#{elem_id} .js-plotly-plot").first, elem_id).to_be_attached(timeout=TIMEOUT_MS)


def svg_texts(plot, selector: str) -> list[str]:
    return plot.locator(selector).evaluate_all("(els) => els.map((e) => e.textContent)")


def run_atlas(page: Page) -> None:
    """Run, and wait for this run's return (it redraws the maps the tab's opening drew), then the maps."""
    before = runs_done(page, "heads-field-note")
    page.locator("#heads-run").click()
    wait_for_run(page, "heads-field-note", before)
    expect(page.locator("#heads-map .js-plotly-plot .hm image").first).to_be_attached(timeout=TIMEOUT_MS)
    expect(page.locator("#heads-head-view .js-plotly-plot .hm image").first).to_be_attached(timeout=TIMEOUT_MS)
    settled(page)


def test_the_first_screen_has_the_button_above_the_fold_and_no_empty_figure(page):
    plots = page.evaluate(PLOTS_JS)
    assert {"heads-map", "heads-head-view", "heads-ablation-loss", "heads-sweep-map", "heads-lens"} <= set(plots)
    run = box(page, "#heads-run")
    assert run["y"] + run["height"] <= FOLD_PX, run
    expect_no_empty_plot(page)
    # before any result the sections below the atlas take little room: the page was 4,236 px with six empty
    # figure boxes (each ~400 px), and is ~3,510 with none and the folded *What feeds a head* (~50 px)
    assert page.evaluate("document.documentElement.scrollHeight") < 3600


def test_the_score_map_is_wide_with_every_layer_and_head_labelled(page):
    run_atlas(page)
    score_map = box(page, "#heads-map")
    assert score_map["width"] >= 600, score_map
    plot = page.locator("#heads-map .js-plotly-plot")
    assert svg_texts(plot, ".xtick text") == ["0", "1"]
    assert sorted(svg_texts(plot, ".ytick text")) == ["0", "1", "2", "3"]
    title = plot.locator(".gtitle").first
    title_box, plot_box = title.evaluate(BOX_JS), plot.evaluate(BOX_JS)
    assert title_box["x"] + title_box["width"] <= plot_box["x"] + plot_box["width"], (title_box, plot_box)
    # a tile's hover names its head "L1 H3"
    tiles = plot.locator(".nsewdrag").first
    corner = {"x": tiles.bounding_box()["width"] * 0.75, "y": tiles.bounding_box()["height"] * 0.85}
    tiles.hover(position=corner)
    expect(page.locator("#heads-map .hoverlayer .hovertext").first).to_contain_text("L1 H3", timeout=10_000)
    expect_no_empty_plot(page)
    screenshot(page, "heads-wide")


def test_on_a_phone_no_two_figures_overlap(page):
    page.set_viewport_size(NARROW)
    try:
        expect_no_empty_plot(page)
        run_atlas(page)
        page.locator("#heads-ablate-list textarea, #heads-ablate-list input").first.fill("0.1, 1.2")
        page.locator("#heads-ablate").click()
        expect(page.locator("#heads-ablation-loss .js-plotly-plot .barlayer .trace").first).to_be_attached(
            timeout=TIMEOUT_MS)
        page.locator("#heads-lens-run").click()
        expect(page.locator("#heads-lens .js-plotly-plot .hm image").first).to_be_attached(timeout=TIMEOUT_MS)
        settled(page)
        shown = shown_plots(page)
        assert {"heads-map", "heads-head-view", "heads-ablation-loss", "heads-lens"} <= set(shown), shown
        boxes = {elem_id: box(page, f"#{elem_id}") for elem_id in shown}
        for elem_id, b in boxes.items():
            assert b["x"] >= 0 and b["x"] + b["width"] <= NARROW["width"] + 1, (elem_id, b)
        names = sorted(boxes)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                assert not overlap(boxes[a], boxes[b]), (a, boxes[a], b, boxes[b])
        expect_no_empty_plot(page)
        screenshot(page, "heads-narrow")
    finally:
        page.set_viewport_size(WIDE)


def overlap(a: dict, b: dict) -> bool:
    """Two boxes share more than a pixel's edge."""
    return (a["x"] + 1 < b["x"] + b["width"] and b["x"] + 1 < a["x"] + a["width"]
            and a["y"] + 1 < b["y"] + b["height"] and b["y"] + 1 < a["y"] + a["height"])


def test_the_window_reading_shows_its_progress_and_stop_ends_it(page, monkeypatch, tiny_llama_app):
    """A text read through the cache token by token: the note counts the steps as they go; Stop closes the
    reading when its next step comes back (Gradio closes a cancelled generator then) and the worker ends long
    before the text's last token, no result coming after it; the reading then runs again to its perplexity. The
    second token waits for the click on Stop, and each later one for the close at most 50 ms, so the rest of the
    text would take seconds: a reading that went on would reach its end."""
    import threading
    import time

    import core.analysis.sinks as core_sinks
    import ui.views.sinks as sink_views

    steps, stopped, closed = [], threading.Event(), threading.Event()
    decode, stream = core_sinks.rolling_decode_step, sink_views.stream_window

    def held(*args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            stopped.wait(60)   # the second token waits for the click on Stop
        elif len(steps) > 2:
            closed.wait(0.05)  # each later one for the reading's close, at most 50 ms
        return decode(*args, **kwargs)

    def watched(*args, **kwargs):
        try:
            yield from stream(*args, **kwargs)
        finally:
            closed.set()

    def reading() -> bool:
        return any(t.name == "streaming-perplexity" for t in threading.enumerate())

    monkeypatch.setattr(core_sinks, "rolling_decode_step", held)
    monkeypatch.setattr(sink_views, "stream_window", watched)
    monkeypatch.setattr(sink_views, "SHOWN_EVERY_S", 0.0)   # every step reaches the page
    page.locator("#heads-window-box > button, #heads-window-box .label-wrap").first.click()
    text = "the lamp was lit at dusk and the boats came home " * 30
    _, services, name = tiny_llama_app
    tokens = len(services.models.get(name).tokenizer(text)["input_ids"])
    page.locator("#heads-text textarea").fill(text)
    page.locator("#heads-window-size input").fill("8")
    page.locator("#heads-window-positions").get_by_text("cache:", exact=False).click()
    page.locator("#heads-window-run").click()
    note = page.locator("#heads-window-note")
    expect(note).to_contain_text("Reading through the window: step 1 of", timeout=TIMEOUT_MS)
    page.locator("#heads-window-stop").click()
    stopped.set()
    assert closed.wait(60), "Stop did not close the reading"
    deadline = time.monotonic() + 60
    while reading() and time.monotonic() < deadline:   # polled: the server's own worker ending
        time.sleep(0.05)
    assert not reading() and len(steps) < tokens // 2, f"the reading went on after Stop: {len(steps)} of {tokens}"
    settled(page)
    assert "Perplexity" not in note.inner_text()
    monkeypatch.setattr(core_sinks, "rolling_decode_step", decode)
    page.locator("#heads-text textarea").fill("the lamp was lit at dusk and the boats came home")
    page.locator("#heads-window-run").click()
    expect(note).to_contain_text("Perplexity", timeout=TIMEOUT_MS)
