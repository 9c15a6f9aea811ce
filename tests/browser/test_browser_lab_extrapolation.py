"""The Lab's positions past the trained length in headless Chromium: at 1400 px and on a 390 px phone the first
screen states the shipped result's finding and the section draws the shipped figures inside the page's width with
the learned table's refusal in words; at 1400 px a short run of two kinds replaces them with its own."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import screenshot, settled  # noqa: E402

RUN_TIMEOUT_MS = 120_000
VIEWPORTS = {"wide": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


def inside_width(page, selector: str) -> None:
    plot = page.locator(f"{selector} .js-plotly-plot").first
    expect(plot).to_be_attached(timeout=RUN_TIMEOUT_MS)
    plot.scroll_into_view_if_needed()
    box, width = plot.bounding_box(), page.viewport_size["width"]
    assert box["width"] > 0 and box["x"] >= -1 and box["x"] + box["width"] <= width + 1, (selector, box, width)


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py), on the Lab tab."""
    shared_page.get_by_role("tab", name="Lab", exact=True).click()
    return shared_page


def test_the_shipped_result_is_the_first_screen_and_fits(page):
    expect(page.locator("#lab-extra-headline")).to_contain_text("saved result", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#lab-extra-headline")).to_contain_text("At 48, the most accurate is")
    expect(page.locator("#lab-extra-note")).to_contain_text("no position 28 in the table")
    # the figures draw after the words arrive (Plotly renders on its own time): wait for the sixth line and a map
    expect(page.locator("#lab-extra-accuracy .scatterlayer .trace").nth(5)).to_be_attached(timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#lab-extra-heads .heatmaplayer, #lab-extra-heads .hm").first).to_be_attached(
        timeout=RUN_TIMEOUT_MS)
    for name, viewport in VIEWPORTS.items():  # the page at 1400 px, then narrowed to a phone's width
        page.set_viewport_size(viewport)
        try:
            settled(page)
            for selector in ("#lab-extra-accuracy", "#lab-extra-heads"):
                inside_width(page, selector)
            screenshot(page, f"lab-extrapolation-saved-{name}")
            if name == "wide":  # a phone's sideways scroll is checked once per tab (test_browser_first_screen.py)
                assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"] + 1
        finally:
            page.set_viewport_size(VIEWPORTS["wide"])


def test_a_short_run_replaces_the_shipped_figures(page):
    expect(page.locator("#lab-extra-note")).to_contain_text("Saved result", timeout=RUN_TIMEOUT_MS)
    kinds = page.locator("#lab-extra-kinds")
    for kind in ("sinusoidal", "rope", "alibi", "relative"):
        kinds.get_by_label(kind, exact=True).uncheck()
    page.locator("#lab-extra-steps input").fill("10")
    page.locator("#lab-extra-run").click()
    expect(page.locator("#lab-extra-status")).to_contain_text("Done: 2 kinds", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#lab-extra-note")).to_contain_text("Computed here, now")
    expect(page.locator("#lab-extra-note")).to_contain_text("no position 28 in the table")
    inside_width(page, "#lab-extra-accuracy")
    expect(page.locator("#lab-extra-accuracy .legend .traces")).to_have_count(2)
    screenshot(page, "lab-extrapolation-run-wide")
