"""The Masks tab's window demo in a real browser (headless Chromium, Playwright), on a tiny random model: after a
run its four figures (mask, one head's weights full vs windowed, next-token KL, cost) are drawn, no two overlap,
each stays within the window at 1400 px and on a 390 px phone, and every title stays inside its figure; a window
it cannot run is a note with the figures in their stated empty state, no toast and no "Error" box.
Screenshots window-mask-wide and window-mask-narrow land in tests/screenshots/ (git-ignored)."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import runs_done, screenshot, settled, wait_for_run  # noqa: E402
from test_browser_masks import overlaps  # noqa: E402

TIMEOUT_MS = 60_000
WIDE, NARROW = {"width": 1400, "height": 1000}, {"width": 390, "height": 844}
FIGURES = ["window-mask", "window-weights", "window-kl", "window-cost"]


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


def run_window(page: Page) -> dict[str, dict]:
    """Press the window demo's button, wait for its four figures, and return their boxes (page coordinates)."""
    expect(page.locator("#window-run")).to_be_attached(timeout=TIMEOUT_MS)
    page.locator("#window-run").scroll_into_view_if_needed()
    before = runs_done(page, "mask-field-note")   # the window demo shares the Masks tab's fields, and their count
    page.locator("#window-run").click()
    wait_for_run(page, "mask-field-note", before)   # a second pass redraws the figures the first drew
    for elem_id in FIGURES:
        expect(page.locator(f"#{elem_id} .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    expect(page.locator("#window-words")).to_contain_text("scores with the model's own masks", timeout=TIMEOUT_MS)
    settled(page)  # the last figures' relayout
    return page.evaluate(
        """(ids) => Object.fromEntries(ids.map((id) => {
             const r = document.querySelector(`#${id} .js-plotly-plot`).getBoundingClientRect();
             return [id, {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}];
           }))""", FIGURES)


def titles_outside(page: Page) -> list[str]:
    return page.evaluate(
        """(ids) => ids.flatMap((id) => {
             const plot = document.querySelector(`#${id} .js-plotly-plot`);
             const edge = plot.getBoundingClientRect();
             return [...plot.querySelectorAll('.gtitle, .gtitle-subtitle')].filter((t) => {
               const r = t.getBoundingClientRect();
               return r.width > 0 && (r.left < edge.left - 1 || r.right > edge.right + 1);
             }).map((t) => `${id}: ${t.textContent}`);
           })""", FIGURES)


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py), on the Masks tab."""
    shared_page.get_by_role("tab", name="Masks", exact=True).click()
    return shared_page


def test_the_window_figures_are_drawn_apart_and_within_the_page(page):
    for viewport, shot in ((WIDE, "window-mask-wide"), (NARROW, "window-mask-narrow")):
        page.set_viewport_size(viewport)
        try:
            boxes = run_window(page)
            for i, a in enumerate(FIGURES):
                assert boxes[a]["width"] > 200 and boxes[a]["height"] > 200, (a, boxes[a])
                assert boxes[a]["x"] >= -1 and boxes[a]["x"] + boxes[a]["width"] <= viewport["width"] + 1, (a, boxes[a])
                for b in FIGURES[i + 1:]:
                    assert not overlaps(boxes[a], boxes[b]), (a, boxes[a], b, boxes[b])
            assert titles_outside(page) == []
            # the weights figure: full, windowed and their difference, three heatmaps
            assert page.locator("#window-weights .js-plotly-plot .hm image").count() == 3
            if viewport is WIDE:  # a phone's sideways scroll is checked once per tab (test_browser_first_screen.py)
                width = page.evaluate("() => document.documentElement.scrollWidth")
                assert width <= viewport["width"], f"the page scrolls sideways: {width} px"
            screenshot(page, shot)
        finally:
            page.set_viewport_size(WIDE)


def test_a_window_setting_it_cannot_run_is_a_note_not_an_error(page):
    expect(page.locator("#window-run")).to_be_attached(timeout=TIMEOUT_MS)
    page.locator("#window-size input").fill("0")
    page.locator("#window-run").scroll_into_view_if_needed()
    page.locator("#window-run").click()
    expect(page.locator("#window-note")).to_contain_text("Window w must be between 1 and 256, got 0",
                                                         timeout=TIMEOUT_MS)
    for elem_id in FIGURES:   # each figure in its stated empty state (the last run's figures gone), no "Error" box
        expect(page.locator(f"#{elem_id}")).to_contain_text("Not computed", timeout=TIMEOUT_MS)
        assert "Error" not in page.locator(f"#{elem_id}").inner_text()
    settled(page)
    assert page.locator(".toast-body").count() == 0, "a refusal became a toast"
