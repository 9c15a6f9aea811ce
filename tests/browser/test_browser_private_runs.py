"""A Lab run saved on a shared server (SPACE_ID set) in a real browser: the page that saved it lists it in its model
picker and loads it from there; a second page opened beside it lists nothing of it."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import open_page  # noqa: E402
from test_browser_lab import TIMEOUT_MS, tiny_config  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-private")
    env = {"ATTN_LAB_EVAL_EXAMPLES": "16", "ATTN_WEIGHTS_DIR": str(root / "weights"), "SPACE_ID": "someone/explorer"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        llama = str(build_tiny_llama(root / "tiny-llama"))
        demo, url, _ = launch_app([llama], llama)
        yield url
        demo.close()


def test_a_saved_run_is_listed_and_loaded_on_its_page_and_nowhere_else(browser, app_url, page):
    page.get_by_role("tab", name="Lab").click()
    tiny_config(page, 20)
    page.locator("#lab-train").click()
    expect(page.locator("#lab-status")).to_contain_text("done, step 20 / 20", timeout=TIMEOUT_MS)
    expect(page.locator("#lab-pick input")).to_have_value("run1", timeout=TIMEOUT_MS)
    page.locator("#lab-name textarea").fill("only-mine")
    page.locator("#lab-save").click()
    expect(page.locator("#lab-saved")).to_contain_text("for this page only", timeout=TIMEOUT_MS)
    page.locator("#model-picker input").click()
    option = page.get_by_role("option", name="only-mine (this page's run", exact=False)
    expect(option).to_be_visible(timeout=TIMEOUT_MS)
    option.click()
    page.locator("#model-card-box").click()
    expect(page.locator("#model-card")).to_contain_text("trained in the lab", timeout=TIMEOUT_MS)
    context, other, errors = open_page(browser, app_url)
    try:
        other.locator("#model-picker input").click()
        expect(other.get_by_role("option").first).to_be_visible(timeout=TIMEOUT_MS)
        assert not any("only-mine" in text for text in other.get_by_role("option").all_inner_texts())
    finally:
        context.close()
    assert not errors, errors
