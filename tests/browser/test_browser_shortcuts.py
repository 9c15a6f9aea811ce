"""How good are the shortcuts, in a real browser (headless Chromium, 1400 px) on a tiny random model: the
comparison draws one scatter panel per method, its note says that a map can look right and rank the wrong heads,
and a point's hover names its cell."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import screenshot  # noqa: E402

RUN_TIMEOUT_MS = 60_000
CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


def test_the_shortcut_scatter_is_drawn_and_names_its_cells(page):
    page.get_by_role("tab", name="Patching").click()
    expect(page.locator("#patch-run")).to_be_visible()
    assert page.locator("#patch-shortcut").count() == 0 or not page.locator("#patch-shortcut").is_visible()
    page.locator("#patch-clean textarea").fill(CLEAN)
    page.locator("#patch-corrupted textarea").fill(CORRUPTED)
    page.locator("#patch-shortcut-run").click()
    expect(page.locator("#patch-shortcut-note")).to_contain_text("rank the wrong heads", timeout=RUN_TIMEOUT_MS)
    panels = page.locator("#patch-shortcut .js-plotly-plot .scatterlayer .trace.scatter")
    expect(panels.first).to_be_attached(timeout=RUN_TIMEOUT_MS)
    assert panels.count() >= 4       # atp, atp*, ig, flow (each with its points; the signed ones a diagonal too)
    expect(page.locator("#patch-shortcut .js-plotly-plot .gtitle")).to_contain_text("exact sweep")
    point = page.locator("#patch-shortcut .js-plotly-plot .scatterlayer .trace.scatter .points path").first
    point.scroll_into_view_if_needed()
    point.hover(force=True)
    expect(page.locator("#patch-shortcut .hoverlayer .hovertext").first).to_contain_text("exact",
                                                                                          timeout=10_000)
    expect(page.locator("#patch-shortcut .hoverlayer .hovertext").first).to_contain_text(" H")
    screenshot(page, "patching-shortcuts")
