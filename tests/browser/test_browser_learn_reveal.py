"""The Learn tab in headless Chromium on the tiny Llama: a link to a lesson computes no other tab's first screen until
that tab is opened. (Every lesson's answer held back until Reveal, and its Try it landing computed, are walked on
SmolLM2 and MiniLM in test_browser_learn.py.)"""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import idle, open_page  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402

TIMEOUT_MS = 60_000
@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app


def test_a_link_to_a_lesson_computes_the_other_tabs_only_when_they_are_opened(browser, app_url):
    """The Attention tab is selected as the page mounts, before the link moves the page to Learn: its first screen
    waits until its user opens it, and so does every other tab's, each computed then."""
    url, _, _ = app_url
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson=heads")
    try:
        expect(page.locator("#learn-place")).to_contain_text(syllabus.find("heads").title, timeout=TIMEOUT_MS)
        idle(page, TIMEOUT_MS)
        assert page.evaluate("() => document.querySelector('#attn-note').innerText.trim()") == ""
        page.get_by_role("tab", name="Attention", exact=True).click()
        expect(page.locator("#attn-note")).to_contain_text("layer", timeout=TIMEOUT_MS)
        expect(page.locator("#attn-head-view .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Masks", exact=True).click()
        expect(page.locator("#mask-stage-on-scores .js-plotly-plot .main-svg").first).to_be_attached(
            timeout=TIMEOUT_MS)
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"
