"""The Inside tab in a real browser (headless Chromium), on a tiny random model: the tab opens on the default text's
walk, all eight stages drawn again after another, and a click on a cell of the weights asking why that weight."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import screenshot  # noqa: E402

RUN_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


def test_inside_tab_walks_every_stage_and_a_cell_click_asks_why(page):
    page.get_by_role("tab", name="Inside").click()
    expect(page.locator("#inside-run")).to_be_visible()
    expect(page.locator("#inside-note")).to_contain_text("through layer 0, head 0", timeout=RUN_TIMEOUT_MS)
    page.locator("#inside-layer input").fill("1")
    page.locator("#inside-run").click()
    expect(page.locator("#inside-note")).to_contain_text("through layer 1, head 0", timeout=RUN_TIMEOUT_MS)
    for i in range(1, 9):
        expect(page.locator(f"#inside-stage{i} .js-plotly-plot").first).to_be_attached(timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#inside-note5")).to_contain_text("with d_k = ", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#inside-note3")).to_contain_text("read key/value head")
    # the softmax panel is the last heatmap of stage 5: its bottom-left cell is the last query on the first key
    cells = page.locator("#inside-stage5 .js-plotly-plot .nsewdrag").last
    cells.scroll_into_view_if_needed()
    box = cells.bounding_box()
    cells.click(position={"x": box["width"] * 0.05, "y": box["height"] * 0.97})
    expect(page.locator("#inside-decomposition .js-plotly-plot .hm image")).to_be_attached(timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#inside-why-note")).to_contain_text("add up to", timeout=RUN_TIMEOUT_MS)
    assert page.locator("#inside-key input").input_value() == "0"
    screenshot(page, "inside")
