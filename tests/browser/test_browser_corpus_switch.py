"""A model change in headless Chromium clears the Across texts tab: after head scores of a tiny Llama over induction
texts, choosing a tiny BERT leaves no map, strip or note of the Llama; the note names the buttons to press."""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import open_page  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus-switch")
    llama = str(build_tiny_llama(root / "tiny-llama"))
    bert = str(build_tiny_bert(root / "tiny-bert", layers=3, heads=8))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_RUNS_DIR", str(root / "runs"))    # saved corpus jobs go here, not into the working tree
        demo, url, _ = launch_app([llama, bert], llama)
        yield url
        demo.close()


def test_a_model_change_clears_the_across_texts_tab(browser, app_url):
    context, page, errors = open_page(browser, app_url)
    try:
        page.get_by_role("tab", name="Across texts").click()
        page.locator("#corpus-n input").fill("4")
        page.locator("#corpus-heads-run").click()
        expect(page.locator("#corpus-note")).to_contain_text("Done in", timeout=TIMEOUT_MS)
        expect(page.locator("#corpus-map .js-plotly-plot")).to_be_attached()
        page.locator("#model-picker input").click()
        page.get_by_role("option", name=re.compile("tiny-bert")).click()
        note = page.locator("#corpus-note")
        expect(note).to_contain_text("Now on", timeout=TIMEOUT_MS)
        expect(note).to_contain_text("tiny-bert")
        expect(note).to_contain_text("Score the heads")
        assert "Done in" not in note.inner_text() and "tiny-llama" not in note.inner_text()
        for figure in ("#corpus-map", "#corpus-strip"):
            expect(page.locator(f"{figure} .js-plotly-plot")).to_have_count(0)
        expect(page.locator("#corpus-examples-note")).to_contain_text("Find its top examples")
        assert not errors, errors
    finally:
        context.close()
