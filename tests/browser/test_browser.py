"""The app in a real browser: Debian's Chromium, headless, driven by Playwright.

Opens each tab on a tiny random model (one page, walked by the tests in order), runs it, checks that the heatmaps and plots are drawn (plotly's
own SVG/canvas elements, not just our containers), hovers a heatmap cell, uploads a file, sends generated
text to the Attention tab, and saves a screenshot of each tab under tests/screenshots/ (git-ignored).
"""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

RUN_TIMEOUT_MS = 60_000

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import drawn, open_card, runs_done, screenshot, wait_for_run  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield url, services.models.get(llama)
    demo.close()


@pytest.fixture(scope="module")
def app_url(served):
    return served[0]


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py): each opens its own tab; the model
    switches come last."""
    return shared_page


def open_tab(page: Page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def expect_plot(page: Page, elem_id: str, kind: str = "heatmap") -> None:
    """Plotly has drawn the figure: a heatmap layer (an image) or the traces of a line/bar chart."""
    selector = {
        "heatmap": f"#{elem_id} .js-plotly-plot .hm image",
        "line": f"#{elem_id} .js-plotly-plot .scatterlayer .trace",
        "bar": f"#{elem_id} .js-plotly-plot .barlayer .trace",
    }[kind]
    expect(page.locator(selector).first).to_be_attached(timeout=RUN_TIMEOUT_MS)


def shot(page: Page, name: str) -> None:
    screenshot(page, name)


def test_page_opens_with_the_model_card_and_its_tabs(page):
    assert page.title() == "The attention explorer"
    tabs = page.get_by_role("tab").all_inner_texts()
    assert tabs[:5] == ["Generate", "Attention", "Positional encoding", "Masks", "Heads"]  # tabs added later follow
    open_card(page)
    expect(page.locator("#model-card")).to_contain_text("4d²")


def test_attention_tab_draws_model_view_head_view_and_window_with_hover(page):
    open_tab(page, "Attention")
    page.locator("#attn-run").click()
    for elem_id in ("attn-model-view", "attn-head-view", "attn-window"):
        expect_plot(page, elem_id)
    expect(page.locator("#attn-note")).to_contain_text("tokens")
    # hover the middle of the head view: plotly shows "query … → key …" and the weight
    plot_area = page.locator("#attn-head-view .js-plotly-plot .nsewdrag").first
    plot_area.scroll_into_view_if_needed()
    box = plot_area.bounding_box()
    plot_area.hover(position={"x": box["width"] * 0.3, "y": box["height"] * 0.8})
    expect(page.locator("#attn-head-view .hoverlayer .hovertext").first).to_contain_text("→ key", timeout=10_000)
    # hover a tile of the model view: it names its layer and head
    mosaic = page.locator("#attn-model-view .js-plotly-plot .nsewdrag").first
    mosaic.scroll_into_view_if_needed()
    box = mosaic.bounding_box()
    mosaic.hover(position={"x": box["width"] * 0.9, "y": box["height"] * 0.9})  # the last layer's last head
    hover = page.locator("#attn-model-view .hoverlayer .hovertext").first
    expect(hover).to_contain_text("layer 1, head 3", timeout=10_000)
    shot(page, "attention")


def test_a_file_over_1_mb_is_refused_in_the_page(page, tmp_path):
    open_tab(page, "Attention")
    before = page.locator("#attn-text textarea").input_value()
    big = tmp_path / "big.txt"
    big.write_bytes(b"word " * 240_000)  # 1.2 MB
    page.locator("#attn-upload input[type=file]").set_input_files(str(big))
    expect(page.locator(".toast-body").first).to_contain_text(
        re.compile(r"(exceed|too large|max|1 ?MB)", re.IGNORECASE), timeout=RUN_TIMEOUT_MS
    )
    assert page.locator("#attn-text textarea").input_value() == before  # nothing typed is lost
    # the refused file does not stay in the box as if it were loaded: the box waits for another file
    expect(page.locator("#attn-upload input[type=file]")).to_be_attached(timeout=RUN_TIMEOUT_MS)
    assert page.locator("#attn-upload .file-preview").count() == 0


def test_attention_tab_reads_an_uploaded_file(page, tmp_path):
    open_tab(page, "Attention")
    path = tmp_path / "story.txt"
    path.write_text("Upload test: the keeper lit the lamp. " * 5, encoding="utf-8")
    page.locator("#attn-upload input[type=file]").set_input_files(str(path))
    textbox = page.locator("#attn-text textarea")
    expect(textbox).to_have_value(path.read_text(encoding="utf-8"), timeout=RUN_TIMEOUT_MS)
    page.locator("#attn-run").click()
    expect_plot(page, "attn-head-view")
    expect(page.locator("#attn-head-view")).to_contain_text("0 U")  # the first token of the file


def test_empty_text_shows_a_message_not_a_traceback(page):
    open_tab(page, "Attention")
    page.locator("#attn-text textarea").fill("")
    page.locator("#attn-run").click()
    toast = page.locator(".toast-body").first
    expect(toast).to_contain_text("The text is empty", timeout=RUN_TIMEOUT_MS)
    assert "Traceback" not in page.content()


def test_generate_tab_streams_and_sends_its_text_to_the_attention_tab(page):
    open_tab(page, "Generate")
    page.locator("#gen-run").click()
    expect(page.locator("#gen-stats")).to_contain_text("done", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#gen-stats")).to_contain_text("tokens/s")
    generated = page.locator("#gen-output textarea").input_value()
    assert generated
    shot(page, "generate")
    page.locator("#gen-send").click()
    expect(page.get_by_role("tab", name="Attention")).to_have_attribute("aria-selected", "true", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#attn-text textarea")).to_have_value(
        re.compile(re.escape(generated[:40])), timeout=RUN_TIMEOUT_MS
    )
    expect_plot(page, "attn-head-view")


def test_positional_tab_draws_sinusoids_similarity_and_rope(page):
    open_tab(page, "Positional encoding")
    page.locator("#pe-run").click()
    expect_plot(page, "pe-heatmap")
    expect_plot(page, "pe-similarity")
    expect_plot(page, "pe-dots", "line")
    expect_plot(page, "pe-rope-angles")
    expect_plot(page, "pe-rope-scores", "line")
    expect(page.locator("#pe-check")).to_contain_text("is a rotation of PE(p)")
    shot(page, "positional-encoding")


def test_masks_tab_draws_stages_and_the_three_measurements(page):
    open_tab(page, "Masks")
    before = runs_done(page, "mask-field-note")
    page.locator("#mask-run").click()
    wait_for_run(page, "mask-field-note", before)   # this run's figures, not the tab's opening ones
    expect_plot(page, "mask-stages")
    expect_plot(page, "mask-causal", "bar")
    expect_plot(page, "mask-padding", "bar")
    expect_plot(page, "mask-entropy", "line")
    expect(page.locator("#mask-stages .js-plotly-plot .hm image")).to_have_count(6)
    shot(page, "masks")


def test_heads_tab_maps_every_head_and_a_click_on_a_tile_opens_that_head(page):
    open_tab(page, "Heads")
    before = runs_done(page, "heads-field-note")
    page.locator("#heads-run").click()
    wait_for_run(page, "heads-field-note", before)
    expect_plot(page, "heads-map")
    expect_plot(page, "heads-head-view")
    expect(page.locator("#heads-note")).to_contain_text("Induction probe")
    expect(page.locator("#heads-named")).to_contain_text("previous-token head")
    expect(page.locator("#heads-head-view")).to_contain_text("Layer 0, head 0")
    # 2 layers across, 4 heads down: the bottom-right tile is layer 1, head 3
    tiles = page.locator("#heads-map .js-plotly-plot .nsewdrag").first
    tiles.scroll_into_view_if_needed()
    box = tiles.bounding_box()
    corner = {"x": box["width"] * 0.75, "y": box["height"] * 0.85}
    tiles.hover(position=corner)
    expect(page.locator("#heads-map .hoverlayer .hovertext").first).to_contain_text("layer 1, head 3", timeout=10_000)
    tiles.click(position=corner)
    expect(page.locator("#heads-head-view")).to_contain_text("Layer 1, head 3", timeout=RUN_TIMEOUT_MS)
    assert page.locator("#heads-layer input").input_value() == "1"
    assert page.locator("#heads-head input").input_value() == "3"
    page.locator("#heads-add").click()
    expect(page.locator("#heads-ablate-list textarea, #heads-ablate-list input").first).to_have_value("1.3")
    shot(page, "heads")


def test_heads_tab_shades_the_text_by_surprisal(page):
    open_tab(page, "Heads")
    page.locator("#heads-surprisal-run").click()
    expect(page.locator("#heads-surprisal-stats")).to_contain_text("perplexity", timeout=RUN_TIMEOUT_MS)
    token = page.locator("#heads-surprisal .surprisal .tok").nth(3)
    expect(token).to_have_attribute("title", re.compile(r"nats\s+top 5 here"))


def test_switching_to_an_encoder_updates_the_card_and_shows_attention_both_ways(page, app_url):
    page.locator("#model-picker input").click()
    page.get_by_role("option", name=re.compile("tiny-bert")).click()
    open_card(page)
    expect(page.locator("#model-card")).to_contain_text("encoder (bidirectional)", timeout=RUN_TIMEOUT_MS)
    open_tab(page, "Attention")
    expect(page.locator("#attn-layer")).to_contain_text("Layer (0–1)")
    page.locator("#attn-run").click()
    expect_plot(page, "attn-head-view")
    expect(page.locator("#attn-model-view")).to_contain_text("bidirectional (encoder)")
    expect(page.locator("#attn-head-view")).to_contain_text("[CLS]")


def test_a_model_that_cannot_be_fetched_gives_one_clear_message(page):
    page.locator("#model-picker input").click()
    # the picker marks it as not installed; its value stays the plain name, which the message quotes
    page.get_by_role("option", name="gpt2 (not installed, from the Hugging Face Hub)", exact=True).click()
    toast = page.locator(".toast-body")
    expect(toast.first).to_contain_text("Model 'gpt2' cannot be loaded here", timeout=RUN_TIMEOUT_MS)
    # the message is the failed load coming back, and every tab's update chains on a load's success only
    drawn(page)
    assert toast.count() == 1, "one failed load should give one message, not one per tab"
