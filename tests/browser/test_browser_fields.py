"""A wrong layer or head in a real browser (headless Chromium), on a tiny random model (layers 0–1, heads 0–3): one
message under the fields that names the model's range, no error toast, no figure marked "Error", and the figures
keep the last result; a right layer afterwards runs as before. The Attention tab's Head dropdown says its range and
shows "mean of heads" in full."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import runs_done, wait_for_run  # noqa: E402

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py), each on its own tab's fields."""
    return shared_page


def errors_shown(page: Page, figures: list[str]) -> list[str]:
    """The figures (elem_ids) whose status says "Error", and the text of any error toast."""
    marked = page.evaluate(
        """(ids) => ids.filter((id) => {
             const e = document.getElementById(id);
             return e && e.querySelector('[data-testid="status-tracker"] .error'); })""",
        figures,
    )
    return marked + page.locator(".toast-body").all_inner_texts()


def title_of(page: Page, figure: str) -> str:
    return page.locator(f"#{figure} .js-plotly-plot .gtitle").first.text_content()


def test_the_attention_head_says_its_range_and_shows_the_mean_in_full(page):
    expect(page.locator("#attn-note")).to_contain_text("Opened on", timeout=TIMEOUT_MS)
    expect(page.locator("#attn-head")).to_contain_text("Head (0–3, or the mean)")
    head = page.locator("#attn-head input")
    head.fill("mean of heads")
    head.press("Enter")
    # two animation frames: the page has handled the key and drawn what followed it
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
    assert head.input_value() == "mean of heads"
    cut = head.evaluate("(e) => e.scrollWidth > e.clientWidth")
    assert not cut, "the Head dropdown cuts off 'mean of heads'"


def test_a_wrong_layer_in_the_attention_tab_is_a_note_and_the_figures_stay(page):
    expect(page.locator("#attn-note")).to_contain_text("Opened on", timeout=TIMEOUT_MS)
    figures = ["attn-head-view", "attn-model-view", "attn-columns", "attn-window"]
    expect(page.locator("#attn-head-view .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    title = title_of(page, "attn-head-view")
    assert title.startswith("Layer "), title

    page.locator("#attn-layer input").fill("99")
    before = runs_done(page, "attn-field-note")
    page.locator("#attn-run").click()
    note = page.locator("#attn-field-note")
    expect(note).to_contain_text("Layer 99 is out of range: this model has layers 0–1.", timeout=TIMEOUT_MS)
    wait_for_run(page, "attn-field-note", before)
    assert not errors_shown(page, figures)
    assert page.locator("#attn-head-view .js-plotly-plot .main-svg").count() > 0, "the head view was emptied"
    assert title_of(page, "attn-head-view") == title

    # a right layer: the note goes and the view follows
    page.locator("#attn-layer input").fill("1")
    page.locator("#attn-head input").fill("2")
    page.locator("#attn-head input").press("Enter")
    page.locator("#attn-run").click()
    expect(page.locator("#attn-head-view")).to_contain_text("Layer 1, head 2", timeout=TIMEOUT_MS)
    expect(note).to_have_text("")
    assert not errors_shown(page, figures)


def test_a_wrong_layer_in_the_masks_tab_keeps_its_figures(page):
    page.get_by_role("tab", name="Masks").click()
    figures = ["mask-stage-on-scores", "mask-stage-on-softmax", "mask-causal", "mask-entropy"]
    expect(page.locator("#mask-stage-on-scores .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    page.locator("#mask-layer input").fill("99")
    before = runs_done(page, "mask-field-note")
    page.locator("#mask-run").click()
    expect(page.locator("#mask-field-note")).to_contain_text("Layer 99 is out of range: this model has layers 0–1.",
                                                             timeout=TIMEOUT_MS)
    wait_for_run(page, "mask-field-note", before)
    assert not errors_shown(page, figures)
    assert page.locator("#mask-stage-on-scores .js-plotly-plot .main-svg").count() > 0


def test_a_wrong_head_in_the_inside_tab_keeps_its_stages(page):
    page.get_by_role("tab", name="Inside").click()
    stage = page.locator("#inside-stage1 .js-plotly-plot .main-svg").first
    expect(stage).to_be_attached(timeout=TIMEOUT_MS)  # the tab opens on the default text's stages
    page.locator("#inside-head input").fill("9")
    before = runs_done(page, "inside-field-note")
    page.locator("#inside-run").click()
    expect(page.locator("#inside-field-note")).to_contain_text("Head 9 is out of range: this model has heads 0–3.",
                                                               timeout=TIMEOUT_MS)
    wait_for_run(page, "inside-field-note", before)
    assert not errors_shown(page, [f"inside-stage{i}" for i in range(1, 9)])
    assert stage.is_visible(), "the stages of the last walk were emptied"


def test_an_offset_past_n_is_a_note_under_the_rotation_check_and_the_other_figures_are_drawn(page):
    page.get_by_role("tab", name="Positional encoding").click()
    expect(page.locator("#pe-rope-scores .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    k = page.locator("#pe-k input")
    assert k.is_visible(), "the offset k sits beside the figure it changes, not in a closed section"
    n = page.locator("#pe-n input[type=number]")
    n.fill("4")
    n.press("Enter")
    k.fill("5")
    page.locator("#pe-run").click()
    # the run came back: its rotation check says what is wrong with k
    expect(page.locator("#pe-check")).to_contain_text("Offset k must be between 1 and 3, got 5", timeout=TIMEOUT_MS)
    figures = ["pe-heatmap", "pe-similarity", "pe-dots", "pe-learned", "pe-rope-angles", "pe-rope-scores"]
    assert not errors_shown(page, figures)
    expect(page.locator("#pe-heatmap")).to_contain_text("n = 4", timeout=TIMEOUT_MS)  # drawn for the new n
    for figure in figures:
        assert page.locator(f"#{figure} .js-plotly-plot .main-svg").count() > 0, f"{figure} is not drawn"
    expect(page.locator("#pe-rope-note")).to_contain_text("depends only on the distance")
