"""The Inside tab's online softmax (eq. 6.10) in headless Chromium on a tiny random model, at 1400 px and on a
390 px phone: the block-size input and its button sit under the softmax stage, the figure draws its three panels
(the running max, the running sum, both softmaxes) inside the page's width, and the bytes table is shown."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import open_page, screenshot, settled  # noqa: E402

RUN_TIMEOUT_MS = 60_000
VIEWPORTS = {"wide": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


def test_the_online_softmax_draws_under_the_softmax_stage(browser, app_url):
    """One page: the section run at 1400 px and checked, then the window narrowed to a phone's width and the
    layout checked again."""
    context, page, errors = open_page(browser, f"{app_url}?tab=inside", VIEWPORTS["wide"])   # a link opens the tab
    try:
        expect(page.locator("#inside-note")).to_contain_text("through layer 0, head 0", timeout=RUN_TIMEOUT_MS)
        page.locator("#inside-online").get_by_text("The same softmax, online").click()
        page.locator("#inside-online-block input").fill("3")
        page.locator("#inside-online-run").click()
        expect(page.locator("#inside-online-note")).to_contain_text("differ from the pass's softmax",
                                                                    timeout=RUN_TIMEOUT_MS)
        plot = page.locator("#inside-online-figure .js-plotly-plot").first
        expect(plot).to_be_attached(timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#inside-online-figure .cartesianlayer .subplot")).to_have_count(3)
        lines = page.locator("#inside-online-figure .scatterlayer .trace")   # max, m, ℓ, online
        expect(lines.nth(2)).to_be_attached()
        expect(page.locator("#inside-online-figure .barlayer .point").first).to_be_attached()  # the plain softmax
        tables = page.locator("#inside-online-bytes table")                # measured, then apart the formula
        expect(tables).to_have_count(2)
        expect(tables.nth(0)).to_contain_text("8,192")
        expect(tables.nth(1)).to_contain_text("8,192")
        expect(page.locator("#inside-online-bytes")).to_contain_text("Formula, not a measurement")
        for name, viewport in VIEWPORTS.items():
            page.set_viewport_size(viewport)
            settled(page)
            box, width = plot.bounding_box(), viewport["width"]
            assert box["width"] > 0 and box["x"] >= -1 and box["x"] + box["width"] <= width + 1, (name, box, width)
            # the online section sits under the softmax stage and above the output stage
            online = page.locator("#inside-online").bounding_box()["y"]
            assert page.locator("#inside-stage5").bounding_box()["y"] < online, name
            assert online < page.locator("#inside-note6").bounding_box()["y"], name
            screenshot(page, f"inside-online-{name}")
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"
